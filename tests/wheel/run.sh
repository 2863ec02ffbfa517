#!/usr/bin/env bash
# The wheels where users install them (make test; docs/install.md): dist/'s wheels
# (make wheel: one per CPython 3.10 and 3.11, one abi3 for 3.12+) installed into fresh
# virtual environments of each CPython users run (WHEEL_SMOKE_PYTHONS, default 3.10 to
# 3.13; scripts/setup.sh finds them, in .venv-build-pyX.Y), and tests/wheel/smoke.py
# run there from a scratch folder, with PATH holding only the environment's bin/ (no
# compiler) and no source tree on sys.path. numpy comes from PyPI, tensorlift from
# dist/ alone (pip --no-index --find-links), so pip itself picks the wheel that fits the
# interpreter, as it would for a user:
#   1. per Python: a fresh venv with the wheel and numpy: no torch;
#   2. for the project's Python (.venv's): a fresh venv with the wheel, and torch (with
#      numpy) from the project's environment (.venv) through a .pth file:
#      tensorlift.load's torch tensors;
#   3. per Python: the venv of 1 again in a container-like root: a mount namespace
#      (unshare) in which /usr/include, the compilers' folders and CUDA are empty and the
#      system's copies of the libraries the wheel grafts (simdjson, xxHash,
#      liburing, cpp-httplib, libxml2), libcurl and libmpi are /dev/null, so the
#      wheel runs on what it carries, and S3 and MPI say what to install. Where unshare is not
#      allowed, it says so and runs the check without the namespace.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
ls "$root"/dist/tensorlift-*.whl > /dev/null 2>&1 || { echo "wheel smoke: no dist/tensorlift-*.whl (make wheel)" >&2; exit 1; }
pythons=${WHEEL_SMOKE_PYTHONS:-3.10 3.11 3.12 3.13}
project=$("$root/.venv/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
work=$(mktemp -d /tmp/tl-wheel.XXXXXX)
trap 'rm -rf "$work"' EXIT
# The script in a folder of its own (its folder is sys.path[0]), the venvs in another.
mkdir -p "$work/run" "$work/env"
cp "$root/tests/wheel/smoke.py" "$work/run/"
echo "wheel smoke: $(cd "$root/dist" && echo tensorlift-*.whl)"

smoke() {  # VENV ARGS...: smoke.py with nothing but VENV/bin on PATH
  local venv=$1
  shift
  (cd "$work/run" && env -i HOME="$HOME" LANG=C.UTF-8 PATH="$venv/bin" "$venv/bin/python" smoke.py "$@")
}

# install VENV [pip args]: tensorlift from dist/ only, the wheel pip picks for VENV's Python.
install() {
  local venv=$1
  shift
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-index --find-links "$root/dist" "$@" tensorlift
  "$venv/bin/python" -c 'import importlib.metadata as m, sys
d = m.distribution("tensorlift")
tags = [l.split(": ", 1)[1] for l in d.read_text("WHEEL").splitlines() if l.startswith("Tag: ")]
want = "cp312-abi3-" if sys.version_info >= (3, 12) else "cp3%d-cp3%d-" % (sys.version_info[1], sys.version_info[1])
print(f"  Python {sys.version.split()[0]}: tensorlift {d.version}, wheel tag {tags[0]}")
sys.exit(0 if tags[0].startswith(want) else f"wheel smoke: expected a {want}* wheel here")'
}

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
can_unshare=0
unshare --mount --propagation private true 2>/dev/null && can_unshare=1

for v in $pythons; do
  base=$("$root/.venv-build-py$v/bin/python" -c 'import sys; print(sys._base_executable)' 2>/dev/null) \
    || { echo "wheel smoke: no CPython $v (.venv-build-py$v): run scripts/setup.sh" >&2; exit 1; }
  env=$work/env/plain-$v
  echo "== 1. Python $v: fresh venv, no torch"
  "$base" -m venv "$env"
  "$env/bin/python" -m pip install -q --disable-pip-version-check numpy
  install "$env"
  smoke "$env" --torch no

  if [ "$v" = "$project" ]; then
    echo "== 2. Python $v: fresh venv, torch from the project's environment"
    "$base" -m venv "$work/env/torch"
    install "$work/env/torch" --no-deps
    site=$("$work/env/torch/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    "$root/.venv/bin/python" -c 'import sysconfig, torch, numpy; print(sysconfig.get_paths()["purelib"])' \
      > "$site/zz-torch-from-project.pth"
    smoke "$work/env/torch" --torch yes

    # PyPI's CUDA build of UCX (libucx-cu12, from .venv-ucx) beside the wheel's tensorlift, as
    # `pip install libucx-cu12` puts it: doctor says whether it is chosen, and why. With no CUDA
    # driver (this machine) the system's UCX is kept; with one, the CUDA build is loaded.
    ucx_site=$(ls -d "$root"/.venv-ucx/lib/python*/site-packages 2>/dev/null | head -1)
    if [ -n "$ucx_site" ] && [ -d "$ucx_site/libucx" ]; then
      echo "== 2b. Python $v: PyPI's libucx-cu12 beside tensorlift"
      for e in "$ucx_site"/libucx "$ucx_site"/libucx_cu12*; do ln -s "$e" "$site/"; done
      doctor=$(cd "$work/run" && env -i HOME="$HOME" LANG=C.UTF-8 PATH="$work/env/torch/bin" tensorlift doctor)
      chosen=$(grep "^  UCX chosen: " <<< "$doctor" || true)
      echo "$chosen"
      if grep -q "^CUDA driver: none" <<< "$doctor"; then
        want="the system's: PyPI's libucx-cu12 beside tensorlift ($site/libucx/lib/libucp.so.0) is a CUDA build, and there is no CUDA driver here"
      else
        want="PyPI's libucx-cu12 beside tensorlift (the driver supports CUDA"
      fi
      [[ "$chosen" == "  UCX chosen: $want"* ]] \
        || { echo "wheel smoke: UCX choice: expected '$want'; doctor said:"; echo "$doctor"; exit 1; } >&2
    fi
  fi

  echo "== 3. Python $v: container-like root"
  if [ "$can_unshare" = 1 ]; then
    unshare --mount --propagation private bash -c "$hide"'
      cd "$1/run" && env -i HOME="$HOME" LANG=C.UTF-8 PATH="$2/bin" "$2/bin/python" smoke.py --torch no --no-libcurl --no-mpi
    ' bash "$work" "$env"
  else
    echo "container-like root: unshare is not allowed here; the clean venv (PATH without build tools) of step 1 only"
  fi
done
