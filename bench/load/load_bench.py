"""The load benchmark (issue #3): tensorlift against today's loaders and the
machine's limits, cold and warm, on one generated Llama-shaped checkpoint.

    .venv/bin/python bench/load/load_bench.py --build build [--gb 4] [--shards 4] [--runs 3]

Environment: TL_BENCH_GB (default 4), TL_BENCH_SHARDS (4), TL_BENCH_RUNS (3),
TL_BENCH_SETTLE (seconds of rest before each run), TL_BENCH_CONTENDERS (a
comma-separated subset, see --help).

Every contender runs in its own fresh process (peak RSS from wait4 is then its
own), and its time runs from just before its first loader call (imports and
process start are not counted) to the end of the pass that reads every
tensor's bytes once (XXH3-64 of each tensor, XORed; the XOR is checked against
tensorlift's). Cold: before EACH run every file is fsync'ed and evicted with
posix_fadvise(DONTNEED), and mincore confirms it. Warm: the files are read once
beforehand, and read again before a run if any page has left the cache. The
figure is the median of the runs; each round runs the contenders in its own
(seeded, shuffled) order.

Rest before each run (--settle): on a VM with free page reporting (virtio),
memory freed by one process goes back to the host within about a second, and
the next process to touch it waits for the host to fault it in again, which is
much slower than a native page fault. Without rest, a run that starts right
after another reuses memory the host still backs and looks faster than one
that starts a second later (a Python contender importing torch, say). With the
default 3 s on such a VM every run starts in the same state, the one a server
starting on a quiet machine sees.

Limits: an O_DIRECT io_uring read of the same bytes into one fresh buffer
(queue depth 32, 8 MiB blocks) followed by the same hash pass (tl_limits read):
with transparent huge pages, with base pages, and with base pages faulted in
by a second thread while the reads run (the fastest of the three counts); the
device alone (the same read into a buffer faulted in beforehand); and memcpy
bandwidth into fresh and pre-faulted memory (tl_limits memcpy).

Output: a table and verdicts on stdout, bench/out/load.json.
"""

import argparse
import ctypes
import datetime
import json
import mmap
import os
import platform
import random
import shlex
import statistics
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import gen_checkpoint  # noqa: E402

TL_MODES = ["auto", "buffered", "direct", "mmap"]
PY_CONTENDERS = [
    ("safetensors load_file", "st_load_file"),
    ("safetensors safe_open", "st_safe_open"),
    ("fastsafetensors (cpu, nogds)", "fastsafetensors"),
    ("runai-model-streamer (cpu)", "runai"),
    # tensorlift's own Python API with its defaults (not peers: left out of the verdicts).
    ("tensorlift.load (Python)", "tl_load"),
    ("tensorlift.stream (Python)", "tl_stream"),
]
NCPU = max(2, min(4, os.cpu_count() or 2))  # as tensorlift's default fault threads
LIMITS = [  # (label, tl_limits read options); the limit is the fastest of them.
    ("limit: O_DIRECT uring + hash, THP", ["--pages", "thp"]),
    ("limit: O_DIRECT uring + hash, 4k pg", ["--pages", "4k"]),
    ("limit: same, 4k pg populated ahead x1", ["--pages", "4k", "--populate-ahead", "1"]),
    (f"limit: same, 4k pg populated ahead x{NCPU}", ["--pages", "4k", "--populate-ahead", str(NCPU)]),
]
DEVICE_ONLY = ("device only: O_DIRECT, pre-faulted", ["--pages", "4k", "--prefault", "1"])


def page_reporting():
    """True on a VM whose free memory goes back to the host (virtio free page
    reporting): there, memory freed by one run is taken back by the host within
    about a second and must be faulted in again, slowly, by the next."""
    return os.path.exists("/sys/module/page_reporting/parameters/page_reporting_order")


def env_num(name, default, kind=float):
    v = os.environ.get(name)
    return kind(v) if v not in (None, "") else default


