#!/usr/bin/env bash
# vLLM start-up per load format (issue 15): bench/vllm/run.sh [vllm_bench.py flags...]
# Sets up both environments (scripts/setup.sh), installs tensorlift into them,
# and runs bench/vllm/vllm_bench.py: a table on stdout, bench/out/vllm.{json,md}.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
bash scripts/setup.sh
bash scripts/build.sh build > /dev/null
bash scripts/install_python.sh
exec .venv/bin/python bench/vllm/vllm_bench.py "$@"
