"""Peers and registries that lie, each in its own way (docs/security.md, "Hostile peers"): every
`tensorlift fetch` here runs under `ulimit -v` and must end (within a watchdog of 120 s; the
slowloris lies at their --timeout-ms, which the fallback line names) in the next source (the disk
fallback, with a `fallback:` line that says what was wrong) or a clear error, and never hand out a
tensor that is not the checkpoint's. A thousand failed fetches in one process leave its file
descriptors, threads and RSS where the first ones left them.

The liar is an HTTP server in front of a real `tensorlift serve`: it passes the control plane
through and rewrites what it was asked to lie about, so the bytes themselves move over UCX from a
real source."""
import base64
import json
import os
import resource
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from safetensors.torch import save_file

from tensorlift._tensorlift import ucx_version
from test_cli_remote import MODEL, Serving, etcd, etcd_keys, load_checksums, run, serving  # noqa: F401 (fixtures)

pytestmark = pytest.mark.skipif(ucx_version() is None, reason="tensorlift was built without UCX (Debian libucx-dev)")

CHUNK = 4 << 20  # The source's checksum granularity (served with --chunk-bytes CHUNK).
# Address space for a fetch (ulimit -v): an honest fetch of this checkpoint runs in 128 MiB here
# (the CLI alone needs 96 MiB to start), the million-tensor manifest's 150 MB need more.
VMEM_LIMIT = int(os.environ.get("TL_TEST_VMEM_LIMIT", 1 << 30))
# --timeout-ms of the fetches a slowloris keeps waiting: the time-out is what ends them. Every
# other fetch gets PATIENT_MS: its lie is found without waiting for anything, and a busy 2-core
# machine must not time out an honest request first (the fallback line would name the time-out,
# not the lie). How long a fetch takes is not asserted: bench/ measures speed.
TIMEOUT_MS = 2000
PATIENT_MS = 60000


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """12 MiB of U8 in 'big' (three 4 MiB chunks) and a few others."""
    d = tmp_path_factory.mktemp("hostile_ckpt")
    g = torch.Generator().manual_seed(3)
    save_file({"big": torch.randint(0, 255, (3 * CHUNK,), generator=g, dtype=torch.uint8),
               "w": torch.randn(256, 512, generator=g).to(torch.bfloat16),
               "b": torch.randn(512, generator=g)}, str(d / "model.safetensors"))
    return d


@pytest.fixture(scope="module")
def disk_checksums(cli, ckpt):
    return load_checksums(cli, ckpt)


@pytest.fixture(scope="module")
def source(cli, ckpt):
    s = Serving(cli, ckpt, *MODEL, "--chunk-bytes", CHUNK)
    yield s
    s.stop()


def limit_address_space():
    resource.setrlimit(resource.RLIMIT_AS, (VMEM_LIMIT, VMEM_LIMIT))


def fetch(cli, *args, fallback=None, timeout_ms=PATIENT_MS):
    """`tensorlift fetch` under ulimit -v (a watchdog of 120 s: a fetch that hangs fails the test)."""
    extra = ["--fallback", fallback] if fallback is not None else []
    return run(cli, "fetch", *args, *MODEL, *extra, "--checksum", "--timeout-ms", timeout_ms,
               preexec_fn=limit_address_space, timeout=120)


class Liar(ThreadingHTTPServer):
    """A control endpoint in front of `upstream` (a real serve) that lies as `mode` says."""
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # A client that hangs up on a lie is what the lie is for.

    def __init__(self, upstream, mode="honest"):
        super().__init__(("127.0.0.1", 0), LiarHandler)
        self.upstream = upstream
        self.mode = mode
        self.stopping = threading.Event()
        self.million = None  # (key answer, manifest) bytes, made once.
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server_address[1]}"

    def close(self):
        self.stopping.set()
        self.shutdown()
        self.server_close()


class LiarHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def upstream(self, method, path):
        req = urllib.request.Request(self.server.upstream + path, method=method,
                                     data=None if method == "GET" else b"")
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.read(), r.headers

    def answer(self, body, headers=(), status=200, length=None):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()

    def reset(self):
        """Closes with a TCP reset (RST), not a FIN."""
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True
        self.connection.close()

    def dribble(self, data, every=0.1):
        """Writes `data` a byte at a time, forever (until the client goes or the liar closes)."""
        try:
            while not self.server.stopping.is_set():
                self.wfile.write(data[:1])
                self.wfile.flush()
                data = data[1:] or data
                time.sleep(every)
        except OSError:
            pass
        self.close_connection = True

    def do_GET(self):
        mode = self.server.mode
        if self.path != "/v1/key":
            return self.answer(b"no", status=404)
        if mode == "slowloris-headers":
            self.wfile.write(b"HTTP/1.1 200 OK\r\n")
            return self.dribble(b"X-Slow: " + b"z" * 64)
        if mode == "redirect-self":
            return self.answer(b"", [("Location", self.server.url + "/v1/key")], status=302)
        body, _ = self.upstream("GET", "/v1/key")
        key = json.loads(body)
        if mode == "key-total":  # The key answer and the manifest disagree.
            key["total_bytes"] += 1
        elif mode in ("shrink", "shrink-content"):  # Consistent with the shrunk manifest below.
            key["total_bytes"] -= CHUNK
            if mode == "shrink":
                key.pop("content", None)
        elif mode == "million":
            key["tensors"] = key["total_bytes"] = 1_000_000
        self.answer(json.dumps(key).encode(), [("Content-Type", "application/json")])

    def do_POST(self):
        mode = self.server.mode
        body, headers = self.upstream("POST", "/v1/session")
        hdr = [("X-Tensorlift-Session", headers["X-Tensorlift-Session"]), ("Content-Type", "application/json")]
        m = json.loads(body)
        if mode.startswith(("slowloris", "reset@", "length-", "million")):
            # The client cannot close a session it never got whole: the liar closes it upstream.
            self.upstream("DELETE", "/v1/session/" + headers["X-Tensorlift-Session"])
        if mode == "slowloris-body":
            self.send_response(200)
            for k, v in hdr:
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            return self.dribble(body)
        if mode.startswith("reset@"):  # The whole answer announced, `at` bytes of it sent, then RST.
            at = int(mode[len("reset@"):])
            self.send_response(200)
            for k, v in hdr:
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[:at])
            self.wfile.flush()
            return self.reset()
        if mode == "length-long":  # Announces more than it sends, then closes.
            return self.answer(body, hdr, length=len(body) + 1000)
        if mode == "length-short":  # Announces less than the manifest.
            return self.answer(body, hdr, length=len(body) - 100)
        if mode == "nbytes":  # A tensor's nbytes off by one.
            m["tensors"][0]["nbytes"] += 1
        elif mode == "bad-checksum":  # Bytes that do not match: found only once they land.
            big = next(t for t in m["tensors"] if t["name"] == "big")
            big["xxh3"][1] = "0123456789abcdef"
        elif mode in ("shrink", "shrink-content"):
            # 'big' as 8 MiB where the checkpoint has 12, its two checksums the true ones for its
            # first 8 MiB, every total adjusted: the checksums match, the size does not. "shrink"
            # also drops the content identity (a manifest without one, as older seeds send), which
            # "shrink-content" keeps: its root then covers the true shape, not the lie.
            big = next(t for t in m["tensors"] if t["name"] == "big")
            big["shape"] = big["full_shape"] = [2 * CHUNK]
            big["nbytes"] = 2 * CHUNK
            big["xxh3"] = big["xxh3"][:2]
            m["total_bytes"] -= CHUNK
            if mode == "shrink":
                m.pop("content", None)
                for t in m["tensors"]:
                    t.pop("xxh128", None)
        elif mode == "million":
            return self.answer(self.server.million, hdr)
        self.answer(json.dumps(m, separators=(",", ":")).encode(), hdr)

    def do_DELETE(self):
        body, _ = self.upstream("DELETE", self.path)
        self.answer(body)


def million_manifest(upstream):
    """The real manifest's handles with a million one-byte tensors (about 150 MB of JSON)."""
    req = urllib.request.Request(upstream + "/v1/session", method="POST", data=b"")
    with urllib.request.urlopen(req, timeout=10) as r:
        m = json.loads(r.read())
        session = r.headers["X-Tensorlift-Session"]
    urllib.request.urlopen(urllib.request.Request(upstream + "/v1/session/" + session, method="DELETE",
                                                  data=b"0"), timeout=10).read()
    head = json.dumps({k: v for k, v in m.items() if k not in ("tensors", "total_bytes")},
                      separators=(",", ":"))[:-1]
    one = ('{"name":"t%07d","dtype":"U8","shape":[1],"nbytes":1,"region":0,"offset":%d,'
           '"shard_dim":-1,"shard_start":0,"full_shape":[1],"xxh3":["0123456789abcdef"]}')
    tensors = ",".join(one % (i, i % 4096) for i in range(1_000_000))
    return f'{head},"total_bytes":1000000,"tensors":[{tensors}]}}'.encode()


@pytest.fixture
def liar(source):
    liars = []

    def make(mode):
        lie = Liar(source.url, mode)
        liars.append(lie)
        return lie
    yield make
    for lie in liars:
        lie.close()


