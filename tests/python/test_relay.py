"""Relaying pullers (docs/remote.md, "Relaying") on a cluster of namespaces (cluster.py): a root
seed and etcd on host 0, receivers on the other hosts, every link capped. Every receiver gets the
checkpoint's bytes; the relays feed each other (each receiver after the first takes from a relay,
and the root's link sends about one checkpoint); a relay killed half way, one that serves
corrupted chunks, and etcd restarted mid-transfer all end in the right bytes, with no disk
fallback (none is given). Where bytes came from is read from each fetch's report."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import save_file

from tensorlift._tensorlift import ucx_version

import cluster

pytestmark = pytest.mark.skipif(ucx_version() is None, reason="tensorlift was built without UCX (Debian libucx-dev)")

MODEL = ["--model", "relayed", "--revision", "r1"]
CAP = 100  # Mbit/s each way: 24 MiB take about 2 s a pull.


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """24 MiB in 12 tensors of 2 MiB (served in chunks of 128 KiB: AutoChunkBytes)."""
    d = tmp_path_factory.mktemp("relay_ckpt")
    g = torch.Generator().manual_seed(11)
    save_file({f"layers.{i}.w": torch.randn(512, 1024, generator=g) for i in range(12)},
              str(d / "model.safetensors"))
    return d


@pytest.fixture(scope="module")
def want(cli, ckpt):
    r = subprocess.run([str(cli), "load", str(ckpt), "--checksum", "--no-progress"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.fixture()
def newer_ucx(monkeypatch):
    """The fault tests kill and cut off relays on purpose. UCX 1.13 (Debian's) can abort a source
    whose client goes at the wrong moment (docs/security.md); with PyPI's UCX (scripts/test.sh
    names it in TENSORLIFT_TEST_UCX_LIB) every process here loads that one instead."""
    lib = os.environ.get("TENSORLIFT_TEST_UCX_LIB")
    if lib:
        monkeypatch.setenv("TENSORLIFT_UCX_LIB", lib)


@pytest.fixture()
def hosts():
    why = cluster.reason()
    if why:
        pytest.skip(why)
    with cluster.Cluster(5, cap_mbit=CAP) as c:
        yield c
    assert c.namespaces_left() == []


def start_root(c, cli, ckpt, tmp_path, etcd, handover=False):
    ready = tmp_path / "root-url"
    log = open(tmp_path / "root.log", "w")
    root = c.popen(0, [cli, "serve", ckpt, *MODEL, "--host", c.addr(0), "--transports", "tcp",
                       *([] if handover else ["--no-handover"]), "--registry", etcd, "--ready-file", ready],
                   stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + 60
    while not ready.exists() or not ready.read_text().strip():
        assert root.poll() is None, (tmp_path / "root.log").read_text()
        assert time.monotonic() < deadline, "the root seed did not start"
        time.sleep(0.05)
    return root, ready.read_text().strip()


def start_receivers(c, cli, etcd, hosts, env=None):
    procs = {}
    for i in hosts:
        procs[i] = c.popen(i, [cli, "fetch", "--registry", etcd, *MODEL, "--transports", "tcp", "--handover", "off",
                               "--no-local", "--seed-host", c.addr(i), "--checksum", "--timeout-ms", "5000"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=dict(os.environ, UCX_TLS="tcp", **(env or {}).get(i, {})))
    return procs


def finish(procs, timeout=180):
    out = {}
    for i, p in procs.items():
        try:
            o, e = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stacks = subprocess.run(["gdb", "-batch", "-p", str(p.pid), "-ex", "thread apply all bt"],
                                    capture_output=True, text=True, timeout=120).stdout \
                if shutil.which("gdb") else "(no gdb)"
            os.killpg(p.pid, signal.SIGTERM)  # fetch stops its pulls and says where it was
            try:
                o, e = p.communicate(timeout=40)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                o, e = p.communicate()
            raise AssertionError(f"receiver {i} not done in {timeout} s: {e}\n{stacks}")
        out[i] = (p.returncode, o, e)
    return out


def given(err):
    """{source URL: bytes} from a relaying fetch's report."""
    return {url: int(n) for url, n in re.findall(r"^  (http://\S+): (\d+) bytes", err, re.M)}