def machine_info():
    info = {"nproc": os.cpu_count(), "kernel": platform.release(), "cpu": "?", "ram_gib": None}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    info["ram_gib"] = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    try:
        out = subprocess.run(["findmnt", "-n", "-o", "SOURCE,FSTYPE", "-T", ROOT], capture_output=True, text=True)
        info["filesystem"] = out.stdout.strip()
    except OSError:
        pass
    return info


def tensor_ranges(shards):
    """Per shard, [(absolute offset, length)] of every tensor, from the headers."""
    out = []
    for path in shards:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        base = 8 + n
        ranges = [(base + v["data_offsets"][0], v["data_offsets"][1] - v["data_offsets"][0])
                  for k, v in header.items() if k != "__metadata__"]
        out.append((path, sorted(ranges)))
    return out



_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


def resident_fraction(path):
    """The fraction of the file's pages in the page cache (mmap + mincore: maps, faults nothing
    in, reads nothing); 1.0 for an empty file. The benches' and the demo's check that a cold run
    is cold and a warm one warm."""
    size = os.path.getsize(path)
    if size == 0:
        return 1.0
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), f"mmap {path}")
        try:
            pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
            vec = (ctypes.c_ubyte * pages)()
            if _libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore {path}")
            return sum(b & 1 for b in bytes(vec)) / pages
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


def evict(paths):
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_through(paths):
    buf = bytearray(8 << 20)
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