def expect_fallback(r, ckpt, disk_checksums, *why):
    assert r.returncode == 0, r.stderr
    assert f"from disk:{ckpt}" in r.stderr, r.stderr
    fallbacks = [line for line in r.stderr.splitlines() if line.startswith("fallback:")]
    assert fallbacks, r.stderr
    for w in why:
        assert w in fallbacks[0], r.stderr
    assert r.stdout == disk_checksums


def test_an_honest_fetch_fits_the_address_space_limit(cli, ckpt, source, liar, disk_checksums):
    """The limit the lies below run under is not what makes them fail."""
    lie = liar("honest")
    r = fetch(cli, lie.url, fallback=ckpt)
    assert r.returncode == 0, r.stderr
    assert f"from {lie.url}" in r.stderr and "fallback:" not in r.stderr, r.stderr
    assert r.stdout == disk_checksums


LIES = {
    # mode: what the fallback line must say
    "slowloris-headers": ["GET /v1/key", f"no complete answer within {TIMEOUT_MS} ms"],
    "slowloris-body": ["POST /v1/session", f"no complete answer within {TIMEOUT_MS} ms"],
    "redirect-self": ["GET /v1/key", "HTTP 302"],
    "length-long": ["POST /v1/session"],
    "length-short": ["manifest"],
    "nbytes": ["manifest", "nbytes"],
    "key-total": ["the manifest lists 3 tensors of", "GET /v1/key said 3 of"],
    "bad-checksum": ["tensor 'big' chunk 1", "XXH3"],
    "shrink": ["tensor 'big' is U8 [8388608] there, U8 [12582912] in the fallback checkpoint"],
    "shrink-content": ["manifest", "is not the root of its tensors' xxh128"],
}


@pytest.mark.parametrize("mode", LIES)
def test_a_lying_peer_ends_in_the_fallback(cli, ckpt, source, liar, disk_checksums, mode):
    lie = liar(mode)
    timeout_ms = TIMEOUT_MS if mode.startswith("slowloris") else PATIENT_MS
    r = fetch(cli, lie.url, fallback=ckpt, timeout_ms=timeout_ms)
    expect_fallback(r, ckpt, disk_checksums, lie.url, *LIES[mode])
    # Without a fallback: an error that says why, and no tensors.
    r = fetch(cli, lie.url, timeout_ms=timeout_ms)
    if mode == "shrink":  # Nothing to compare with: its tensors are its own (checksums match).
        assert r.returncode == 0, r.stderr
        assert r.stdout != disk_checksums
        return
    assert r.returncode == 1, r.stderr
    assert r.stdout == ""
    assert "no peer worked" in r.stderr and LIES[mode][-1] in r.stderr, r.stderr


def test_a_reset_at_every_chunk_of_the_manifest(cli, ckpt, source, liar, disk_checksums):
    """The manifest's answer announced whole, then cut by a TCP reset after 0, 4 KiB, 8 KiB, ...
    of it: every cut is a clear error and the fallback."""
    req = urllib.request.Request(source.url + "/v1/session", method="POST", data=b"")
    with urllib.request.urlopen(req, timeout=10) as r:
        size = len(r.read())
        session = r.headers["X-Tensorlift-Session"]
    urllib.request.urlopen(urllib.request.Request(source.url + "/v1/session/" + session, method="DELETE",
                                                  data=b"0"), timeout=10).read()
    cuts = list(range(0, size, 4096)) + [size - 1]
    assert len(cuts) >= 2
    for at in cuts:
        lie = liar(f"reset@{at}")
        r = fetch(cli, lie.url, fallback=ckpt)
        expect_fallback(r, ckpt, disk_checksums, lie.url, "POST /v1/session")


def test_a_manifest_of_a_million_tensors(cli, ckpt, source, liar, disk_checksums):
    """150 MB of well-formed manifest whose key answer agrees with it. Under the 1 GiB limit its
    JSON does not fit the parser: a clear out-of-memory error. With room for it (more address
    space), it is refused because the checkpoint has 3 tensors, or, without a fallback, because
    its first chunk's checksum is wrong. Either way the next source."""
    lie = liar("million")
    lie.million = million_manifest(source.url)
    assert len(lie.million) > 100_000_000
    r = fetch(cli, lie.url, fallback=ckpt)
    expect_fallback(r, ckpt, disk_checksums, lie.url)
    line = next(x for x in r.stderr.splitlines() if x.startswith("fallback:"))
    assert "serves 1000000 tensors, 3 in the fallback checkpoint" in line or "memory" in line, line
    r = fetch(cli, lie.url)
    assert r.returncode == 1 and r.stdout == "", r.stderr
    assert "XXH3" in r.stderr or "memory" in r.stderr, r.stderr


