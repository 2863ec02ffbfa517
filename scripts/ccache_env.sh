# Sourced by the scripts that build (build.sh, install_python.sh, wheel.sh, demo.sh; with
# $root set): every build tree (build, build-asan, build-tsan, build-wheel, build-demo)
# compiles through ccache when it is installed (setup.sh installs it), with one cache per
# machine beside the environments (~/.cache/tensorlift/ccache). A fresh clone on a machine
# that has built tensorlift before then recompiles only what changed: the four trees of make
# test took 39 of its 73 minutes on a 2-core machine (2026-12-03). Paths are hashed relative
# to the checkout (base_dir, no working directory in the hash), so that clones in other
# directories share the cache. TENSORLIFT_CCACHE=0 turns it off; CCACHE_DIR and
# CCACHE_MAXSIZE override.
if [ "${TENSORLIFT_CCACHE:-1}" != 0 ] && command -v ccache > /dev/null; then
  export CCACHE_DIR=${CCACHE_DIR:-${TENSORLIFT_VENV_CACHE:-$HOME/.cache/tensorlift}/ccache}
  export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-12G}
  export CCACHE_BASEDIR=$root CCACHE_NOHASHDIR=1
  # CMake takes these as the launchers' defaults when it configures a tree.
  export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache
  export CMAKE_CUDA_COMPILER_LAUNCHER=ccache
fi
