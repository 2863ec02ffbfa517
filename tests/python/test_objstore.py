"""tensorlift.load and the CLI on s3:// paths, against a real S3 server: rclone serve s3 on
loopback (.venv-s3, made by scripts/setup.sh), checking SigV4 signatures; started per module,
waited for by polling its port, stopped by PID."""
import os
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import tensorlift
from tensorlift._tensorlift import Checkpoint

ROOT = Path(__file__).resolve().parents[2]
RCLONE = os.environ.get("TENSORLIFT_TEST_RCLONE") or str(ROOT / ".venv-s3" / "bin" / "rclone")
KEY, SECRET = "TLTESTACCESSKEY02", "tl-python-test-secret-0123456789"
pytestmark = pytest.mark.skipif(not os.access(RCLONE, os.X_OK), reason="rclone is not installed (.venv-s3)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, proc, deadline_s: float = 60.0) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"rclone exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"rclone did not answer on port {port} within {deadline_s} s")


@pytest.fixture(scope="module")
def bucket(tmp_path_factory):
    root = tmp_path_factory.mktemp("s3")
    model = root / "models" / "tiny"
    model.mkdir(parents=True)
    g = torch.Generator().manual_seed(3)
    save_file({"a": torch.randn(33, 17, generator=g), "b": torch.arange(10, dtype=torch.int64),
               "c": torch.randn(8, 8, generator=g).to(torch.bfloat16)}, str(model / "model.safetensors"))
    medium = root / "models" / "medium"  # 24 tensors of 256 KiB to 1 MiB: ranges for three sources
    medium.mkdir()
    save_file({f"layer.{i}.w": torch.randn(256, 256 * (1 + i % 4), generator=g) for i in range(24)},
              str(medium / "model.safetensors"))
    port = _free_port()
    with open(root / "rclone.log", "wb") as log:
        proc = subprocess.Popen([RCLONE, "serve", "s3", "--addr", f"127.0.0.1:{port}", "--auth-key",
                                 f"{KEY},{SECRET}", "--config", "/dev/null", str(root)],
                                stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_for_port(port, proc)
        yield root, f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture()
def aws_env(bucket, monkeypatch):
    root, endpoint = bucket
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    return root, endpoint


def test_load_from_s3_matches_the_file(aws_env):
    root, _ = aws_env
    want = load_file(str(root / "models" / "tiny" / "model.safetensors"))
    for url in ("s3://models/tiny", "s3://models/tiny/model.safetensors"):
        got = tensorlift.load(url)
        assert sorted(got) == sorted(want)
        for name, t in want.items():
            assert torch.equal(got[name], t), (url, name)
    got = tensorlift.load("s3://models/tiny", filter="^a$", framework="np")
    assert list(got) == ["a"] and (got["a"] == want["a"].numpy()).all()


def test_every_load_option_on_a_bucket_gives_the_local_copys_tensors(aws_env):
    """A bucket is a source of the one loader: dtype, copy, progress, a filter and the content root
    give what the same options give on the local copy (issue 55)."""
    root, _ = aws_env
    local = str(root / "models" / "tiny" / "model.safetensors")
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        got = tensorlift.load("s3://models/tiny", dtype=dtype)
        want = tensorlift.load(local, dtype=dtype)
        assert sorted(got) == sorted(want)
        for name, t in want.items():
            assert got[name].dtype == t.dtype and torch.equal(got[name], t), (dtype, name)
    got = tensorlift.load("s3://models/medium", copy=True, progress=True, filter=r"layer\.1[0-9]\.w")
    want = tensorlift.load(str(root / "models" / "medium"), filter=r"layer\.1[0-9]\.w")
    assert sorted(got) == sorted(want) and len(got) == 10
    assert all(torch.equal(got[n], want[n]) for n in want)
    assert tensorlift.content_root("s3://models/tiny") == tensorlift.content_root(local)
    with pytest.raises(ValueError, match="threads .* apply to local files"):
        tensorlift.load("s3://models/tiny", threads=3)


def test_checkpoint_open_takes_settings(bucket, monkeypatch):
    root, endpoint = bucket
    for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    ckpt = Checkpoint.open("s3://models/tiny", endpoint=endpoint, region="us-east-1")
    assert ckpt.shards() == ["s3://models/tiny/model.safetensors"]
    assert sorted(n for n, *_ in ckpt.tensors()) == ["a", "b", "c"]


def test_errors_are_clear(aws_env, monkeypatch):
    with pytest.raises(FileNotFoundError, match="s3://models/missing.safetensors"):
        tensorlift.load("s3://models/missing.safetensors")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    with pytest.raises(PermissionError, match="environment"):
        tensorlift.load("s3://models/tiny")
    with pytest.raises(ValueError, match="applies to local files"):
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
        tensorlift.load("s3://models/tiny", mode="direct")


def test_cli_inspect_verify_and_load(aws_env, cli):
    root, endpoint = aws_env
    out = subprocess.run([str(cli), "inspect", "s3://models/tiny"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert re.search(r"^total\s+3\s+2452 ", out.stdout, re.M), out.stdout
    out = subprocess.run([str(cli), "verify", "s3://models/tiny"], capture_output=True, text=True)
    assert out.returncode == 0 and "OK (3 tensors" in out.stdout, out.stdout + out.stderr
    local = subprocess.run([str(cli), "load", "--checksum", str(root / "models" / "tiny")],
                           capture_output=True, text=True)
    remote = subprocess.run([str(cli), "load", "--checksum", "s3://models/tiny"], capture_output=True, text=True)
    assert remote.returncode == 0, remote.stderr
    assert remote.stdout == local.stdout and remote.stdout.count("\n") == 3
    assert "s3://models/tiny/model.safetensors: 3 tensors" in remote.stderr
    # A write-through cache: the second load reads the local copy.
    cache = root.parent / "cli-cache"
    for expect in ("written to the cache", "from the cache of s3://models/tiny/model.safetensors"):
        out = subprocess.run([str(cli), "load", "--checksum", "--cache-dir", str(cache), "s3://models/tiny"],
                             capture_output=True, text=True)
        assert out.returncode == 0 and out.stdout == local.stdout and expect in out.stderr, out.stderr
    # Settings on the command line instead of the environment.
    env = {k: v for k, v in os.environ.items() if k != "AWS_ENDPOINT_URL"}
    out = subprocess.run([str(cli), "inspect", "--endpoint-url", endpoint, "s3://models/tiny"],
                         capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    out = subprocess.run([str(cli), "load", "s3://models/nope"], capture_output=True, text=True)
    assert out.returncode == 1 and "s3://models/nope" in out.stderr


def test_peer_loads_fall_back_to_the_bucket(aws_env, cli):
    import tensorlift.remote as remote
    root, _ = aws_env
    want = load_file(str(root / "models" / "tiny" / "model.safetensors"))
    # The key of the bucket's copy is the local checkpoint's.
    assert remote.key_for("s3://models/tiny") == remote.key_for(root / "models" / "tiny")
    got = remote.load_from_peer("http://127.0.0.1:1", fallback="s3://models/tiny", timeout=2)
    assert remote.last_report()["source"] == "s3://models/tiny"
    assert sorted(got) == sorted(want) and all(torch.equal(got[n], want[n]) for n in want)
    # A tensor-parallel rank's fallback reads its slices from the bucket, as the local copy gives them.
    layout = "^a$=1;^c$=0"
    mine = remote.load_from_peer("http://127.0.0.1:1", fallback="s3://models/tiny", timeout=2, layout=layout,
                                 tp_size=2, tp_rank=1)
    assert remote.last_report()["source"] == "s3://models/tiny"
    local = tensorlift.load(str(root / "models" / "tiny"), tp_size=2, tp_rank=1, layout=layout)
    assert mine["a"].shape[1] < 17 and mine["c"].shape[0] == 4
    assert sorted(mine) == sorted(local) and all(torch.equal(mine[n], local[n]) for n in local)
    out = subprocess.run([str(cli), "fetch", "--fallback", "s3://models/tiny", "--checksum", "--timeout-ms", "2000",
                          "http://127.0.0.1:1"], capture_output=True, text=True)
    local = subprocess.run([str(cli), "load", "--checksum", str(root / "models" / "tiny")],
                           capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout == local.stdout


def test_stream_from_s3(aws_env):
    root, _ = aws_env
    want = load_file(str(root / "models" / "tiny" / "model.safetensors"))
    got = dict(tensorlift.stream("s3://models/tiny", piece_bytes=1))  # a piece per tensor
    assert sorted(got) == sorted(want) and all(torch.equal(got[n], want[n]) for n in want)


def test_safe_open_and_load_file_on_s3(aws_env):
    import tensorlift.numpy
    import tensorlift.torch
    root, _ = aws_env
    local = str(root / "models" / "tiny" / "model.safetensors")
    url = "s3://models/tiny/model.safetensors"
    want = load_file(local)
    got = tensorlift.torch.load_file(url)
    assert sorted(got) == sorted(want) and all(torch.equal(got[n], want[n]) for n in want)
    assert sorted(tensorlift.numpy.load_file(url)) == sorted(want)
    from safetensors import safe_open as ref_open
    with tensorlift.safe_open(url, framework="pt") as f, ref_open(local, framework="pt") as r:
        assert f.keys() == r.keys() and f.metadata() == r.metadata()
        assert torch.equal(f.get_tensor("a"), r.get_tensor("a"))
        assert torch.equal(f.get_slice("a")[3:9, 2:5], r.get_slice("a")[3:9, 2:5])  # rows 3..8 fetched
        assert torch.equal(f.get_slice("c")[1:2], r.get_slice("c")[1:2])
        assert f.get_slice("b").get_shape() == [10]
        with pytest.raises(KeyError):
            f.get_tensor("nope")
    with pytest.raises(IsADirectoryError):
        tensorlift.safe_open("s3://models/tiny", framework="pt")
    with pytest.raises(FileNotFoundError):
        tensorlift.safe_open("s3://models/tiny/nope.safetensors", framework="np")


def test_striped_over_the_disk_the_bucket_and_a_peer(aws_env, cli):
    """Every source at once: Python's load_striped and Peer(stripe=True), and fetch --stripe."""
    import tensorlift.remote as remote
    from tensorlift._tensorlift import ucx_version
    if ucx_version() is None:
        pytest.skip("tensorlift was built without UCX (Debian libucx-dev)")
    root, _ = aws_env
    local = root / "models" / "medium"
    want = load_file(str(local / "model.safetensors"))
    with remote.serve(local, chunk_bytes=256 << 10) as server:  # keyed by its headers, as the bucket's is
        got = remote.load_striped(local, "s3://models/medium", peers=[server.url], range_bytes=256 << 10,
                                  use_page_cache=False)
        assert sorted(got) == sorted(want) and all(torch.equal(got[n], want[n]) for n in want)
        report = remote.last_report()
        names = [s["name"] for s in report["sources"]]
        assert names == [f"disk:{local}", "s3://models/medium", server.url], report
        assert report["checked"] and report["bytes"] == sum(s["bytes"] for s in report["sources"])
        assert all(s["bytes"] > 0 and s["failure"] == "" for s in report["sources"]), report

        got = remote.load_from_peer(server.url, fallback=[str(local), "s3://models/medium"], stripe=True,
                                    use_page_cache=False)
        assert all(torch.equal(got[n], want[n]) for n in want)
        assert len(remote.last_report()["sources"]) == 3

        out = subprocess.run([str(cli), "fetch", "--stripe", "--stripe-cached", "--fallback", str(local),
                              "--fallback", "s3://models/medium", "--checksum", server.url],
                             capture_output=True, text=True)
        sums = subprocess.run([str(cli), "load", "--checksum", str(local)], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert out.stdout == sums.stdout
        assert "3 source(s) at once, every chunk checked" in out.stderr, out.stderr
        assert f"  {server.url}: " in out.stderr

        # A tensor-parallel rank's slices, striped over the three: its own load of the local copy.
        layout = r"layer\.[0-9]*[02468]\.w$=0;layer\.[0-9]*[13579]\.w$=1"
        tp = ["--tp-size", "3", "--tp-rank", "1", "--layout", layout]
        out = subprocess.run([str(cli), "fetch", "--stripe", "--stripe-cached", "--fallback", str(local),
                              "--fallback", "s3://models/medium", "--checksum", *tp, server.url],
                             capture_output=True, text=True)
        sums = subprocess.run([str(cli), "load", "--checksum", *tp, str(local)], capture_output=True, text=True)
        assert out.returncode == 0 and sums.returncode == 0, out.stderr + sums.stderr
        assert out.stdout == sums.stdout and out.stdout.count("\n") == 24
        rank = remote.Peer(server.url, fallback=[str(local), "s3://models/medium"], stripe=True, tp_size=3,
                           tp_rank=1, layout=layout, use_page_cache=False)
        with pytest.raises(ValueError, match="not served"):
            rank.pull(become_seed=True)
        got = tensorlift.load(rank)
        mine = tensorlift.load(local, tp_size=3, tp_rank=1, layout=layout)
        assert sorted(got) == sorted(mine) and all(torch.equal(got[n], mine[n]) for n in mine)
        assert got["layer.1.w"].shape == (256, 171) and got["layer.2.w"].shape == (86, 768)

    # Without a peer: the disk and the bucket (nothing to check the bytes against).
    got = remote.load_striped(url="s3://models/medium", path=local, use_page_cache=False)
    assert all(torch.equal(got[n], want[n]) for n in want)
    assert not remote.last_report()["checked"]
    # The local copy is in the page cache (just written and read): read from it alone, as views.
    got = remote.load_striped(local, "s3://models/medium")
    assert all(torch.equal(got[n], want[n]) for n in want)
    assert [s["name"] for s in remote.last_report()["sources"]] == [f"disk:{local}"]
    assert "in the page cache" in remote.last_report()["note"]
    with pytest.raises(ValueError, match="need stripe=True"):
        remote.Peer("http://127.0.0.1:1", fallback=[str(local), "s3://models/tiny"])
    out = subprocess.run([str(cli), "fetch", "--fallback", str(local), "--fallback", "s3://models/tiny",
                          "http://127.0.0.1:1"], capture_output=True, text=True)
    assert out.returncode == 2 and "several need --stripe" in out.stderr
    out = subprocess.run([str(cli), "fetch", "--stripe", "--model", "m", "--revision", "r", "http://127.0.0.1:1"],
                         capture_output=True, text=True)
    assert out.returncode != 0 and "give --fallback" in out.stderr, out.stderr


def test_a_tensor_parallel_rank_loads_its_slices(aws_env, cli):
    """tp_size, tp_rank and layout: each rank gets its slices of the tensors the layout splits
    (fetching only their bytes), the others whole; the ranks' slices put together are the file's."""
    root, _ = aws_env
    want = load_file(str(root / "models" / "tiny" / "model.safetensors"))
    layout = "^a$=0;^c$=1"
    ranks = [tensorlift.load("s3://models/tiny", tp_size=2, tp_rank=r, layout=layout) for r in range(2)]
    assert torch.equal(torch.cat([ranks[0]["a"], ranks[1]["a"]], 0), want["a"])
    assert torch.equal(torch.cat([ranks[0]["c"], ranks[1]["c"]], 1), want["c"])
    assert ranks[0]["a"].shape[0] < 33 and ranks[0]["c"].shape[1] == 4
    assert all(torch.equal(r["b"], want["b"]) for r in ranks)
    # The local copy's ranks: the same slices, read by the same planner.
    for r in range(2):
        local = tensorlift.load(root / "models" / "tiny", tp_size=2, tp_rank=r, layout=layout)
        assert all(torch.equal(local[n], ranks[r][n]) for n in want)
    converted = tensorlift.load("s3://models/tiny", tp_size=2, tp_rank=1, layout=layout, dtype=torch.float16)
    assert all(torch.equal(converted[n], ranks[1][n].to(torch.float16)) for n in want
               if ranks[1][n].dtype == torch.float32)
    out = subprocess.run([str(cli), "load", "--tp-size", "2", "--tp-rank", "1", "--layout", layout, "--checksum",
                          "s3://models/tiny"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.count("\n") == 3, out.stderr
    local = subprocess.run([str(cli), "load", "--tp-size", "2", "--tp-rank", "1", "--layout", layout, "--checksum",
                            str(root / "models" / "tiny")], capture_output=True, text=True)
    assert local.returncode == 0 and local.stdout == out.stdout, local.stderr
