#!/usr/bin/env bash
# The wheel where users install it (make test; docs/install.md): dist/'s wheel
# (make wheel) installed into fresh virtual environments, and tests/wheel/smoke.py
# run there from a scratch folder, with PATH holding only the environment's bin/
# (no compiler) and no source tree on sys.path:
#   1. a fresh venv with the wheel and its dependencies from PyPI (numpy): no torch;
#   2. a fresh venv with the wheel, and torch (with numpy) from the project's
#      environment (.venv) through a .pth file: tensorlift.load's torch tensors;
#   3. the first venv again in a container-like root: a mount namespace (unshare) in
#      which /usr/include, the compilers' folders and CUDA are empty and the
#      system's copies of the libraries the wheel grafts (simdjson, xxHash,
#      liburing, cpp-httplib, libxml2), libcurl and libmpi are /dev/null, so the
#      wheel runs on what it carries, and S3 and MPI say what to install. Where unshare is not
#      allowed, it says so and runs the check without the namespace.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
wheel=$(ls "$root"/dist/tensorlift-*.whl 2>/dev/null | head -1)
[ -n "$wheel" ] || { echo "wheel smoke: no dist/tensorlift-*.whl (make wheel)" >&2; exit 1; }
base=$("$root/.venv/bin/python" -c 'import sys; print(sys._base_executable)')
work=$(mktemp -d /tmp/tl-wheel.XXXXXX)
trap 'rm -rf "$work"' EXIT
# The script in a folder of its own (its folder is sys.path[0]), the venvs in another.
mkdir -p "$work/run" "$work/env"
cp "$root/tests/wheel/smoke.py" "$work/run/"
echo "wheel smoke: $(basename "$wheel")"

smoke() {  # VENV ARGS...: smoke.py with nothing but VENV/bin on PATH
  local venv=$1
  shift
  (cd "$work/run" && env -i HOME="$HOME" LANG=C.UTF-8 PATH="$venv/bin" "$venv/bin/python" smoke.py "$@")
}

echo "== 1. fresh venv, no torch"
"$base" -m venv "$work/env/plain"
"$work/env/plain/bin/python" -m pip install -q --disable-pip-version-check "$wheel"
smoke "$work/env/plain" --torch no

echo "== 2. fresh venv, torch from the project's environment"
"$base" -m venv "$work/env/torch"
"$work/env/torch/bin/python" -m pip install -q --disable-pip-version-check --no-deps "$wheel"
site=$("$work/env/torch/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$root/.venv/bin/python" -c 'import sysconfig, torch, numpy; print(sysconfig.get_paths()["purelib"])' \
  > "$site/zz-torch-from-project.pth"
smoke "$work/env/torch" --torch yes

echo "== 3. container-like root"
hide='
set -e
for d in /usr/include /usr/lib/gcc /usr/libexec/gcc /usr/local/cuda; do
  [ -d "$d" ] && mount -t tmpfs -o ro,size=1m none "$d"
done
for f in /usr/lib/x86_64-linux-gnu/lib{simdjson,xxhash,uring,cpp-httplib,xml2,curl,mpi}.so*; do
  [ -f "$f" ] && mount --bind /dev/null "$f"
done
echo "container-like root: a mount namespace (unshare) with no headers, compilers or CUDA, and /dev/null for the system copies of the grafted libraries, libcurl and MPI"
'
if unshare --mount --propagation private true 2>/dev/null; then
  unshare --mount --propagation private bash -c "$hide"'
    cd "$1/run" && env -i HOME="$HOME" LANG=C.UTF-8 PATH="$1/env/plain/bin" "$1/env/plain/bin/python" smoke.py --torch no --no-libcurl --no-mpi
  ' bash "$work"
else
  echo "container-like root: unshare is not allowed here; the clean venv (PATH without build tools) of step 1 only"
fi
