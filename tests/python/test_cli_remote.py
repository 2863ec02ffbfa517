"""`tensorlift serve` and `tensorlift fetch` as two processes: pulls over UCX
(TCP and shared memory) that match `tensorlift load --checksum`; the seed killed
mid-transfer, a wrong key, a wrong token, the registry (etcd) and etcd down,
each ending in the documented fallback or error, never in corrupt tensors; and
two network namespaces joined by veth acting as two hosts."""
import base64
import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from tensorlift._tensorlift import ucx_version

# Peer loading needs the UCX data plane; a build without it (the GPU check's bundle) skips this
# file, as ctest skips its UCX tests.
pytestmark = pytest.mark.skipif(ucx_version() is None, reason="tensorlift was built without UCX (Debian libucx-dev)")

MODEL = ["--model", "tiny", "--revision", "r1"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A 24 MB checkpoint in two shards."""
    d = tmp_path_factory.mktemp("remote_ckpt")
    g = torch.Generator().manual_seed(7)
    a = {f"layers.{i}.w": torch.randn(512, 1024, generator=g).to(torch.bfloat16) for i in range(6)}
    b = {f"layers.{i}.b": torch.randn(1024, 1024, generator=g) for i in range(3)}
    b["empty"] = torch.zeros(0, 3)
    save_file(a, str(d / "model-00001-of-00002.safetensors"))
    save_file(b, str(d / "model-00002-of-00002.safetensors"))
    return d


def run(cli, *args, timeout=120, **kw):
    r = subprocess.run([str(cli), *map(str, args)], capture_output=True, text=True, timeout=timeout, **kw)
    assert r.returncode >= 0, f"{args} died of signal {-r.returncode}: {r.stderr}"
    return r


class Serving:
    """`tensorlift serve` in the background; .url once it is ready."""

    def __init__(self, cli, path, *args, prefix=(), handover=False):
        self.ready = pathlib.Path(tempfile.mkdtemp(prefix="tl_serve_")) / "url"
        # These tests are about pulls over UCX: a seed on this host would hand its memory over
        # instead (tests/python/test_handover.py) unless told not to.
        extra = [] if handover else ["--no-handover"]
        self.proc = subprocess.Popen([*prefix, str(cli), "serve", str(path), *map(str, args), *extra,
                                      "--ready-file", str(self.ready)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not self.ready.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited with {self.proc.returncode}: {self.proc.stderr.read()}")
            if time.monotonic() > deadline:
                self.proc.kill()
                raise RuntimeError("serve did not become ready in 60 s")
            time.sleep(0.05)
        self.url = self.ready.read_text().strip()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.ready.parent, ignore_errors=True)


@pytest.fixture
def serving(cli):
    started = []

    def start(path, *args, prefix=(), handover=False):
        s = Serving(cli, path, *args, prefix=prefix, handover=handover)
        started.append(s)
        return s
    yield start
    for s in started:
        s.stop()


def wait_for_session(url, timeout=60):
    """Polls the seed's GET /v1/key until it has a session open (a fetch is under way)."""
    deadline = time.monotonic() + timeout
    while json.loads(urllib.request.urlopen(url + "/v1/key", timeout=10).read())["sessions"] < 1:
        assert time.monotonic() < deadline, f"no session opened on {url} in {timeout} s"
        time.sleep(0.02)


def etcd_keys(url, prefix):
    """The keys under `prefix` in etcd (its v3 JSON gateway)."""
    end = prefix[:-1].encode() + bytes([ord(prefix[-1]) + 1])
    body = json.dumps({"key": base64.b64encode(prefix.encode()).decode(),
                       "range_end": base64.b64encode(end).decode(), "keys_only": True}).encode()
    reply = json.loads(urllib.request.urlopen(urllib.request.Request(url + "/v3/kv/range", data=body),
                                              timeout=10).read())
    return [base64.b64decode(kv["key"]).decode() for kv in reply.get("kvs", [])]


def wait_for_seeds(etcd_url, count, timeout=60):
    """Polls etcd until `count` seed entries are left (a dead seed's lease expires after its TTL)."""
    deadline = time.monotonic() + timeout
    while len(etcd_keys(etcd_url, "/tensorlift/seeds/")) != count:
        assert time.monotonic() < deadline, etcd_keys(etcd_url, "/tensorlift/seeds/")
        time.sleep(0.1)


def load_checksums(cli, path):
    r = run(cli, "load", path, "--checksum", "--no-progress")
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize("transports", ["tcp", "sm"])
def test_fetch_matches_a_disk_load(cli, ckpt, serving, transports):
    s = serving(ckpt, *MODEL, "--transports", transports)
    r = run(cli, "fetch", s.url, *MODEL, "--transports", transports, "--checksum")
    assert r.returncode == 0, r.stderr
    assert "fallback:" not in r.stderr
    assert f"from {s.url}" in r.stderr
    assert r.stdout == load_checksums(cli, ckpt)


def libucx_libucp():
    """(libucp.so.0, its version) of PyPI's CUDA build of UCX (the libucx-cu12 wheel):
    TENSORLIFT_TEST_UCX_LIB (scripts/test.sh sets it from .venv-ucx), else the `libucx` package of this
    Python; or (None, None)."""
    named = os.environ.get("TENSORLIFT_TEST_UCX_LIB")
    if named:
        lib = pathlib.Path(named)
    else:
        try:
            import libucx
        except ImportError:
            return None, None
        lib = pathlib.Path(libucx.__file__).parent / "lib" / "libucp.so.0"
    pc = lib.parent / "pkgconfig" / "ucx.pc"  # The wheel's own record of its version.
    m = re.search(r"^Version:\s*(\d+\.\d+\.\d+)", pc.read_text(), re.M) if pc.is_file() else None
    return (lib, m.group(1)) if lib.is_file() and m else (None, None)


@pytest.mark.skipif(libucx_libucp()[0] is None,
                    reason="PyPI's libucx-cu12 (UCX with CUDA) is not installed: make test puts it in .venv-ucx")
def test_fetch_with_the_ucx_of_the_libucx_wheel(cli, ckpt, serving):
    """serve and fetch loading the wheel's UCX (TENSORLIFT_UCX_LIB) instead of Debian's."""
    lib, version = libucx_libucp()
    env = {**os.environ, "TENSORLIFT_UCX_LIB": str(lib)}
    r = run(cli, "doctor", env=env)
    assert r.returncode == 0, r.stderr
    assert f"UCX (peer loading): built, {version} ({lib})" in r.stdout, r.stdout
    s = serving(ckpt, *MODEL, "--transports", "tcp", prefix=("env", f"TENSORLIFT_UCX_LIB={lib}"))
    r = run(cli, "fetch", s.url, *MODEL, "--transports", "tcp", "--checksum", env=env)
    assert r.returncode == 0, r.stderr
    assert "fallback:" not in r.stderr
    assert f"from {s.url}" in r.stderr
    assert r.stdout == load_checksums(cli, ckpt)


def test_serve_from_a_devices_memory(cli, ckpt, serving):
    """serve --device: the source holds the tensors on the (emulated) device and serves that memory."""
    s = serving(ckpt, *MODEL, "--device", "emulated:0", "--transports", "tcp", handover=True)
    r = run(cli, "fetch", s.url, *MODEL, "--transports", "tcp", "--checksum")
    assert r.returncode == 0, r.stderr
    assert f"from {s.url}" in r.stderr
    assert r.stdout == load_checksums(cli, ckpt)
    bad = run(cli, "serve", ckpt, *MODEL, "--device", "tpu:0")
    assert bad.returncode != 0 and "tpu:0" in bad.stderr, bad.stderr
    # fetch --device: device memory to device memory, the bytes checked on the way.
    r = run(cli, "fetch", s.url, *MODEL, "--transports", "tcp", "--device", "emulated:0", "--checksum",
            "--handover", "off")
    assert r.returncode == 0, r.stderr
    assert "into emulated:0's memory" in r.stderr, r.stderr
    assert r.stdout == load_checksums(cli, ckpt)
    # The same device on this host: the seed's allocations are handed over, mapped (no byte
    # copied) or copied once on the device (docs/remote.md, "Same-host handover of GPU memory").
    for extra, how in (([], "mapped, no byte copied"), (["--copy-on-write"], "copied once on the device")):
        r = run(cli, "fetch", s.url, *MODEL, "--device", "emulated:0", "--checksum", *extra)
        assert r.returncode == 0, r.stderr
        assert "handed over" in r.stderr and how in r.stderr, r.stderr
        assert "fallback:" not in r.stderr, r.stderr
        assert r.stdout == load_checksums(cli, ckpt)
    bad = run(cli, "fetch", s.url, *MODEL, "--device", "emulated:0", "--out", ckpt.parent / "never")
    assert bad.returncode != 0 and "--out writes a host fetch" in bad.stderr, bad.stderr


def test_fetch_out_writes_a_checkpoint(cli, ckpt, serving, tmp_path):
    s = serving(ckpt, *MODEL)
    r = run(cli, "fetch", s.url, *MODEL, "--out", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    got = load_file(str(tmp_path / "out" / "model.safetensors"))
    want = {}
    for f in sorted(ckpt.glob("*.safetensors")):
        want.update(load_file(str(f)))
    assert got.keys() == want.keys()
    for k in want:
        assert torch.equal(got[k], want[k]), k


def test_default_key_comes_from_the_checkpoint(cli, ckpt, serving):
    s = serving(ckpt)  # Key: the directory's name and a digest of its headers.
    r = run(cli, "fetch", s.url, "--fallback", ckpt, "--checksum")
    assert r.returncode == 0, r.stderr
    assert "fallback:" not in r.stderr, r.stderr
    assert r.stdout == load_checksums(cli, ckpt)


# A seed killed mid-transfer: its rate limit makes the pull last about a minute (the client paces
# its gets of the 18 MiB to 250 KB/s; --min-rate 0 takes so slow a grant), so the kill, however
# late a busy machine lets it come after the session opened, lands before the last byte. How soon
# the fetch then gives up is not asserted: at once when UCX reports the dead peer, else at the
# stall time-out (--timeout-ms, generous so that no request times out before the kill).
SLOW_SEED = ["--rate-limit", "0.25"]
SLOW_FETCH = ["--min-rate", "0", "--timeout-ms", "10000"]


def test_seed_killed_mid_transfer_falls_back_to_disk(cli, ckpt, serving):
    s = serving(ckpt, *MODEL, *SLOW_SEED)
    fetch = subprocess.Popen([str(cli), "fetch", s.url, *MODEL, "--fallback", str(ckpt), "--checksum", *SLOW_FETCH],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_session(s.url)
    s.kill()
    out, err = fetch.communicate(timeout=60)
    assert fetch.returncode == 0, err
    assert "fallback:" in err and s.url in err, err
    assert f"from disk:{ckpt}" in err, err
    assert out == load_checksums(cli, ckpt)


def test_seed_killed_without_fallback_is_an_error_and_no_tensors(cli, ckpt, serving):
    s = serving(ckpt, *MODEL, *SLOW_SEED)
    fetch = subprocess.Popen([str(cli), "fetch", s.url, *MODEL, "--checksum", *SLOW_FETCH],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_session(s.url)
    s.kill()
    out, err = fetch.communicate(timeout=60)
    assert fetch.returncode == 1, err
    assert out == ""  # Nothing was handed out.
    assert "no peer worked" in err


def test_wrong_key_moves_no_bytes(cli, ckpt, serving):
    s = serving(ckpt, *MODEL)
    r = run(cli, "fetch", s.url, "--model", "tiny", "--revision", "r2", "--fallback", ckpt, "--checksum")
    assert r.returncode == 0, r.stderr
    assert "incompatible: revision: 'r2' (ours) != 'r1' (peer's)" in r.stderr
    assert f"from disk:{ckpt}" in r.stderr
    r = run(cli, "fetch", s.url, "--model", "tiny", "--revision", "r1", "--layout", "w=0", "--checksum")
    assert r.returncode == 1
    assert "layout" in r.stderr


def test_token(cli, ckpt, serving, tmp_path):
    good = tmp_path / "good"
    good.write_text("correct horse\n")
    good.chmod(0o600)
    bad = tmp_path / "bad"
    bad.write_text("battery staple\n")
    bad.chmod(0o600)
    s = serving(ckpt, *MODEL, "--token-file", good)
    r = run(cli, "fetch", s.url, *MODEL, "--checksum")
    assert r.returncode == 1 and "HTTP 401" in r.stderr, r.stderr
    r = run(cli, "fetch", s.url, *MODEL, "--checksum", "--token-file", bad, "--fallback", ckpt)
    assert r.returncode == 0 and "HTTP 401" in r.stderr and f"from disk:{ckpt}" in r.stderr, r.stderr
    r = run(cli, "fetch", s.url, *MODEL, "--checksum", "--token-file", good)
    assert r.returncode == 0, r.stderr
    assert r.stdout == load_checksums(cli, ckpt)
    loose = tmp_path / "loose"
    loose.write_text("x")
    loose.chmod(0o644)
    r = run(cli, "fetch", s.url, *MODEL, "--token-file", loose)
    assert r.returncode == 1 and "chmod 600" in r.stderr, r.stderr


def test_tensor_parallel_sources_serve_another_size(cli, ckpt, serving):
    layout = ["--layout", r"\.w$=0;\.b$=1"]
    s0 = serving(ckpt, *MODEL, *layout, "--tp-size", "2", "--tp-rank", "0")
    s1 = serving(ckpt, *MODEL, *layout, "--tp-size", "2", "--tp-rank", "1")
    # TP=2 -> TP=1: the whole tensors, from both ranks.
    r = run(cli, "fetch", s0.url, s1.url, *MODEL, *layout, "--checksum")
    assert r.returncode == 0, r.stderr
    assert "(2 source ranks)" in r.stderr
    assert r.stdout == load_checksums(cli, ckpt)
    # TP=2 -> TP=4 rank 3: the last quarter of each split dim.
    r = run(cli, "fetch", s0.url, s1.url, *MODEL, *layout, "--tp-size", "4", "--tp-rank", "3", "--checksum")
    assert r.returncode == 0, r.stderr
    got = dict(line.split("\t") for line in r.stdout.splitlines())
    import xxhash
    for f in sorted(ckpt.glob("*.safetensors")):
        for k, v in load_file(str(f)).items():
            if k.endswith(".w"):
                v = v[384:512]
            elif k.endswith(".b"):
                v = v[:, 768:1024]
            raw = v.contiguous().view(torch.uint8).numpy().tobytes() if v.numel() else b""
            assert got[k] == xxhash.xxh3_64_hexdigest(raw), k


ETCD = shutil.which("etcd")


@pytest.fixture
def etcd(tmp_path):
    if ETCD is None:
        pytest.skip("etcd is not installed (Debian etcd-server)")
    client, peer = free_port(), free_port()
    url = f"http://127.0.0.1:{client}"
    proc = subprocess.Popen([ETCD, "--data-dir", str(tmp_path / "etcd"), "--listen-client-urls", url,
                             "--advertise-client-urls", url, "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                             "--initial-cluster", f"default=http://127.0.0.1:{peer}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        try:
            with socket.create_connection(("127.0.0.1", client), timeout=0.5):
                break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                pytest.fail("etcd did not start")
            time.sleep(0.1)
    yield url
    proc.kill()
    proc.wait()


# The registry leases' TTL in seconds: a killed seed's entry goes within it. A live seed renews every
# TTL/3, and its entry lapses only if no renewal reaches etcd for a whole TTL: 5 s, not 2, so that a
# busy machine that holds up the seed or etcd for a second or two cannot drop a live seed.
TTL = "5"


def test_registry_finds_the_seed_and_forgets_a_dead_one(cli, ckpt, serving, etcd):
    s = serving(ckpt, *MODEL, "--registry", etcd, "--registry-ttl", TTL)
    r = run(cli, "fetch", "--registry", etcd, *MODEL, "--checksum")
    assert r.returncode == 0, r.stderr
    assert f"from {s.url}" in r.stderr
    assert r.stdout == load_checksums(cli, ckpt)
    s.kill()  # Its lease is not renewed any more: the entry goes after the TTL.
    wait_for_seeds(etcd, 0)
    r = run(cli, "fetch", "--registry", etcd, *MODEL, "--fallback", ckpt, "--checksum")
    assert r.returncode == 0, r.stderr
    assert "no live seed" in r.stderr, r.stderr
    assert f"from disk:{ckpt}" in r.stderr


def test_registry_down_falls_back(cli, ckpt):
    dead = f"http://127.0.0.1:{free_port()}"
    r = run(cli, "fetch", "--registry", dead, *MODEL, "--fallback", ckpt, "--checksum", "--timeout-ms", "2000")
    assert r.returncode == 0, r.stderr
    assert f"registry {dead}" in r.stderr, r.stderr
    assert f"from disk:{ckpt}" in r.stderr
    assert r.stdout == load_checksums(cli, ckpt)


def _netns_reason():
    if os.geteuid() != 0:
        return "needs root for ip netns"
    if shutil.which("ip") is None:
        return "iproute2 (ip) is not installed"
    name = f"tlprobe{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if r.returncode != 0:
        return f"ip netns add failed: {r.stderr.strip()}"
    r = subprocess.run(["ip", "link", "add", f"tlp{os.getpid() % 10000}a", "type", "veth", "peer", "name",
                        f"tlp{os.getpid() % 10000}b"], capture_output=True, text=True)
    subprocess.run(["ip", "link", "del", f"tlp{os.getpid() % 10000}a"], capture_output=True)
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    if r.returncode != 0:
        return f"veth pairs are not allowed here: {r.stderr.strip()}"
    return None


@pytest.fixture
def two_hosts():
    reason = _netns_reason()
    if reason:
        pytest.skip(reason)
    tag = os.getpid() % 10000
    a, b = f"tlA{tag}", f"tlB{tag}"
    cmds = [["ip", "netns", "add", a], ["ip", "netns", "add", b],
            ["ip", "link", "add", f"va{tag}", "type", "veth", "peer", "name", f"vb{tag}"],
            ["ip", "link", "set", f"va{tag}", "netns", a], ["ip", "link", "set", f"vb{tag}", "netns", b],
            ["ip", "-n", a, "addr", "add", "10.77.0.1/24", "dev", f"va{tag}"],
            ["ip", "-n", b, "addr", "add", "10.77.0.2/24", "dev", f"vb{tag}"],
            ["ip", "-n", a, "link", "set", f"va{tag}", "up"], ["ip", "-n", b, "link", "set", f"vb{tag}", "up"],
            ["ip", "-n", a, "link", "set", "lo", "up"], ["ip", "-n", b, "link", "set", "lo", "up"]]
    try:
        for c in cmds:
            subprocess.run(c, check=True, capture_output=True)
        yield a, b
    finally:
        subprocess.run(["ip", "netns", "del", a], capture_output=True)
        subprocess.run(["ip", "netns", "del", b], capture_output=True)


def test_two_hosts_over_veth(cli, ckpt, serving, two_hosts):
    a, b = two_hosts
    s = serving(ckpt, *MODEL, "--host", "10.77.0.1", "--transports", "tcp", prefix=("ip", "netns", "exec", a))
    assert s.url.startswith("http://10.77.0.1:")
    r = run("ip", "netns", "exec", b, str(cli), "fetch", s.url, *MODEL, "--transports", "tcp", "--checksum")
    assert r.returncode == 0, r.stderr
    assert "fallback:" not in r.stderr, r.stderr
    assert r.stdout == load_checksums(cli, ckpt)


def test_a_striped_fetch_from_a_seed_on_another_capped_host(cli, ckpt, tmp_path):
    """tests/python/cluster.py: a seed on a host whose link is capped at 200 Mbit/s each way, a
    striped fetch on another host from the seed and its local copy at once: the bytes are the
    checkpoint's, each source gave some (every source's first piece is its own), and every process
    and namespace the cluster made is gone after it."""
    import cluster
    why = cluster.reason()
    if why:
        pytest.skip(why)
    ready = tmp_path / "seed-url"
    with cluster.Cluster(2, cap_mbit=[200, None]) as c:
        seed = c.popen(0, [cli, "serve", ckpt, *MODEL, "--host", c.addr(0), "--transports", "tcp", "--no-handover",
                           "--ready-file", ready], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert seed.poll() is None, seed.stderr.read().decode()
            assert time.monotonic() < deadline, "the seed did not start"
            time.sleep(0.05)
        url = ready.read_text().strip()
        assert url.startswith(f"http://{c.addr(0)}:")
        r = c.run(1, [cli, "fetch", url, *MODEL, "--stripe", "--stripe-cached", "--fallback", ckpt, "--transports",
                      "tcp", "--checksum"], env=dict(os.environ, UCX_TLS="tcp"))
        assert r.returncode == 0, r.stderr
        assert r.stdout == load_checksums(cli, ckpt)
        assert "2 source(s) at once, every chunk checked" in r.stderr, r.stderr
        given = dict(re.findall(r"^  (\S+): (\d+) bytes in \d+ ranges$", r.stderr, re.M))
        assert sorted(given) == sorted([url, f"disk:{ckpt}"]), r.stderr
        assert all(int(b) > 0 for b in given.values()), r.stderr
        names = c.names + [c.bridge]
    assert seed.poll() is not None
    assert c.namespaces_left() == []
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(n in listed.split() for n in names)


def test_fetched_instance_becomes_a_seed(cli, ckpt, serving, etcd, tmp_path):
    a = serving(ckpt, *MODEL, "--registry", etcd, "--registry-ttl", TTL)
    ready = tmp_path / "seed-url"
    b = subprocess.Popen([str(cli), "fetch", "--registry", etcd, *MODEL, "--seed", "--registry-ttl", TTL,
                          "--ready-file", str(ready)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert b.poll() is None, b.stderr.read()
            assert time.monotonic() < deadline, "fetch --seed did not start serving"
            time.sleep(0.05)
        seed_url = ready.read_text().strip()
        assert seed_url != a.url
        a.kill()  # The original seed goes; its lease expires.
        wait_for_seeds(etcd, 1)
        r = run(cli, "fetch", "--registry", etcd, *MODEL, "--checksum")
        assert r.returncode == 0, r.stderr
        assert f"from {seed_url}" in r.stderr, r.stderr
        assert r.stdout == load_checksums(cli, ckpt)
    finally:
        b.send_signal(signal.SIGTERM)
        out, err = b.communicate(timeout=30)
    assert b.returncode == 0, err
    assert f"seeding at {seed_url}" in out


def test_sessions_move_to_a_fresh_worker_every_clients_per_worker(cli, ckpt, serving):
    """UCX remembers every client a worker has met until the worker goes: the seed hands each
    worker --clients-per-worker sessions, then a fresh one (the manifest names it), and every
    fetch still gets the checkpoint."""
    s = serving(ckpt, *MODEL, "--clients-per-worker", "2")

    def session():
        req = urllib.request.Request(s.url + "/v1/session", data=b"", method="POST")
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.headers["X-Tensorlift-Session"], json.loads(r.read())["worker_address"]

    opened = [session() for _ in range(3)]
    assert opened[0][1] == opened[1][1] != opened[2][1]
    for sid, _ in opened:
        req = urllib.request.Request(f"{s.url}/v1/session/{sid}", data=b"0", method="DELETE")
        urllib.request.urlopen(req, timeout=10).read()
    want = load_checksums(cli, ckpt)
    for _ in range(3):
        r = run(cli, "fetch", s.url, *MODEL, "--checksum")
        assert r.returncode == 0, r.stderr
        assert "fallback:" not in r.stderr
        assert r.stdout == want
    r = run(cli, "serve", ckpt, *MODEL, "--clients-per-worker", "-1")
    assert r.returncode != 0 and "--clients-per-worker" in r.stderr, r.stderr
