#!/usr/bin/env bash
# make gpu-check [STEP=setup|test|bench|all|bundle] [OUT=DIR]: validates and
# measures tensorlift's GPU path on the machine's first GPU, from a fresh copy
# of the checkout, and leaves the results in one folder (docs/gpu.md).
#
#   setup   Debian packages and a Python environment with CUDA torch, then a
#           CUDA build for the GPU present (build-gpu/, cached: a second call
#           only rebuilds what changed). Offline, from .gpu-bundle/ when the
#           checkout carries one (STEP=bundle makes it on a machine with
#           the registries; lent GPU machines reach none).
#   test    every C++ test (ctest) and Python test (pytest) on the device, the
#           kernels' tests again under compute-sanitizer where it is installed.
#   bench   bench/gpu/gpu_bench.py: checkpoint -> GPU memory, cold and warm,
#           tensorlift against the other loaders and the limits; the kernels
#           against a device-to-device copy.
#   all     setup, test, bench (the default); exits non-zero if a test failed.
#   wheel   the wheel users install, before any build: dist/'s (make wheel), or
#           on a lent machine the one .gpu-bundle/tensorlift/ carries, installed
#           beside the machine's Python into <build>-fromwheel/site, with
#           tl_limits (one file) compiled on its own; then the Python GPU tests
#           (GPU_CHECK_WHEEL_PYTESTS) and the load benchmark (gpu_bench.py
#           --parts loads) with it. A lease runs it first (scripts/gpu_lease.sh).
#   disturbance  bench/remote/seed_disturbance.py: a seed's matmul loop on the
#           device, alone and while a client pulls its weights, with and
#           without a rate limit (after setup).
#   handover  bench/remote/gpu_handover_bench.py: a seed serving 8 GB on the
#           device and client processes taking it by same-device handover
#           (CUDA IPC; mapped, and copied once device to device), time to
#           usable tensors against the 0.1 s target (after setup;
#           GPU_HANDOVER_ARGS adds to its arguments).
#   offload  (after setup) gpu_bench.py --parts sparse: a 50 %-pruned checkpoint
#           stored sparse against the same tensors dense, into device memory,
#           cold and warm ($OUT/sparse/results.json, .md; SPARSE_BENCH_ARGS adds
#           to --gb 2 --runs 3); then bench/sparse/offload_bench.py --quick:
#           greedy generation with the blocks streamed onto the device within
#           half the weights' bytes, tensorlift dense and sparse against
#           accelerate's disk and CPU offload ($OUT/offload.json, its table
#           $OUT/offload.md; OFFLOAD_BENCH_ARGS adds to its arguments).
#
# Each step fits one 10-minute command. Results: $OUT (default
# bench/out/gpu/): results.json, results.md (printed at the end), and each
# step's log.
#
# Without a GPU it says so in one line and exits 0, after checking that its
# scripts are complete. GPU_CHECK_EMULATED=1 runs the whole sequence against
# tensorlift's emulated device instead (small sizes, the device tests only),
# which is how `make test` tests these scripts.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
step=${STEP:-all}
out=${OUT:-$root/bench/out/gpu}
case "$step" in setup|test|bench|all|bundle|wheel|disturbance|handover|offload) ;; *)
  echo "gpu-check: unknown STEP '$step' (setup, test, bench, all, wheel, disturbance, handover, offload or bundle)" >&2
  exit 2 ;;
esac

# The files this check needs; a missing or broken one fails the dry run too.
check_scripts() {
  local f n=0
  for f in scripts/gpu_check.sh scripts/gpu_bundle.sh scripts/gpu_lease.sh; do
    [ -f "$f" ] || { echo "gpu-check: $f is missing" >&2; return 1; }
    bash -n "$f" || { echo "gpu-check: $f does not parse" >&2; return 1; }
    n=$((n + 1))
  done
  for f in bench/gpu/gpu_bench.py bench/gpu/contender.py bench/load/gen_checkpoint.py \
      bench/remote/gpu_handover_bench.py bench/sparse/offload_bench.py; do
    [ -f "$f" ] || { echo "gpu-check: $f is missing" >&2; return 1; }
    python3 -c "import ast, sys; ast.parse(open(sys.argv[1]).read(), sys.argv[1])" "$f" \
      || { echo "gpu-check: $f does not parse" >&2; return 1; }
    n=$((n + 1))
  done
  for f in tests/device/kernels_bench.cc docs/gpu.md; do
    [ -f "$f" ] || { echo "gpu-check: $f is missing" >&2; return 1; }
    n=$((n + 1))
  done
  grep -q tl_gpu_kernels_bench tests/CMakeLists.txt \
    || { echo "gpu-check: tests/CMakeLists.txt does not build tl_gpu_kernels_bench" >&2; return 1; }
  echo "$n"
}

