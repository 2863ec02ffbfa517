"""Peer-loading benchmark (issue #8): a 4 GB checkpoint pulled from a running
peer against loaded from disk (cold and warm), against the transport's limit on
the same path (ucx_perftest, one-sided gets of the same size), and the source's
own throughput while it serves.

    .venv/bin/python bench/remote/peer_bench.py --build build [--runs 3] [--gb 4]

One machine plays both hosts (loopback), so the numbers are for UCX over TCP
and over shared memory on this machine; the same code runs over RDMA where UCX
has it. For each transport: `tensorlift serve` holds the checkpoint (loaded once
from disk); each run times `tensorlift fetch` (its own "fetched ... in S s", the
pull alone: session, manifest, gets, checksums of every chunk) in a fresh
process. Disk loads are tl_load_bench (cold: files evicted with posix_fadvise
DONTNEED; warm: read through once first). The transport's limit is ucx_perftest
-t ucp_get with 8 MiB messages between two processes on the same transport.
The source's service is played by a process on the source side that runs a
fixed memory-bound loop (numpy copy of 256 MiB) and reports GB/s: idle, and
while a client pulls. Medians of --runs; peak RSS of each client. Prints
tables and writes bench/out/peer.json.
"""
import argparse
import glob
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench", "load"))
import gen_checkpoint  # noqa: E402
from load_bench import evict, read_through  # noqa: E402

KEY = ["--model", "bench-4gb", "--revision", "1"]


def wait4_run(cmd, env=None):
    """(stdout, stderr, wall seconds, peak RSS bytes) of a child."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, env=env)
    out = p.stdout.read()
    err = p.stderr.read()
    _, status, ru = os.wait4(p.pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise RuntimeError(f"{cmd} exited with {code}: {err.decode()[-2000:]}")
    return out.decode(), err.decode(), time.perf_counter() - t0, ru.ru_maxrss * 1024


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(build, path, transports, extra=()):
    ready = tempfile.mktemp(prefix="tl_peer_bench_")
    proc = subprocess.Popen([os.path.join(build, "tensorlift"), "serve", path, *KEY, "--transports", transports,
                             "--ready-file", ready, *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    t0 = time.perf_counter()
    while not os.path.exists(ready):
        if proc.poll() is not None:
            raise RuntimeError(f"serve exited: {proc.stderr.read().decode()}")
        time.sleep(0.05)
    url = open(ready).read().strip()
    os.unlink(ready)
    return proc, url, time.perf_counter() - t0


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def fetch(build, url, transports):
    out, err, wall, rss = wait4_run([os.path.join(build, "tensorlift"), "fetch", url, *KEY,
                                     "--transports", transports, "--timeout-ms", "60000"])
    m = re.search(r"fetched (\d+) tensors, (\d+) bytes from (\S+) .* in ([0-9.]+) s", out)
    if not m or "fallback:" in err:
        raise RuntimeError(f"fetch did not pull from the peer: {out}{err}")
    return {"seconds": float(m.group(4)), "bytes": int(m.group(2)), "process_wall_s": wall, "peak_rss_bytes": rss}


def disk_load(build, path):
    out, err, wall, rss = wait4_run([os.path.join(build, "tl_load_bench"), path])
    res = json.loads([ln for ln in out.splitlines() if ln.startswith("{")][-1])
    return {"seconds": res["load_s"], "bytes": res["bytes"], "process_wall_s": wall, "peak_rss_bytes": rss}


def perftest(transports, size, iters):
    """ucx_perftest ucp_get bandwidth (MB/s as it reports, 2^20 bytes)."""
    port = free_port()
    env = dict(os.environ, UCX_TLS=transports, UCX_NET_DEVICES="all")
    server = subprocess.Popen(["ucx_perftest", "-p", str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=env)
    time.sleep(1.0)
    try:
        r = subprocess.run(["ucx_perftest", "127.0.0.1", "-p", str(port), "-t", "ucp_get", "-s", str(size),
                            "-n", str(iters), "-w", "5"], capture_output=True, text=True, env=env, timeout=300)
    finally:
        server.kill()
        server.wait()
    # The final line: "Final: iters  latency(overhead avg overall)  bandwidth(avg overall)  msgrate(avg overall)".
    final = [ln for ln in r.stdout.splitlines() if "Final:" in ln]
    if r.returncode != 0 or not final:
        return {"error": (r.stdout + r.stderr)[-600:]}
    fields = final[-1].split()
    nums = [float(x) for x in fields if re.fullmatch(r"[0-9.]+", x)]
    # iters, lat typical/avg/overall, bw avg, bw overall, msgrate avg, overall
    return {"mb_per_s_avg": nums[4], "mb_per_s_overall": nums[5], "gb_per_s": nums[5] * 2**20 / 1e9,
            "line": final[-1].strip()}


SERVICE = r"""
import sys, time, numpy as np
a = np.ones(32 << 20, dtype=np.float64); b = np.empty_like(a)
end = time.perf_counter() + float(sys.argv[1]); n = 0; t0 = time.perf_counter()
while time.perf_counter() < end:
    np.copyto(b, a); n += 1
