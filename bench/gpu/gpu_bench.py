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

Sparse (--parts sparse, issue 44; not in the default parts): the checkpoint
pruned 50 % (`tensorlift sparsify --prune magnitude:0.5`, cached beside it as
bench/sparse/load_bench.py caches it) and the same tensors stored dense,
each loaded into device memory by tensorlift.load in a process of its own,
cold and warm, --runs rounds; medians (min–max), the ratio dense time over
sparse time (target cold 1.6x), and whether both gave the same tensors.

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
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench", "load"))
import gen_checkpoint  # noqa: E402
from load_bench import evict, read_through, tensor_ranges  # noqa: E402

LIMIT = "the limit"  # A round's read of the limit's best point, among the contenders.
CONTENDERS = ["tensorlift", "tensorlift_pinned", "st_load_file", "fastsafetensors_gds", "fastsafetensors_nogds",
              "instanttensor", "runai", "tensorlift_scheduling"]
MODULES = {"tensorlift": "tensorlift", "tensorlift_pinned": "tensorlift", "tensorlift_scheduling": "tensorlift",
           "st_load_file": "safetensors",
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
    if device == "emulated" and name not in ("tensorlift", "tensorlift_scheduling"):
        return "needs a GPU (torch cannot use tensorlift's emulated device)"
    if device != "emulated" and name == "tensorlift_scheduling":
        return "a diagnostic of the emulated device"
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
            # Over UCX: a same-device seed would hand its allocations over instead
            # (bench/remote/gpu_handover_bench.py measures that).
            p = subprocess.run([cli, "fetch", url, *key, "--device", dev, "--checksum", "--handover", "off"],
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


def torch_h2d(device, mib=1024, reps=5):
    """Pinned host to device copies of `mib` MiB through torch (non_blocking from pinned memory,
    one stream): the best of `reps`, in GB/s."""
    import torch
    src = torch.empty(mib << 20, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(mib << 20, dtype=torch.uint8, device=device)
    best = None
    for _ in range(reps):
        torch.cuda.synchronize(device)
        t = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize(device)
        s = time.perf_counter() - t
        best = s if best is None else min(best, s)
    return {"gbps": src.numel() / best / 1e9, "bytes": src.numel(), "reps": reps}


def sparse_checkpoints(args, shards_dir):
    """The load checkpoint pruned 50 % (`tensorlift sparsify --prune magnitude:0.5`) and the very same
    tensors stored dense (tl_sparse_densify, or tensorlift.load and safetensors where the build has no
    tl_sparse_densify), cached next to it as bench/sparse/load_bench.py caches them (the same names)."""
    sparse_dir = shards_dir.rstrip("/") + "-pruned50-sparse"
    dense_dir = shards_dir.rstrip("/") + "-pruned50-dense"
    if not os.path.exists(os.path.join(sparse_dir, ".complete")):
        subprocess.run(["rm", "-rf", sparse_dir, dense_dir], check=True)
        subprocess.run([os.path.join(args.build, "tensorlift"), "sparsify", shards_dir, sparse_dir,
                        "--prune", "magnitude:0.5", "--max-shard-size", "1GB"], check=True, stdout=subprocess.DEVNULL)
        open(os.path.join(sparse_dir, ".complete"), "w").close()
    if not os.path.exists(os.path.join(dense_dir, ".complete")):
        subprocess.run(["rm", "-rf", dense_dir], check=True)
        densify = os.path.join(args.build, "tl_sparse_densify")
        if os.path.exists(densify):
            subprocess.run([densify, sparse_dir, dense_dir], check=True, stdout=subprocess.DEVNULL)
        else:
            import tensorlift
            from safetensors.torch import save_file
            os.makedirs(dense_dir)
            tensors = tensorlift.load(sparse_dir)
            names = sorted(tensors)
            shard, size, k = {}, 0, 1
            for i, name in enumerate(names):  # about 1 GiB a shard, in name order (as tl_sparse_densify)
                shard[name] = tensors[name].contiguous()
                size += shard[name].numel() * shard[name].element_size()
                if size >= 1 << 30 or i == len(names) - 1:
                    save_file(shard, os.path.join(dense_dir, f"dense-{k:05d}.safetensors"))
                    shard, size, k = {}, 0, k + 1
        for f in shard_files(dense_dir):
            fd = os.open(f, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        open(os.path.join(dense_dir, ".complete"), "w").close()
    return sparse_dir, dense_dir


def shard_files(d):
    return sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".safetensors"))


def sparse_loads(args, shards_dir):
    """The sparse part: a 50 %-pruned checkpoint stored sparse against the same tensors stored dense,
    each loaded into device memory by tensorlift.load(files, device) in a process of its own
    (contender.py's "tensorlift"), cold (every file of both evicted) and warm (both read through),
    --runs rounds alternating which goes first. Both must give the same tensors (checksums on the
    device); the figure is the dense load's median time over the sparse one's (target cold 1.6x)."""
    sparse_dir, dense_dir = sparse_checkpoints(args, shards_dir)
    files = {"sparse": shard_files(sparse_dir), "dense": shard_files(dense_dir)}
    everything = files["sparse"] + files["dense"]
    out = {"sparse_dir": sparse_dir, "dense_dir": dense_dir, "target_cold": 1.6,
           "file_bytes": {k: sum(os.path.getsize(f) for f in fs) for k, fs in files.items()}, "loads": {}}
    env = dict(os.environ)
    if not args.device.startswith("cuda"):
        env["TENSORLIFT_EMULATED_PREFAULT_GB"] = f"{out['file_bytes']['dense'] / 1e9 * 1.05 + 0.2:.3f}"
    for state in args.states.split(","):
        for r in range(args.runs):
            for kind in (("sparse", "dense") if r % 2 == 0 else ("dense", "sparse")):
                if state == "cold":
                    evict(everything)
                else:
                    read_through(everything)
                res, err = run_json([sys.executable, os.path.join(HERE, "contender.py"), "tensorlift", args.device]
                                    + files[kind], timeout=args.load_timeout, env=env)
                out["loads"].setdefault(kind, {}).setdefault(state, []).append(res if res else {"error": err})
                print(f"gpu-bench: sparse part, {state} run {r + 1}/{args.runs} {kind}: "
                      + (f"{res['load_s']:.3f} s" if res else f"failed: {err}"), flush=True)
                yield out


def sparse_lines(sp):
    """The sparse part's table: medians (min–max), GB/s of dense tensor bytes, the same tensors, the ratio."""
    lines = ["", f"Sparse checkpoint (50 % pruned, {sp['file_bytes']['sparse'] / 1e9:.2f} GB of files) against the "
             f"same tensors dense ({sp['file_bytes']['dense'] / 1e9:.2f} GB), tensorlift.load into device memory, "
             "medians (min–max):", "",
             "| checkpoint | cold s | warm s | GB/s of tensors, cold | same tensors as the other |",
             "|---|---|---|---|---|"]
    loads = sp["loads"]
    ok = {(k, s): sorted(r["load_s"] for r in loads.get(k, {}).get(s, []) if "load_s" in r)
          for k in ("sparse", "dense") for s in ("cold", "warm")}
    medians = {key: statistics.median(v) if v else None for key, v in ok.items()}
    sums = {r.get("checksum") for states in loads.values() for runs in states.values() for r in runs if "checksum" in r}
    same = "n/a (emulated)" if any(str(c).startswith("n/a") for c in sums) else (
        "yes" if len(sums) == 1 else "**NO: WRONG BYTES**" if sums else "–")
    sp["same_tensors"] = same
    for kind in ("sparse", "dense"):
        cells = []
        for state in ("cold", "warm"):
            v, m = ok[(kind, state)], medians[(kind, state)]
            cells.append(f"{m:.3f} ({v[0]:.3f}–{v[-1]:.3f})" if m and len(v) > 1 else f"{m:.3f}" if m else "–")
        nbytes = next((r["bytes"] for runs in loads.get(kind, {}).values() for r in runs if "bytes" in r), None)
        cold = medians[(kind, "cold")]
        gbps = f"{nbytes / cold / 1e9:.2f}" if nbytes and cold else "–"
        errors = [" ".join(r["error"]) for runs in loads.get(kind, {}).values() for r in runs if "error" in r]
        note = f" (failed: {errors[0]})" if errors else ""
        lines.append(f"| {kind}{note} | {cells[0]} | {cells[1]} | {gbps} | {same} |")
    ratios = {}
    for state in ("cold", "warm"):
        s_, d = medians[("sparse", state)], medians[("dense", state)]
        ratios[state] = d / s_ if s_ and d else None
    sp["ratio_dense_over_sparse"] = ratios
    target = (f" (target cold {sp['target_cold']}x: {'met' if ratios['cold'] >= sp['target_cold'] else 'NOT met'})"
              if ratios["cold"] else "")
    lines += ["", "sparse vs dense (dense time / sparse time): " + ", ".join(
        f"{state} {r:.2f}x" if r else f"{state} –" for state, r in ratios.items()) + target]
    return lines


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

    if args.emulated_h2d_gbps is not None and not args.device.startswith("cuda"):
        # The kernels' H2D row and every contender's copies at this rate.
        os.environ["TENSORLIFT_EMULATED_H2D_GBPS"] = str(args.emulated_h2d_gbps)
    # Kernels and the pinned H2D limit: one process, the device layer's own calls.
    parts = set(args.parts.split(","))
    if "kernels" in parts:
        kb = os.path.join(args.build, "tl_gpu_kernels_bench")
        kcmd = [kb, "--device", args.device if args.device.startswith("cuda") else "emulated"]
        if args.kernel_mib:
            kcmd += ["--mib", str(args.kernel_mib)]
        kernels, err = run_json(kcmd)
        data["kernels"] = kernels if kernels else {"error": err}
        save(args, data)
    elif args.device.startswith("cuda"):
        # Without the kernels bench (a lease's first step, from the wheel): the pinned H2D limit
        # through torch's own copy, so that the warm limit is there from the start.
        data["h2d_torch"] = torch_h2d(args.device)
        save(args, data)
    if "sparse" in parts:
        for sparse in sparse_loads(args, shards_dir):
            data["sparse"] = sparse
            save(args, data)
    if "loads" not in parts:
        if "peer" in parts:
            data["peer_pull"] = peer_pull(args, shards_dir)
            save(args, data)
        return data

    # O_DIRECT read of the same bytes, cold (tl_limits, as the host load bench does).
    ranges_file = os.path.join(args.out, "ranges.txt")
    with open(ranges_file, "w") as f:
        for path, ranges in tensor_ranges(shards):
            f.write(f"file {path}\n")
            for off, n in ranges:
                f.write(f"range {off} {n}\n")
    # A sweep of queue depth x block size; the limit is its best point (cold: O_DIRECT into memory
    # faulted in before the clock; warm: buffered preads on that many threads out of the page cache).
    def limit_read(point, buffered):
        depth, block = point.split("x")
        size = ["--block-kib", block[:-1]] if block.endswith("k") else ["--block-mib", block]
        if buffered:
            read_through(shards)
        else:
            evict(shards)
        return run_json([os.path.join(args.build, "tl_limits"), "read", ranges_file, "--queue-depth", depth,
                         *size, "--prefault", "1", "--buffered", "1" if buffered else "0"])

    for key, points, buffered in (("odirect", args.limit_points, False),
                                  ("buffered", args.warm_limit_points, True)):
        if ("warm" if key == "buffered" else "cold") not in args.states.split(","):
            continue
        sweep = {}
        for point in points.split(","):
            res, err = limit_read(point, buffered)
            sweep[point] = res if res else {"error": err}
            what = "page cache read on N threads" if buffered else "O_DIRECT read, queue depth"
            print(f"gpu-bench: {what} {point.replace('x', ' x ')}: "
                  + (f"{res['read_s']:.3f} s" if res else f"failed: {err}"), flush=True)
        data["limits"][f"{key}_sweep"] = sweep
        ok = {p: r for p, r in sweep.items() if r.get("read_s")}
        best = min(ok, key=lambda p: ok[p]["read_s"]) if ok else None
        data["limits"][f"{key}_read"] = dict(ok[best], point=best) if best else {"error": "every point failed"}
        save(args, data)

    contenders = [c for c in (args.contenders.split(",") if args.contenders else CONTENDERS) if c]
    runnable = []
    for c in contenders:
        why = available(c, args.device)
        if why and c == "tensorlift_scheduling" and not args.contenders:
            continue  # The emulated device's diagnostic: no row on a GPU unless asked for.
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
        # Each round reads the limit's best point again among the contenders: a disk (a VM's
        # above all) drifts, and the ratios compare runs of the same minutes.
        key = "odirect" if state == "cold" else "buffered"
        best = data["limits"].get(f"{key}_read", {}).get("point")
        for r in range(args.runs):
            order = runnable[:] + ([LIMIT] if best else [])
            rng.shuffle(order)
            for c in order:
                if c == LIMIT:
                    res, err = limit_read(best, state != "cold")
                    data["limits"].setdefault(f"{key}_rounds", []).append(res if res else {"error": err})
                    print(f"gpu-bench: {state} run {r + 1}/{args.runs} the limit ({best}): "
                          + (f"{res['read_s']:.3f} s" if res else f"failed: {err}"), flush=True)
                    continue
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
    if "peer" in parts:
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
    h2d = ops.get("h2d_pinned", {}).get("gbps_out") or (data.get("h2d_torch") or {}).get("gbps")
    limits = data["limits"]

    def read_limit(key):
        """The sweep's best point, then the median (min, max) of its reads in the rounds, in GB/s."""
        best = limits.get(f"{key}_read", {})
        runs = [r for r in limits.get(f"{key}_rounds", []) if r.get("read_s")] or ([best] if best.get("read_s") else [])
        if not runs:
            return None, None, None
        rates = sorted(r["bytes_read"] / r["read_s"] / 1e9 for r in runs)
        return statistics.median(rates), rates[0], rates[-1]

    # The device alone: reads into memory faulted in before the clock (a GPU load reads into
    # reused pinned staging, never into fresh memory).
    od_gbps, od_lo, od_hi = read_limit("odirect")
    pc_gbps, pc_lo, pc_hi = read_limit("buffered")
    limit_gbps = min(x for x in (h2d, od_gbps) if x) if (h2d or od_gbps) else None
    warm_limit_gbps = min(x for x in (h2d, pc_gbps) if x) if (h2d or pc_gbps) else None
    limit_for = {"cold": limit_gbps, "warm": warm_limit_gbps}
    od = limits.get("odirect_read", {})
    pc = limits.get("buffered_read", {})
    ref = data["loads"].get("tensorlift", {})
    ref_sum = {s: next((r.get("checksum") for r in runs if "checksum" in r), None) for s, runs in ref.items()}
    lines = [f"GPU benchmark, {data['date']}: {data['gpu']}, device {data['device']}, "
             f"{ckpt / 1e9:.2f} GB in {data['checkpoint']['shards']} shards, medians of {data['runs']} runs",
             "", f"GDS: {'works' if data['gds']['works'] else 'unavailable'} ({data['gds']['reason']})"]
    if data["loads"] or data["skipped"]:  # Not measured: --parts without loads.
        lines += ["", "| contender | cold s | cold GB/s | cold vs limit | warm s | warm GB/s | warm vs limit | "
                  "peak RSS GiB |", "|---|---|---|---|---|---|---|---|"]
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
            lim = limit_for[s]
            rows.setdefault(c, {})[s] = {"median_s": m, "gbps": gbps, "vs_limit": gbps / lim if gbps and lim else None}
            ok = sorted(r["load_s"] for r in runs if "load_s" in r)
            spread = f" ({ok[0]:.3f}–{ok[-1]:.3f})" if len(ok) > 1 else ""
            cells += [f"{m:.3f}{spread}" if m else "–", f"{gbps:.2f}" if gbps else "–",
                      f"{gbps / lim:.2f}x" if gbps and lim else "–"]
        note = f" ({'; '.join(bad)})" if bad else ""
        rss_cell = f"{max(rss) / 2**30:.2f}" if rss else "–"
        lines.append(f"| {c}{note} | " + " | ".join(cells) + f" | {rss_cell} |")
    for c, why in data["skipped"].items():
        lines.append(f"| {c} | not run: {why} |||||||")
    if h2d or od_gbps or pc_gbps:  # Not measured: --parts sparse alone on the emulated device.
        lines += ["", "| limit | GB/s, median (min–max) of the rounds | seconds for the checkpoint |",
                  "|---|---|---|"]

    def spread(g, lo, hi):
        return f"{g:.2f} ({lo:.2f}–{hi:.2f})" if lo is not None and hi is not None and lo != hi else f"{g:.2f}"

    for name, g, lo, hi in (
            ("pinned H2D (torch's copy_, 1 GiB, best of 5)" if not ops.get("h2d_pinned") and data.get("h2d_torch")
             else "pinned H2D (cudaMemcpyAsync)",
             h2d, None, None),
            (f"O_DIRECT read, cold (best of the sweep: {od.get('point', '?').replace('x', ' x ')})", od_gbps, od_lo, od_hi),
            ("cold limit = min(H2D, O_DIRECT)", limit_gbps, None, None),
            (f"page cache read, warm (best of the sweep: {pc.get('point', '?').replace('x', ' threads x ')})",
             pc_gbps, pc_lo, pc_hi),
            ("warm limit = min(H2D, page cache read)", warm_limit_gbps, None, None)):
        if h2d or od_gbps or pc_gbps:
            lines.append(f"| {name} | {spread(g, lo, hi)} | {ckpt / g / 1e9:.3f} |" if g else f"| {name} | – | – |")
    for key, what in (("odirect", "O_DIRECT sweep (cold, s; queue depth x block)"),
                      ("buffered", "page cache sweep (warm, s; threads x block)")):
        sweep = limits.get(f"{key}_sweep") or {}
        if sweep:
            lines += ["", f"{what}: " + ", ".join(
                f"{p}: {r['read_s']:.3f}" if r.get("read_s") else f"{p}: failed" for p, r in sweep.items())]
    if data.get("emulated_model"):
        lines += ["", "The emulated device as a GPU's model: " + ", ".join(
            f"{k}={v}" for k, v in data["emulated_model"].items())]
    if "tensorlift_scheduling" in data["loads"]:
        lines += ["", "tensorlift_scheduling: a diagnostic, not a load: tensorlift's defaults onto the emulated "
                  "device with TENSORLIFT_EMULATED_DISCARD_COPIES=1 (the copies take the copy model's time but "
                  "move no bytes, so the CPUs that read do not also do the copies a GPU's DMA engines do); "
                  "its tensors' bytes are wrong."]
    if data.get("sparse"):
        lines += sparse_lines(data["sparse"])
    if "peer_pull" in data:  # Not measured: --parts without peer.
        lines += peer_lines(data["peer_pull"] or {}, ops.get("d2d", {}).get("gbps_out"))
    if ops:
        lines += ["", "| kernel | GB/s moved | GB/s out | vs d2d |", "|---|---|---|---|"]
        for name, o in ops.items():
            lines.append(f"| {name} | {o['gbps_moved']:.2f} | {o['gbps_out']:.2f} | {o['vs_d2d']:.2f}x |")
    elif k.get("error"):
        lines += ["", f"kernels: failed: {' '.join(k['error'])}"]
    data["summary"] = {"limit_gbps": limit_gbps, "warm_limit_gbps": warm_limit_gbps, "h2d_gbps": h2d,
                       "odirect_gbps": od_gbps, "page_cache_gbps": pc_gbps, "rows": rows}
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
    ap.add_argument("--limit-points", default="32x8,8x16,32x16,16x4,4x16",
                    help="the O_DIRECT sweep: comma-separated QUEUE_DEPTHxBLOCK points (BLOCK in MiB, or KiB "
                         "with a k: 64x512k); the cold limit is the best")
    ap.add_argument("--warm-limit-points", default="1x16,2x16,4x16,8x16,16x16",
                    help="the page cache sweep: THREADSxBLOCK points of buffered preads; the warm limit is the best")
    ap.add_argument("--emulated-h2d-gbps", type=float, default=None,
                    help="the emulated device's copy bandwidth (TENSORLIFT_EMULATED_H2D_GBPS; default: its own, "
                         "the H200's 54.8)")
    ap.add_argument("--parts", default="kernels,loads,peer",
                    help="what to measure, comma-separated: kernels (tl_gpu_kernels_bench and the pinned H2D "
                         "limit), loads (the limits' sweeps and every contender, cold and warm), peer (a pull "
                         "from a seed process), sparse (the checkpoint pruned 50 %% and stored sparse against "
                         "the same tensors dense, tensorlift cold and warm; not in the default: a lease runs "
                         "it in its offload step); a lease measures the loads from the wheel first, the rest "
                         "after the source build")
    args = ap.parse_args()
    bad = set(args.parts.split(",")) - {"kernels", "loads", "peer", "sparse"}
    if bad:
        ap.error(f"--parts: unknown part(s) {', '.join(sorted(bad))} (kernels, loads, peer, sparse)")
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
