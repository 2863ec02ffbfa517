#!/usr/bin/env bash
# The multi-rank load benchmark (issue #6): bench/dist/run.sh [dist_bench.py flags...]
# Runs bench/dist/dist_bench.py with the project's Python environment: 1, 2 and 4
# ranks (torchrun, gloo, CPU) loading one checkpoint with tensorlift.fastsafetensors
# and fastsafetensors, cold and warm; a table on stdout, bench/out/dist.json.
# TL_BENCH_DIST_GB (default 1), TL_BENCH_SHARDS (4), TL_BENCH_RUNS (3),
# TL_BENCH_SETTLE and TL_BENCH_DIST_WORLDS (1,2,4) set the size, the shards, the
# runs per cell, the rest before each run and the world sizes. Needs no build:
# it uses the tensorlift package installed in .venv (or the one on PYTHONPATH).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
exec .venv/bin/python bench/dist/dist_bench.py "$@"
