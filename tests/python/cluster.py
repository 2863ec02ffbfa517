"""A cluster on one machine: hosts as network namespaces, for tests and benchmarks of loads
between hosts (peers, buckets, striped loads).

    with Cluster(3, cap_mbit=400) as c:
        seed = c.popen(0, [cli, "serve", ckpt, "--host", c.addr(0), "--transports", "tcp", ...])
        r = c.run(1, [cli, "fetch", url, ...])

Each host is a namespace of its own (`tl<tag>h<i>`) with one veth into a bridge that lives in
a namespace of its own (`tl<tag>br`), addresses 10.77.0.<i+1>/24 (they exist only inside the
cluster's namespaces, so clusters of concurrent tests do not collide), loopback up. With
`cap_mbit` (a number for every host, or a list with one per host, None for an uncapped one),
each link is rate-capped in both directions with a token bucket (`tc ... tbf`): the host's side
caps what it sends, the bridge's side what it receives (segmentation offloads on: tbf shapes
GSO segments, at a fraction of the CPU that shaping each 1500-byte packet costs; the bridge
skips the host's netfilter, as a switch costs its hosts nothing). Processes started on a host
(`popen`, `run`) get their own IPC namespace and their own /dev/shm (`unshare --ipc --mount`),
so that nothing on one host reaches another through shared memory (UCX would otherwise pick
shared memory between processes of one machine and bypass the caps); pass `--transports tcp`
to UCX users as well.

Faults: `set_loss(i, percent)` drops that share of the packets host i receives and sends (an
nftables `numgen random` rule in its namespace: this kernel has no netem; the link's offloads
are off meanwhile, so that each wire packet is dropped alone); `partition(i)` is
100 %, `heal(i)` 0 %. `loss=` at construction sets it for every host (a number, or one per host).
`etcd(i)` starts a real etcd listening on host i's address (reachable from every host) and
returns its URL; `stop(p)` and `restart_etcd()` kill and start it again with its data.

Every process started is stopped by its process group at close (SIGTERM, then SIGKILL), and
every namespace made is deleted, also when the caller fails. `reason()` says why a cluster
cannot be made here (not root, no iproute2 or tc, namespaces or veth refused), else None.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

SUBNET = "10.77.0"

# Run inside a host's namespace by Cluster.seed_entries: etcd's v3 JSON gateway, every key under
# /tensorlift/seeds/.
_SEED_ENTRIES = """
import base64, json, sys, urllib.request
prefix = "/tensorlift/seeds/"
end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
body = json.dumps({"key": base64.b64encode(prefix.encode()).decode(),
                   "range_end": base64.b64encode(end.encode()).decode()}).encode()
reply = json.loads(urllib.request.urlopen(urllib.request.Request(sys.argv[1] + "/v3/kv/range", data=body),
                                          timeout=5).read())
print(json.dumps([(json.loads(base64.b64decode(kv["value"])), int(kv["create_revision"]))
                  for kv in reply.get("kvs", [])]))
