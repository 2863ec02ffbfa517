"""Striped loads against each source alone: the local disk, a bucket (rclone serve s3
on loopback) and a running peer (`tensorlift serve` in another process), each
alone with tensorlift's defaults, and every combination of them through
tensorlift.remote.load_striped, on the object-storage benchmark's checkpoint.

    .venv/bin/python bench/objstore/striped_bench.py [--runs 3] [--gb 2] [--states cold,warm]

Each run is a fresh process (bench/objstore/contender.py: disk, s3 as `tl`,
peer, stripe), timed from the first loader call to every tensor in hand; peak
RSS is the child's. Cold: the checkpoint's files are evicted from the page
cache before each run (the disk source and rclone read them from the disk);
warm: they are all cached. The peer holds the weights in its own memory in
both states (it is a loaded instance). rclone is restarted before each run (as
in objstore_bench.py); the peer runs for the whole benchmark. Medians of
--runs runs, contenders shuffled per round.

The target of issue 21: a load striped over two sources reaches at least 0.9x
the sum of their separate throughputs (measured in the same state, same run).

--hosts: independent sources. On one machine the bucket (rclone) and the peer
share the loader's CPUs and disk, so a sum of their rates alone means little.
With --hosts the peer and rclone run on hosts of their own, network namespaces
(tests/python/cluster.py: their own IPC and /dev/shm, UCX over TCP), each host's
link capped at --cap-mbit in both directions, and every load runs on a third
host (uncapped) with the local copy: the network sources are then limited by their links,
not by the loader's CPUs, and the sum of the sources alone is what striping can
reach. Needs root (ip netns, tc).

Output: a markdown table on stdout and in bench/out/striped.md, everything in
bench/out/striped.json.
"""

import argparse
import datetime
import itertools
import json
import os
import random
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import objstore_bench as ob  # noqa: E402

SOURCES = ("disk", "s3", "peer")