def test_a_source_granting_less_than_the_minimum_rate_is_skipped(cli, ckpt, serving, disk_checksums):
    """A rate limit whose share is below --min-rate (1 MB/s by default) would make a pull last as
    long as the source likes: skipped before any byte moves. (A slow data plane is ended by the
    same floor once the pull is --timeout-ms old: ucx_transport_test, MinimumRate.)"""
    s = serving(ckpt, *MODEL, "--rate-limit", "0.5")
    r = fetch(cli, s.url, fallback=ckpt)
    expect_fallback(r, ckpt, disk_checksums, s.url, "grants 500000 bytes/s, below the minimum of 1000000")
    r = fetch(cli, s.url, "--min-rate", "0.6", fallback=ckpt)
    expect_fallback(r, ckpt, disk_checksums, "below the minimum of 600000")


def etcd_put(url, key, value):
    body = json.dumps({"key": base64.b64encode(key.encode()).decode(),
                       "value": base64.b64encode(value.encode()).decode()}).encode()
    urllib.request.urlopen(urllib.request.Request(url + "/v3/kv/put", data=body), timeout=10).read()


def test_a_registry_entry_that_points_at_the_registry(cli, ckpt, etcd, disk_checksums):
    """A seed entry whose URL is etcd itself (the key's digest learnt from a real seed's entry,
    which is gone once that seed stops): the fetch asks etcd for /v1/key, gets no key, says so."""
    s = Serving(cli, ckpt, *MODEL, "--registry", etcd)
    keys = etcd_keys(etcd, "/tensorlift/seeds/")
    s.stop()
    assert len(keys) == 1, keys
    digest = keys[0].split("/")[3]
    deadline = time.monotonic() + 30
    while etcd_keys(etcd, "/tensorlift/seeds/"):  # Removed as the seed stops.
        assert time.monotonic() < deadline
        time.sleep(0.05)
    etcd_put(etcd, f"/tensorlift/seeds/{digest}/0/00aa",
             json.dumps({"url": etcd, "rank": 0, "world": 1, "load": 0, "id": "00aa"}))
    r = fetch(cli, "--registry", etcd, fallback=ckpt)
    expect_fallback(r, ckpt, disk_checksums, etcd, "GET /v1/key: HTTP 404")


LEAK_CHECK = textwrap.dedent("""
    import json, os, sys
    from tensorlift.remote import load_from_peer

    def snapshot():
        status = dict(line.split(":", 1) for line in open("/proc/self/status"))
        return {"fds": len(os.listdir("/proc/self/fd")), "threads": int(status["Threads"]),
                "rss_kb": int(status["VmRSS"].split()[0])}

    urls = sys.argv[1].split(",")
    n = int(sys.argv[2])
    after = {}
    for i in range(n):
        try:
            load_from_peer(urls[i % len(urls)], model="tiny", revision="r1", timeout=2.0)
            raise SystemExit("fetch %d from %s succeeded" % (i, urls[i % len(urls)]))
        except Exception as e:
            if "no peer worked" not in str(e):
                raise
        if i + 1 in (len(urls), 10 * len(urls), n):
            after[i + 1] = snapshot()
    print(json.dumps(after))
""")


def test_a_thousand_failed_fetches_leave_nothing_behind(cli, source, liar, disk_checksums):
    """1,000 fetches in one process, each failing in one of five ways (one of them after UCX has
    connected and pulled): file descriptors and threads exactly as after the first five, RSS
    within 8 MiB of it. The source behind the liars keeps serving: 200 clients gave up on it
    mid-pull (a chunk failed its check), which with UCX 1.13 aborted the source 1 time in 29
    until clients let their gets in flight land before closing."""
    modes = ["key-total", "nbytes", "reset@100", "redirect-self", "bad-checksum"]
    urls = [liar(m).url for m in modes]
    r = subprocess.run([sys.executable, "-c", LEAK_CHECK, ",".join(urls), "1000"], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    after = {int(k): v for k, v in json.loads(r.stdout.strip().splitlines()[-1]).items()}
    first, last = after[len(modes)], after[1000]
    print("after", len(modes), first, "after 1000", last)
    assert last["fds"] == first["fds"], after
    assert last["threads"] == first["threads"], after
    assert last["rss_kb"] - first["rss_kb"] < 8 * 1024, after
    assert source.proc.poll() is None, source.proc.stderr.read()[-2000:]
    r = fetch(cli, source.url)
    assert r.returncode == 0 and r.stdout == disk_checksums, r.stderr