def tx_bytes(c, host):
    r = subprocess.run(["ip", "-n", c.names[host], "-s", "-j", "link", "show", "eth0"], capture_output=True,
                       text=True, check=True)
    return json.loads(r.stdout)[0]["stats64"]["tx"]["bytes"]


def test_four_receivers_relay_to_each_other_and_the_root_sends_about_one_checkpoint(cli, ckpt, want, hosts,
                                                                                    tmp_path):
    c = hosts
    etcd = c.etcd(0)
    _, root_url = start_root(c, cli, ckpt, tmp_path, etcd)
    tx0 = tx_bytes(c, 0)
    results = finish(start_receivers(c, cli, etcd, [1, 2, 3, 4]))
    sent = tx_bytes(c, 0) - tx0
    from_relays = 0
    for i, (rc, out, err) in results.items():
        assert rc == 0, err
        assert out == want, f"receiver {i}: {err}"
        assert "relayed at http://" + c.addr(i) + ":" in err, err
        g = given(err)
        assert sum(g.values()) == os.path.getsize(ckpt / "model.safetensors") - _header_bytes(ckpt), err
        if any(n > 0 for url, n in g.items() if url != root_url):
            from_relays += 1
    # The first to register takes from the root; each of the others from the relay before it.
    assert from_relays == 3, results
    tensor_bytes = 24 << 20
    assert sent <= 1.5 * tensor_bytes, f"the root's link sent {sent} bytes for a {tensor_bytes}-byte checkpoint"


def _header_bytes(ckpt):
    with open(ckpt / "model.safetensors", "rb") as f:
        return 8 + int.from_bytes(f.read(8), "little")