"""


def _run(argv, check=True):
    r = subprocess.run(argv, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip() or r.stdout.strip()}")
    return r


def reason():
    """Why a cluster cannot be made on this machine, or None."""
    if os.geteuid() != 0:
        return "needs root for ip netns"
    for tool in ("ip", "tc", "unshare", "nft"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    try:
        with Cluster(2, cap_mbit=100):
            pass
    except RuntimeError as e:
        return f"namespaces, veth pairs or tc refused here: {e}"
    return None


class Cluster:
    def __init__(self, hosts, cap_mbit=None, tag=None, loss=None):
        if hosts < 1 or hosts > 200:
            raise ValueError("hosts must be 1..200")
        self.hosts = hosts
        caps = cap_mbit if isinstance(cap_mbit, (list, tuple)) else [cap_mbit] * hosts
        if len(caps) != hosts:
            raise ValueError("cap_mbit: one per host")
        self.caps = list(caps)
        self.losses = list(loss if isinstance(loss, (list, tuple)) else [loss] * hosts)
        if len(self.losses) != hosts:
            raise ValueError("loss: one per host")
        self._etcd = None  # (host, argv, process) of etcd()
        self.tag = tag if tag is not None else f"{os.getpid() % 100000}{int(time.monotonic() * 1000) % 1000}"
        self.bridge = f"tl{self.tag}br"
        self.names = [f"tl{self.tag}h{i}" for i in range(hosts)]
        self.made = []   # namespaces made, deleted at close
        self.procs = []  # every process started, stopped at close
        try:
            self._make()
        except BaseException:
            self.close()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def addr(self, i):
        """Host i's address (it exists only inside the cluster)."""
        return f"{SUBNET}.{i + 1}"

    def _netns(self, name):
        _run(["ip", "netns", "add", name])
        self.made.append(name)
        _run(["ip", "-n", name, "link", "set", "lo", "up"])

    def _make(self):
        self._netns(self.bridge)
        _run(["ip", "-n", self.bridge, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", self.bridge, "link", "set", "br0", "up"])
        # A switch costs its hosts no CPU: frames crossing the bridge skip the host's netfilter
        # (on where br_netfilter is loaded, e.g. by Docker; its sysctls are per namespace).
        for table in ("iptables", "ip6tables", "arptables"):
            _run(["ip", "netns", "exec", self.bridge, "sysctl", "-qw", f"net.bridge.bridge-nf-call-{table}=0"],
                 check=False)
        for i, ns in enumerate(self.names):
            self._netns(ns)
            # Made inside the namespaces, so the names need only be unique within each.
            _run(["ip", "link", "add", "name", "eth0", "netns", ns, "type", "veth", "peer", "name", f"p{i}",
                  "netns", self.bridge])
            _run(["ip", "-n", self.bridge, "link", "set", f"p{i}", "master", "br0", "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{self.addr(i)}/24", "dev", "eth0"])
            _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
            if self.caps[i]:
                self._cap(ns, "eth0", self.caps[i])
                self._cap(self.bridge, f"p{i}", self.caps[i])
        for i, percent in enumerate(self.losses):
            if percent:
                self.set_loss(i, percent)

    def _cap(self, ns, dev, mbit):
        # burst: at least 1 ms of traffic and 256 KiB, so that a GSO segment (up to 64 KiB, what
        # the veth hands tbf with segmentation offloads on) is shaped whole, never split into
        # wire-sized packets; latency bounds the queue. Shaping 1500-byte packets instead cost 2
        # CPUs 85-90 % in the kernel at 8 links x 200 Mbit/s (a VM's timer interrupts), enough
        # to slow what was measured; the rate holds as well either way (one pull's time at 200
        # Mbit/s: 5.64 s with, 5.65 s without).
        rate = int(mbit * 1e6)
        burst = max(256 << 10, rate // 8 // 1000)
        _run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate",
              f"{rate}bit", "burst", str(burst), "latency", "50ms"])

    def _offloads(self, i, on):
        # Host i's link, both ends: segmentation offloads on (GSO segments cross the bridge and
        # tbf whole), or off (each wire packet alone: what a loss rule drops one at a time).
        flag = "on" if on else "off"
        for ns, dev in ((self.names[i], "eth0"), (self.bridge, f"p{i}")):
            _run(["ip", "netns", "exec", ns, "ethtool", "-K", dev, "tso", flag, "gso", flag, "gro", flag],
                 check=False)

    def set_loss(self, i, percent):
        """Host i drops `percent` % of the packets it receives and of those it sends, each at
        random (0: none; 100: host i is cut off, a partition). Replaces what was set before."""
        if not 0 <= percent <= 100:
            raise ValueError("percent must be 0..100")
        ns = self.names[i]
        _run(["ip", "netns", "exec", ns, "nft", "delete", "table", "inet", "tlloss"], check=False)
        # A share of the packets is dropped one wire packet at a time, not 64 KiB GSO segments.
        self._offloads(i, on=percent in (0, 100))
        if percent == 0:
            return
        rules = ["add table inet tlloss"]
        cond = "" if percent >= 100 else f"numgen random mod 100 < {int(percent)} "
        for chain, hook, dev in (("in", "input", "iif"), ("out", "output", "oif")):
            rules.append(f"add chain inet tlloss {chain} {{ type filter hook {hook} priority 0 ; }}")
            # Loopback stays whole: a host's own processes still reach each other.
            rules.append(f"add rule inet tlloss {chain} {dev} != lo {cond}drop")
        r = subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input="\n".join(rules) + "\n",
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"nft on {ns}: {r.stderr.strip()}")

    def partition(self, i):
        """Cuts host i off from every other host (its processes keep running)."""
        self.set_loss(i, 100)

    def heal(self, i):
        self.set_loss(i, 0)

    def etcd(self, i, port=2379):
        """Starts etcd on host i, listening on its address (and loopback), with its data in a
        directory of its own; returns "http://ADDR:PORT" once it answers. Stopped at close."""
        import tempfile
        exe = shutil.which("etcd")
        if exe is None:
            raise RuntimeError("etcd is not installed (Debian etcd-server)")
        if self._etcd is not None:
            raise RuntimeError("one etcd per cluster")
        data = tempfile.mkdtemp(prefix="tl-cluster-etcd-")
        url = f"http://{self.addr(i)}:{port}"
        peer = f"http://127.0.0.1:{port + 1}"
        argv = [exe, "--data-dir", data, "--listen-client-urls", f"{url},http://127.0.0.1:{port}",
                "--advertise-client-urls", url, "--listen-peer-urls", peer, "--initial-advertise-peer-urls",
                peer, "--initial-cluster", f"default={peer}"]
        self._etcd = [i, argv, None, data, url]
        self.restart_etcd()
        return url

    def restart_etcd(self):
        """Starts the cluster's etcd again (after `stop`), with the data it had; waits until it
        answers."""
        i, argv, old, data, url = self._etcd
        if old is not None:
            self._stop(old)
        p = self.popen(i, argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._etcd[2] = p
        deadline = time.monotonic() + 60
        while True:
            r = subprocess.run(["ip", "netns", "exec", self.names[i], "bash", "-c",
                                f"exec 3<>/dev/tcp/{self.addr(i)}/{url.rsplit(':', 1)[1]}"],
                               capture_output=True)
            if r.returncode == 0:
                return p
            if p.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"etcd on host {i} did not start")
            time.sleep(0.1)

    def seed_entries(self, etcd_url, host=0):
        """The tensorlift registry entries in the cluster's etcd, each (value as a dict, etcd's
        create_revision), asked from `host` (the cluster's addresses exist only in its namespaces)."""
        r = subprocess.run(["ip", "netns", "exec", self.names[host], sys.executable, "-c", _SEED_ENTRIES,
                            etcd_url], capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise RuntimeError(f"registry entries from {etcd_url}: {r.stderr.strip()}")
        return json.loads(r.stdout)

    def etcd_process(self):
        """The running etcd's Popen (for `stop`), or None."""
        return self._etcd[2] if self._etcd else None

    def wrap(self, i, argv):
        """argv run on host i: its network namespace, an IPC namespace and a /dev/shm of its own."""
        return ["ip", "netns", "exec", self.names[i], "unshare", "--ipc", "--mount", "--propagation", "private",
                "sh", "-c", 'mount -t tmpfs -o size=1g tmpfs /dev/shm && exec "$@"', "sh"] + [str(a) for a in argv]

    def popen(self, i, argv, **kw):
        """Starts argv on host i in a process group of its own; stopped at close."""
        kw.setdefault("stdin", subprocess.DEVNULL)
        p = subprocess.Popen(self.wrap(i, argv), start_new_session=True, **kw)
        self.procs.append(p)
        return p

    def run(self, i, argv, timeout=300, **kw):
        """argv on host i to its end (killed with its group after `timeout` s); a CompletedProcess."""
        p = self.popen(i, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._stop(p)
            out, err = p.communicate()
            err += f"\n(killed after {timeout} s)"
        return subprocess.CompletedProcess(p.args, p.returncode, out, err)

    @staticmethod
    def _stop(p):
        if p.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                return
            try:
                p.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def stop(self, p):
        """Stops one process started here (its group), as close does."""
        self._stop(p)

    def close(self):
        for p in reversed(self.procs):
            self._stop(p)
        self.procs = []
        for ns in reversed(self.made):
            _run(["ip", "netns", "del", ns], check=False)
        self.made = []
        if self._etcd is not None:
            shutil.rmtree(self._etcd[3], ignore_errors=True)
            self._etcd = None

    def namespaces_left(self):
        """The cluster's namespaces that exist now (none after close)."""
        r = _run(["ip", "netns", "list"], check=False)
        mine = set(self.names) | {self.bridge}
        return sorted(line.split()[0] for line in r.stdout.splitlines() if line.split() and line.split()[0] in mine)
