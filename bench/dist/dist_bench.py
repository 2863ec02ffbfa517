"""The multi-rank load benchmark (issue #6): 1, 2 and 4 ranks loading one
checkpoint with tensorlift.fastsafetensors and with fastsafetensors, cold and
warm, in the same run.

    .venv/bin/python bench/dist/dist_bench.py [--gb 1] [--shards 4] [--runs 3] [--worlds 1,2,4]

Environment: TL_BENCH_DIST_GB (default 1), TL_BENCH_SHARDS (4), TL_BENCH_RUNS
(3), TL_BENCH_SETTLE (seconds of rest before each run; 3 on a VM with free page
reporting, else 0), TL_BENCH_DIST_WORLDS (1,2,4).

The checkpoint is bench/load/gen_checkpoint.py's (Llama-shaped, bf16, cached).
Each run is one `torchrun --standalone --nproc-per-node N bench/dist/worker.py`
(gloo, CPU): every rank makes SafeTensorsFileLoader(WORLD, "cpu", nogds=True),
add_filenames with tensorlift.fastsafetensors.assign_files' byte-balanced
{rank: [files]} (the same for both contenders), copy_files_to_device, then
get_sharded(name, 0) for every 2-D tensor whose rows divide by the world size
and get_tensor for the rest, then XXH3-64 of every result. Time per rank: from
just before the loader is made to after the last tensor; the run's time is the
max over ranks (all_reduce MAX). Per rank: bytes read from storage
(/proc/self/io read_bytes), bytes of its own files, peak RSS (getrusage).
GB/s = the checkpoint's tensor bytes / the run's time. Each rank's checksum is
checked against the other contender's for the same world size and rank.

Cold: before EACH run every file is fsync'ed and evicted with
posix_fadvise(DONTNEED), and mincore confirms it (a run that finds more than 1%
cached is left out). Warm: the files are read once and again before a run if
any page has left the cache. The figure is the median of the runs; each round
runs every (world size, contender) cell in its own seeded, shuffled order,
after TL_BENCH_SETTLE seconds of rest (see bench/load/load_bench.py: on a VM
with free page reporting, memory freed by one run goes back to the host).

Output: a table and verdicts on stdout, bench/out/dist.json.
"""

import argparse
import datetime
import json
import os
import random
import shlex
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "load"))
import gen_checkpoint  # noqa: E402
from load_bench import evict, machine_info, page_reporting, read_through  # noqa: E402
from load_bench import resident_fraction as resident  # noqa: E402

CONTENDERS = [("tensorlift", "tensorlift.fastsafetensors"), ("fastsafetensors", "fastsafetensors 0.5")]

def env_num(name, default, kind=float):
    v = os.environ.get(name)
    return kind(v) if v not in (None, "") else default


def headers(shards):
    """{name: shape} and the tensor bytes of the checkpoint, from the headers."""
    shapes, total = {}, 0
    for path in shards:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        for k, v in header.items():
            if k == "__metadata__":
                continue
            shapes[k] = (v["dtype"], v["shape"])
            total += v["data_offsets"][1] - v["data_offsets"][0]
    return shapes, total


def plan_for(world, shards, shapes):
    """The same calls for both contenders: files by assign_files, dim 0 where it divides."""
    from tensorlift.fastsafetensors import assign_files

    dims = {}
    for name, (dtype, shape) in shapes.items():
        # fastsafetensors 0.5 over gloo fails on float8 and on sizes that do not
        # divide by the world size; the generated checkpoint has neither, but keep
        # the rule so that any other checkpoint gives a set both can load.
        if dtype.startswith("F8"):
            raise SystemExit(f"dist_bench: {name} is {dtype}; fastsafetensors 0.5 cannot send float8 over gloo")
        dims[name] = 0 if len(shape) == 2 and shape[0] % world == 0 else -1
    return {"assignment": {str(r): fs for r, fs in assign_files(shards, world).items()}, "dims": dims}


