#!/usr/bin/env bash
# The load benchmark (issue #3): bench/load/run.sh [load_bench.py flags...]
# Builds tl_load_bench and tl_limits in the build directory (TL_BUILD_DIR,
# default build/) and runs bench/load/load_bench.py with the project's Python
# environment: a table on stdout, bench/out/load.json. TL_BENCH_GB (default 4),
# TL_BENCH_SHARDS (4), TL_BENCH_RUNS (3) and TL_BENCH_SETTLE set the size, the
# shards, the runs per cell and the rest before each run.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${TL_BUILD_DIR:-$root/build}
cd "$root"
cmake --build "$build" --target tl_load_bench tl_limits -j 2 > "$build/bench-load-build.log" 2>&1 \
  || { cat "$build/bench-load-build.log"; echo "bench: building tl_load_bench and tl_limits failed" >&2; exit 1; }
exec .venv/bin/python bench/load/load_bench.py --build "$build" "$@"
