#!/usr/bin/env bash
# One short lease of a lent GPU machine (docs/gpu.md, "A lent machine"): make
# gpu-check's steps in one command of at most LEASE_SECONDS (default 560), in
# the order that keeps the most when time runs out:
#   1. wheel: the wheel users install (the bundle carries it: make gpu-check
#      STEP=bundle), installed beside the machine's Python with no build; the
#      Python tests that use the GPU and the load benchmark (every contender, cold
#      and warm, against the limits; GPU_BENCH_ARGS, default one run each) with it:
#      a lease measures within a minute or two of starting, and proves the wheel
#      on a GPU machine;
#   2. setup: the source build (CUDA, for this GPU's architecture);
#   3. test: the C++ tests of the device and of peer loading (ctest labels
#      device|sparse|load|dist|remote);
#   4. bench: the kernels against a device-to-device copy, and the peer pull
#      (gpu_bench.py --parts kernels,peer);
#   5. disturbance: a seed's matmul loop alone and while a client pulls its
#      weights, with and without a rate limit (bench/remote/seed_disturbance.py);
#   6. handover: same-GPU handover of 8 GB, a seed process on cuda:0 and client
#      processes that map its memory (CUDA IPC) or copy it once device to
#      device: time to usable tensors, target 0.1 s
#      (bench/remote/gpu_handover_bench.py; its JSON is written as it goes);
#   7. offload: a 50 %-pruned checkpoint stored sparse against the same tensors
#      dense, into GPU memory cold and warm (gpu_bench.py --parts sparse), then
#      greedy generation with the blocks streamed onto the GPU within half the
#      weights' bytes, tensorlift dense and sparse against accelerate's disk and
#      CPU offload (bench/sparse/offload_bench.py --quick; each row saved as it
#      completes);
#   8. sanitize: compute-sanitizer over the CUDA device tests and a whole load
#      while time is left.
# Every step has its own time limit, so the packing at the end always runs.
# LEASE_STEPS (space-separated names) runs only those steps, e.g.
# LEASE_STEPS="setup offload" (the steps after setup need it).
#
# The device tool brings back at most 8 files from $OUT; these are 8: the logs
# of every step travel as $OUT/gpu-check.tgz, beside summary.txt (each step's
# exit status and seconds), results.md (the tables of steps 1, 4 and 7, one
# after the other), results-wheel.json (step 1), results-kernels.json (step 4),
# seed-disturbance.json (step 5), gpu-handover.json (step 6) and offload.json
# (step 7: the offload bench's JSON under "offload_bench", the sparse part's
# under "sparse_load").
#
#   run(command="bash scripts/gpu_lease.sh", carry=[".gpu-bundle"], timeout_s=600)
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
budget=${LEASE_SECONDS:-560}
start=$(date +%s)
dest=${OUT:-$root/bench/out/gpu-lease}
work=$(mktemp -d /tmp/gpu-lease.XXXXXX)
mkdir -p "$dest"
left() { echo $((budget - ($(date +%s) - start))); }

