"""The object-storage benchmark: tensorlift.load("s3://...") against
runai-model-streamer's S3 backend, boto3 download + safetensors load_file, and
the limit (parallel ranged GETs into one buffer), on one generated Llama-shaped
checkpoint served by a real S3 server (rclone serve s3) on loopback.

    .venv/bin/python bench/objstore/objstore_bench.py [--runs 3] [--gb 2] [--states cold,warm]

Environment: TL_BENCH_OBJ_GB (default 2), TL_BENCH_SHARDS (4), TL_BENCH_RUNS (3),
TL_BENCH_SETTLE (seconds of rest before each run; 3 on a VM with free page
reporting, else 0), TL_BENCH_OBJ_BUDGET (seconds: warm runs are skipped when
they would not fit; default 780).

The checkpoint comes from bench/load/gen_checkpoint.py (cached under
~/.cache/tensorlift/bench/). A temporary root holds one bucket, tlbench, whose
prefix model/ links to the checkpoint's shards and index; `rclone serve s3`
(from .venv-s3, SigV4 checked, path-style) serves it on a free loopback port,
waited for by polling the port, and killed by its PID, also on errors and
signals. rclone runs with --etag-hash "" (no MD5 of whole files as ETags:
see Rclone), and each run gets a fresh server (started just before it,
outside its time; --shared-server keeps one), so that no run pays for what
the previous one left behind.

Every run is a fresh process (bench/objstore/contender.py); its time runs from
just before the first loader call to every tensor in hand (imports and process
start are not counted); peak RSS is the child's ru_maxrss (wait4); the CPU
seconds of the child and of the server during the run are recorded too. Cold:
before each run the checkpoint's files are evicted from the page cache
(posix_fadvise DONTNEED, checked with mincore): the server reads them from
disk. Warm: they are all in the page cache. Each figure is the median of
--runs runs; each round runs the contenders in its own (seeded, shuffled)
order. Contenders:

  tensorlift        tensorlift.load("s3://tlbench/model"), its defaults (16
                    connections, 16 MiB ranged GETs, 256 MiB in flight)
  runai cN          runai-model-streamer's S3 backend (SafetensorsStreamer on the
                    listed s3:// shards) with RUNAI_STREAMER_CONCURRENCY=N, for
                    each N of --runai-concurrency; the best median is "runai best"
  boto3 + load_file boto3 download_file of every object to a temp dir, then
                    safetensors.torch.load_file of each shard (both timed)
  limit tN          the same tensor bytes by N threads of raw ranged GETs (16 MiB,
                    SigV4) into one preallocated buffer; the best is "limit"

Once, outside the timed runs, tensorlift's tensors are checked against the
local files (name, dtype, shape, XXH3-64 of the bytes vs safetensors' load_file).

Output: a markdown table on stdout and in bench/out/objstore.md, everything in
bench/out/objstore.json. A contender that fails is recorded with its error text.
"""

import argparse
import datetime
import json
import os
import random
import shlex
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench", "load"))
import gen_checkpoint  # noqa: E402
from load_bench import resident_fraction  # noqa: E402
from load_bench import evict, machine_info, page_reporting, read_through, tensor_ranges  # noqa: E402

BUCKET = "tlbench"
PREFIX = "model"
ACCESS_KEY = "TLBENCHACCESSKEY1"
SECRET_KEY = "tl-bench-secret-0123456789"
REGION = "us-east-1"
RANGE_BYTES = 16 << 20  # The limit's ranged GETs: tensorlift's default request size.


def env_num(name, default, kind=float):
    v = os.environ.get(name)
    return kind(v) if v not in (None, "") else default


# --- page cache ---------------------------------------------------------------

def resident(paths):
    """(min, max) resident fraction over the files."""
    r = [resident_fraction(p) for p in paths]
    return min(r), max(r)


