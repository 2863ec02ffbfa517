"""Same-device handover of GPU memory (issue 43): a seed process holds a checkpoint on a device
(`tensorlift serve --device DEV --resident`), and a client process on the same device takes it:

  map    the seed's allocations opened in the client (CUDA IPC; the emulated device's memfds):
         no byte copied (target: usable tensors within 0.1 s for 8 GB on one GPU).
  copy   the same, then copied once device to device into the client's own memory
         (`fetch --copy-on-write`), the seed's let go.
  ucx    (--ucx) the same seed pulled over UCX (`--handover off`), for scale.

    python3 bench/remote/gpu_handover_bench.py --build build --device cuda:0 --gb 8
    python3 bench/remote/gpu_handover_bench.py --build build --device emulated:0 --gb 0.25

Each run is a fresh `tensorlift fetch` process; "to usable tensors" is the time LoadFromPeer
reports (finding the seed, the session, the handover, the tensors built; on a GPU also the CUDA
context's creation, ~0.1-0.3 s, which a serving process has already paid), the process's wall time
beside it. On a GPU, with --python (default: this interpreter when it imports torch and
tensorlift), each path is also timed in a fresh Python process whose CUDA context exists
(torch.cuda.init first): tensorlift.remote.load_from_peer to torch tensors on the GPU, synchronized,
which is the restart the target is about. Standard library only: the checkpoint is written here (a few
256 MiB tensors in /dev/shm when it has room, else /tmp). Writes --out (JSON) and prints a table;
the numbers of an emulated device are labelled so (its memory is host memory).
"""
import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time