pack() {
  cp "$root"/build-gpu.cmake.log "$root"/build-gpu.build.log "$work"/ 2>/dev/null
  tar czf "$dest/gpu-check.tgz" -C "$work" . 2>/dev/null
  cp "$work/summary.txt" "$dest/" 2>/dev/null
  local part f
  for part in "wheel: loads|wheel/results.md" "bench: kernels, peer pull|bench/results.md" \
      "offload: sparse against dense|offload/sparse/results.md" "offload: streaming onto the GPU|offload/offload.md"; do
    f=$work/${part#*|}
    [ -s "$f" ] && printf '## %s\n\n%s\n\n' "${part%%|*}" "$(cat "$f")"
  done > "$dest/results.md"
  [ -s "$dest/results.md" ] || rm -f "$dest/results.md"
  cp "$work/wheel/results.json" "$dest/results-wheel.json" 2>/dev/null
  cp "$work/bench/results.json" "$dest/results-kernels.json" 2>/dev/null
  cp "$work/disturbance/seed-disturbance.json" "$dest/" 2>/dev/null
  cp "$work/handover/gpu-handover.json" "$dest/" 2>/dev/null
  python3 - "$work/offload" "$dest/offload.json" <<'EOF' 2>/dev/null
import json, os, sys
src, dst = sys.argv[1], sys.argv[2]
out = {}
for key, rel in (("offload_bench", "offload.json"), ("sparse_load", "sparse/results.json")):
    path = os.path.join(src, rel)
    if os.path.exists(path):
        try:
            with open(path) as f:
                out[key] = json.load(f)
        except ValueError as e:  # a file cut short mid-write
            out[key] = {"error": f"{rel}: {e}"}
if out:
    with open(dst, "w") as f:
        json.dump(out, f, indent=1)
EOF
  true
}
trap pack EXIT

# step NAME SECONDS [VAR=VALUE...]: one gpu-check call under `timeout`, its
# output in NAME.out, a line in summary.txt.
step() {
  local name=$1 secs=$2 t rc
  shift 2
  if [ -n "${LEASE_STEPS:-}" ] && [[ " $LEASE_STEPS " != *" $name "* ]]; then
    echo "$name: not run (LEASE_STEPS)" | tee -a "$work/summary.txt"
    return 0
  fi
  if [ "$secs" -lt 20 ]; then
    echo "$name: not run (${secs} s left)" | tee -a "$work/summary.txt"
    return 1
  fi
  t=$(date +%s)
  mkdir -p "$work/$name"
  timeout --kill-after=10 "$secs" env "$@" OUT="$work/$name" bash scripts/gpu_check.sh > "$work/$name.out" 2>&1
  rc=$?
  echo "$name: rc $rc in $(($(date +%s) - t)) s (limit $secs s)" | tee -a "$work/summary.txt"
  tail -n 5 "$work/$name.out"
  return $rc
}

{
  date -u
  nvidia-smi
  nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv
  nproc; free -g; df -h "$root" /tmp
  command -v python3 g++ nvcc cmake compute-sanitizer
  python3 -c 'import sys, torch; print(sys.version, torch.__version__, torch.version.cuda)'
  python3 -c 'import importlib.metadata as m
for p in ("transformers", "accelerate", "huggingface-hub", "safetensors", "numpy"):
    try:
        print(p, m.version(p))
    except m.PackageNotFoundError:
        print(p, "not installed")'
} > "$work/machine.txt" 2>&1
head -n 12 "$work/machine.txt"


limit() { local l; l=$(($(left) - $2)); echo $((l < $1 ? l : $1)); }  # min(CAP, left - RESERVE)
pytests="${LEASE_PYTESTS:-tests/python/test_device.py tests/python/test_cli_device.py tests/python/test_doctor.py tests/python/test_safetensors_api.py tests/python/test_fastsafetensors_compat.py tests/python/test_remote.py tests/python/test_server_loading.py tests/python/test_transformers.py tests/python/test_crash_report.py tests/python/test_peer_model_proxy.py tests/python/test_offload.py}"
step wheel "$(limit 220 320)" STEP=wheel GPU_CHECK_WHEEL_PYTESTS="$pytests" \
  GPU_CHECK_PYTEST_ARGS="${LEASE_PYTEST_ARGS--n 8}" GPU_BENCH_ARGS="${GPU_BENCH_ARGS:---runs 1 --load-timeout 60}"
# A build that does not finish leaves nothing more to test.
step setup "$(limit 330 60)" STEP=setup || { cat "$work/summary.txt"; exit 1; }
step test "$(limit 100 150)" STEP=test \
  GPU_CHECK_CTEST_LABELS="${LEASE_CTEST_LABELS:-device|sparse|load|dist|remote}" GPU_CHECK_SANITIZE=none \
  GPU_CHECK_PYTESTS=none
step bench "$(limit 120 130)" STEP=bench GPU_BENCH_ARGS="--runs 1 --parts kernels,peer"
step disturbance "$(limit 45 120)" STEP=disturbance SEED_DISTURBANCE_ARGS="--seconds 3 --runs 2"
step handover "$(limit 45 110)" STEP=handover GPU_HANDOVER_ARGS="--runs 2"
step offload "$(limit 110 5)" STEP=offload SPARSE_BENCH_ARGS="${LEASE_SPARSE_ARGS:---gb 1 --runs 2}" \
  OFFLOAD_BENCH_ARGS="${LEASE_OFFLOAD_ARGS:---runs 2}"
step sanitize $(($(left) - 5)) STEP=test GPU_CHECK_CTEST_LABELS=none GPU_CHECK_PYTESTS=none \
  GPU_CHECK_SANITIZE="${LEASE_SANITIZE:-cuda_device_test load}"
cat "$work/summary.txt"