class Runner:
    def __init__(self, files, shards, settle, tmp):
        self.files, self.shards, self.settle, self.tmp = files, shards, settle, tmp

    def prepare(self, state):
        """As load_bench: cold = evict, rest, evict again until mincore finds nothing;
        warm = rest, then read again whatever left the cache. Returns resident (min, max)."""
        if state == "cold":
            evict(self.files)
            if self.settle > 0:
                time.sleep(self.settle)
            for _ in range(3):
                evict(self.files)
                if max(resident(p) for p in self.shards) <= 0.01:
                    break
        else:
            if self.settle > 0:
                time.sleep(self.settle)
            if min(resident(p) for p in self.shards) < 1.0:
                read_through(self.files)
        r = [resident(p) for p in self.shards]
        return min(r), max(r)

    def run(self, world, contender, plan_path, timeout=900):
        out = os.path.join(self.tmp, f"result-{world}-{contender}.json")
        if os.path.exists(out):
            os.unlink(out)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
               os.path.join(HERE, "worker.py"), contender, plan_path, out]
        with tempfile.TemporaryFile() as log:
            t0 = time.perf_counter()
            p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
            try:
                rc = p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                rc = "timeout"
            wall = time.perf_counter() - t0
            log.seek(0)
            text = log.read().decode(errors="replace")
        if rc != 0 or not os.path.exists(out):
            raise RuntimeError(f"{shlex.join(cmd)} exited with {rc}:\n{text[-4000:]}")
        with open(out) as f:
            res = json.load(f)
        res["launch_wall_s"] = wall
        return res


def gib(b):
    return f"{b / 2**30:.2f}"


def measure(args):
    started = time.time()
    ckpt_dir = gen_checkpoint.checkpoint_dir(args.gb, args.shards)
    shards = gen_checkpoint.shard_paths(ckpt_dir)
    files = shards + [os.path.join(ckpt_dir, "model.safetensors.index.json")]
    shapes, ckpt_bytes = headers(shards)
    worlds = [int(w) for w in args.worlds.split(",") if w]
    states = [s for s in args.states.split(",") if s]
    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="tl-dist-bench-")
    plans = {}
    for w in worlds:
        plans[w] = plan_for(w, shards, shapes)
        with open(os.path.join(tmp, f"plan-{w}.json"), "w") as f:
            json.dump(plans[w], f)
    runner = Runner(files, shards, args.settle, tmp)
    print(f"dist bench: {ckpt_dir}\n  {len(shards)} shards, {len(shapes)} tensors, {ckpt_bytes / 1e9:.2f} GB "
          f"({gib(ckpt_bytes)} GiB); world sizes {worlds}; {args.runs} runs per cell; {args.settle:g} s of rest "
          "before each run", flush=True)
    cells = [(w, c) for w in worlds for c, _ in CONTENDERS]
    raw = {}
    for state in states:
        if state == "warm":
            read_through(files)
        for r in range(args.runs):
            order = list(cells)
            random.Random(f"dist-{state}-{r}").shuffle(order)
            for w, c in order:
                lo, hi = runner.prepare(state)
                res = runner.run(w, c, os.path.join(tmp, f"plan-{w}.json"))
                res["resident_before"] = [lo, hi]
                res["round"] = r
                raw.setdefault(f"{w}|{c}|{state}", []).append(res)
                warn = ""
                if (state == "cold" and hi > 0.01) or (state == "warm" and lo < 0.99):
                    warn = f"  (resident before: {lo:.0%}..{hi:.0%})"
                rk = res["ranks"]
                print(f"  {state} {r + 1}/{args.runs}  world {w}  {c:16s} {res['load_s']:8.3f} s"
                      f"  read/rank max {gib(max(x['read_bytes'] for x in rk))} GiB"
                      f"  rss max {gib(max(x['peak_rss_bytes'] for x in rk))} GiB"
                      f"  (launch {res['launch_wall_s']:.1f} s){warn}", flush=True)
    for name in os.listdir(tmp):
        os.unlink(os.path.join(tmp, name))
    os.rmdir(tmp)
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join(shlex.quote(a) for a in sys.argv),
        "machine": machine_info(),
        "page_reporting": page_reporting(),
        "settle_s": args.settle,
        "checkpoint": {"dir": ckpt_dir, "shards": len(shards), "tensors": len(shapes), "bytes": ckpt_bytes,
                       "file_bytes": sum(os.path.getsize(p) for p in shards)},
        "runs_per_cell": args.runs,
        "worlds": worlds,
        "states": states,
        "plans": {str(w): {"assignment": p["assignment"],
                           "sharded": sum(1 for d in p["dims"].values() if d == 0),
                           "whole": sum(1 for d in p["dims"].values() if d != 0)} for w, p in plans.items()},
        "raw": [{"world": int(k.split("|")[0]), "contender": k.split("|")[1], "state": k.split("|")[2], "runs": v}
                for k, v in raw.items()],
        "elapsed_s": time.time() - started,
    }