class Peer:
    """`tensorlift serve DIR` in its own process (on host 0 of `cluster`), stopped by PID."""

    def __init__(self, cli, path, workdir, cluster=None):
        ready = os.path.join(workdir, "peer.url")
        self.log = os.path.join(workdir, "peer.log")
        t0 = time.perf_counter()
        cmd = [cli, "serve", path, "--ready-file", ready]
        with open(self.log, "wb") as log:
            if cluster is None:
                self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            else:
                cmd += ["--host", cluster.addr(0), "--transports", "tcp"]
                self.proc = cluster.popen(0, cmd, stdout=log, stderr=subprocess.STDOUT,
                                          env=dict(os.environ, UCX_TLS="tcp"))
        deadline = time.monotonic() + 300
        while not os.path.exists(ready):
            if self.proc.poll() is not None:
                raise RuntimeError(f"tensorlift serve exited: {open(self.log).read()[-2000:]}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("tensorlift serve did not get ready in 300 s")
            time.sleep(0.05)
        self.url = open(ready).read().strip()
        self.ready_s = time.perf_counter() - t0

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class HostRclone:
    """`rclone serve s3` on host 2 of `cluster` (as objstore_bench.Rclone on loopback)."""

    def __init__(self, cluster, rclone, root, log_path):
        self.cluster = cluster
        self.port = ob.free_port()
        self.endpoint = f"http://{cluster.addr(2)}:{self.port}"
        self.log = open(log_path, "wb")
        self.proc = cluster.popen(2, [rclone, "serve", "s3", "--addr", f"{cluster.addr(2)}:{self.port}",
                                      "--auth-key", f"{ob.ACCESS_KEY},{ob.SECRET_KEY}", "--config", "/dev/null",
                                      "--etag-hash", "", "-L", root], stdout=self.log, stderr=subprocess.STDOUT)
        probe = ("import socket,sys,time\nfor _ in range(600):\n try:\n  socket.create_connection("
                 f"('{cluster.addr(2)}',{self.port}),0.5).close(); sys.exit(0)\n except OSError: time.sleep(0.1)\n"
                 "sys.exit(1)")
        if cluster.run(1, [sys.executable, "-c", probe], timeout=90).returncode != 0:
            self.stop()
            raise RuntimeError(f"rclone on {self.endpoint} did not start")

    def stop(self):
        self.cluster.stop(self.proc)
        self.log.close()


# Every source at once onto the emulated device (its copies discarded: the peak RSS is host
# memory), set against the GPU pipeline's staging pool.
DEVICE = "-> emulated device"


def label(combo):
    return " + ".join(combo) if len(combo) > 1 else f"{combo[0]} alone"


def command(python, script, combo, path, url, peer_url):
    if len(combo) == 1:
        kind = combo[0]
        if kind == "disk":
            return [python, script, "disk", path]
        if kind == "s3":
            return [python, script, "tl", url]
        # Over UCX, as a striped load reads a peer: a seed on this host would
        # otherwise hand its memory over (milliseconds, no bytes moved).
        return [python, script, "peer", peer_url, path, "off"]
    return [python, script, "stripe", path if "disk" in combo else "-", url if "s3" in combo else "-",
            peer_url if "peer" in combo else "-", path] + (["emulated:0"] if DEVICE in combo else [])


def summarize(data):
    tb = data["tensor_bytes"]
    med = {}
    for r in data["raw"]:
        ok = [x for x in r["runs"] if "error" not in x]
        if ok:
            med[(r["combo"], r["state"])] = {
                "gbps": statistics.median(tb / x["seconds"] / 1e9 for x in ok),
                "rss": statistics.median(x["peak_rss_bytes"] for x in ok),
                "runs": len(ok),
                "shares": ok[len(ok) // 2].get("sources"),
            }
    lines = [f"Striped loads, {tb / 1e9:.2f} GB ({data['shards']} shards, {data['tensors']} tensors), "
             f"medians of {data['runs_per_cell']} runs, {data['date']}.", "",
             "Each source alone with its defaults (disk: tensorlift.load, views of the page cache when "
             "warm; s3: tensorlift.load(s3://...); peer: remote.load_from_peer with handover off); combinations: "
             "remote.load_striped with its defaults (a local copy in the page cache is loaded from alone).",
             "",
             "| sources | state | GB/s | vs the sum of its sources alone | peak RSS GiB | bytes per source (median run) |",
             "|---|---|---:|---:|---:|---|"]
    for combo in data["combos"]:
        for state in data["states_run"]:
            m = med.get((tuple(combo), state))
            if not m:
                lines.append(f"| {label(combo)} | {state} | failed | | | |")
                continue
            ratio = ""
            if len(combo) > 1 and DEVICE not in combo:
                alone = [med.get(((s,), state)) for s in combo]
                if all(alone):
                    total = sum(a["gbps"] for a in alone)
                    ratio = f"{m['gbps'] / total:.2f}x of {total:.2f}"
            shares = ""
            if m["shares"]:
                parts = []
                for s in m["shares"]:
                    name = "disk" if s["name"].startswith("disk:") else (
                        "s3" if s["name"].startswith("s3://") else "peer")
                    parts.append(f"{name} {s['bytes'] / tb:.0%}" + (" (failed)" if s["failure"] else ""))
                shares = ", ".join(parts)
            lines.append(f"| {label(combo)} | {state} | {m['gbps']:.2f} | {ratio} | {m['rss'] / 2**30:.2f} | "
                         f"{shares} |")
    # The staged pipeline's pinned pool with the defaults (as objstore_bench.py): 2 slots per
    # reader, a reader per CPU (4 to 16), 16 MiB each.
    pool = 2 * min(16, max(4, data["machine"]["nproc"])) * (16 << 20)
    lines.append("")
    for combo in data["combos"]:
        for state in data["states_run"]:
            m = med.get((tuple(combo), state))
            if DEVICE in combo and m:
                lines.append(f"- {state}: {label(combo)}: the whole process peaked at {m['rss'] / 2**30:.2f} GiB "
                             f"RSS = {m['rss'] / pool:.2f}x the staging pool ({pool / 2**30:.3f} GiB) = "
                             f"{m['rss'] / tb:.2f}x the checkpoint, the interpreter and torch included")
    return "\n".join(lines)


def measure(args):
    started = time.time()
    ckpt_dir = ob.gen_checkpoint.checkpoint_dir(args.gb, args.shards)
    shards = ob.gen_checkpoint.shard_paths(ckpt_dir)
    files = shards + [os.path.join(ckpt_dir, "model.safetensors.index.json")]
    ranges = ob.tensor_ranges(shards)
    n_tensors = sum(len(rs) for _, rs in ranges)
    tensor_bytes = sum(n for _, rs in ranges for _, n in rs)
    workdir = tempfile.mkdtemp(prefix="tl_striped_bench_")
    peer = server = cluster = None
    try:
        if args.hosts:
            sys.path.insert(0, os.path.join(ob.ROOT, "tests", "python"))
            import cluster as cl  # noqa: E402
            # The loader's host (1) uncapped: each network source is limited by its own link.
            cluster = cl.Cluster(3, cap_mbit=[args.cap_mbit, None, args.cap_mbit])
        model = os.path.join(workdir, "root", ob.BUCKET, ob.PREFIX)
        os.makedirs(model)
        for p in files:
            os.symlink(p, os.path.join(model, os.path.basename(p)))
        url = f"s3://{ob.BUCKET}/{ob.PREFIX}"
        peer = Peer(args.cli, ckpt_dir, workdir, cluster)
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update({"AWS_ACCESS_KEY_ID": ob.ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": ob.SECRET_KEY,
                    "AWS_REGION": ob.REGION, "AWS_EC2_METADATA_DISABLED": "true",
                    "AWS_CONFIG_FILE": os.path.join(workdir, "none"),
                    "AWS_SHARED_CREDENTIALS_FILE": os.path.join(workdir, "none")})
        if cluster is not None:
            env["UCX_TLS"] = "tcp"
        combos = [c for n in range(1, 4) for c in itertools.combinations(SOURCES, n)]
        combos.append(SOURCES + (DEVICE,))
        if args.only:
            # The named rows, and each source alone of theirs (their sum is the yardstick).
            wanted = [tuple(w.strip().split("+")) for w in args.only.split(",") if w.strip()]
            keep = set(wanted) | {(s,) for w in wanted for s in w if s in SOURCES}
            keep |= {SOURCES + (DEVICE,) for w in wanted if w == ("device",)}
            combos = [c for c in combos if c in keep]
        where = (f"; peer and bucket on hosts of their own, links capped at {args.cap_mbit:g} Mbit/s each way"
                 if cluster is not None else "")
        print(f"striped bench: {ckpt_dir}: {len(shards)} shards, {n_tensors} tensors, {tensor_bytes / 1e9:.2f} GB; "
              f"peer {peer.url} (ready in {peer.ready_s:.1f} s); {args.runs} runs per cell{where}", flush=True)
        script = os.path.join(HERE, "contender.py")
        raw = {}
        states_run = []
        for state in args.states:
            states_run.append(state)
            if state == "warm":
                ob.read_through(files)
            for r in range(args.runs):
                order = list(combos)
                random.Random(f"{state}-{r}").shuffle(order)
                for combo in order:
                    if server is not None:
                        server.stop()
                    if cluster is None:
                        server = ob.Rclone(args.rclone, os.path.join(workdir, "root"),
                                           os.path.join(workdir, "rclone.log"))
                    else:
                        server = HostRclone(cluster, args.rclone, os.path.join(workdir, "root"),
                                            os.path.join(workdir, "rclone.log"))
                    run_env = dict(env, AWS_ENDPOINT_URL=server.endpoint)
                    if DEVICE in combo:
                        run_env["TENSORLIFT_EMULATED_DISCARD_COPIES"] = "1"
                    if state == "cold":
                        for _ in range(3):
                            ob.evict(files)
                            if ob.resident(shards)[1] <= 0.01:
                                break
                    elif ob.resident(shards)[0] < 1.0:
                        ob.read_through(files)
                    cmd = command(sys.executable, script, combo, ckpt_dir, url, peer.url)
                    if cluster is not None:
                        cmd = cluster.wrap(1, cmd)
                    try:
                        res = ob.run_child(cmd, run_env, args.timeout)
                        if res.get("bytes") != tensor_bytes:
                            raise ob.ChildError(f"got {res.get('bytes')} bytes, expected {tensor_bytes}")
                    except ob.ChildError as e:
                        res = {"error": str(e), "error_detail": e.detail}
                    raw.setdefault((combo, state), []).append(res)
                    shown = (f"FAILED: {res['error'][:300]}" if "error" in res else
                             f"{res['seconds']:7.3f} s {tensor_bytes / res['seconds'] / 1e9:5.2f} GB/s "
                             f"rss {res['peak_rss_bytes'] / 2**30:.2f} GiB")
                    print(f"  {state} {r + 1}/{args.runs} {label(combo):20s} {shown}", flush=True)
        return {
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "command": " ".join(shlex.quote(a) for a in sys.argv),
            "machine": ob.machine_info(),
            "checkpoint": ckpt_dir, "shards": len(shards), "tensors": n_tensors, "tensor_bytes": tensor_bytes,
            "runs_per_cell": args.runs, "states_run": states_run,
            "hosts": {"cap_mbit": args.cap_mbit} if cluster is not None else None,
            "combos": [list(c) for c in combos],
            "raw": [{"combo": list(k[0]), "state": k[1], "runs": v} for k, v in raw.items()],
            "elapsed_s": time.time() - started,
        }
    finally:
        if server is not None:
            server.stop()
        if peer is not None:
            peer.stop()
        if cluster is not None:
            cluster.close()
        shutil.rmtree(workdir, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gb", type=float, default=ob.env_num("TL_BENCH_OBJ_GB", 2.0))
    ap.add_argument("--shards", type=int, default=ob.env_num("TL_BENCH_SHARDS", 4, int))
    ap.add_argument("--runs", type=int, default=ob.env_num("TL_BENCH_RUNS", 3, int))
    ap.add_argument("--states", default="cold,warm")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--rclone", default=os.path.join(ob.ROOT, ".venv-s3", "bin", "rclone"))
    ap.add_argument("--cli", default=os.path.join(ob.ROOT, "build", "tensorlift"))
    ap.add_argument("--out", default=os.path.join(ob.ROOT, "bench", "out", "striped.json"))
    ap.add_argument("--hosts", action="store_true",
                    help="the peer and the bucket on hosts of their own (network namespaces, capped links)")
    ap.add_argument("--cap-mbit", type=float, default=1000.0, help="with --hosts: each link's cap, Mbit/s each way")
    ap.add_argument("--only", default="",
                    help="these rows alone (and each of their sources alone): e.g. disk+s3+peer,device "
                         "(device: every source onto the emulated device)")
    args = ap.parse_args()
    args.states = [s for s in args.states.split(",") if s]
    signal.signal(signal.SIGTERM, lambda n, f: sys.exit(128 + n))
    data = measure(args)
    for r in data["raw"]:
        r["combo"] = tuple(r["combo"])
    report = summarize({**data, "raw": [{**r, "combo": tuple(r["combo"])} for r in data["raw"]],
                        "combos": [tuple(c) for c in data["combos"]]})
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({**data, "raw": [{**r, "combo": list(r["combo"])} for r in data["raw"]], "report": report}, f,
                  indent=1)
    with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
        f.write(report + "\n")
    print()
    print(report)
    print(f"\n{data['elapsed_s']:.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
