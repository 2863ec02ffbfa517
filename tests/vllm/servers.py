"""What the vLLM and SGLang end-to-end tests share (tests/vllm, tests/sglang): running one
engine script, a corrupt copy of a model, waiting for a server and stopping it, a model in a
bucket (rclone serve s3), and the dtype each engine's runs use on this CPU (cpu_probe)."""
import contextlib
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import shutil
import time
import urllib.error
import urllib.request

import cpu_probe

MAKE_MODEL = pathlib.Path(__file__).resolve().parent / "make_model.py"
RCLONE = pathlib.Path(__file__).resolve().parents[2] / ".venv-s3" / "bin" / "rclone"
S3_KEY, S3_SECRET = "TLVLLMACCESSKEY01", "tl-vllm-test-secret-0123456789"


def make_model(arch, out, env):
    subprocess.run([sys.executable, str(MAKE_MODEL), arch, str(out)], check=True, env=env, timeout=300)
    return out


def run_engine(cmd, env, expect_ok=True):
    """Runs an engine script that prints one '{"tokens": ...}' line: that line's JSON plus the
    whole output when it succeeds (expect_ok), else the output of the failed run."""
    # The servers log to stdout too: their output and ours, interleaved, in one stream. The engine
    # gets a process group of its own, so that one past its time leaves none of its engine-core or
    # worker processes behind (they would hold cores and memory through the tests after it).
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        stop_group(proc)
        out, _ = proc.communicate(timeout=60)  # everything it printed, the part read before included
        raise AssertionError(f"{cmd[1:]} did not finish in 600 s:\n{out[-6000:]}") from None
    p = subprocess.CompletedProcess(cmd, proc.returncode, out)
    if expect_ok:
        # The exit status too: a negative one is the signal that ended the engine (its output may
        # then stop without an error).
        assert p.returncode == 0, f"exit status {p.returncode}:\n{p.stdout[-4000:]}"
        result = [line for line in p.stdout.splitlines() if line.startswith('{"tokens"')]
        assert result, p.stdout[-4000:]
        return dict(json.loads(result[-1]), output=p.stdout)
    assert p.returncode != 0, p.stdout[-2000:]
    return p.stdout


def corrupt_copy(model, dest):
    """A copy of the model directory whose second shard has its last bytes cut off; its path."""
    dest.mkdir()
    for f in model.iterdir():
        (dest / f.name).write_bytes(f.read_bytes())
    shard = sorted(dest.glob("*.safetensors"))[1]
    shard.write_bytes(shard.read_bytes()[:-100])  # the last tensor's bytes cut short
    return shard


def new_weights(model, dest, seed=1):
    """A copy of the model directory with other weights (the same names, shapes and dtypes: what an
    RL step writes), seeded random values of each tensor's spread; its path."""
    import torch
    from safetensors.torch import load_file, save_file
    dest.mkdir()
    gen = torch.Generator().manual_seed(seed)
    for f in sorted(model.iterdir()):
        if f.suffix != ".safetensors":
            (dest / f.name).write_bytes(f.read_bytes())
            continue
        tensors = {}
        for name, t in load_file(str(f)).items():
            std = t.float().std() if t.numel() > 1 else torch.tensor(0.0)
            tensors[name] = t if std == 0 else (torch.randn(t.shape, generator=gen) * std).to(t.dtype)
        save_file(tensors, str(dest / f.name), metadata={"format": "pt"})
    return dest


def bad_copies(model, root):
    """Three directories a reload must refuse, copies of `model`: {"missing": its second shard
    deleted (the index still names it), "truncated": its second shard cut short, "other": one
    tensor of another shape (another model's)}, and the names of the files to blame."""
    import torch
    from safetensors.torch import load_file, save_file
    out = {}
    for kind in ("missing", "truncated", "other"):
        dest = root / kind
        dest.mkdir()
        for f in model.iterdir():
            (dest / f.name).write_bytes(f.read_bytes())
        shard = sorted(dest.glob("*.safetensors"))[1]
        if kind == "missing":
            shard.unlink()
        elif kind == "truncated":
            shard.write_bytes(shard.read_bytes()[:-100])
        else:
            tensors = load_file(str(shard))
            name = sorted(tensors)[0]
            tensors[name] = torch.zeros((tensors[name].shape[0] + 64,) + tuple(tensors[name].shape[1:]),
                                        dtype=tensors[name].dtype)
            save_file(tensors, str(shard), metadata={"format": "pt"})
        out[kind] = (dest, shard.name)
    return out