def summarize(data):
    ckpt_bytes = data["checkpoint"]["bytes"]
    runs = {(r["world"], r["contender"], r["state"]): r["runs"] for r in data["raw"]}
    rows, left_out = [], {}
    for state in data["states"]:
        for w in data["worlds"]:
            for c, label in CONTENDERS:
                all_runs = runs.get((w, c, state), [])
                if not all_runs:
                    continue
                good = [x for x in all_runs if (state == "cold" and x["resident_before"][1] <= 0.01)
                        or (state == "warm" and x["resident_before"][0] >= 0.99)] or all_runs
                if len(good) != len(all_runs):
                    left_out[(w, c, state)] = len(all_runs) - len(good)
                ts = [x["load_s"] for x in good]
                med = statistics.median(ts)
                ranks = [rk for x in good for rk in x["ranks"]]
                rows.append({
                    "world": w, "contender": c, "label": label, "state": state, "runs": len(good),
                    "median_s": med, "min_s": min(ts), "max_s": max(ts),
                    "median_total_s": statistics.median(x["total_s"] for x in good),
                    "gbps": ckpt_bytes / med / 1e9,
                    "read_bytes_per_rank_max": max(rk["read_bytes"] for rk in ranks),
                    "own_file_bytes_per_rank_max": max(rk["own_file_bytes"] for rk in ranks),
                    "peak_rss_per_rank_max": max(rk["peak_rss_bytes"] for rk in ranks),
                    "rss_at_start_per_rank_max": max(rk["rss_at_start_bytes"] for rk in ranks),
                    "rss_growth_per_rank_max": max(rk["peak_rss_bytes"] - rk["rss_at_start_bytes"] for rk in ranks),
                    "xor_by_rank": {str(rk["rank"]): sorted({y["xor"] for x in good for y in x["ranks"]
                                                             if y["rank"] == rk["rank"]}) for rk in ranks},
                })
    hdr = (f"{'world':>5}  {'contender':28s} {'state':5s} {'median s':>9s} {'spread s':>15s} {'GB/s':>6s} "
           f"{'read/rank GiB':>13s} {'own files GiB':>13s} {'peak RSS GiB':>12s} {'RSS growth':>10s}")
    lines = [hdr, "-" * len(hdr)]
    for r in rows:
        lines.append(f"{r['world']:>5}  {r['label']:28s} {r['state']:5s} {r['median_s']:9.3f} "
                     f"{r['min_s']:7.3f}..{r['max_s']:<7.3f} {r['gbps']:6.2f} "
                     f"{gib(r['read_bytes_per_rank_max']):>13s} {gib(r['own_file_bytes_per_rank_max']):>13s} "
                     f"{gib(r['peak_rss_per_rank_max']):>12s} {gib(r['rss_growth_per_rank_max']):>10s}")
    table = "\n".join(lines)

    by = {(r["world"], r["contender"], r["state"]): r for r in rows}
    verdicts, mismatches = [], []
    for state in data["states"]:
        for w in data["worlds"]:
            t, f = by.get((w, "tensorlift", state)), by.get((w, "fastsafetensors", state))
            if not t or not f:
                continue
            verdicts.append((t["median_s"] <= f["median_s"],
                             f"{state}, {w} rank{'s' if w > 1 else ''}: tensorlift {t['median_s']:.3f} s "
                             f"({t['gbps']:.2f} GB/s) vs fastsafetensors {f['median_s']:.3f} s ({f['gbps']:.2f} GB/s): "
                             f"tensorlift {f['median_s'] / t['median_s']:.2f}x as fast"))
            verdicts.append((t["peak_rss_per_rank_max"] <= f["peak_rss_per_rank_max"],
                             f"{state}, {w} rank{'s' if w > 1 else ''}: peak RSS per rank (max) tensorlift "
                             f"{gib(t['peak_rss_per_rank_max'])} GiB vs fastsafetensors "
                             f"{gib(f['peak_rss_per_rank_max'])} GiB"))
            for rank, xs in t["xor_by_rank"].items():
                if len(xs) != 1 or f["xor_by_rank"].get(rank) != xs:
                    mismatches.append({"world": w, "state": state, "rank": rank,
                                       "tensorlift": xs, "fastsafetensors": f["xor_by_rank"].get(rank)})
    machine, ck = data["machine"], data["checkpoint"]
    report = [
        f"checkpoint: {ck['shards']} shards, {ck['tensors']} tensors, {ck['bytes'] / 1e9:.3f} GB of tensors "
        f"({gib(ck['bytes'])} GiB), bf16, Llama-shaped; world sizes {data['worlds']} (torchrun, gloo, CPU); "
        f"{data['runs_per_cell']} runs per cell, medians; {data['settle_s']:g} s rest before each run",
        f"machine: {machine['nproc']} CPUs ({machine['cpu']}), {machine['ram_gib']} GiB RAM, kernel "
        f"{machine['kernel']}, {machine.get('filesystem', '')}" + ("; free page reporting on" if data["page_reporting"] else ""),
        f"date: {data['date']}",
        "",
        table,
        "",
        "Time: max over ranks, from just before SafeTensorsFileLoader() to after the last get_sharded/get_tensor",
        "(torchrun, imports and the process group not counted). GB/s: the checkpoint's tensor bytes / that time.",
        "read/rank: /proc/self/io read_bytes during the load, max over ranks (what the rank made the kernel fetch",
        "from storage; 0 when warm through the page cache, not with O_DIRECT). own files: the bytes of the files",
        "the rank was assigned. peak RSS: getrusage ru_maxrss, max over ranks (torch and the libraries included);",
        "RSS growth: peak RSS - RSS when the clock started.",
    ]
    for w, p in data["plans"].items():
        report.append(f"  {w} rank(s): {p['sharded']} tensors get_sharded(dim 0), {p['whole']} get_tensor; files per "
                      "rank " + ", ".join(f"{r}: {len(fs)}" for r, fs in sorted(p["assignment"].items(),
                                                                              key=lambda kv: int(kv[0]))))
    if left_out:
        report.append(f"  Runs left out (files found cached when cold, or not cached when warm): {left_out}")
    report.append("")
    for ok, text in verdicts:
        report.append(f"  [{'met ' if ok else 'MISS'}] {text}")
    if mismatches:
        report.append(f"  [FAIL] checksums differ between the contenders or between runs: {mismatches}")
    else:
        report.append("  [met ] every rank's checksum is the same for both contenders and every run")
    extra = {"rows": rows, "verdicts": [{"met": ok, "text": t} for ok, t in verdicts], "mismatches": mismatches}
    return "\n".join(report), extra


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gb", type=float, default=env_num("TL_BENCH_DIST_GB", 1.0))
    ap.add_argument("--shards", type=int, default=env_num("TL_BENCH_SHARDS", 4, int))
    ap.add_argument("--runs", type=int, default=env_num("TL_BENCH_RUNS", 3, int))
    ap.add_argument("--settle", type=float, default=env_num("TL_BENCH_SETTLE", 3.0 if page_reporting() else 0.0),
                    help="seconds of rest before each run (default 3 on a VM with free page reporting, else 0)")
    ap.add_argument("--worlds", default=os.environ.get("TL_BENCH_DIST_WORLDS", "1,2,4"))
    ap.add_argument("--states", default="cold,warm")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "out", "dist.json"))
    ap.add_argument("--report", metavar="JSON", help="print the report of a saved run (its --out) and exit")
    args = ap.parse_args()
    if args.report:
        with open(args.report) as f:
            print(summarize(json.load(f))[0])
        return 0
    try:
        from tensorlift.fastsafetensors import assign_files  # noqa: F401
    except ImportError:
        sys.exit("dist_bench: this tensorlift.fastsafetensors has no multi-rank support (assign_files); "
                 "reinstall the package (pip install ./) or put a newer one on PYTHONPATH")
    data = measure(args)
    report, extra = summarize(data)
    print()
    print(report)
    print(f"\n{data['elapsed_s']:.0f} s in all; results in {os.path.relpath(args.out, ROOT)}")
    with open(args.out, "w") as f:
        json.dump({**data, **extra, "report": report}, f, indent=1)
    return 1 if extra["mismatches"] else 0


if __name__ == "__main__":
    sys.exit(main())
