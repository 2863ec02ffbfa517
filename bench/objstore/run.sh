#!/usr/bin/env bash
# The object-storage benchmark: bench/objstore/run.sh [objstore_bench.py flags...]
# tensorlift.load("s3://...") against runai-model-streamer's S3 backend, boto3
# download + safetensors load_file and the limit (parallel ranged GETs), on a
# generated checkpoint (TL_BENCH_OBJ_GB, default 2 GB) served by `rclone serve s3`
# (.venv-s3) on loopback, cold and warm. Uses the tensorlift Python package
# installed in .venv (scripts/install_python.sh); builds nothing. A table on
# stdout and in bench/out/objstore.md, everything in bench/out/objstore.json. Then
# striped_bench.py: striped loads against each source alone (bench/out/striped.md).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
[ -x .venv-s3/bin/rclone ] || { echo "bench/objstore: .venv-s3/bin/rclone is missing (scripts/setup.sh)" >&2; exit 1; }
.venv/bin/python -c "import tensorlift, runai_model_streamer_s3, boto3" \
  || { echo "bench/objstore: .venv lacks tensorlift, runai-model-streamer-s3 or boto3 (scripts/setup.sh, scripts/install_python.sh)" >&2; exit 1; }
.venv/bin/python bench/objstore/objstore_bench.py "$@"
# Striped loads (disk, bucket and a peer, each alone and together): needs the CLI (tensorlift serve).
[ -x build/tensorlift ] || { echo "bench/objstore: build/tensorlift is missing (make build)" >&2; exit 1; }
exec .venv/bin/python bench/objstore/striped_bench.py
