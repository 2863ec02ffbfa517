"""The GPU benchmark of `make gpu-check` (issue 14): a checkpoint into GPU memory,
cold and warm, tensorlift with its defaults against the other loaders and the
machine's limits, and the device-side kernels against a device-to-device copy.

    python bench/gpu/gpu_bench.py --build build-gpu --device cuda:0 --out DIR [--gb 8] [--runs 3]

Loads: every contender runs in its own process (bench/gpu/contender.py),
timed from its first loader call to every tensor in device memory (device
synchronized); each round runs the contenders in a seeded shuffled order;
the figure is the median of --runs rounds. Cold: before each run every
shard is fsync'ed and evicted with posix_fadvise(DONTNEED). Warm: the shards
are read once before, and again if pages left the cache. Every contender's
checksum of the loaded bytes (computed on the device after the clock) must
equal tensorlift's, or the row says "WRONG BYTES".

Limits, in the same run: pinned host-to-device bandwidth (cudaMemcpyAsync
from pinned memory through tensorlift's device layer: tl_gpu_kernels_bench),
an O_DIRECT read of the same bytes (tl_limits read, cold; the best point of a
sweep of queue depth x block size, --limit-points), and the load limit
min(pinned H2D, O_DIRECT read) in seconds for the checkpoint's bytes.

Kernels (tl_gpu_kernels_bench): realignment and bf16->f16/f32 conversion
against a device-to-device memcpy, and the sparse decoder at 50 % density
against a memcpy of the dense bytes.

Writes DIR/results.json and DIR/results.md (the table docs/gpu.md shows).
With --device emulated (the dry run `make test` makes) only tensorlift runs,
on tensorlift's emulated device as a GPU's model (its memory faulted in when
it is opened, before the clock; copies at the H200's pinned H2D rate), and
the other rows say why they did not.
"""
import argparse
import datetime
import json
import os
import platform
import random
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench", "load"))
import gen_checkpoint  # noqa: E402
from load_bench import evict, read_through, tensor_ranges  # noqa: E402

CONTENDERS = ["tensorlift", "tensorlift_pinned", "st_load_file", "fastsafetensors_gds", "fastsafetensors_nogds",
              "instanttensor", "runai"]
MODULES = {"tensorlift": "tensorlift", "tensorlift_pinned": "tensorlift", "st_load_file": "safetensors",
           "fastsafetensors_gds": "fastsafetensors", "fastsafetensors_nogds": "fastsafetensors",
           "instanttensor": "instanttensor", "runai": "runai_model_streamer"}


def run_json(cmd, timeout=900, env=None):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return None, [f"no answer in {timeout} s"]
    if p.returncode != 0:
        return None, (p.stderr or p.stdout).strip().splitlines()[-1:] or [f"exit {p.returncode}"]
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line), None
    return None, ["no JSON on stdout"]


def gds_state(build):
    """(works, reason) from `tensorlift doctor --json`."""
    tool = os.path.join(build, "tensorlift")
    try:
        p = subprocess.run([tool, "doctor", "--json"], capture_output=True, text=True, timeout=60)
        doc = json.loads(p.stdout)
    except (OSError, ValueError, subprocess.TimeoutExpired) as e:
        return False, f"tensorlift doctor failed: {e}"
    g = doc.get("gds", {})
    if g.get("ready"):
        return True, g.get("library") or "ready"
    return False, g.get("library_reason") or g.get("driver_reason") or g.get("nvidia_fs_reason") or "not ready"


def available(name, device):
    if device == "emulated" and name != "tensorlift":
        return "needs a GPU (torch cannot use tensorlift's emulated device)"
    try:
        __import__(MODULES[name])
    except Exception as e:  # noqa: BLE001 - any import failure means "not installed here"
        return f"not installed ({type(e).__name__}: {e})"
    return None


