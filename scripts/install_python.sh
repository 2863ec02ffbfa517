#!/usr/bin/env bash
# Builds the Python package from this checkout as a wheel (scikit-build-core,
# in the main build tree build/ with its settings, so that only the extension is
# compiled on top of scripts/build.sh's build; the wheel in build/dist) and
# installs it into the project's venv, so that `.venv/bin/python -c "import
# tensorlift"` works, and into the vLLM venv (.venv-vllm, same Python) where
# setup made one: an installed distribution, so that vLLM finds the
# `vllm.general_plugins` entry point of --load-format tensorlift.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
. "$root/scripts/ccache_env.sh"
log=build/pip-install.log
mkdir -p build
rm -rf build/dist
# build/'s settings (scripts/build.sh: RelWithDebInfo, tests, bench and the CLI on, its
# generator) over pyproject.toml's, which are for a wheel built on its own (pip install .).
generator=$(sed -n 's/^CMAKE_GENERATOR:INTERNAL=//p' build/CMakeCache.txt 2>/dev/null)
if ! CMAKE_GENERATOR="${generator:-Unix Makefiles}" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
      .venv/bin/python -m pip wheel --no-build-isolation --no-deps --disable-pip-version-check -q -w build/dist \
      -Cbuild-dir=build -Ccmake.build-type=RelWithDebInfo -Cinstall.strip=true -Ccmake.define.TENSORLIFT_BUILD_TESTS=ON \
      -Ccmake.define.TENSORLIFT_BUILD_BENCH=ON -Ccmake.define.TENSORLIFT_BUILD_TOOLS=ON . > "$log" 2>&1; then
  cat "$log"
  echo "install_python: pip wheel . failed" >&2
  exit 1
fi
wheel=$(ls build/dist/tensorlift-*.whl)
for venv in .venv .venv-vllm .venv-frameworks; do
  [ -x "$venv/bin/python" ] || continue
  if ! "$venv/bin/python" -m pip install --no-deps --force-reinstall --disable-pip-version-check -q "$wheel" \
        >> "$log" 2>&1; then
    cat "$log"
    echo "install_python: installing $wheel into $venv failed" >&2
    exit 1
  fi
done
