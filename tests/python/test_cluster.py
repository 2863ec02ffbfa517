"""tests/python/cluster.py, the cluster of namespaces relaying tests and benchmarks run on: a
partition cuts a host off and heals, random loss drops some packets and not all, an etcd in one
host is reached from the others and keeps its data across a restart, and nothing the cluster
made is left behind."""
import json
import subprocess
import sys
import textwrap

import pytest

import cluster

ASK = textwrap.dedent("""
    import base64, json, sys, urllib.request
    url, op = sys.argv[1], sys.argv[2]
    if op == "put":
        body = {"key": base64.b64encode(b"tl-test").decode(), "value": base64.b64encode(b"kept").decode()}
        path = "/v3/kv/put"
    else:
        body = {"key": base64.b64encode(b"tl-test").decode()}
        path = "/v3/kv/range"
    try:
        r = urllib.request.urlopen(urllib.request.Request(url + path, data=json.dumps(body).encode()), timeout=2)
        kvs = json.loads(r.read()).get("kvs", [])
        print(json.dumps([base64.b64decode(kv["value"]).decode() for kv in kvs]))
    except OSError as e:
        print(json.dumps({"error": str(e)}))
""")

COUNT = textwrap.dedent("""
    import socket, sys
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((sys.argv[1], 9999))
    s.settimeout(5)
    print("ready", flush=True)
    got = 0
    try:
        while True:
            data, _ = s.recvfrom(64)
            if data == b"end":
                break
            got += 1
    except socket.timeout:
        pass
    print(got)
""")

SEND = textwrap.dedent("""
    import socket, sys, time
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    def send(data):
        try:
            s.sendto(data, (sys.argv[1], 9999))
        except PermissionError:  # A packet the sender's own output rule dropped.
            pass

    for i in range(int(sys.argv[2])):
        send(b"x")
        time.sleep(0.001)
    for _ in range(50):
        send(b"end")
        time.sleep(0.01)
""")


@pytest.fixture()
def three():
    why = cluster.reason()
    if why:
        pytest.skip(why)
    with cluster.Cluster(3, cap_mbit=100) as c:
        yield c
    assert c.namespaces_left() == []


def ask(c, host, url, op="get"):
    r = c.run(host, [sys.executable, "-c", ASK, url, op], timeout=30)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_etcd_in_one_host_answers_the_others_until_partitioned_and_keeps_its_data(three):
    c = three
    url = c.etcd(0)
    assert url.startswith(f"http://{c.addr(0)}:")
    assert ask(c, 1, url, "put") == []
    assert ask(c, 2, url) == ["kept"]
    c.partition(1)
    assert "error" in ask(c, 1, url)
    assert ask(c, 2, url) == ["kept"]  # The other hosts still reach it.
    c.heal(1)
    assert ask(c, 1, url) == ["kept"]
    c.stop(c.etcd_process())
    assert "error" in ask(c, 2, url)
    c.restart_etcd()
    assert ask(c, 2, url) == ["kept"]  # Its data survived the restart.


def test_random_loss_drops_some_packets_and_not_all(three):
    c = three
    sent = 400

    def received():
        counter = c.popen(2, [sys.executable, "-c", COUNT, c.addr(2)], stdout=subprocess.PIPE, text=True)
        assert counter.stdout.readline() == "ready\n"  # Bound before the first packet is sent.
        r = c.run(1, [sys.executable, "-c", SEND, c.addr(2), str(sent)], timeout=60)
        assert r.returncode == 0, r.stderr
        out = counter.stdout.read()
        assert counter.wait(timeout=30) == 0
        return int(out)

    assert received() == sent  # No loss set: the cluster's links lose nothing at this rate.
    c.set_loss(1, 30)
    ruleset = subprocess.run(["ip", "netns", "exec", c.names[1], "nft", "list", "ruleset"], capture_output=True,
                             text=True).stdout
    assert "numgen random mod 100 < 30" in ruleset
    got = received()
    # 30 % of 400 dropped at random: 280 expected, sd ~9; these bounds are 10 sd away.
    assert 180 < got < 380, got
    c.set_loss(1, 0)
    assert "tlloss" not in subprocess.run(["ip", "netns", "exec", c.names[1], "nft", "list", "ruleset"],
                                          capture_output=True, text=True).stdout