# --- the S3 server ------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Rclone:
    """`rclone serve s3` on a free loopback port, serving `root` (top-level folders are buckets)."""

    def __init__(self, rclone, root, log_path, deadline_s=60.0):
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.log = open(log_path, "wb")
        # -L: follow the bucket's symlinks to the cached checkpoint. No VFS cache (the
        # default): objects are read from the local files, through the page cache.
        # --etag-hash "": no ETag. By default rclone makes the ETag the MD5 of the whole
        # file, computed when an object is first served (and again once its 5 min
        # directory cache expires) by every request that arrives before it is known:
        # 16 parallel ranged GETs on a fresh server cost rclone ~50 CPU seconds, 32 ~100
        # (it reads the file too, warming the page cache before a "cold" run). A real
        # store keeps its ETags; no contender needs one.
        self.cmd = [rclone, "serve", "s3", "--addr", f"127.0.0.1:{self.port}",
                    "--auth-key", f"{ACCESS_KEY},{SECRET_KEY}", "--config", "/dev/null", "--etag-hash", "",
                    "-L", root]
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        t0 = time.perf_counter()
        try:
            self._wait(deadline_s)
        except BaseException:
            self.stop()
            raise
        self.ready_s = time.perf_counter() - t0

    def _wait(self, deadline_s):
        deadline = time.monotonic() + deadline_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"rclone exited with {self.proc.returncode}: {self.tail()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"rclone did not listen on port {self.port} within {deadline_s:g} s: {self.tail()}")
            time.sleep(0.05)

    def tail(self):
        self.log.flush()
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-2000:].decode(errors="replace")
        except OSError:
            return ""

    def cpu_s(self):
        """User + system CPU seconds of the server so far."""
        try:
            with open(f"/proc/{self.proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            return None

    def peak_rss_bytes(self):
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024
        except (OSError, ValueError):
            pass
        return None

    def stop(self):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def rclone_version(rclone):
    try:
        out = subprocess.run([rclone, "version"], capture_output=True, text=True, timeout=30).stdout
        return out.splitlines()[0].strip() if out else "?"
    except (OSError, subprocess.TimeoutExpired):
        return "?"


# --- runs ---------------------------------------------------------------------

class ChildError(RuntimeError):
    """A contender that failed: str() is its last words (the exception line), .detail more of stderr."""

    def __init__(self, text, detail=""):
        super().__init__(text)
        self.detail = detail


def last_line(text):
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "(no output)"


def run_child(cmd, env, timeout_s):
    """Runs a contender; returns its JSON plus wall, peak RSS and CPU (raises on failure)."""
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, cwd=ROOT, env=env)
        timed_out = []

        def kill():
            timed_out.append(True)
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

        timer = threading.Timer(timeout_s, kill)
        timer.start()
        try:
            out = p.stdout.read()
        except BaseException:  # A signal or an interrupt: the child goes too.
            kill()
            raise
        finally:
            p.stdout.close()
            try:
                _, status, ru = os.wait4(p.pid, 0)
            finally:
                timer.cancel()
        p.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        err.seek(0)
        errtext = err.read().decode(errors="replace")
    if timed_out:
        raise ChildError(f"timed out after {timeout_s:g} s", errtext[-3000:])
    if p.returncode != 0:
        raise ChildError(f"exit {p.returncode}: {last_line(errtext)}", errtext[-3000:])
    lines = [ln for ln in out.decode(errors="replace").splitlines() if ln.startswith("{")]
    if not lines:
        raise ChildError("printed no JSON", out.decode(errors="replace")[-1500:] + errtext[-1500:])
    res = json.loads(lines[-1])
    res["process_wall_s"] = wall
    res["peak_rss_bytes"] = ru.ru_maxrss * 1024  # wait4: this child alone, KiB.
    res["cpu_s"] = ru.ru_utime + ru.ru_stime
    res["stderr_tail"] = errtext[-600:]
    return res