if [ "$step" = bundle ]; then
  exec bash scripts/gpu_bundle.sh
fi

gpu_reason=""
if [ -n "${GPU_CHECK_EMULATED:-}" ]; then
  mode=emulated
elif ! command -v nvidia-smi >/dev/null 2>&1; then
  mode=none; gpu_reason="nvidia-smi is not installed"
elif ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  mode=none; gpu_reason="nvidia-smi lists no GPU"
else
  mode=gpu
fi
if [ "$mode" = none ]; then
  n=$(check_scripts)
  echo "gpu-check: no GPU here ($gpu_reason); checked its $n files, ran nothing (GPU_CHECK_EMULATED=1 runs it on the emulated device)"
  exit 0
fi
check_scripts >/dev/null

mkdir -p "$out"
out=$(cd "$out" && pwd)
if [ "$mode" = gpu ]; then
  build=build-gpu
  device=cuda:0
else
  build=build
  device=emulated
fi
envfile=$root/$build/gpu-env.sh
failed=0

log() { echo "gpu-check [$mode] $*"; }

# unpack_bundle SITE: offline, the carried Debian packages, unpacked without
# overwriting any file the machine has, UCX's libraries, DLPack's header, and the
# carried wheels installed into SITE next to the machine's own Python (the one
# with CUDA torch).
unpack_bundle() {
  local site=$1 deb x
  x=$(mktemp -d)
  for deb in "$root"/.gpu-bundle/debs/*.deb; do
    [ -e "$deb" ] || continue
    dpkg-deb -x "$deb" "$x"
  done
  cp -rn "$x"/. / 2>/dev/null || true
  [ -d "$root/.gpu-bundle/root" ] && { cp -rn "$root/.gpu-bundle/root"/. / 2>/dev/null || true; }
  rm -rf "$x"
  ldconfig 2>/dev/null || true
  local t
  for t in "$root"/.gpu-bundle/ucx-cu*.tar.xz; do
    [ -f "$t" ] || continue
    [ -f "${t%.tar.xz}/lib/libucp.so.0" ] || tar xJf "$t" -C "$root/.gpu-bundle"
  done
  mkdir -p "$site"
  if compgen -G "$root/.gpu-bundle/wheels/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" \
      "$root"/.gpu-bundle/wheels/*.whl
  fi
}

do_setup() {
  log "setup"
  if [ "$mode" = emulated ]; then
    bash scripts/setup.sh
    py=$root/.venv/bin/python
    bash scripts/build.sh "$build"
    cmake --build "$build" --target tl_gpu_kernels_bench tl_limits -j "$(nproc)" > "$out/build.log" 2>&1 \
      || { cat "$out/build.log"; return 1; }
    bash scripts/install_python.sh
    printf 'py=%q\nsite=\n' "$py" > "$envfile"
    return 0
  fi
  local site=$root/$build/site
  if [ -d "$root/.gpu-bundle" ]; then
    log "setup: offline, from .gpu-bundle/"
    unpack_bundle "$site"
    py=$(command -v python3)
  else
    log "setup: from the registries (scripts/setup.sh)"
    bash scripts/setup.sh
    py=$root/.venv/bin/python
    site=""
  fi
  PYTHONPATH="$site" "$py" - <<'EOF'
import sys, torch
if not torch.cuda.is_available():
    sys.exit(f"gpu-check: {sys.executable}'s torch {torch.__version__} sees no GPU")
print(f"gpu-check: torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
EOF
  if [ -n "$site" ]; then  # the wheels (DLPack's header among them), for cmake too
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  fi
  # This GPU's architecture only: a faster build, and the SASS that runs here.
  local cc
  cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')
  local dlpack=()
  [ -f "$root/.gpu-bundle/dlpack/dlpack/dlpack.h" ] && dlpack=(-DTENSORLIFT_DLPACK_INCLUDE_DIR="$root/.gpu-bundle/dlpack")
  bash scripts/build.sh "$build" -DTENSORLIFT_CUDA_ARCHITECTURES="${cc}-real" \
    -DPython_EXECUTABLE="$py" "${dlpack[@]}" > "$out/build.log" 2>&1 || { cat "$out/build.log"; return 1; }
  cmake --build "$build" --target tl_gpu_kernels_bench tl_limits -j "$(nproc)" >> "$out/build.log" 2>&1 \
    || { cat "$out/build.log"; return 1; }
  # The Python package, built against this Python and installed beside the wheels,
  # in $build with its settings (as scripts/install_python.sh does in build/): only
  # the extension is compiled on top of the build above.
  local target=() generator
  [ -n "$site" ] && target=(--target "$site" --upgrade)
  generator=$(sed -n 's/^CMAKE_GENERATOR:INTERNAL=//p' "$build/CMakeCache.txt")
  CMAKE_GENERATOR="${generator:-Unix Makefiles}" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
    "$py" -m pip install -q --no-build-isolation --no-deps --disable-pip-version-check "${target[@]}" \
    -Cbuild-dir="$build" -Ccmake.build-type=RelWithDebInfo -Cinstall.strip=true \
    -Ccmake.define.TENSORLIFT_BUILD_TESTS=ON -Ccmake.define.TENSORLIFT_BUILD_BENCH=ON \
    -Ccmake.define.TENSORLIFT_BUILD_TOOLS=ON -Ccmake.define.TENSORLIFT_CUDA_ARCHITECTURES="${cc}-real" \
    -Ccmake.define.Python_EXECUTABLE="$py" . > "$out/pip.log" 2>&1 \
    || { cat "$out/pip.log"; return 1; }
  printf 'py=%q\nsite=%q\n' "$py" "$site" > "$envfile"
}

do_wheel() {
  log "wheel"
  local dir=$root/$build-fromwheel wheels site rc
  site=$dir/site
  rm -rf "$dir"
  mkdir -p "$dir"
  if [ "$mode" = gpu ] && [ -d "$root/.gpu-bundle" ]; then
    log "wheel: offline, from .gpu-bundle/"
    unpack_bundle "$site"
    py=$(command -v python3)
    wheels=$root/.gpu-bundle/tensorlift
  else
    [ -x "$root/.venv/bin/python" ] || bash scripts/setup.sh
    py=$root/.venv/bin/python
    wheels=$root/dist
  fi
  compgen -G "$wheels/tensorlift-*.whl" >/dev/null \
    || { echo "gpu-check: no wheel in $wheels (make wheel; on a lent machine, the bundle's)" >&2; return 1; }
  # The wheel pip picks for this Python, from that folder alone.
  "$py" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" \
    --find-links "$wheels" tensorlift || return 1
  ln -sfn "$site/tensorlift/_bin/tensorlift" "$dir/tensorlift"
  # The limits' reader, one file of its own (no tensorlift code): liburing and xxHash
  # from the machine or the bundle's Debian packages.
  local uring=(-DTL_LIMITS_HAVE_URING=1 -luring)
  echo '#include <liburing.h>' | g++ -x c++ -fsyntax-only - 2>/dev/null || uring=()
  # shellcheck disable=SC2068
  g++ -O2 -std=c++17 bench/load/tl_limits.cc -o "$dir/tl_limits" ${uring[@]} -lxxhash -pthread \
    > "$out/tl_limits-build.log" 2>&1 || { cat "$out/tl_limits-build.log"; return 1; }
  PYTHONPATH="$site" "$py" -c 'import sys, tensorlift
where = tensorlift.__file__
assert where.startswith(sys.argv[1]), f"tensorlift came from {where}, not the wheel in {sys.argv[1]}"
print(f"gpu-check: tensorlift {tensorlift.__version__} from the wheel ({where})")' "$site" || return 1
  "$dir/tensorlift" --version
  printf 'py=%q\nsite=%q\n' "$py" "$site" > "$dir/gpu-env.sh"
  # The Python GPU tests, then the loads, with the wheel.
  envfile=$dir/gpu-env.sh build=$build-fromwheel
  load_env
  local py_tests=(tests/python/test_device.py tests/python/test_cli_device.py)
  [ -n "${GPU_CHECK_WHEEL_PYTESTS:-}" ] && read -ra py_tests <<< "$GPU_CHECK_WHEEL_PYTESTS"
  : > "$out/tests.jsonl"
  if [ "${GPU_CHECK_WHEEL_PYTESTS:-}" != none ]; then
    set +e
    # shellcheck disable=SC2086
    "$py" -m pytest -q -rfE -p no:cacheprovider ${GPU_CHECK_PYTEST_ARGS:-} "${py_tests[@]}" > "$out/pytest-wheel.log" 2>&1
    rc=$?
    set -e
    record_tests pytest-wheel "$out/pytest-wheel.log" $rc
    [ $rc -eq 0 ] || failed=1
  fi
  local args=(--build "$dir" --device "$device" --out "$out" --parts loads)
  [ "$mode" = emulated ] && args+=(--gb 0.05 --runs 1)
  # shellcheck disable=SC2086
  "$py" bench/gpu/gpu_bench.py "${args[@]}" ${GPU_BENCH_ARGS:-}
}

load_env() {
  [ -f "$envfile" ] || { echo "gpu-check: run STEP=setup first ($envfile is missing)" >&2; exit 1; }
  # shellcheck disable=SC1090
  source "$envfile"
  if [ -n "$site" ]; then
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  fi
  export TENSORLIFT_BUILD=$root/$build
  # cuFile from PyPI's nvidia-cufile (a dependency of CUDA torch) where the
  # machine has no libcufile of its own.
  if [ "$mode" = gpu ] && [ -z "${TENSORLIFT_CUFILE_LIB:-}" ] && ! ldconfig -p 2>/dev/null | grep -q libcufile.so.0; then
    local lib
    lib=$("$py" -c 'import glob, os, nvidia.cufile as m; p = list(m.__path__)[0]; print((glob.glob(os.path.join(p, "lib", "libcufile.so*")) or [""])[0])' 2>/dev/null || true)
    [ -n "$lib" ] && export TENSORLIFT_CUFILE_LIB=$lib
  fi
  # UCX with CUDA (the libucx-cu12 or -cu13 libraries the bundle carries, the one
  # for the driver's CUDA, else the newest older one): the data plane's tests, and
  # the peer pull from GPU memory into GPU memory, use it.
  if [ "$mode" = gpu ] && [ -z "${TENSORLIFT_UCX_LIB:-}" ]; then
    local major cu lib=""
    major=$(nvidia-smi 2>/dev/null | grep -o 'CUDA Version: [0-9]*' | grep -o '[0-9]*$' || true)
    for cu in 13 12; do
      [ -n "$major" ] && [ "$cu" -gt "$major" ] && continue
      if [ -f "$root/.gpu-bundle/ucx-cu$cu/lib/libucp.so.0" ]; then
        lib=$root/.gpu-bundle/ucx-cu$cu/lib/libucp.so.0
        break
      fi
    done
    if [ -n "$lib" ]; then
      log "UCX: $lib (the driver supports CUDA ${major:-?})"
      export TENSORLIFT_UCX_LIB=$lib
      export TENSORLIFT_TEST_UCX_LIB=$lib
    fi
  fi
  # NCCL likewise, from PyPI's nvidia-nccl (CUDA torch's): the NCCL tests and
  # the one-rank device load over NCCL run with it.
  if [ "$mode" = gpu ] && [ -z "${TENSORLIFT_NCCL_LIB:-}" ] && ! ldconfig -p 2>/dev/null | grep -q libnccl.so.2; then
    local nccl
    nccl=$("$py" -c 'import glob, os, nvidia.nccl as m; p = list(m.__path__)[0]; print((glob.glob(os.path.join(p, "lib", "libnccl.so.2")) or [""])[0])' 2>/dev/null || true)
    [ -n "$nccl" ] && export TENSORLIFT_NCCL_LIB=$nccl
  fi
}

# Counts from a ctest or pytest log into $out/tests.json entries.
record_tests() {  # NAME LOG RC
  "$py" - "$out/tests.jsonl" "$1" "$2" "$3" <<'EOF'
import json, re, sys
path, name, log, rc = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
text = open(log, errors="replace").read()
counts = {}
m = re.search(r"(\d+)% tests passed, (\d+) tests failed out of (\d+)", text)
if m:
    total, bad = int(m.group(3)), int(m.group(2))
    counts = {"passed": total - bad, "failed": bad}
    counts["skipped"] = len(re.findall(r"\*\*\*Skipped|Not Run \(Disabled\)", text)) + len(re.findall(r"\(Skipped\)", text))
for k in ("passed", "failed", "skipped", "error", "errors"):
    m = re.findall(r"(\d+) " + k + r"\b", text.splitlines()[-1] if text.splitlines() else "")
    if m and name.startswith("pytest"):
        counts[k.rstrip("s") if k == "errors" else k] = int(m[-1])
rec = {"suite": name, "rc": rc, **counts}
open(path, "a").write(json.dumps(rec) + "\n")
print(f"gpu-check: {name}: rc {rc} {counts}")
EOF
}

do_test() {
  load_env
  log "test"
  : > "$out/tests.jsonl"
  local rc labels=()
  # On the emulated device, `make test` has already run everything else.
  [ "$mode" = emulated ] && labels=(-L 'device|sparse')
  # GPU_CHECK_CTEST_LABELS: only the tests of these labels (a regex), e.g. 'device|sparse'
  # where a short lease has no time for the tests that never touch the device.
  # "none": no ctest (a lease's later call, for the sanitizer alone).
  [ -n "${GPU_CHECK_CTEST_LABELS:-}" ] && labels=(-L "$GPU_CHECK_CTEST_LABELS")
  if [ "${GPU_CHECK_CTEST_LABELS:-}" != none ]; then
    set +e
    ctest --test-dir "$build" --output-on-failure -j "$(nproc)" "${labels[@]}" > "$out/ctest.log" 2>&1
    rc=$?
    set -e
    record_tests ctest "$out/ctest.log" $rc
    [ $rc -eq 0 ] || failed=1
  fi
  # The kernels under compute-sanitizer (memcheck, then racecheck): the CUDA
  # device tests, and whole loads through the pipeline (plain and converting).
  local cs=""
  cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
  if [ "$mode" = gpu ] && [ -n "$cs" ] && [ "${GPU_CHECK_SANITIZE:-}" != none ]; then
    local ckpt tool name
    ckpt=$("$py" bench/load/gen_checkpoint.py --gb 0.05 --shards 2 | tail -1)
    local -a cases=(
      "cuda_device_test|$build/tests/cuda_device_test --gtest_filter=CudaDeviceTest.*"
      "load|$build/tensorlift load $ckpt --device cuda:0 --checksum"
      "load_f16|$build/tensorlift load $ckpt --device cuda:0 --dtype f16 --checksum"
    )
    local c
    for c in "${cases[@]}"; do
      name=${c%%|*}
      # GPU_CHECK_SANITIZE: only these cases (space-separated names), "none" for none.
      if [ -n "${GPU_CHECK_SANITIZE:-}" ] && [[ " $GPU_CHECK_SANITIZE " != *" $name "* ]]; then
        continue
      fi
      for tool in memcheck racecheck; do
        set +e
        # shellcheck disable=SC2086
        # API errors are not counted: the tests make some on purpose (an allocation
        # too large), and cuFile's driver open makes one of its own (cuMemFree).
        "$cs" --tool "$tool" --report-api-errors no --error-exitcode 99 ${c#*|} \
          > "$out/sanitizer-$tool-$name.log" 2>&1
        rc=$?
        set -e
        record_tests "compute-sanitizer $tool $name" "$out/sanitizer-$tool-$name.log" $rc
        [ $rc -eq 0 ] || failed=1
      done
    done
  elif [ "$mode" = gpu ] && [ -z "$cs" ]; then
    echo '{"suite": "compute-sanitizer", "rc": 0, "skipped_reason": "compute-sanitizer is not installed"}' >> "$out/tests.jsonl"
  fi
  local py_tests=(tests/python)
  [ "$mode" = emulated ] && py_tests=(tests/python/test_device.py tests/python/test_cli_device.py)
  # GPU_CHECK_PYTESTS: other pytest paths (space-separated), e.g. to rerun one file.
  [ -n "${GPU_CHECK_PYTESTS:-}" ] && read -ra py_tests <<< "$GPU_CHECK_PYTESTS"
  [ "${GPU_CHECK_PYTESTS:-}" = none ] && return 0
  set +e
  # -rfE names every failure and error in the summary; a crash leaves its Python
  # traceback in the log (pytest's faulthandler).
  # shellcheck disable=SC2086  # GPU_CHECK_PYTEST_ARGS: more pytest options, e.g. "-n 8"
  "$py" -m pytest -q -rfE -p no:cacheprovider ${GPU_CHECK_PYTEST_ARGS:-} "${py_tests[@]}" > "$out/pytest.log" 2>&1
  rc=$?
  set -e
  record_tests pytest "$out/pytest.log" $rc
  [ $rc -eq 0 ] || failed=1
  return 0
}

do_bench() {
  load_env
  log "bench"
  local args=(--build "$root/$build" --device "$device" --out "$out")
  if [ "$mode" = emulated ]; then
    args+=(--gb 0.05 --runs 1 --kernel-mib 8)
  fi
  "$py" bench/gpu/gpu_bench.py "${args[@]}" ${GPU_BENCH_ARGS:-}
}

rc=0
case "$step" in
  setup) do_setup ;;
  test) do_test ;;
  bench) do_bench ;;
  wheel) do_wheel || failed=1 ;;
  disturbance)
    load_env
    log "disturbance"
    dargs=(--device "$device" --out "$out/seed-disturbance.json")
    [ "$mode" = emulated ] && dargs=(--device cpu --mb 64 --seconds 1 --runs 1 --out "$out/seed-disturbance.json")
    "$py" bench/remote/seed_disturbance.py "${dargs[@]}" ${SEED_DISTURBANCE_ARGS:-} || failed=1 ;;
  handover)
    load_env
    log "handover"
    hargs=(--build "$build" --device "$device" --gb 8 --runs 3 --out "$out/gpu-handover.json")
    [ "$mode" = emulated ] && hargs=(--build "$build" --device emulated:0 --gb 0.05 --runs 1 --out "$out/gpu-handover.json")
    # shellcheck disable=SC2086
    "$py" bench/remote/gpu_handover_bench.py "${hargs[@]}" ${GPU_HANDOVER_ARGS:-} || failed=1 ;;
  offload)
    load_env
    log "offload"
    # The sparse part first: short and bounded; the offload bench saves each row as it goes.
    sargs=(--build "$root/$build" --device "$device" --out "$out/sparse" --parts sparse --gb 2 --runs 3)
    oargs=(--build "$root/$build" --device "$device" --quick --out "$out/offload.json")
    if [ "$mode" = emulated ]; then
      sargs=(--build "$root/$build" --device emulated --out "$out/sparse" --parts sparse --gb 0.05 --runs 1)
      oargs+=(--runs 1)
    fi
    # shellcheck disable=SC2086
    "$py" bench/gpu/gpu_bench.py "${sargs[@]}" ${SPARSE_BENCH_ARGS:-} || failed=1
    cat "$out/sparse/results.md" 2>/dev/null || true
    # shellcheck disable=SC2086
    "$py" bench/sparse/offload_bench.py "${oargs[@]}" ${OFFLOAD_BENCH_ARGS:-} || failed=1 ;;
  all) do_setup; do_test; do_bench ;;
esac
if [ -f "$out/tests.jsonl" ] && [ "$step" != setup ] && [ "$step" != bench ]; then
  grep -q '"rc": [1-9]' "$out/tests.jsonl" && failed=1
fi
if [ -f "$out/results.md" ] && [ "$step" != setup ]; then
  cat "$out/results.md"
fi
if [ "$failed" -ne 0 ]; then
  echo "gpu-check: tests failed (logs in $out)" >&2
  rc=1
fi
exit $rc