def peer_pull(args, shards_dir):
    """A peer pull from device memory into device memory: `tensorlift serve --device DEV` in one process,
    `tensorlift fetch --device DEV --checksum` in another (--runs times), each pull's bytes checked against
    a disk load onto the device. Its figure is the pull's own time (the fetch's report: sessions, gets,
    checks, copies), set against a device-to-device copy (the kernels' d2d). UCX is the one
    TENSORLIFT_UCX_LIB names (a GPU's memory needs a CUDA build, docs/remote.md); the fetch says whether
    the pull landed straight in the device's memory or came through host memory."""
    import re
    import time
    cli = os.path.join(args.build, "tensorlift")
    dev = args.device if args.device.startswith("cuda") else "emulated:0"
    key = ["--model", "gpu-bench", "--revision", "r1"]
    ready = os.path.join(args.out, "peer-url")
    if os.path.exists(ready):
        os.remove(ready)
    out = {"device": dev, "ucx_lib": os.environ.get("TENSORLIFT_UCX_LIB", "libucp.so.0 (the system's)"), "runs": []}
    want = subprocess.run([cli, "load", shards_dir, "--device", dev, "--checksum", "--no-progress"],
                          capture_output=True, text=True, timeout=900)
    if want.returncode != 0:
        return {**out, "error": "disk load: " + want.stderr.strip()[-500:]}
    serve = subprocess.Popen([cli, "serve", shards_dir, *key, "--device", dev, "--ready-file", ready],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600
        while not os.path.exists(ready):
            if serve.poll() is not None:
                return {**out, "error": "serve: " + serve.stderr.read().strip()[-500:]}
            if time.monotonic() > deadline:
                return {**out, "error": "serve was not ready in 600 s"}
            time.sleep(0.05)
        url = open(ready).read().strip()
        for r in range(args.runs):
            p = subprocess.run([cli, "fetch", url, *key, "--device", dev, "--checksum"],
                               capture_output=True, text=True, timeout=900)
            m = re.search(r"fetched \d+ tensors, (\d+) bytes from .* in ([0-9.]+) s", p.stderr)
            if p.returncode != 0 or not m:
                out["runs"].append({"error": p.stderr.strip()[-500:]})
                continue
            out["runs"].append({"bytes": int(m.group(1)), "pull_s": float(m.group(2)),
                                "same_bytes": p.stdout == want.stdout,
                                "landing": "device" if f"into {dev}'s memory" in p.stderr else "host",
                                "transports": (re.findall(r"over UCX (\S+)", p.stderr) or [""])[0]})
            print(f"gpu-bench: peer pull {r + 1}/{args.runs}: {out['runs'][-1]}", flush=True)
    finally:
        serve.terminate()
        try:
            serve.wait(timeout=60)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.wait()
    return out


def measure(args):
    shards_dir = gen_checkpoint.checkpoint_dir(args.gb, args.shards)
    shards = gen_checkpoint.shard_paths(shards_dir)
    ckpt_bytes = sum(os.path.getsize(p) for p in shards)
    data = {"date": datetime.date.today().isoformat(), "device": args.device, "host": platform.node(),
            "checkpoint": {"dir": shards_dir, "shards": len(shards), "bytes": ckpt_bytes}, "runs": args.runs,
            "loads": {}, "skipped": {}, "limits": {}, "kernels": None}
    if args.device.startswith("cuda"):
        import torch
        data["gpu"] = torch.cuda.get_device_name(int(args.device.split(":")[1]))
        data["torch"] = torch.__version__
    else:
        data["gpu"] = "emulated device (tensorlift's, on the CPU)"
    data["gds"] = dict(zip(("works", "reason"), gds_state(args.build)))

    # Kernels and the pinned H2D limit: one process, the device layer's own calls.
    kb = os.path.join(args.build, "tl_gpu_kernels_bench")
    kcmd = [kb, "--device", args.device if args.device.startswith("cuda") else "emulated"]
    if args.kernel_mib:
        kcmd += ["--mib", str(args.kernel_mib)]
    kernels, err = run_json(kcmd)
    data["kernels"] = kernels if kernels else {"error": err}
    save(args, data)

    # O_DIRECT read of the same bytes, cold (tl_limits, as the host load bench does).
    ranges_file = os.path.join(args.out, "ranges.txt")
    with open(ranges_file, "w") as f:
        for path, ranges in tensor_ranges(shards):
            f.write(f"file {path}\n")
            for off, n in ranges:
                f.write(f"range {off} {n}\n")
    # A sweep of queue depth x block size; the limit is its best point.
    sweep = {}
    for point in args.limit_points.split(","):
        depth, mib = point.split("x")
        evict(shards)
        res, err = run_json([os.path.join(args.build, "tl_limits"), "read", ranges_file, "--queue-depth", depth,
                             "--block-mib", mib, "--prefault", "1"])
        sweep[point] = res if res else {"error": err}
        print(f"gpu-bench: O_DIRECT read, queue depth {depth} x {mib} MiB: "
              + (f"{res['read_s']:.3f} s" if res else f"failed: {err}"), flush=True)
    data["limits"]["odirect_sweep"] = sweep
    ok = {p: r for p, r in sweep.items() if r.get("read_s")}
    best = min(ok, key=lambda p: ok[p]["read_s"]) if ok else None
    data["limits"]["odirect_read"] = dict(ok[best], point=best) if best else {"error": "every point failed"}
    save(args, data)

    contenders = [c for c in (args.contenders.split(",") if args.contenders else CONTENDERS) if c]
    runnable = []
    for c in contenders:
        why = available(c, args.device)
        if why:
            data["skipped"][c] = why
        else:
            runnable.append(c)
    # The emulated device as a GPU's model: its memory faulted in when it is opened, before the clock
    # (contender.py), and host-to-device copies at the H200's pinned rate (its default).
    contender_env = dict(os.environ)
    if not args.device.startswith("cuda"):
        contender_env["TENSORLIFT_EMULATED_PREFAULT_GB"] = f"{ckpt_bytes / 1e9 * 1.05 + 0.2:.3f}"
        data["emulated_model"] = {k: contender_env.get(k, "default") for k in (
            "TENSORLIFT_EMULATED_PREFAULT_GB", "TENSORLIFT_EMULATED_H2D_GBPS", "TENSORLIFT_EMULATED_COPY_LATENCY_US")}
    rng = random.Random(14)
    for state in args.states.split(","):
        if state == "warm":
            read_through(shards)
        for r in range(args.runs):
            order = runnable[:]
            rng.shuffle(order)
            for c in order:
                if state == "cold":
                    evict(shards)
                elif state == "warm":
                    read_through(shards)
                res, err = run_json([sys.executable, os.path.join(HERE, "contender.py"), c, args.device] + shards,
                                    timeout=args.load_timeout, env=contender_env)
                data["loads"].setdefault(c, {}).setdefault(state, []).append(res if res else {"error": err})
                print(f"gpu-bench: {state} run {r + 1}/{args.runs} {c}: "
                      + (f"{res['load_s']:.3f} s" if res else f"failed: {err}"), flush=True)
                save(args, data)

    # Last: the pull needs UCX with CUDA, the loads above need nothing more.
    data["peer_pull"] = peer_pull(args, shards_dir)
    save(args, data)
    return data


def median_s(runs):
    ok = [r["load_s"] for r in runs if "load_s" in r]
    return statistics.median(ok) if ok else None


def summarize(data):
    ckpt = data["checkpoint"]["bytes"]
    k = data.get("kernels") or {}
    ops = k.get("ops", {}) if isinstance(k, dict) else {}
    h2d = ops.get("h2d_pinned", {}).get("gbps_out")
    od = data["limits"].get("odirect_read", {})
    # The device alone: O_DIRECT reads into memory faulted in before the clock
    # (a GPU load reads into reused pinned staging, never into fresh memory).
    od_gbps = od["bytes_read"] / od["read_s"] / 1e9 if isinstance(od, dict) and od.get("read_s") else None
    limit_gbps = min(x for x in (h2d, od_gbps) if x) if (h2d or od_gbps) else None
    ref = data["loads"].get("tensorlift", {})
    ref_sum = {s: next((r.get("checksum") for r in runs if "checksum" in r), None) for s, runs in ref.items()}
    lines = [f"GPU benchmark, {data['date']}: {data['gpu']}, device {data['device']}, "
             f"{ckpt / 1e9:.2f} GB in {data['checkpoint']['shards']} shards, medians of {data['runs']} runs",
             "", f"GDS: {'works' if data['gds']['works'] else 'unavailable'} ({data['gds']['reason']})", "",
             "| contender | cold s | cold GB/s | cold vs limit | warm s | warm GB/s | warm vs limit | peak RSS GiB |",
             "|---|---|---|---|---|---|---|---|"]
    rows = {}
    for c, states in data["loads"].items():
        cells = []
        rss = []
        bad = []
        for s in ("cold", "warm"):
            runs = states.get(s, [])
            m = median_s(runs)
            rss += [r.get("peak_rss_bytes", 0) for r in runs if "load_s" in r]
            if any("error" in r for r in runs):
                bad.append(f"{s}: " + " ".join(next(r["error"] for r in runs if "error" in r)))
            sums = {r.get("checksum") for r in runs if "checksum" in r}
            if ref_sum.get(s) and sums and sums != {ref_sum[s]}:
                bad.append(f"{s}: WRONG BYTES")
            gbps = ckpt / m / 1e9 if m else None
            rows.setdefault(c, {})[s] = {"median_s": m, "gbps": gbps,
                                         "vs_limit": gbps / limit_gbps if gbps and limit_gbps else None}
            cells += [f"{m:.3f}" if m else "–", f"{gbps:.2f}" if gbps else "–",
                      f"{gbps / limit_gbps:.2f}x" if gbps and limit_gbps else "–"]
        note = f" ({'; '.join(bad)})" if bad else ""
        rss_cell = f"{max(rss) / 2**30:.2f}" if rss else "–"
        lines.append(f"| {c}{note} | " + " | ".join(cells) + f" | {rss_cell} |")
    for c, why in data["skipped"].items():
        lines.append(f"| {c} | not run: {why} |||||||")
    lines += ["", "| limit | GB/s | seconds for the checkpoint |", "|---|---|---|"]
    best = od.get("point", "32x8") if isinstance(od, dict) else "32x8"
    for name, g in (("pinned H2D (cudaMemcpyAsync)", h2d),
                    (f"O_DIRECT read, cold (best of the sweep: queue depth {best.replace('x', ' x ')} MiB)", od_gbps),
                    ("load limit = min of the two", limit_gbps)):
        lines.append(f"| {name} | {g:.2f} | {ckpt / g / 1e9:.3f} |" if g else f"| {name} | – | – |")
    sweep = data["limits"].get("odirect_sweep") or {}
    if sweep:
        lines += ["", "O_DIRECT sweep (cold, s): " + ", ".join(
            f"{p}: {r['read_s']:.3f}" if r.get("read_s") else f"{p}: failed" for p, r in sweep.items())]
    if data.get("emulated_model"):
        lines += ["", "The emulated device as a GPU's model: " + ", ".join(
            f"{k}={v}" for k, v in data["emulated_model"].items())]
    lines += peer_lines(data.get("peer_pull") or {}, ops.get("d2d", {}).get("gbps_out"))
    if ops:
        lines += ["", "| kernel | GB/s moved | GB/s out | vs d2d |", "|---|---|---|---|"]
        for name, o in ops.items():
            lines.append(f"| {name} | {o['gbps_moved']:.2f} | {o['gbps_out']:.2f} | {o['vs_d2d']:.2f}x |")
    elif k.get("error"):
        lines += ["", f"kernels: failed: {' '.join(k['error'])}"]
    data["summary"] = {"limit_gbps": limit_gbps, "h2d_gbps": h2d, "odirect_gbps": od_gbps, "rows": rows}
    return "\n".join(lines) + "\n"


def peer_lines(peer, d2d_gbps):
    """The peer pull's table: the median pull against a device-to-device copy."""
    runs = [r for r in peer.get("runs", []) if "pull_s" in r]
    if peer.get("error") or not runs:
        why = peer.get("error") or "; ".join(r.get("error", "") for r in peer.get("runs", [])) or "no run"
        return ["", f"Peer pull, device memory to device memory: failed: {why}"]
    m = statistics.median(r["pull_s"] for r in runs)
    gbps = runs[0]["bytes"] / m / 1e9
    same = "yes" if all(r["same_bytes"] for r in runs) else "NO: WRONG BYTES"
    landing = ", ".join(sorted({r["landing"] for r in runs}))
    vs = f"{gbps / d2d_gbps:.3f}x" if d2d_gbps else "–"
    return ["", f"Peer pull, {peer['device']} to {peer['device']} in another process (UCX: {peer['ucx_lib']}; "
            f"transports {runs[0]['transports'] or '?'}), median of {len(runs)}:", "",
            "| bytes | pull s | GB/s | vs d2d copy | landed in | same bytes as a disk load |",
            "|---|---|---|---|---|---|",
            f"| {runs[0]['bytes']} | {m:.3f} | {gbps:.2f} | {vs} | {landing} memory | {same} |"]


def save(args, data):
    """Writes results.json and results.md as they stand, so that a run cut short (a lease's
    time limit) leaves what it measured; the last call, at the end, writes the whole."""
    md = summarize(data)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(data, f, indent=1)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(md)
    return md


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", required=True, help="build directory with tensorlift, tl_gpu_kernels_bench, tl_limits")
    ap.add_argument("--device", default="cuda:0", help="cuda:N, or emulated (dry run)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "out", "gpu"))
    ap.add_argument("--gb", type=float, default=8.0, help="checkpoint size in GB (at least 8 for the report)")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--states", default="cold,warm")
    ap.add_argument("--contenders", default="", help="comma-separated subset of " + ",".join(CONTENDERS))
    ap.add_argument("--load-timeout", type=int, default=300, help="seconds a contender's load may take")
    ap.add_argument("--kernel-mib", type=int, default=0, help="kernel buffer size (default: the bench's own)")
    ap.add_argument("--limit-points", default="32x8,8x16,32x16,16x4",
                    help="the O_DIRECT sweep: comma-separated QUEUE_DEPTHxBLOCK_MIB points; the limit is the best")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    data = measure(args)
    save(args, data)
    failed = [c for c, states in data["loads"].items() if any("error" in r for runs in states.values() for r in runs)]
    if "tensorlift" in failed:
        print("gpu-bench: tensorlift's own load failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