dt = time.perf_counter() - t0
print(n * a.nbytes * 2 / dt / 1e9)
"""


def service_gbps(seconds):
    r = subprocess.run([sys.executable, "-c", SERVICE, str(seconds)], capture_output=True, text=True, check=True)
    return float(r.stdout.strip())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--gb", type=float, default=4.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--transports", default="tcp,sm")
    args = ap.parse_args()

    path = gen_checkpoint.checkpoint_dir(args.gb, 4)
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    total = sum(os.path.getsize(f) for f in files)
    results = {"checkpoint": {"dir": path, "file_bytes": total}, "runs": args.runs, "machine": {
        "nproc": os.cpu_count(), "kernel": os.uname().release}, "disk": {}, "peer": {}, "perftest": {},
        "service": {}}

    # Disk: cold and warm.
    cold, warm = [], []
    for _ in range(args.runs):
        evict(files)
        time.sleep(2)
        cold.append(disk_load(args.build, path))
    read_through(files)
    for _ in range(args.runs):
        warm.append(disk_load(args.build, path))
    results["disk"] = {"cold": cold, "warm": warm}

    for transports in args.transports.split(","):
        proc, url, ready_s = start_server(args.build, path, transports)
        try:
            pulls = [fetch(args.build, url, transports) for _ in range(args.runs)]
            # The source's service: idle, then while a client pulls.
            idle = service_gbps(4)
            box = {}
            t = threading.Thread(target=lambda: box.update(v=service_gbps(6)))
            t.start()
            time.sleep(0.5)
            during = fetch(args.build, url, transports)
            t.join()
            results["peer"][transports] = {"serve_ready_s": ready_s, "pulls": pulls}
            results["service"][transports] = {"idle_gbps": idle, "during_pull_gbps": box["v"],
                                              "pull_during": during}
        finally:
            stop(proc)
        results["perftest"][transports] = perftest(transports, 8 << 20, 300)

    med = lambda rs: statistics.median(r["seconds"] for r in rs)  # noqa: E731
    nbytes = cold[0]["bytes"]
    print(f"peer bench: {path} ({nbytes / 1e9:.2f} GB of tensors), medians of {args.runs} runs")
    print("| source | median s | GB/s | vs disk cold | vs disk warm | peak RSS / bytes |")
    print("|---|---|---|---|---|---|")
    dc, dw = med(cold), med(warm)
    for name, rs in [("disk, cold (tl_load_bench)", cold), ("disk, warm", warm)] + \
            [(f"peer over UCX {t}", results["peer"][t]["pulls"]) for t in results["peer"]]:
        m = med(rs)
        rss = max(r["peak_rss_bytes"] for r in rs)
        print(f"| {name} | {m:.3f} | {nbytes / m / 1e9:.2f} | {dc / m:.2f}x | {dw / m:.2f}x | {rss / nbytes:.2f} |")
    print("| transport | pull GB/s | ucx_perftest ucp_get 8 MiB GB/s | pull / limit |")
    print("|---|---|---|---|")
    for t, p in results["perftest"].items():
        pull = nbytes / med(results["peer"][t]["pulls"]) / 1e9
        if "gb_per_s" in p:
            print(f"| {t} | {pull:.2f} | {p['gb_per_s']:.2f} | {pull / p['gb_per_s']:.0%} |")
        else:
            print(f"| {t} | {pull:.2f} | failed: {p['error'][:80]!r} | |")
    print("| transport | source service idle GB/s | while serving a pull GB/s | ratio |")
    print("|---|---|---|---|")
    for t, s in results["service"].items():
        print(f"| {t} | {s['idle_gbps']:.2f} | {s['during_pull_gbps']:.2f} | {s['during_pull_gbps'] / s['idle_gbps']:.0%} |")
    os.makedirs(os.path.join(ROOT, "bench", "out"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "out", "peer.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