class Runner:
    def __init__(self, build, ckpt_dir, shards, ranges_file, ckpt_bytes):
        self.build = build
        self.dir = ckpt_dir
        self.shards = shards
        self.files = shards + [os.path.join(ckpt_dir, "model.safetensors.index.json")]
        self.ranges_file = ranges_file
        self.bytes = ckpt_bytes
        self.python = sys.executable

    def resident(self):
        out = subprocess.run([os.path.join(self.build, "tl_limits"), "resident", *self.shards],
                             capture_output=True, text=True, check=True)
        return json.loads(out.stdout)

    def prepare(self, state, settle):
        """Puts the files in `state` after `settle` seconds of rest; returns the
        resident fraction (min, max) of the shards just before the run.

        Cold: evict, then rest (memory freed by the eviction and by the previous
        run goes back to the host on a VM with free page reporting, as it has
        when a server starts). Warm: rest, then read again whatever is not in
        the page cache (a VM may page out idle page cache within seconds: DAMON
        pageout), so that the run starts with every byte cached."""
        if state in ("cold", "half"):
            evict(self.files)
            if settle > 0:
                time.sleep(settle)
            # Again, in case another process read the files meanwhile (a no-op
            # otherwise); a run that still finds them cached is left out.
            for _ in range(3):
                evict(self.files)
                r = self.resident()
                if max(r.values()) <= 0.01:
                    break
            if state == "half":  # the first half of the shards cached, the rest cold
                read_through(self.shards[:len(self.shards) // 2])
        else:
            if settle > 0:
                time.sleep(settle)
            r = self.resident()
            if min(r.values()) < 1.0:
                read_through(self.files)
        r = self.resident()
        if state == "half":  # (the least cached of the cached half, the most cached of the cold half)
            half = len(self.shards) // 2
            return (min(r[p] for p in self.shards[:half]), max(r[p] for p in self.shards[half:]))
        return min(r.values()), max(r.values())

    def command(self, contender):
        kind, arg = contender
        if kind == "tl":
            mode, _, stream = arg.partition(":")
            return [os.path.join(self.build, "tl_load_bench"), self.dir, "--mode", mode] + (["--stream"] if stream else [])
        if kind == "py":
            return [self.python, os.path.join(HERE, "contender.py"), arg, *self.shards]
        if kind == "limit":
            return [os.path.join(self.build, "tl_limits"), "read", self.ranges_file,
                    "--queue-depth", "32", "--block-mib", "8", *arg]
        raise ValueError(kind)

    def run(self, contender, timeout=900):
        cmd = self.command(contender)
        with tempfile.TemporaryFile() as err:
            t0 = time.perf_counter()
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, cwd=ROOT)
            try:
                out = p.stdout.read()
            finally:
                p.stdout.close()
            _, status, ru = os.wait4(p.pid, 0)
            p.returncode = os.waitstatus_to_exitcode(status)
            wall = time.perf_counter() - t0
            err.seek(0)
            errtext = err.read().decode(errors="replace")
        if p.returncode != 0:
            raise RuntimeError(f"{shlex.join(cmd)} exited with {p.returncode}:\n{errtext[-4000:]}")
        lines = [ln for ln in out.decode().splitlines() if ln.startswith("{")]
        if not lines:
            raise RuntimeError(f"{shlex.join(cmd)} printed no JSON:\n{out.decode()[-2000:]}\n{errtext[-2000:]}")
        res = json.loads(lines[-1])
        res["process_wall_s"] = wall
        res["peak_rss_bytes"] = ru.ru_maxrss * 1024  # wait4: this child alone, KiB.
        if "tensor_bytes" in res:  # tl_limits read
            res["bytes"] = res["tensor_bytes"]
        return res


def valid_state(state, lo, hi):
    """Whether a run found the files as its state says (resident fractions of the shards, min and max)."""
    if state == "cold":
        return hi <= 0.01
    if state == "warm":
        return lo >= 0.99
    return lo >= 0.99 and hi <= 0.01  # half: (cached half's least, cold half's most)


def fmt_gib(b):
    return f"{b / 2**30:.2f}"


def measure(args):
    """Runs every contender; returns the raw data (what summarize() needs)."""
    build = os.path.abspath(args.build)
    for tool in ("tl_load_bench", "tl_limits"):
        if not os.access(os.path.join(build, tool), os.X_OK):
            sys.exit(f"load_bench: {build}/{tool} is missing (cmake --build {args.build} --target tl_load_bench tl_limits)")

    started = time.time()
    ckpt_dir = gen_checkpoint.checkpoint_dir(args.gb, args.shards)
    shards = gen_checkpoint.shard_paths(ckpt_dir)
    ranges = tensor_ranges(shards)
    ckpt_bytes = sum(n for _, rs in ranges for _, n in rs)
    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    ranges_file = os.path.join(out_dir, "load-ranges.txt")
    with open(ranges_file, "w") as f:
        for path, rs in ranges:
            f.write(f"file {path}\n")
            for off, n in rs:
                f.write(f"range {off} {n}\n")

    # (label, (kind, arg), states it runs in)
    contenders = [(f"tensorlift {m}", ("tl", m), ("cold", "warm", "half")) for m in TL_MODES]
    # The defaults with the hash pass in LoadOptions::on_tensor, as each tensor lands.
    contenders += [("tensorlift auto, on_tensor", ("tl", "auto:stream"), ("cold", "warm", "half"))]
    contenders += [(label, ("py", name), ("cold", "warm", "half")) for label, name in PY_CONTENDERS]
    # O_DIRECT bypasses the page cache: its limit is the same warm or cold, so it
    # runs cold only; the warm limit is memcpy's.
    contenders += [(label, ("limit", opts), ("cold",)) for label, opts in LIMITS]
    contenders += [(DEVICE_ONLY[0], ("limit", DEVICE_ONLY[1]), ("cold",))]
    if args.contenders:
        want = set(args.contenders.split(","))
        keep = lambda c: (c[1][0] == "tl" and f"tl:{c[1][1]}" in want) or (c[1][0] == "py" and c[1][1] in want) \
            or (c[1][0] == "limit" and "limit" in want) or c[1] == ("tl", "auto")
        contenders = [c for c in contenders if keep(c)]
    states = [s for s in args.states.split(",") if s]
    runner = Runner(build, ckpt_dir, shards, ranges_file, ckpt_bytes)
    n_tensors = sum(len(rs) for _, rs in ranges)
    print(f"load bench: {ckpt_dir}\n  {len(shards)} shards, {n_tensors} tensors, {ckpt_bytes / 1e9:.2f} GB "
          f"({fmt_gib(ckpt_bytes)} GiB); {args.runs} runs per cell; {args.settle:g} s of rest before each run",
          flush=True)

    raw = {}  # (label, state) -> [result]
    for state in states:
        if state == "warm":
            read_through(runner.files)
        for r in range(args.runs):
            # Each round in its own (seeded) order: what one run leaves behind
            # (freed memory, the host's state) then falls on every contender in
            # turn rather than always on the same one.
            order = [c for c in contenders if state in c[2]]
            random.Random(f"{state}-{r}").shuffle(order)
            for label, c, _ in order:
                lo, hi = runner.prepare(state, args.settle)
                res = runner.run(c)
                res["resident_before"] = [lo, hi]
                res["round"] = r
                raw.setdefault((label, state), []).append(res)
                warn = ""
                if not valid_state(state, lo, hi):
                    warn = f"  (resident before: {lo:.0%}..{hi:.0%})"
                print(f"  {state} {r + 1}/{args.runs}  {label:38s} {res['total_s']:8.3f} s"
                      f"  rss {fmt_gib(res['peak_rss_bytes'])} GiB  xor {res['xor']}{warn}", flush=True)

    memcpy = {}
    for pages in ("thp", "4k"):
        memcpy[pages] = json.loads(subprocess.run(
            [os.path.join(build, "tl_limits"), "memcpy", str(ckpt_bytes), "--pages", pages,
             "--settle-ms", str(int(args.settle * 1000))],
            capture_output=True, text=True, check=True).stdout)
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join(shlex.quote(a) for a in sys.argv),
        "machine": machine_info(),
        "page_reporting": page_reporting(),
        "settle_s": args.settle,
        "checkpoint": {"dir": ckpt_dir, "shards": len(shards), "tensors": n_tensors, "bytes": ckpt_bytes},
        "runs_per_cell": args.runs,
        "states": states,
        "contenders": [[label, c[0], c[1], list(st)] for label, c, st in contenders],
        "raw": [{"contender": k[0], "state": k[1], "runs": v} for k, v in raw.items()],
        "memcpy": memcpy,
        "elapsed_s": time.time() - started,
    }