def wait_progress(c, etcd, at_least, count=1, timeout=60):
    """Until `count` relays are registered and one says it has `at_least` of its bytes; the relays'
    entries."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        relays = [(v, rev) for v, rev in c.seed_entries(etcd) if v.get("partial")]
        if len(relays) >= count and any(v["progress"] >= at_least for v, _ in relays):
            return relays
        time.sleep(0.05)
    raise AssertionError(f"no relay reached {at_least}: {c.seed_entries(etcd)}")


def test_a_relay_killed_half_way_its_children_re_attach_and_every_other_receiver_finishes(
        cli, ckpt, want, newer_ucx, hosts, tmp_path):
    c = hosts
    etcd = c.etcd(0)
    _, root_url = start_root(c, cli, ckpt, tmp_path, etcd)
    procs = start_receivers(c, cli, etcd, [1, 2, 3, 4])
    # The second relay to register, once the first is a third of the way: it has a child.
    relays = sorted(wait_progress(c, etcd, 0.3, count=4), key=lambda e: e[1])
    assert len(relays) == 4, relays
    victim_url = relays[1][0]["url"]
    victim = next(i for i in procs if f"//{c.addr(i)}:" in victim_url)
    # SIGTERM (then SIGKILL after 10 s): fetch stops its pulls cleanly (StopPeerPulls), the gets
    # in flight landing first, so that its parent, a source, is not left replying into a closed
    # connection (UCX's software RMA aborted it then: docs/security.md).
    stopped = procs.pop(victim)
    c.stop(stopped)
    _, stopped_err = stopped.communicate(timeout=30)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped_err
    assert "stopped (signal 15)" in stopped_err, stopped_err
    results = finish(procs)
    child_re_attached = False
    for i, (rc, out, err) in results.items():
        assert rc == 0, f"receiver {i} (killed: {victim_url}): {err}"
        assert out == want, f"receiver {i}: {err}"
        assert "fallback:" not in err or "no peer worked" not in err, err
        g = given(err)
        if victim_url in g and re.search(re.escape(victim_url) + r": \d+ bytes, dropped: ", err):
            child_re_attached = True
            assert any(n > 0 for url, n in g.items() if url != victim_url), err
    assert child_re_attached, f"killed {victim_url}: " + "\n".join(e for _, _, e in results.values())


def test_a_relay_cut_off_half_way_its_children_re_attach_and_every_other_receiver_finishes(
        cli, ckpt, want, newer_ucx, hosts, tmp_path):
    """A partition (every packet to and from the relay's host dropped): its child's gets stall and
    its chunk map cannot be read; after the time-out the child takes from the holder before."""
    c = hosts
    etcd = c.etcd(0)
    start_root(c, cli, ckpt, tmp_path, etcd)
    procs = start_receivers(c, cli, etcd, [1, 2, 3, 4])
    relays = sorted(wait_progress(c, etcd, 0.3, count=4), key=lambda e: e[1])
    victim_url = relays[1][0]["url"]
    victim = next(i for i in procs if f"//{c.addr(i)}:" in victim_url)
    c.partition(victim)
    cut_off = procs.pop(victim)
    results = finish(procs)
    went_on = False
    for i, (rc, out, err) in results.items():
        assert rc == 0, f"receiver {i} (cut off: {victim_url}): {err}"
        assert out == want, f"receiver {i}: {err}"
        g = given(err)
        # Its child dropped it, or took the rest from a second source (the holder before it,
        # probed as the cut-off parent stopped giving) and finished before dropping it.
        went_on |= bool(re.search(re.escape(victim_url) + r": \d+ bytes, dropped: ", err)) or (
            g.get(victim_url, 0) > 0 and any(n > 0 for url, n in g.items() if url != victim_url))
    assert went_on, f"cut off {victim_url}: " + "\n".join(e for _, _, e in results.values())
    c.stop(cut_off)


def test_a_relay_serving_corrupted_chunks_is_dropped_and_the_loads_get_the_right_bytes(
        cli, ckpt, want, newer_ucx, hosts, tmp_path):
    c = hosts
    etcd = c.etcd(0)
    start_root(c, cli, ckpt, tmp_path, etcd)
    # Host 1 registers first (it is started first and alone): it relays corrupted chunks.
    liar = start_receivers(c, cli, etcd, [1], env={1: {"TENSORLIFT_RELAY_FAULTS": "corrupt"}})
    wait_progress(c, etcd, 0.0)
    procs = start_receivers(c, cli, etcd, [2, 3, 4])
    results = finish(procs)
    liar_url = None
    for i, (rc, out, err) in results.items():
        assert rc == 0, err
        assert out == want, f"receiver {i}: {err}"
        for url, n in given(err).items():
            if f"//{c.addr(1)}:" in url:
                liar_url = url
                assert re.search(re.escape(url) + r": \d+ bytes, dropped: .*(checksum|XXH3|mismatch)", err, re.I), err
    assert liar_url is not None, results
    finish(liar)


def test_a_relay_behind_a_slower_link_goes_to_the_chains_end(cli, ckpt, want, hosts, tmp_path):
    """A relay that finds itself behind its parent (sources/relay.h, BehindRule) says so in its entry
    (TENSORLIFT_RELAY_FAULTS=behind says it at once): the relays registered after it order it after
    themselves, so none takes from it, and it takes from them, whose uploads are free."""
    c = hosts
    etcd = c.etcd(0)
    start_root(c, cli, ckpt, tmp_path, etcd)
    slow = start_receivers(c, cli, etcd, [1], env={1: {"TENSORLIFT_RELAY_FAULTS": "behind"}})
    deadline = time.monotonic() + 60
    while not any(v.get("behind") for v, _ in c.seed_entries(etcd)):
        assert time.monotonic() < deadline, c.seed_entries(etcd)
        time.sleep(0.05)
    results = finish(start_receivers(c, cli, etcd, [2, 3, 4]))
    results.update(finish(slow))
    urls, moved = {}, {}
    for i, (rc, out, err) in results.items():
        assert rc == 0, err
        assert out == want, f"receiver {i}: {err}"
        relay = re.search(r"relayed at (http://\S+?)( \(behind its parent: moved to the chain's end\))?;", err)
        assert relay, err
        urls[i] = relay.group(1)
        moved[i] = bool(relay.group(2))
    assert moved[1], results[1][2]
    # Those that did not move too (a relay stalled on this busy machine might) never took from it.
    for i in (2, 3, 4):
        if not moved[i]:
            assert given(results[i][2]).get(urls[1], 0) == 0, results[i][2]
    assert any(given(results[1][2]).get(urls[i], 0) > 0 for i in (2, 3, 4)), results[1][2]


def test_the_root_killed_the_relays_finish_among_themselves_where_the_bytes_exist(cli, ckpt, want, newer_ucx,
                                                                                   tmp_path):
    """Receiver 1 (a fast link) registers first and has every byte while the three after it
    (links at a quarter) have about a quarter: the root seed is killed then, and they finish from
    the relays, none falling back (none is given)."""
    why = cluster.reason()
    if why:
        pytest.skip(why)
    with cluster.Cluster(5, cap_mbit=[CAP, CAP, CAP / 4, CAP / 4, CAP / 4]) as c:
        etcd = c.etcd(0)
        root, _ = start_root(c, cli, ckpt, tmp_path, etcd)
        first = start_receivers(c, cli, etcd, [1])
        wait_progress(c, etcd, 0.0)
        procs = start_receivers(c, cli, etcd, [2, 3, 4])
        deadline = time.monotonic() + 60
        while not any(not v.get("partial") and f"//{c.addr(1)}:" in v["url"] for v, _ in c.seed_entries(etcd)):
            assert time.monotonic() < deadline, c.seed_entries(etcd)
            time.sleep(0.05)
        behind = [v["progress"] for v, _ in c.seed_entries(etcd) if v.get("partial")]
        c.stop(root)
        results = finish(procs)
        for i, (rc, out, err) in results.items():
            assert rc == 0, f"receiver {i} (the root killed, the others at {behind}): {err}"
            assert out == want, f"receiver {i}: {err}"
            assert "relayed at" in err and "fallback" not in err, err
        assert len(behind) == 3 and max(behind) < 0.9, behind  # they had most of it still to come
        finish(first)
    assert c.namespaces_left() == []


def test_the_root_killed_before_any_relay_had_everything_the_pulls_fall_back(cli, ckpt, want, hosts, tmp_path):
    """The root seed killed when the first relay has a third: the bytes after that exist nowhere,
    so every pull falls back as it would without relaying (to --fallback, the local copy)."""
    c = hosts
    etcd = c.etcd(0)
    root, _ = start_root(c, cli, ckpt, tmp_path, etcd)
    procs = {}
    for i in (1, 2, 3):
        procs[i] = c.popen(i, [cli, "fetch", "--registry", etcd, *MODEL, "--transports", "tcp", "--handover",
                               "off", "--no-local", "--seed-host", c.addr(i), "--checksum", "--timeout-ms", "3000",
                               "--fallback", ckpt], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=dict(os.environ, UCX_TLS="tcp"))
    wait_progress(c, etcd, 0.3, count=3)
    c.stop(root)
    for i, (rc, out, err) in finish(procs).items():
        assert rc == 0, f"receiver {i}: {err}"
        assert out == want, f"receiver {i}: {err}"
        fetched = [x for x in err.splitlines() if x.startswith("fetched ")]
        assert len(fetched) == 1 and f"from disk:{ckpt} " in fetched[0], err  # from the local copy


def test_the_registry_restarted_mid_transfer_the_transfers_go_on(cli, ckpt, want, newer_ucx, hosts, tmp_path):
    c = hosts
    etcd = c.etcd(0)
    start_root(c, cli, ckpt, tmp_path, etcd)
    procs = start_receivers(c, cli, etcd, [1, 2, 3, 4])
    wait_progress(c, etcd, 0.2, count=4)
    c.stop(c.etcd_process())
    time.sleep(1)
    c.restart_etcd()
    results = finish(procs)
    relayed = 0
    for i, (rc, out, err) in results.items():
        assert rc == 0, err
        assert out == want, f"receiver {i}: {err}"
        relayed += "relayed at" in err
    assert relayed == 4, results


def test_a_root_seed_on_the_receivers_host_is_handed_over_and_one_on_another_host_relayed(cli, ckpt, want, hosts,
                                                                                        tmp_path):
    """A root seed that hands its memory over: a fetch on its host (its network namespace) maps
    it, with nothing relayed; a fetch on another host (the handover's socket out of reach)
    relays as before. Both with the default --handover auto."""
    c = hosts
    etcd = c.etcd(0)
    _, root_url = start_root(c, cli, ckpt, tmp_path, etcd, handover=True)
    argv = [cli, "fetch", "--registry", etcd, *MODEL, "--transports", "tcp", "--no-local", "--checksum"]
    here = c.run(0, argv, env=dict(os.environ, UCX_TLS="tcp"), timeout=120)
    assert here.returncode == 0, here.stderr
    assert here.stdout == want
    assert f"from {root_url} (1 source ranks, handed over)" in here.stderr, here.stderr
    assert "relayed at" not in here.stderr and "relaying pull" not in here.stderr, here.stderr
    there = c.run(1, [*argv, "--seed-host", c.addr(1)], env=dict(os.environ, UCX_TLS="tcp"), timeout=120)
    assert there.returncode == 0, there.stderr
    assert there.stdout == want
    assert "relayed at" in there.stderr and "handed over" not in there.stderr, there.stderr
    assert given(there.stderr) == {root_url: 24 << 20}, there.stderr


PY_RECEIVER = """
import json, sys, torch
from safetensors.torch import load_file
from tensorlift import remote
etcd, ckpt, host = sys.argv[1], sys.argv[2], sys.argv[3]
got = remote.load_from_peer(model="relayed", revision="r1", registry=etcd, transports="tcp", handover="off",
                            seed_host=host)
want = load_file(ckpt + "/model.safetensors")
assert sorted(got) == sorted(want)
assert all(torch.equal(got[k], want[k]) for k in want)
r = remote.last_report()
print(json.dumps({"relay": r["relay"], "relay_behind": r["relay_behind"], "sources": r["sources"]}))
"""


def test_load_from_peer_relays_from_python_and_says_what_each_source_gave(cli, ckpt, want, hosts, tmp_path):
    """Python's load_from_peer with a registry relays by default: the second receiver (Python)
    takes from the first (the CLI), and last_report() names its relay and each source's bytes."""
    c = hosts
    etcd = c.etcd(0)
    _, root_url = start_root(c, cli, ckpt, tmp_path, etcd)
    first = start_receivers(c, cli, etcd, [1])
    wait_progress(c, etcd, 0.0)
    r = c.run(2, [sys.executable, "-c", PY_RECEIVER, etcd, ckpt, c.addr(2)],
              env=dict(os.environ, UCX_TLS="tcp"), timeout=180)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout.strip().splitlines()[-1])
    assert report["relay"].startswith(f"http://{c.addr(2)}:"), report
    assert isinstance(report["relay_behind"], bool), report  # Moved to the chain's end (BehindRule).
    by = {s["url"]: s["bytes"] for s in report["sources"]}
    relays = [u for u in by if f"//{c.addr(1)}:" in u]
    assert relays and by[relays[0]] > 0, report
    assert sum(by.values()) == 24 << 20, report
    rc, out, err = finish(first)[1]
    assert rc == 0 and out == want, err