def assert_format_error(output, shard):
    lines = [line for line in output.splitlines() if "FormatError" in line]
    assert lines, output[-4000:]
    assert shard.name in lines[-1], lines[-1]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def etcd(root):
    """A real etcd on loopback (Debian's etcd-server), its data under `root`; yields its URL and
    stops it by PID after."""
    exe = shutil.which("etcd")
    if exe is None:
        import pytest
        pytest.skip("etcd is not installed (Debian etcd-server)")
    client, peer = free_port(), free_port()
    url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
    proc = subprocess.Popen([exe, "--data-dir", str(root / "etcd"), "--listen-client-urls", url,
                             "--advertise-client-urls", url, "--listen-peer-urls", peer_url,
                             "--initial-advertise-peer-urls", peer_url, "--initial-cluster", f"default={peer_url}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(url + "/version", timeout=1).read()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "etcd did not start"
                time.sleep(0.1)
        yield url
    finally:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def s3_bucket(model, root, key):
    """`model` copied to bucket/key under `root` and served by rclone serve s3 (.venv-s3) on
    loopback, checking SigV4 signatures (S3_KEY, S3_SECRET); yields the endpoint URL. Started
    here, waited for with a deadline, stopped by PID. The caller skips when RCLONE is missing."""
    root = pathlib.Path(root)
    shutil.copytree(model, root / key)  # before rclone starts: it lists a folder once
    port = free_port()
    with open(root / "rclone.log", "wb") as log:
        proc = subprocess.Popen([str(RCLONE), "serve", "s3", "--addr", f"127.0.0.1:{port}", "--auth-key",
                                 f"{S3_KEY},{S3_SECRET}", "--config", "/dev/null", str(root)],
                                stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (root / "rclone.log").read_text()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "rclone did not answer within 60 s"
                time.sleep(0.02)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()


def llama_bucket(llama, tmp_path_factory):
    """A module fixture's body (tests/vllm and tests/sglang): the llama checkpoint in a bucket
    (models/llama) behind rclone serve s3; yields its endpoint. Skips without rclone."""
    import pytest
    if not RCLONE.exists():
        pytest.skip("rclone is not installed (.venv-s3; scripts/setup.sh)")
    with s3_bucket(llama, tmp_path_factory.mktemp("s3"), "models/llama") as endpoint:
        yield endpoint


def s3_env(endpoint):
    """The variables that point tensorlift (and runai-model-streamer, which the servers use to
    pull an s3:// model's config and tokenizer) at the bucket."""
    return dict(AWS_ACCESS_KEY_ID=S3_KEY, AWS_SECRET_ACCESS_KEY=S3_SECRET, AWS_ENDPOINT_URL=endpoint,
                AWS_REGION="us-east-1", RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING="0",
                AWS_EC2_METADATA_DISABLED="true")


def wait_healthy(proc, url, log_path, timeout=400):
    """Until GET url answers 200; fails with the server's log if it exits or times out."""
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, open(log_path).read()[-4000:]
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        assert time.monotonic() < deadline, "the server did not become healthy: " + open(log_path).read()[-4000:]
        time.sleep(0.5)


def post_json(url, body, timeout=120, status=None):
    """POSTs body as JSON; the JSON answer. status: also return the HTTP status, as (status, answer),
    an error status included."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            code, answer = r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        if not status:
            raise
        code, answer = e.code, json.loads(e.read() or b"null")
    return (code, answer) if status else answer


def stop_group(proc):
    """SIGTERM to the process group (started with start_new_session), SIGKILL after 60 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    except ProcessLookupError:
        pass  # already gone (it failed to start: the test's assertion says why)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class Seed:
    """An engine script (command(opts), opts being the tensorlift options {"serve": {"ready_file"}})
    started with TL_HOLD=1: it loads with tensorlift, prints its tokens, serves its weights until
    stop() (or the end of a with block) closes its standard input."""

    def __init__(self, command, env, tmp_path, timeout=400, serve=None):
        self.ready_file = tmp_path / "seed.url"
        self.log = open(tmp_path / "seed.log", "w+")
        self.proc = subprocess.Popen(command({"serve": {"ready_file": str(self.ready_file), **(serve or {})}}),
                                     stdin=subprocess.PIPE, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=dict(env, TL_HOLD="1"), start_new_session=True)
        deadline = time.monotonic() + timeout
        while not (self.ready_file.exists() and '{"tokens"' in open(self.log.name).read()):
            assert self.proc.poll() is None, open(self.log.name).read()[-4000:]
            assert time.monotonic() < deadline, "the seed did not come up: " + open(self.log.name).read()[-4000:]
            time.sleep(0.5)
        self.urls = self.ready_file.read_text().split()  # one a rank
        self.url = self.urls[0]
        line = [x for x in open(self.log.name).read().splitlines() if x.startswith('{"tokens"')][-1]
        self.tokens = json.loads(line)["tokens"]

    def output(self):
        return open(self.log.name).read()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def weights_line(output):
    """The loader's last 'tensorlift: weights from ...' line."""
    lines = [x for x in output.splitlines() if "tensorlift: weights from" in x]
    assert lines, output[-4000:]
    return lines[-1]


VERDICTS = {}  # engine name -> cpu_probe.Verdict: decided once per test session


def e2e_verdict(config, engine, command, env):
    """The engine's cpu_probe verdict (the dtype its end-to-end runs use here), decided once per
    test session: TL_E2E_DTYPE's choice, or a bf16 run of command. Said at once on the terminal and
    again in the summary (report_verdict, from each conftest.py)."""
    if engine not in VERDICTS:
        VERDICTS[engine] = verdict = cpu_probe.choose(engine, command, env)
        with config.pluginmanager.getplugin("capturemanager").global_and_fixture_disabled():
            print(f"\n{verdict.line()}", flush=True)
    return VERDICTS[engine]


def report_verdict(terminalreporter, engine):
    """The engine's verdict line in pytest's summary, when this session decided one."""
    if engine in VERDICTS:
        terminalreporter.write_line(VERDICTS[engine].line())