def summarize(data):
    """The table, what auto chose and the verdicts; returns (report text, extra JSON)."""
    ckpt_bytes = data["checkpoint"]["bytes"]
    gb = ckpt_bytes / 1e9
    states = data["states"]
    contenders = [(label, (kind, arg), tuple(st)) for label, kind, arg, st in data["contenders"]]
    runs = {(r["contender"], r["state"]): r["runs"] for r in data["raw"]}
    memcpy = data["memcpy"]
    best_pages = max(memcpy, key=lambda k: memcpy[k]["fresh_nt_gbps"])
    mc = memcpy[best_pages]

    # A cold run that found more than 1% of the bytes cached, or a warm run that
    # found less than 99%, measured something else (another process read or
    # evicted the files meanwhile): left out, unless no run of its cell is valid.
    def valid(state, r):
        lo, hi = r.get("resident_before", {"warm": [1.0, 1.0], "half": [1.0, 0.0]}.get(state, [0.0, 0.0]))
        return valid_state(state, lo, hi)

    left_out = {}
    for key in list(runs):
        good = [r for r in runs[key] if valid(key[1], r)]
        if good and len(good) < len(runs[key]):
            left_out[key] = len(runs[key]) - len(good)
            runs[key] = good

    def times(key, field="total_s"):
        return [r[field] for r in runs[key]]

    def median(key, field="total_s"):
        return statistics.median(times(key, field))

    ref_xor = runs[("tensorlift auto", states[0])][0]["xor"]
    limit_labels = [label for label, _ in LIMITS if (label, "cold") in runs]
    rows = []
    limit_of = {}
    for state in states:
        auto_t = median(("tensorlift auto", state))
        if state == "half":
            limit_t = None
            limit_of[state] = "none (half the shards cached, half cold: see the verdicts)"
        elif state == "cold" and limit_labels:
            limit_label = min(limit_labels, key=lambda l: median((l, "cold")))
            limit_t = median((limit_label, "cold"))
            limit_of[state] = f"'{limit_label}' (the fastest of the O_DIRECT limits)"
        else:  # Copy into fresh memory on every core, then the hash pass.
            limit_t = gb / mc["fresh_nt_gbps"] + gb / mc["xxh3_1t_gbps"]
            limit_of[state] = (f"memcpy into fresh memory ({best_pages} pages, {mc['threads']} threads, "
                               f"{mc['fresh_nt_gbps']:.2f} GB/s) + the hash pass ({mc['xxh3_1t_gbps']:.2f} GB/s)")
        for label, c, _ in contenders:
            key = (label, state)
            if key not in runs:
                continue
            field = "read_s" if label == DEVICE_ONLY[0] else "total_s"
            t = median(key, field)
            rss = max(r["peak_rss_bytes"] for r in runs[key])
            xors = {r["xor"] for r in runs[key]}
            rows.append({
                "contender": label, "state": state, "median_s": t, "runs_s": times(key, field),
                "runs_left_out": left_out.get(key, 0),
                "median_load_s": median(key, "read_s" if c[0] == "limit" else "load_s"),
                "median_first_s": (statistics.median(r["first_s"] for r in runs[key])
                                   if all(r.get("first_s") is not None for r in runs[key]) else None),
                "gbps": gb / t, "x_tensorlift_auto": auto_t / t, "x_limit": None if limit_t is None else limit_t / t,
                "peak_rss_bytes": None if label == DEVICE_ONLY[0] else rss, "rss_x_checkpoint": rss / ckpt_bytes,
                "xor_ok": None if label == DEVICE_ONLY[0] else xors == {ref_xor},
                "bytes_ok": all(r["bytes"] == ckpt_bytes for r in runs[key]),
            })
        if state == "warm":
            rows.append({"contender": f"limit: memcpy x{mc['threads']} fresh + hash", "state": state,
                         "median_s": limit_t, "runs_s": [], "gbps": gb / limit_t,
                         "x_tensorlift_auto": auto_t / limit_t, "x_limit": 1.0, "peak_rss_bytes": None,
                         "xor_ok": None})

    hdr = (f"{'contender':38s} {'state':5s} {'median s':>8s} {'min-max s':>11s} {'1st s':>6s} {'GB/s':>6s} "
           f"{'x tl auto':>9s} {'x limit':>7s} {'RSS GiB':>7s} {'x ckpt':>6s}  check")
    lines = [hdr, "-" * len(hdr)]
    for row in rows:
        rss = row["peak_rss_bytes"]
        spread = f"{min(row['runs_s']):.2f}-{max(row['runs_s']):.2f}" if row["runs_s"] else "-"
        check = {None: "", True: "ok", False: "MISMATCH"}[row["xor_ok"] if row.get("bytes_ok", True) else False]
        if row["contender"] == DEVICE_ONLY[0]:
            check = "(read only)"
        if row.get("runs_left_out"):
            check += f" ({row['runs_left_out']} run(s) left out)"
        first = row.get("median_first_s")
        lines.append(f"{row['contender']:38s} {row['state']:5s} {row['median_s']:8.3f} {spread:>11s} "
                     f"{('-' if first is None else format(first, '6.3f')):>6s} "
                     f"{row['gbps']:6.2f} {row['x_tensorlift_auto']:8.2f}x "
                     f"{('-' if row['x_limit'] is None else format(row['x_limit'], '6.2f') + 'x'):>7s} "
                     f"{(fmt_gib(rss) if rss else '-'):>7s} {(f'{rss / ckpt_bytes:.2f}x' if rss else '-'):>6s}  {check}")
    table = "\n".join(lines)

    auto_choice = {}
    for state in states:
        auto_choice[state] = [[(os.path.basename(f["path"]), f["mode"], f["engine"], f["reason"]) for f in r["files"]]
                              for r in runs[("tensorlift auto", state)]]

    # The targets of issue #3, as measured.
    others = [label for label, c, _ in contenders if c[0] == "py" and not c[1].startswith("tl_")]
    tl_labels = [label for label, c, _ in contenders if c[0] == "tl"]
    by = {(r["contender"], r["state"]): r for r in rows}
    verdicts = []
    if "cold" in states:
        a = by[("tensorlift auto", "cold")]
        if limit_labels:
            verdicts.append((a["x_limit"] >= 0.9, f"cold: tensorlift auto at {a['x_limit']:.2f}x the O_DIRECT limit "
                                                  f"(read + hash; target >= 0.90x)"))
        for o in others:
            r = by[(o, "cold")]
            verdicts.append((r["median_s"] > a["median_s"],
                             f"cold: tensorlift auto {a['median_s']:.3f} s vs {o} {r['median_s']:.3f} s "
                             f"(tensorlift {r['median_s'] / a['median_s']:.2f}x as fast)"))
    if "warm" in states:
        a = by[("tensorlift auto", "warm")]
        best = min((by[(t, "warm")] for t in tl_labels), key=lambda r: r["median_s"])
        for o in others:
            r = by[(o, "warm")]
            verdicts.append((r["median_s"] > a["median_s"],
                             f"warm: tensorlift auto {a['median_s']:.3f} s vs {o} {r['median_s']:.3f} s "
                             f"(tensorlift {r['median_s'] / a['median_s']:.2f}x as fast)"))
            if best is not a:
                verdicts.append((r["median_s"] > best["median_s"],
                                 f"warm: {best['contender']} {best['median_s']:.3f} s vs {o} {r['median_s']:.3f} s "
                                 f"(tensorlift {r['median_s'] / best['median_s']:.2f}x as fast)"))
        verdicts.append((None, f"warm: tensorlift auto {a['gbps']:.2f} GB/s, best tensorlift mode ({best['contender']}) "
                               f"{best['gbps']:.2f} GB/s; memcpy into fresh memory: " +
                               "; ".join(f"{p} pages {m['fresh_1t_gbps']:.2f} GB/s (1 thread), {m['fresh_nt_gbps']:.2f} "
                                         f"GB/s ({m['threads']} threads)" for p, m in memcpy.items()) +
                               f"; into pre-faulted memory {mc['prefaulted_1t_gbps']:.2f} / {mc['prefaulted_nt_gbps']:.2f}"
                               f" GB/s; XXH3 {mc['xxh3_1t_gbps']:.2f} GB/s (1 thread)"))
    if "half" in states:
        a = by[("tensorlift auto", "half")]
        for t in ("tensorlift direct", "tensorlift buffered"):
            if (t, "half") in by:
                r = by[(t, "half")]
                verdicts.append((r["median_s"] > a["median_s"],
                                 f"half cached: tensorlift auto {a['median_s']:.3f} s vs {t} (all files) "
                                 f"{r['median_s']:.3f} s (auto {r['median_s'] / a['median_s']:.2f}x as fast)"))
        for o in others:
            r = by[(o, "half")]
            verdicts.append((r["median_s"] > a["median_s"],
                             f"half cached: tensorlift auto {a['median_s']:.3f} s vs {o} {r['median_s']:.3f} s "
                             f"(tensorlift {r['median_s'] / a['median_s']:.2f}x as fast)"))
    for state in states:
        for t in tl_labels:
            r = by[(t, state)]
            verdicts.append((r["rss_x_checkpoint"] <= 1.05,
                             f"{state}: {t} peak RSS {fmt_gib(r['peak_rss_bytes'])} GiB = "
                             f"{r['rss_x_checkpoint']:.3f}x the checkpoint (target <= 1.05x)"))
    mismatches = [(r["contender"], r["state"]) for r in rows if r["xor_ok"] is False]

    machine = data["machine"]
    ck = data["checkpoint"]
    report = [
        f"checkpoint: {ck['shards']} shards, {ck['tensors']} tensors, {gb:.3f} GB ({fmt_gib(ckpt_bytes)} GiB), bf16, "
        f"Llama-shaped; {data['runs_per_cell']} runs per cell, medians; {data['settle_s']:g} s rest before each run",
        f"machine: {machine['nproc']} CPUs ({machine['cpu']}), {machine['ram_gib']} GiB RAM, kernel {machine['kernel']}, "
        f"{machine.get('filesystem', '')}" + ("; free page reporting on" if data["page_reporting"] else ""),
        f"date: {data['date']}",
        "",
        table,
        "",
        "Time: from the first loader call to the end of the hash pass over every tensor (imports and process",
        "start not counted). x tl auto: tensorlift auto's time / this time (above 1: faster than tensorlift",
        "auto). x limit: the limit's time / this time. 1st s: from the first loader call to the first",
        "tensor in hand (Python contenders).",
    ]
    for state in states:
        report.append(f"  {state} limit: {limit_of[state]}")
    report += [f"  '{DEVICE_ONLY[0]}': the O_DIRECT read alone into a buffer faulted in beforehand (not a",
               "  limit for a loader, which must fault its memory in; it shows what the device gives)."]
    if left_out:
        report.append("  Runs left out: cold runs that found more than 1% of the bytes in the page cache, warm runs")
        report.append("  that found less than 99% (another process touched the files between eviction and run).")
    report.append("")
    for state in states:
        choices = auto_choice[state]
        distinct = {json.dumps(c) for c in choices}
        note = "" if len(distinct) == 1 else f" (runs differ: {len(distinct)} variants; first shown)"
        report.append(f"tensorlift auto, {state}{note}:")
        for name, mode, engine, reason in choices[0]:
            report.append(f"  {name}: {mode} ({engine}), {reason}")
    report.append("")
    for ok, text in verdicts:
        report.append(f"  [{'----' if ok is None else 'met ' if ok else 'MISS'}] {text}")
    if mismatches:
        report.append(f"  [FAIL] checksum or byte count differs from tensorlift's: {mismatches}")
    extra = {"rows": rows, "limits": limit_of, "auto_choice": auto_choice,
             "verdicts": [{"met": ok, "text": t} for ok, t in verdicts], "mismatches": mismatches}
    return "\n".join(report), extra


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="build directory with tl_load_bench, tl_limits")
    ap.add_argument("--gb", type=float, default=env_num("TL_BENCH_GB", 4.0))
    ap.add_argument("--shards", type=int, default=env_num("TL_BENCH_SHARDS", 4, int))
    ap.add_argument("--runs", type=int, default=env_num("TL_BENCH_RUNS", 3, int))
    ap.add_argument("--settle", type=float, default=env_num("TL_BENCH_SETTLE", 3.0 if page_reporting() else 0.0),
                    help="seconds of rest before each run (default 3 on a VM with free page reporting, else 0)")
    ap.add_argument("--states", default="cold,warm,half",
                    help="cold, warm and half (the first half of the shards cached, the rest cold)")
    ap.add_argument("--contenders", default=os.environ.get("TL_BENCH_CONTENDERS", ""),
                    help="comma-separated subset: tl:auto,tl:buffered,tl:direct,tl:mmap,"
                         + ",".join(n for _, n in PY_CONTENDERS) + ",limit (tensorlift auto always runs)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "out", "load.json"))
    ap.add_argument("--report", metavar="JSON", help="print the report of a saved run (its --out) and exit")
    args = ap.parse_args()
    if args.report:
        with open(args.report) as f:
            data = json.load(f)
        print(summarize(data)[0])
        return 0
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
