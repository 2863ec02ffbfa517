#!/usr/bin/env bash
# make gpu-check STEP=bundle: prepares .gpu-bundle/ (git-ignored) on a machine
# that reaches Debian's and PyPI's registries, for a GPU machine that reaches
# neither (the lent ones): the Debian packages tensorlift's build needs
# (headers and libraries, unpacked there without overwriting anything) and
# the wheels of the Python packages the GPU image lacks, for its Python
# (GPU_PY_VERSION, default 3.12). It stays under GPU_BUNDLE_MAX_MIB (default
# 60) so that it travels with the checkout (the device tool carries 64 MiB with
# the tree); MPI and etcd are left out and those tests skip there. UCX travels
# as Debian's headers (tensorlift is built with them and does not link UCX) and
# the libraries of PyPI's libucx-cu12 and libucx-cu13 (UCX with CUDA, compressed:
# ucx-cu12.tar.xz, ucx-cu13.tar.xz), which gpu_check.sh unpacks into
# .gpu-bundle/ucx-cuNN/lib and names the one for the driver's CUDA in
# TENSORLIFT_UCX_LIB. DLPack's header travels
# alone (dlpack/, from apache-tvm-ffi's wheel), and tensorlift's own wheel for that
# Python (make wheel's steps: the abi3 wheel for 3.12 and later) in tensorlift/, which
# a lease installs and measures first (gpu_check.sh STEP=wheel).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bundle=$root/.gpu-bundle
pyver=${GPU_PY_VERSION:-3.12}
max_mib=${GPU_BUNDLE_MAX_MIB:-60}
grep -q "^/\.gpu-bundle/$" .gitignore \
  || { echo "gpu-bundle: .gpu-bundle/ must be ignored by git (.gitignore)" >&2; exit 1; }
rm -rf "$bundle"
mkdir -p "$bundle/debs" "$bundle/wheels"

# Debian: the -dev packages of the required libraries, their runtime
# libraries, and the test frameworks (the static GoogleTest libraries). libxml2
# (the S3 answers' parser) comes with its ICU, in case the image has no libxml2.
debs=(libsimdjson-dev libsimdjson14 libcli11-dev libxxhash-dev libxxhash0 liburing-dev liburing2
      libgtest-dev libgmock-dev libbenchmark-dev libbenchmark1debian libcpp-httplib-dev libcpp-httplib0.11
      libssl-dev zlib1g-dev libbrotli-dev libbrotli1 pkgconf pkgconf-bin libpkgconf3 libucx-dev
      libxml2-dev libxml2 libicu72)
sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
$sudo apt-get update -qq
(cd "$bundle/debs" && apt-get download -qq "${debs[@]}")
# ICU's headers alone (libxml2's headers include unicode/ucnv.h), not libicu-dev's
# 10 MB of static libraries: unpacked into root/, which setup copies onto /.
icu_tmp=$(mktemp -d)
(cd "$icu_tmp" && apt-get download -qq libicu-dev && dpkg-deb -x libicu-dev_*.deb x)
mkdir -p "$bundle/root/usr/include"
cp -r "$icu_tmp/x/usr/include/unicode" "$bundle/root/usr/include/"
rm -rf "$icu_tmp"

# PyPI: what the GPU image lacks (it has torch, safetensors, nanobind,
# scikit-build-core, pytest, xxhash, ml-dtypes, psutil, tqdm, nvidia-cufile).
# accelerate (0.4 MB, pure Python) is the offload benchmark's baseline
# (bench/sparse/offload_bench.py), whether or not the image has it.
wheels=(fastsafetensors runai-model-streamer instanttensor accelerate)
for w in "${wheels[@]}"; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_35_x86_64 \
    -d "$bundle/wheels" "$w" || echo "gpu-bundle: no wheel of $w for Python $pyver (that contender will say so)" >&2
done

# DLPack 1.x's header, from apache-tvm-ffi's wheel (4 MB; the header is 20 KB): the
# build names it in TENSORLIFT_DLPACK_INCLUDE_DIR.
tvm_tmp=$(mktemp -d)
python3 -m pip download -q --no-deps --only-binary=:all: -d "$tvm_tmp" apache-tvm-ffi
python3 -c '
import os, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    name = next(n for n in z.namelist() if n.endswith("/include/dlpack/dlpack.h"))
    os.makedirs(sys.argv[2], exist_ok=True)
    with open(os.path.join(sys.argv[2], "dlpack.h"), "wb") as f:
        f.write(z.read(name))
' "$tvm_tmp"/apache_tvm_ffi-*.whl "$bundle/dlpack/dlpack"
rm -rf "$tvm_tmp"

# tensorlift's wheel for the GPU machine's Python, built here (scripts/wheel.sh).
wheel_py=$pyver
[ "$(printf '%s\n3.12\n' "$pyver" | sort -V | head -1)" = 3.12 ] && wheel_py=3.12  # abi3 from 3.12 on
[ -x ".venv-build-py$wheel_py/bin/python" ] && [ -x .venv-wheel/bin/python ] || bash scripts/setup.sh
WHEEL_PYTHONS=$wheel_py WHEEL_OUT="$bundle/tensorlift" bash scripts/wheel.sh

# UCX with CUDA, a build for CUDA 12 and one for CUDA 13 (PyPI's libucx-cu12 and
# libucx-cu13, 43 MB each): only the libraries the data plane opens
# (remote/ucx_api.cc) and the transport modules it needs, not their static
# archives, perftest or tools; compressed (16 MiB of libraries travel as 4 each).
# gpu_check.sh unpacks them on the machine and names the one that fits its
# driver's CUDA in TENSORLIFT_UCX_LIB.
for cu in 12 13; do
  ucx_tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$ucx_tmp" "libucx-cu$cu==1.22.0"
  mkdir -p "$bundle/ucx-cu$cu"
  python3 - "$ucx_tmp"/libucx_cu$cu-*.whl "$bundle/ucx-cu$cu" <<'EOF'
import sys, zipfile
keep = ["libucp.so.0", "libucs.so.0", "libucs_signal.so.0", "libucm.so.0", "libuct.so.0",
        "ucx/libuct_cuda.so.0", "ucx/libucm_cuda.so.0", "ucx/libuct_cma.so.0"]
with zipfile.ZipFile(sys.argv[1]) as z:
    for name in keep:
        info = z.getinfo("libucx/lib/" + name)
        info.filename = "lib/" + name
        z.extract(info, sys.argv[2])
EOF
  chmod 755 "$bundle"/ucx-cu$cu/lib/*.so.0 "$bundle"/ucx-cu$cu/lib/ucx/*.so.0
  rm -rf "$ucx_tmp"
  tar cJf "$bundle/ucx-cu$cu.tar.xz" -C "$bundle" "ucx-cu$cu"
  rm -rf "$bundle/ucx-cu$cu"
done

mib=$(du -sm "$bundle" | cut -f1)
echo "gpu-bundle: $bundle: $(ls "$bundle/debs" | wc -l) Debian packages, $(ls "$bundle/wheels" | wc -l) wheels, $(cd "$bundle/tensorlift" && echo tensorlift-*.whl), ${mib} MiB"
if [ "$mib" -gt "$max_mib" ]; then
  echo "gpu-bundle: ${mib} MiB is over ${max_mib} MiB: it would not travel with the checkout" >&2
  exit 1
fi