class Bench:
    def __init__(self, args, ckpt_dir, shards, files, tensor_bytes, n_tensors, new_server, workdir, plan_path):
        self.args = args
        self.ckpt_dir = ckpt_dir
        self.shards = shards
        self.files = files
        self.tensor_bytes = tensor_bytes
        self.n_tensors = n_tensors
        self.new_server = new_server
        self.server = new_server()
        self.servers_started = 1
        self.workdir = workdir
        self.plan_path = plan_path
        self.url = f"s3://{BUCKET}/{PREFIX}"
        self.python = sys.executable
        self.script = os.path.join(HERE, "contender.py")
        env = dict(os.environ)
        for k in list(env):  # Nothing from the caller's AWS or streamer settings leaks in.
            if k.startswith(("AWS_", "RUNAI_STREAMER_")):
                del env[k]
        env.update({
            "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": REGION,
            "AWS_ENDPOINT_URL": self.server.endpoint, "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_CONFIG_FILE": os.path.join(workdir, "no-aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE": os.path.join(workdir, "no-aws-credentials"),
            # runai: path-style addressing for an S3-compatible store (its docs' setting).
            "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING": "0",
        })
        self.env = env

    def fresh_server(self):
        """A new rclone for the next run (each run starts with a server in the same state: nothing left
        over from the previous contender's connections, requests or memory)."""
        self.server.stop()
        self.server = None
        self.server = self.new_server()
        self.servers_started += 1
        self.env["AWS_ENDPOINT_URL"] = self.server.endpoint

    def contenders(self):
        """[(label, group, kind, args, extra env)]"""
        out = [("tensorlift", "tensorlift", "tl", [self.url], {})]
        # Onto the emulated device, its copies discarded: the peak RSS is host memory alone.
        out += [("tensorlift -> emulated device", "tensorlift-device", "tl-device", [self.url],
                 {"TENSORLIFT_EMULATED_DISCARD_COPIES": "1"})]
        out += [(f"runai c{c}", "runai", "runai", [self.url], {"RUNAI_STREAMER_CONCURRENCY": str(c)})
                for c in self.args.runai_concurrency]
        out += [("boto3 + load_file", "boto3", "boto3", [self.url], {})]
        out += [(f"limit t{t}", "limit", "limit", [self.plan_path, str(t)], {}) for t in self.args.limit_threads]
        return out

    def prepare(self, state):
        if state == "cold":
            evict(self.files)
            if self.args.settle > 0:
                time.sleep(self.args.settle)
            for _ in range(3):  # Again, in case something read them meanwhile.
                evict(self.files)
                lo, hi = resident(self.shards)
                if hi <= 0.01:
                    break
        else:
            if self.args.settle > 0:
                time.sleep(self.args.settle)
            lo, hi = resident(self.shards)
            if lo < 1.0:
                read_through(self.files)
        return resident(self.shards)

    def run(self, label, kind, cargs, extra_env):
        env = dict(self.env, **extra_env)
        tmp = None
        if kind == "boto3":
            tmp = tempfile.mkdtemp(prefix="boto3-", dir=self.workdir)
            cargs = cargs + [tmp]
        cmd = [self.python, self.script, kind, *cargs]
        if not self.args.shared_server:
            self.fresh_server()
            env["AWS_ENDPOINT_URL"] = self.server.endpoint
        cpu0 = self.server.cpu_s()
        try:
            res = run_child(cmd, env, self.args.timeout)
            if res.get("bytes") != self.tensor_bytes or res.get("tensors") != self.n_tensors:
                raise ChildError(f"got {res.get('tensors')} tensors, {res.get('bytes')} bytes; expected "
                                 f"{self.n_tensors} tensors, {self.tensor_bytes} bytes")
        except ChildError as e:
            res = {"error": str(e), "error_detail": e.detail}
        finally:
            if tmp:
                shutil.rmtree(tmp, ignore_errors=True)
        cpu1 = self.server.cpu_s()
        res["server_cpu_s"] = None if cpu0 is None or cpu1 is None else cpu1 - cpu0
        res["server_peak_rss_bytes"] = self.server.peak_rss_bytes()
        res["server_endpoint"] = self.server.endpoint
        if self.server.proc.poll() is not None:
            raise RuntimeError(f"rclone died during '{label}': {self.server.tail()}")
        return res

    def baseline_rss(self):
        """Peak RSS of a Python child that only imports the contenders' libraries (or the error)."""
        try:
            return run_child([self.python, self.script, "imports"], self.env, self.args.timeout)["peak_rss_bytes"]
        except ChildError as e:
            return str(e)

    def verify(self):
        try:
            return run_child([self.python, self.script, "verify", self.url, *self.shards], self.env,
                             self.args.timeout)
        except ChildError as e:
            return {"ok": False, "error": str(e), "error_detail": e.detail}


def fmt_gib(b):
    return f"{b / 2**30:.2f}"


def summarize(data):
    """Rows, ratios and the markdown report of a run's raw data."""
    tb = data["checkpoint"]["tensor_bytes"]
    gb = tb / 1e9
    rows = []
    by = {}
    order = {label: i for i, label in enumerate(data["contenders"])}
    raw = sorted(data["raw"], key=lambda c: (data["states_run"].index(c["state"]), order.get(c["contender"], 99)))
    for cell in raw:
        label, state, runs = cell["contender"], cell["state"], cell["runs"]
        good = [r for r in runs if "error" not in r]
        errors = [r["error"] for r in runs if "error" in r]
        row = {"contender": label, "group": cell["group"], "state": state, "runs": len(runs),
               "failed_runs": len(errors), "errors": errors}
        if good:
            secs = [r["seconds"] for r in good]
            med = statistics.median(secs)
            rss = max(r["peak_rss_bytes"] for r in good)
            scpu = [r["server_cpu_s"] for r in good if r.get("server_cpu_s") is not None]
            row.update({
                "median_s": med, "runs_s": secs, "gbps": gb / med, "peak_rss_bytes": rss,
                "rss_x_checkpoint": rss / tb,
                "median_cpu_s": statistics.median(r["cpu_s"] for r in good),
                "median_server_cpu_s": statistics.median(scpu) if scpu else None,
                "max_server_peak_rss_bytes": max((r.get("server_peak_rss_bytes") or 0 for r in good), default=0) or None,
                "resident_before": [r["resident_before"] for r in good],
            })
            before = [r["rss_before_bytes"] for r in good if r.get("rss_before_bytes")]
            if before:  # The load's own peak: beyond what the process held before the call.
                row["peak_beyond_start_bytes"] = max(r["peak_rss_bytes"] - r["rss_before_bytes"]
                                                     for r in good if r.get("rss_before_bytes"))
            if cell["group"] == "boto3":
                row["median_download_s"] = statistics.median(r["download_s"] for r in good)
                row["median_load_file_s"] = statistics.median(r["load_file_s"] for r in good)
        rows.append(row)
        by[(label, state)] = row

    ratios = {}
    for state in data["states_run"]:
        def best(group):
            cands = [r for r in rows if r["group"] == group and r["state"] == state and "median_s" in r]
            return min(cands, key=lambda r: r["median_s"]) if cands else None
        tl = by.get(("tensorlift", state))
        rb, lim, bo = best("runai"), best("limit"), by.get(("boto3 + load_file", state))
        ok = tl is not None and "median_s" in tl
        ratios[state] = {
            "runai_best": rb["contender"] if rb else None,
            "limit_best": lim["contender"] if lim else None,
            "tensorlift_over_runai_best": (tl["gbps"] / rb["gbps"]) if ok and rb else None,
            "tensorlift_over_limit": (tl["gbps"] / lim["gbps"]) if ok and lim else None,
            "tensorlift_over_boto3": (tl["gbps"] / bo["gbps"]) if ok and bo and "gbps" in bo else None,
            "runai_best_over_limit": (rb["gbps"] / lim["gbps"]) if rb and lim else None,
        }
        for r in rows:
            if r["state"] == state:
                r["best_of_group"] = r is rb or r is lim

    def cell(r):
        if "median_s" not in r:
            return f"| {r['contender']} | {r['state']} | failed: {r['errors'][0][:160].replace('|', '/').replace(chr(10), ' ')} | | | | | | |"
        spread = f"{min(r['runs_s']):.2f}-{max(r['runs_s']):.2f}"
        name = r["contender"] + (" **(best)**" if r.get("best_of_group") else "")
        note = f" ({r['failed_runs']} of {r['runs']} runs failed)" if r["failed_runs"] else ""
        scpu = "-" if r["median_server_cpu_s"] is None else f"{r['median_server_cpu_s']:.1f}"
        res = r["resident_before"]
        cache = f"{min(x[0] for x in res):.0%}-{max(x[1] for x in res):.0%}"
        srss = r.get("max_server_peak_rss_bytes")
        return (f"| {name}{note} | {r['state']} | {r['median_s']:.2f} | {spread} | {r['gbps']:.2f} | "
                f"{fmt_gib(r['peak_rss_bytes'])} ({r['rss_x_checkpoint']:.2f}x) | {r['median_cpu_s']:.1f} / {scpu} | "
                f"{'-' if not srss else fmt_gib(srss)} | {cache} |")

    ck = data["checkpoint"]
    m = data["machine"]
    v = data["verify"]
    lines = [
        f"# Object storage: s3:// loads through `rclone serve s3` on loopback",
        "",
        f"checkpoint: {ck['shards']} shards + index, {ck['tensors']} tensors ({', '.join(ck['dtypes'])}), "
        f"{gb:.3f} GB of tensors ({fmt_gib(tb)} GiB), {ck['shape']}; {data['runs_per_cell']} runs per cell, medians; "
        f"{data['settle_s']:g} s rest before each run",
        f"server: {data['server']['version']} (`serve s3 --etag-hash ''`, path-style, SigV4, no VFS cache) on loopback, "
        + (f"a fresh one for each run ({data['server'].get('started')} started)" if data["server"].get("fresh_per_run")
           else "one for every run"),
        f"machine: {m['nproc']} CPUs ({m['cpu']}), {m['ram_gib']} GiB RAM, kernel {m['kernel']}, {m.get('filesystem', '')}"
        + ("; free page reporting on" if data["page_reporting"] else ""),
        f"date: {data['date']}; load average (1 min) {data['loadavg_start'][0]:.2f} at the start, "
        f"{data['loadavg_end'][0]:.2f} at the end",
        f"check: " + (f"tensorlift's {v.get('tensors_tensorlift')} tensors equal safetensors' load_file of the local "
                      f"files (name, dtype, shape, XXH3-64 of the bytes)" if v.get("ok") else
                      f"FAILED: {json.dumps({k: v[k] for k in v if k in ('error', 'missing', 'extra', 'differ', 'n_differ')})[:600]}"),
        "baseline: a Python child that imports torch, tensorlift, runai_model_streamer, boto3 and safetensors "
        "and loads nothing peaks at " + (f"{fmt_gib(data['baseline_rss_bytes'])} GiB RSS (the limit imports "
                                         "numpy and botocore only)" if isinstance(data.get("baseline_rss_bytes"), int)
                                         else f"? ({data.get('baseline_rss_bytes')})"),
        "",
        "| contender | cache | median s | min-max s | GB/s | peak RSS GiB (x ckpt) | CPU s client / server | server peak RSS GiB | resident before |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [cell(r) for r in rows]
    lines.append("")
    for state, rt in ratios.items():
        def f(x):
            return "n/a" if x is None else f"{x:.2f}x"
        lines.append(f"- {state}: tensorlift / runai best ({rt['runai_best']}) = {f(rt['tensorlift_over_runai_best'])}; "
                     f"tensorlift / limit ({rt['limit_best']}) = {f(rt['tensorlift_over_limit'])}; "
                     f"tensorlift / boto3 + load_file = {f(rt['tensorlift_over_boto3'])}; "
                     f"runai best / limit = {f(rt['runai_best_over_limit'])} (ratios of GB/s: above 1, faster)")
    # The staged pipeline's pinned pool with the defaults: 2 slots per reader, a reader per CPU
    # (4 to 16), 16 MiB each (LoadOptions::staging_buffers, staging_bytes). The device contender
    # imports tensorlift alone (not the others' libraries), so its peak RSS is set against the
    # pool and the checkpoint in all, the interpreter included, not against the baseline.
    pool = 2 * min(16, max(4, data["machine"]["nproc"])) * (16 << 20)
    for r in rows:
        if r["group"] == "tensorlift-device" and "median_s" in r:
            peak = r["peak_rss_bytes"]
            r["peak_over_staging_pool"] = peak / pool
            lines.append(f"- {r['state']}: onto the emulated device (its copies discarded), the whole process "
                         f"peaked at {fmt_gib(peak)} GiB RSS = {peak / pool:.2f}x the staging pool "
                         f"({fmt_gib(pool)} GiB) = {peak / tb:.2f}x the checkpoint, the interpreter included")
            if "peak_beyond_start_bytes" in r:
                beyond = r["peak_beyond_start_bytes"]
                r["beyond_start_over_staging_pool"] = beyond / pool
                lines.append(f"- {r['state']}: that load's own peak, beyond the RSS just before its call (the most of "
                             f"the runs): {fmt_gib(beyond)} GiB = {beyond / pool:.2f}x the staging pool")
    for r in rows:
        if r["group"] == "boto3" and "median_s" in r:
            lines.append(f"- {r['state']}: boto3 + load_file = download {r['median_download_s']:.2f} s + load_file "
                         f"{r['median_load_file_s']:.3f} s (medians; load_file maps the downloaded files: its tensors "
                         f"read them from the page cache when first touched, which nothing here does)")
    for s in data.get("skipped", []):
        lines.append(f"- skipped: {s}")
    lines += [
        "",
        "Time: from the first loader call to every tensor in hand (imports and process start not counted); GB/s:",
        "tensor bytes / median time. Peak RSS: the child's ru_maxrss. CPU s: the child's user+system seconds and",
        "the server's (rclone) during the run (medians); server peak RSS: rclone's VmHWM (the largest). Cold:",
        "the checkpoint's files evicted from the page cache (posix_fadvise DONTNEED, mincore-checked) before each",
        "run, so rclone reads them from disk; warm: all cached.",
        "resident before: the least and most cached shard just before the runs. runai cN: RUNAI_STREAMER_CONCURRENCY=N",
        "(its default chunk size, 8 MiB for object storage). boto3 + load_file: download_file of every object",
        "(default TransferConfig) to a temp dir, then load_file of each shard. limit tN: N threads of raw SigV4",
        f"ranged GETs ({RANGE_BYTES >> 20} MiB, kept-alive http.client connections, readinto one preallocated buffer),",
        "the tensors' bytes only, nothing else done.",
    ]
    return rows, ratios, "\n".join(lines)


def measure(args):
    started = time.time()
    ckpt_dir = gen_checkpoint.checkpoint_dir(args.gb, args.shards)
    shards = gen_checkpoint.shard_paths(ckpt_dir)
    index = os.path.join(ckpt_dir, "model.safetensors.index.json")
    files = shards + [index]
    ranges = tensor_ranges(shards)
    n_tensors = sum(len(rs) for _, rs in ranges)
    tensor_bytes = sum(n for _, rs in ranges for _, n in rs)
    with open(os.path.join(ckpt_dir, ".complete")) as f:
        meta = json.load(f)
    dtypes = set()
    for path in shards:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            dtypes |= {v["dtype"] for k, v in json.loads(f.read(n)).items() if k != "__metadata__"}

    load_start = os.getloadavg()
    workdir = tempfile.mkdtemp(prefix="tl_objstore_bench_")
    bench = None
    data = None
    try:
        model = os.path.join(workdir, "root", BUCKET, PREFIX)
        os.makedirs(model)
        for p in files:
            os.symlink(p, os.path.join(model, os.path.basename(p)))
        # The limit's plan: the tensors' bytes of each shard, in 16 MiB ranges.
        plan_ranges = []
        for path, rs in ranges:
            start = min(o for o, _ in rs)
            end = max(o + n for o, n in rs)
            assert end - start == sum(n for _, n in rs), "tensors not contiguous"
            key = f"{PREFIX}/{os.path.basename(path)}"
            for off in range(start, end, RANGE_BYTES):
                plan_ranges.append([key, off, min(RANGE_BYTES, end - off)])
        plan_path = os.path.join(workdir, "limit-plan.json")
        with open(plan_path, "w") as f:
            json.dump({"bucket": BUCKET, "tensors": n_tensors, "ranges": plan_ranges}, f)
        logs = []

        def new_server():
            logs.append(os.path.join(workdir, f"rclone-{len(logs)}.log"))
            return Rclone(args.rclone, os.path.join(workdir, "root"), logs[-1])

        bench = Bench(args, ckpt_dir, shards, files, tensor_bytes, n_tensors, new_server, workdir, plan_path)
        server = bench.server
        print(f"objstore bench: {ckpt_dir}\n  {len(shards)} shards, {n_tensors} tensors, {tensor_bytes / 1e9:.2f} GB; "
              f"rclone on {server.endpoint} (ready in {server.ready_s:.2f} s); {args.runs} runs per cell; "
              f"{args.settle:g} s rest before each run", flush=True)

        verify = bench.verify()
        print(f"  check: tensorlift vs local load_file: "
              f"{'ok' if verify.get('ok') else 'FAILED ' + json.dumps(verify)[:800]}", flush=True)

        baseline = bench.baseline_rss()
        contenders = bench.contenders()
        raw = {}
        states_run, skipped = [], []
        phase_s = {}
        for state in args.states:
            if states_run and args.budget > 0:
                projected = max(phase_s.values())
                spent = time.time() - started
                if spent + projected > args.budget:
                    skipped.append(f"{state} runs: {spent:.0f} s spent + ~{projected:.0f} s projected > the "
                                   f"{args.budget:g} s budget (--budget)")
                    print(f"  skipping {state}: {skipped[-1]}", flush=True)
                    continue
            t_state = time.time()
            states_run.append(state)
            if state == "warm":
                read_through(files)
            for r in range(args.runs):
                order = list(contenders)
                random.Random(f"{state}-{r}").shuffle(order)
                for label, group, kind, cargs, extra in order:
                    lo, hi = bench.prepare(state)
                    res = bench.run(label, kind, cargs, extra)
                    res["resident_before"] = [lo, hi]
                    res["round"] = r
                    raw.setdefault((label, group, state), []).append(res)
                    if "error" in res:
                        shown = f"FAILED: {res['error'][:300]}"
                    else:
                        shown = (f"{res['seconds']:8.3f} s  {tensor_bytes / res['seconds'] / 1e9:5.2f} GB/s  "
                                 f"rss {fmt_gib(res['peak_rss_bytes'])} GiB  cpu {res['cpu_s']:.1f} s  "
                                 f"server cpu {res['server_cpu_s'] or 0:.1f} s")
                    print(f"  {state} {r + 1}/{args.runs}  {label:18s} {shown}  (cached {lo:.0%}..{hi:.0%})",
                          flush=True)
            phase_s[state] = time.time() - t_state
        data = {
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "command": " ".join(shlex.quote(a) for a in sys.argv),
            "machine": machine_info(),
            "page_reporting": page_reporting(),
            "settle_s": args.settle,
            "checkpoint": {"dir": ckpt_dir, "shards": len(shards), "tensors": n_tensors, "tensor_bytes": tensor_bytes,
                           "file_bytes": sum(os.path.getsize(p) for p in files),
                           "shape": f"{meta.get('shape')}, {meta.get('layers')} layers", "dtypes": sorted(dtypes)},
            "server": {"version": rclone_version(args.rclone), "endpoint": bench.server.endpoint,
                       "cmd": bench.server.cmd, "ready_s": server.ready_s, "bucket": BUCKET, "prefix": PREFIX,
                       "fresh_per_run": not args.shared_server, "started": bench.servers_started},
            "settings": {"runai_concurrency": args.runai_concurrency, "limit_threads": args.limit_threads,
                         "limit_range_bytes": RANGE_BYTES, "runai_env": {"RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING": "0"},
                         "timeout_s": args.timeout, "budget_s": args.budget},
            "runs_per_cell": args.runs,
            "states": args.states,
            "states_run": states_run,
            "contenders": [c[0] for c in contenders],
            "skipped": skipped,
            "phase_s": phase_s,
            "verify": verify,
            "baseline_rss_bytes": baseline,
            "loadavg_start": load_start,
            "loadavg_end": os.getloadavg(),
            "raw": [{"contender": k[0], "group": k[1], "state": k[2], "runs": v} for k, v in raw.items()],
            "server_log_tail": bench.server.tail(),
        }
    finally:
        if bench is not None and bench.server is not None:
            bench.server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    data["elapsed_s"] = time.time() - started
    return data


def _terminate(signum, _frame):
    raise SystemExit(128 + signum)  # Unwinds through measure()'s finally: rclone is stopped.


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gb", type=float, default=env_num("TL_BENCH_OBJ_GB", 2.0), help="checkpoint size in GB, at least")
    ap.add_argument("--shards", type=int, default=env_num("TL_BENCH_SHARDS", 4, int))
    ap.add_argument("--runs", type=int, default=env_num("TL_BENCH_RUNS", 3, int))
    ap.add_argument("--states", default="cold,warm", help="cold and/or warm (the checkpoint's page cache state)")
    ap.add_argument("--settle", type=float, default=env_num("TL_BENCH_SETTLE", 3.0 if page_reporting() else 0.0),
                    help="seconds of rest before each run (default 3 on a VM with free page reporting, else 0)")
    ap.add_argument("--runai-concurrency", default="8,16,32,64", help="RUNAI_STREAMER_CONCURRENCY values to try")
    ap.add_argument("--limit-threads", default="16,32", help="thread counts of the limit's ranged GETs")
    ap.add_argument("--budget", type=float, default=env_num("TL_BENCH_OBJ_BUDGET", 780.0),
                    help="seconds: a later state (warm) is skipped when it would end past this (0: never skip)")
    ap.add_argument("--shared-server", action="store_true",
                    help="one rclone for every run (default: a fresh one before each run)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per contender run")
    ap.add_argument("--rclone", default=os.path.join(ROOT, ".venv-s3", "bin", "rclone"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "out", "objstore.json"))
    ap.add_argument("--report", metavar="JSON", help="print the report of a saved run (its --out) and exit")
    args = ap.parse_args()
    if args.report:
        with open(args.report) as f:
            print(summarize(json.load(f))[2])
        return 0
    args.states = [s for s in args.states.split(",") if s]
    if any(s not in ("cold", "warm") for s in args.states):
        ap.error("--states: cold and/or warm")
    args.runai_concurrency = [int(x) for x in args.runai_concurrency.split(",") if x]
    args.limit_threads = [int(x) for x in args.limit_threads.split(",") if x]
    if not os.access(args.rclone, os.X_OK):
        sys.exit(f"objstore_bench: no rclone at {args.rclone} (scripts/setup.sh makes .venv-s3)")
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGHUP, _terminate)

    data = measure(args)
    rows, ratios, report = summarize(data)
    out_md = os.path.splitext(args.out)[0] + ".md"
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({**data, "rows": rows, "ratios": ratios, "report": report}, f, indent=1)
    with open(out_md, "w") as f:
        f.write(report + "\n")
    print()
    print(report)
    print(f"\n{data['elapsed_s']:.0f} s in all; results in {os.path.relpath(args.out, ROOT)} and "
          f"{os.path.relpath(out_md, ROOT)}")
    return 0 if data["verify"].get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
