#!/usr/bin/env bash
# Scatter or per-rank reads for GetSharded(name, 0) (issue #6): bench/dist/sharded.sh
# Builds tl_dist_sharded_bench (needs MPI) and runs it under mpiexec with 2 and 4
# ranks; one JSON line per (ranks, tensor size, state, mode) in
# bench/out/dist-sharded.jsonl and a table on stdout (docs/performance-dist.md,
# "Scatter or read"). TL_BENCH_RUNS (5), TL_BENCH_SHARDED_MIB (256) and
# TL_BENCH_SHARDED_KIB (4,16,64,1024,16384,65536) set the runs, the checkpoint
# size and the tensor sizes; the checkpoints go to a temporary directory.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${TL_BUILD_DIR:-$root/build}
cd "$root"
cmake --build "$build" --target tl_dist_sharded_bench -j 2 > "$build/bench-dist-build.log" 2>&1 \
  || { cat "$build/bench-dist-build.log"; echo "bench: building tl_dist_sharded_bench failed (needs MPI)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tl-sharded-bench-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir -p bench/out
out=bench/out/dist-sharded.jsonl
: > "$out"
for ranks in 2 4; do
  mpiexec --oversubscribe -n "$ranks" "$build/tl_dist_sharded_bench" "$tmp" \
    --total-mib "${TL_BENCH_SHARDED_MIB:-256}" --runs "${TL_BENCH_RUNS:-5}" \
    --sizes-kib "${TL_BENCH_SHARDED_KIB:-4,16,64,1024,16384,65536}" >> "$out"
done
.venv/bin/python - "$out" <<'PY'
import json, sys
rows = {}
for line in open(sys.argv[1]):
    d = json.loads(line)
    rows.setdefault((d["world"], d["tensor_bytes"], d["state"]), {})[d["mode"]] = d
print("| ranks | tensor | state | tensors | scatter s (spread) | read s (spread) | scatter / read |")
print("|---|---|---|---|---|---|---|")
for (world, size, state), m in sorted(rows.items()):
    s, r = m["scatter"], m["read"]
    kib = size >> 10
    name = f"{kib} KiB" if kib < 1024 else f"{kib >> 10} MiB"
    print(f"| {world} | {name} | {state} | {s['tensors']} | {s['median_s']:.3f} "
          f"({min(s['runs_s']):.3f}-{max(s['runs_s']):.3f}) | {r['median_s']:.3f} "
          f"({min(r['runs_s']):.3f}-{max(r['runs_s']):.3f}) | {s['median_s'] / r['median_s']:.2f}x |")
PY