def write_checkpoint(path, nbytes, tensor_bytes=256 << 20):
    """A safetensors file of U8 tensors "w.NNN" (tensor_bytes each, the last shorter)."""
    sizes = []
    left = nbytes
    while left > 0:
        sizes.append(min(tensor_bytes, left))
        left -= sizes[-1]
    header, offset = {}, 0
    for i, n in enumerate(sizes):
        header[f"w.{i:03d}"] = {"dtype": "U8", "shape": [n], "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    block = bytes(range(256)) * (4 << 12)  # 4 MiB of a repeating pattern.
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for n in sizes:
            while n > 0:
                k = min(n, len(block))
                f.write(block[:k])
                n -= k
    return len(sizes)


def start_seed(build, path, model, device, env, timeout):
    ready = tempfile.mktemp(prefix="tl_gpu_handover_")
    cmd = [os.path.join(build, "tensorlift"), "serve", path, "--model", model, "--revision", "1",
           "--device", device, "--resident", "--ready-file", ready]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    t0 = time.perf_counter()
    while not os.path.exists(ready):
        if proc.poll() is not None:
            raise RuntimeError(f"serve exited: {proc.stderr.read().decode()[-2000:]}")
        if time.perf_counter() - t0 > timeout:
            proc.kill()
            raise RuntimeError(f"serve did not start within {timeout} s")
        time.sleep(0.05)
    os.unlink(ready)
    return proc, time.perf_counter() - t0


def fetch(build, model, device, how, env):
    cmd = [os.path.join(build, "tensorlift"), "fetch", "--model", model, "--revision", "1",
           "--device", device, "--timeout-ms", "120000"]
    cmd += {"map": [], "copy": ["--copy-on-write"], "ucx": ["--handover", "off"]}[how]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    wall = time.perf_counter() - t0
    m = re.search(r"fetched \d+ tensors, (\d+) bytes from (\S+) \(.*\) in ([0-9.]+) s", r.stdout)
    if r.returncode != 0 or not m:
        raise RuntimeError(f"fetch {how} failed: {r.stdout[-2000:]}{r.stderr[-2000:]}")
    handed = "handed over" in r.stdout
    if handed != (how != "ucx"):
        raise RuntimeError(f"fetch {how}: handed over = {handed}: {r.stdout[-1000:]}{r.stderr[-1000:]}")
    return {"seconds": float(m.group(3)), "wall": wall, "bytes": int(m.group(1))}


PY_CLIENT = r"""
import json, sys, time
import torch
import tensorlift.remote as remote
model, device, how = sys.argv[1:4]
torch.zeros(1, device=device)  # The CUDA context, as a serving process has it.
torch.cuda.synchronize()
t0 = time.perf_counter()
got = remote.load_from_peer(model=model, revision="1", device=device,
                            handover="off" if how == "ucx" else "auto",
                            handover_copy_on_write=how == "copy")
torch.cuda.synchronize()
ready = time.perf_counter() - t0
report = remote.last_report()
print(json.dumps({"ready_s": ready, "handover": bool(report.get("handover")),
                  "bytes": sum(t.numel() * t.element_size() for t in got.values()),
                  "device": str(next(iter(got.values())).device)}))
"""


def py_fetch(python, model, device, how, env):
    r = subprocess.run([python, "-c", PY_CLIENT, model, device, how], capture_output=True, text=True,
                       env=env, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"python client {how} failed: {r.stderr[-2000:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    if out["handover"] != (how != "ucx"):
        raise RuntimeError(f"python client {how}: handover = {out['handover']}")
    return out


def python_with_torch(python):
    r = subprocess.run([python, "-c", "import torch, tensorlift.remote; assert torch.cuda.is_available()"],
                       capture_output=True, timeout=120)
    return r.returncode == 0


def summary(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "runs": values}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--device", default="emulated:0", help="cuda:N or emulated:0")
    ap.add_argument("--gb", type=float, default=0.25)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--ucx", action="store_true", help="also pull over UCX, for scale")
    ap.add_argument("--seed-timeout", type=float, default=180)
    ap.add_argument("--python", default=None,
                    help="interpreter for the warm-process client (cuda only; default: this one when it "
                         "imports torch and tensorlift; 'none' to skip)")
    ap.add_argument("--out", default=os.path.join("bench", "out", "gpu_handover.json"))
    args = ap.parse_args()
    nbytes = int(args.gb * 1e9)
    parent = "/dev/shm" if shutil.disk_usage("/dev/shm").free > 2 * nbytes else tempfile.gettempdir()
    work = tempfile.mkdtemp(prefix="tl_gpu_handover_", dir=parent)
    path = os.path.join(work, "model.safetensors")
    env = dict(os.environ, UCX_TLS=os.environ.get("UCX_TLS", "sm,self"))
    model = f"gpu-handover-bench-{os.getpid()}"
    label = "emulated" if args.device.startswith("emulated") else args.device
    results = {"device": args.device, "label": label, "gb": args.gb, "paths": {}}
    seed = None
    try:
        t0 = time.perf_counter()
        results["tensors"] = write_checkpoint(path, nbytes)
        results["write_s"] = time.perf_counter() - t0
        seed, results["seed_start_s"] = start_seed(args.build, path, model, args.device, env,
                                                   args.seed_timeout)
        hows = ["map", "copy"] + (["ucx"] if args.ucx else [])
        rows = {h: [] for h in hows}
        python = args.python or sys.executable
        use_python = (args.device.startswith("cuda") and python != "none"
                      and python_with_torch(python))
        py_rows = {h: [] for h in hows}
        for _ in range(args.runs):
            for how in hows:  # Interleaved: each path once a round.
                rows[how].append(fetch(args.build, model, args.device, how, env))
                # Kept as it goes: a run cut short still has what was measured.
                results["paths"][how] = {
                    "ready_s": summary([r["seconds"] for r in rows[how]]),
                    "process_s": summary([r["wall"] for r in rows[how]]),
                    "bytes": rows[how][-1]["bytes"]}
                if use_python:
                    py_rows[how].append(py_fetch(python, model, args.device, how, env))
                    results["paths"][how]["warm_process_ready_s"] = summary(
                        [r["ready_s"] for r in py_rows[how]])
                os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
                with open(args.out, "w") as f:
                    json.dump(results, f, indent=1)
    finally:
        if seed is not None:
            seed.send_signal(signal.SIGTERM)
            try:
                seed.wait(timeout=60)
            except subprocess.TimeoutExpired:
                seed.kill()
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n## Same-device handover ({label}), {nbytes / 1e9:.2f} GB in {results['tensors']} tensors, "
          f"medians of {args.runs} (min-max); seed started in {results['seed_start_s']:.2f} s\n")
    print("| path | to usable tensors (fetch) | GB/s | fetch process | warm Python process |")
    print("|---|---|---|---|---|")
    for how, p in results["paths"].items():
        r, w = p["ready_s"], p["process_s"]
        warm = p.get("warm_process_ready_s")
        print(f"| {how} ({label}) | {r['median']:.4f} s ({r['min']:.4f}-{r['max']:.4f}) | "
              f"{p['bytes'] / max(r['median'], 1e-9) / 1e9:.1f} | {w['median']:.3f} s | "
              f"{'%.4f s' % warm['median'] if warm else '-'} |")
    if "map" in results["paths"] and nbytes >= 4e9:
        p = results["paths"]["map"]
        best = p.get("warm_process_ready_s", p["ready_s"])["median"]
        print(f"\ntarget (map <= 0.1 s to usable tensors): {'met' if best <= 0.1 else 'NOT met'} ({best:.4f} s)")


if __name__ == "__main__":
    sys.exit(main())
