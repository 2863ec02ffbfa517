"""make soak: tensorlift under repetition (docs/security.md, "Soak"). Not part of make test.

    .venv/bin/python tests/soak/soak.py [--seconds 1800] [--out FILE.md]

Three workloads, each its count once, then rounds of a tenth of the counts until --seconds
(30 minutes) have passed:
  load     load a checkpoint (16 MB, 11 tensors in 2 shards) and free it (modes auto, buffered and direct; threads and io_uring)
  serve    a seed (`tensorlift serve`, its own process, 1.3 MB) serves fetches to 8 concurrent clients
           (one process each, tensorlift.remote.load_from_peer in a loop)
  stream   tensorlift.stream abandoned after its first tensor
Each process's RSS, open file descriptors, threads and io_uring instances are sampled after a
warm-up and at the end; any that grows past its allowance fails the soak (exit 1). Prints a
Markdown table (and writes it to --out).
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
RSS_ALLOWANCE_KB = 16 * 1024  # Allocator noise; a leak of a tensor per round is far more.

COUNTS = {"load": 1000, "serve": 10000, "stream": 1000}
CLIENTS = 8


def usage(pid="self"):
    """RSS (KB), open fds, threads, io_uring instances of a process."""
    status = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status"))
    fds = os.listdir(f"/proc/{pid}/fd")
    rings = 0
    for fd in fds:
        try:
            if "io_uring" in os.readlink(f"/proc/{pid}/fd/{fd}"):
                rings += 1
        except OSError:
            pass
    return {"rss_kb": int(status["VmRSS"].split()[0]), "fds": len(fds), "threads": int(status["Threads"]),
            "io_uring": rings}


def make_checkpoint(d, rows=256):
    """11 tensors in two shards: 16 MB (rows=256), or 1.3 MB for the fetches (rows=16)."""
    import torch
    from safetensors.torch import save_file
    d.mkdir()
    g = torch.Generator().manual_seed(5)
    save_file({f"layers.{i}.w": torch.randn(rows, 1024, generator=g).to(torch.bfloat16) for i in range(8)},
              str(d / "model-00001-of-00002.safetensors"))
    save_file({f"layers.{i}.b": torch.randn(rows * 4, 1024, generator=g) for i in range(3)},
              str(d / "model-00002-of-00002.safetensors"))
    return d


WORKER = r"""
import json, sys, time, os
sys.path.insert(0, sys.argv[1])
from soak import usage
import tensorlift
from tensorlift.remote import load_from_peer
kind, ckpt, n, url = sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
modes = [dict(mode="auto"), dict(mode="buffered"), dict(mode="direct"), dict(mode="buffered", copy=True)]
warm = None
t0 = time.monotonic()
for i in range(n):
    if kind == "load":
        t = tensorlift.load(ckpt, **modes[i % len(modes)])
        assert len(t) == 11
        del t
    elif kind == "stream":
        it = tensorlift.stream(ckpt, mode="buffered", piece_bytes=1 << 20)
        name, _ = next(it)
        it.close()
        del it
    else:
        t = load_from_peer(url, model="soak", revision="r1", timeout=30.0)
        assert len(t) == 11
        del t
    if i + 1 == min(20, n // 2):
        warm = usage()
seconds = time.monotonic() - t0
# An abandoned stream's reader thread ends on its own shortly after: wait for it, up to 30 s (a few
# seconds may not do on a busy machine; the wait ends as soon as the count is back).
end, settle = usage(), time.monotonic() + 30
while end["threads"] > warm["threads"] and time.monotonic() < settle:
    time.sleep(0.05)
    end = usage()
print(json.dumps({"warm": warm, "end": end, "seconds": seconds}))
"""


def run_worker(kind, ckpt, n, url=""):
    return subprocess.Popen([sys.executable, "-c", WORKER, str(HERE), kind, str(ckpt), str(n), url],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc):
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"soak worker failed ({proc.returncode}): {err[-3000:]}")
    return json.loads(out.strip().splitlines()[-1])


def grew(warm, end):
    """What grew past its allowance, as text ('' when flat)."""
    bad = []
    for k in ("fds", "threads", "io_uring"):
        if end[k] > warm[k]:
            bad.append(f"{k} {warm[k]} -> {end[k]}")
    if end["rss_kb"] - warm["rss_kb"] > RSS_ALLOWANCE_KB:
        bad.append(f"rss {warm['rss_kb']} -> {end['rss_kb']} KB")
    return ", ".join(bad)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=float(os.environ.get("SOAK_SECONDS", 1800)))
    ap.add_argument("--out", default=None)
    ap.add_argument("--scale", type=float, default=1.0, help="multiply the counts (a quick check: 0.01)")
    ap.add_argument("--only", action="append", choices=("load", "stream", "serve"),
                    help="run only this workload (repeatable); default: all three")
    ap.add_argument("--serve-arg", action="append", default=[],
                    help="an argument for the seed's `tensorlift serve` (repeatable), e.g. "
                         "--serve-arg=--clients-per-worker=0")
    args = ap.parse_args()
    counts = {k: max(CLIENTS, int(v * args.scale)) for k, v in COUNTS.items()}
    cli = os.environ.get("TENSORLIFT_CLI", str(ROOT / "build" / "tensorlift"))
    rows = []
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tl_soak_") as tmp:
        ckpt = make_checkpoint(pathlib.Path(tmp) / "big")
        small = make_checkpoint(pathlib.Path(tmp) / "small", rows=16)
        ready = pathlib.Path(tmp) / "url"
        seed = subprocess.Popen([cli, "serve", str(small), "--model", "soak", "--revision", "r1",
                                 "--max-sessions", str(2 * CLIENTS), "--ready-file", str(ready), *args.serve_arg],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not ready.exists():
            if seed.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"serve did not start: {seed.stderr.read()}")
            time.sleep(0.05)
        url = ready.read_text().strip()
        done = {k: 0 for k in counts}
        round_no = 0
        seed_warm = None
        while round_no == 0 or time.monotonic() - start < args.seconds:
            round_no += 1
            if round_no == 2:  # The counts once; then shorter rounds until the time is up.
                counts = {k: max(CLIENTS, v // 10) for k, v in counts.items()}
            for kind in args.only or ("load", "stream", "serve"):
                if round_no > 1 and time.monotonic() - start >= args.seconds:
                    break
                t0 = time.monotonic()
                if kind == "serve":
                    per = counts["serve"] // CLIENTS
                    if seed_warm is None:  # A warm-up round of 20 fetches per client, then idle.
                        for p in [run_worker("serve", small, 20, url) for _ in range(CLIENTS)]:
                            finish(p)
                        seed_warm = usage(seed.pid)
                    procs = [run_worker("serve", small, per, url) for _ in range(CLIENTS)]
                    results = [finish(p) for p in procs]
                    n = per * CLIENTS
                    seed_end = usage(seed.pid)
                    worst = max(results, key=lambda r: r["end"]["rss_kb"] - r["warm"]["rss_kb"])
                    problems = [grew(r["warm"], r["end"]) for r in results] + [grew(seed_warm, seed_end)]
                    problem = "; ".join(p for p in problems if p)
                    rows.append((round_no, f"serve (seed, {CLIENTS} clients)", n, time.monotonic() - t0,
                                 seed_warm, seed_end, problem))
                    rows.append((round_no, "serve (a client, most RSS growth)", per, worst["seconds"],
                                 worst["warm"], worst["end"], ""))
                else:
                    r = finish(run_worker(kind, ckpt, counts[kind]))
                    n = counts[kind]
                    problem = grew(r["warm"], r["end"])
                    rows.append((round_no, kind, n, time.monotonic() - t0, r["warm"], r["end"], problem))
                done[kind] += n
                print(f"round {round_no} {kind}: {n} in {time.monotonic() - t0:.0f} s"
                      f"{' GREW: ' + rows[-1][-1] if rows[-1][-1] else ''}", flush=True)
        seed.terminate()
        seed.wait(timeout=30)
    fmt = lambda u: f"{u['rss_kb']:,} KB / {u['fds']} / {u['threads']} / {u['io_uring']}"
    table = ["| round | workload | count | seconds | after warm-up: RSS / fds / threads / io_uring | at the end | grew |",
             "|---:|---|---:|---:|---|---|---|"]
    for rnd, kind, n, secs, warm, end, problem in rows:
        table.append(f"| {rnd} | {kind} | {n:,} | {secs:.0f} | {fmt(warm)} | {fmt(end)} | {problem or 'no'} |")
    table.append("")
    table.append(f"Totals: {done['load']:,} loads, {done['serve']:,} fetches, {done['stream']:,} abandoned "
                 f"streams in {time.monotonic() - start:.0f} s.")
    failed = any(row[-1] for row in rows)
    text = "\n".join(table)
    print(text)
    if args.out:
        pathlib.Path(args.out).write_text(text + "\n")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
