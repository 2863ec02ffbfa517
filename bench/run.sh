#!/usr/bin/env bash
# The benchmarks behind `make bench`: bench/run.sh [header_bench.py flags...]
# Builds what they need in the build directory (TL_BUILD_DIR, default build/) and
# runs them with the project's Python environment. Results go to bench/out/.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${TL_BUILD_DIR:-$root/build}
cd "$root"
cmake --build "$build" --target tl_header_bench -j 2 > "$build/bench-build.log" 2>&1 \
  || { cat "$build/bench-build.log"; echo "bench: building tl_header_bench failed" >&2; exit 1; }
.venv/bin/python bench/header_bench.py --build "$build" "$@"
bash bench/load/run.sh
.venv/bin/python bench/load/tp_bench.py --runs "${TL_BENCH_RUNS:-3}"
bash bench/dist/run.sh
bash bench/dist/sharded.sh
cmake --build "${TL_BUILD_DIR:-$root/build}" --target tl_sparse_decode_bench tl_load_bench tl_sparse_densify tensorlift_cli -j 2 \
  > "$build/bench-sparse-build.log" 2>&1 || { cat "$build/bench-sparse-build.log"; exit 1; }
"$build/tl_sparse_decode_bench" --reps 15 > bench/out/sparse-decode.json
.venv/bin/python bench/sparse/load_bench.py --build "$build" --runs "${TL_BENCH_RUNS:-3}"
.venv/bin/python bench/sparse/offload_bench.py --build "$build" --tokens 8 --runs "${TL_BENCH_RUNS:-3}"
.venv/bin/python bench/remote/peer_bench.py --build "$build" --runs "${TL_BENCH_RUNS:-3}"
bash bench/vllm/run.sh --runs "${TL_BENCH_RUNS:-3}"
bash bench/objstore/run.sh --runs "${TL_BENCH_RUNS:-3}"
# PNG charts of the load benchmark's results (bench/charts.py, matplotlib): bench/out/charts/.
.venv/bin/python bench/charts.py --out bench/out/charts bench/out/load.json
