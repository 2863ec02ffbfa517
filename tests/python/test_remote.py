"""tensorlift.remote: serving and pulling from Python, the same tensors as a
disk load (tensorlift.load takes a Peer as its source), user buffers,
fallbacks with their reasons, and a loaded instance becoming a seed."""
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import tensorlift
import tensorlift.remote as remote
from tensorlift._tensorlift import Checkpoint, ucx_version

# Peer loading needs the UCX data plane; a build without it (the GPU check's bundle) skips this
# file, as ctest skips its UCX tests.
pytestmark = pytest.mark.skipif(ucx_version() is None, reason="tensorlift was built without UCX (Debian libucx-dev)")

KEY = dict(model="tiny", revision="r1")


@pytest.fixture()
def ckpt(tmp_path):
    tensors = {
        "a": torch.randn(64, 33),
        "b": torch.arange(10, dtype=torch.int64),
        "c": torch.randn(7, 5).to(torch.bfloat16),
        "d": torch.zeros(0, 3),
        "e": torch.tensor(3.5, dtype=torch.float64),
        "f8": torch.randn(16).to(torch.float8_e4m3fn),
        "big": torch.randn(1024, 1024),
    }
    path = tmp_path / "m.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    return path


def same(got, ref):
    assert sorted(got) == sorted(ref)
    for k, v in ref.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
        # Bitwise (fp8 has no torch.equal): the bytes of each.
        assert got[k].reshape(-1).view(torch.uint8).tolist() == v.reshape(-1).view(torch.uint8).tolist(), k


def test_serve_and_pull(ckpt):
    with remote.serve(ckpt, **KEY) as server:
        assert server.url.startswith("http://127.0.0.1:")
        got = remote.load_from_peer(server.url, **KEY)
        same(got, load_file(str(ckpt)))
        report = remote.last_report()
        assert report["source"] == server.url and report["failures"] == []
        # tensorlift.load takes a Peer as its source (with its filter).
        peer = remote.Peer(server.url, **KEY)
        same(tensorlift.load(peer), load_file(str(ckpt)))
        part = tensorlift.load(peer, filter=r"^[ab]$", framework="np")
        assert sorted(part) == ["a", "b"] and isinstance(part["a"], np.ndarray)


def test_a_keys_dtype_in_torchs_spelling_is_the_same_key(ckpt):
    # A seed labelled "torch.bfloat16" and a puller asking for "bf16" name one key: BF16.
    with remote.serve(ckpt, **KEY, dtype="torch.bfloat16") as server:
        assert server.key["dtype"] == "BF16"
        remote.load_from_peer(server.url, **KEY, dtype="bf16")
        assert remote.last_report()["source"] == server.url
    with pytest.raises(ValueError, match="is neither"):
        remote.serve(ckpt, **KEY, dtype="auto")


def test_pull_onto_a_device(ckpt):
    # The emulated device (no framework can touch it): the pulled tensors are there;
    # tests/remote/peer_test.cc compares their bytes.
    with remote.serve(ckpt, **KEY) as server:
        loaded, report, seed = remote.Peer(server.url, **KEY, device="emulated:0").pull()
        assert report["source"] == server.url and seed is None
        assert loaded.names() and all(loaded.device(n) == (12, 0) for n in loaded.names())
        # A seed on the device serves the device's copy; a host pull from it matches the file.
        _, _, seed = remote.Peer(server.url, **KEY, device="emulated:0").pull(become_seed=True)
        with seed:
            same(remote.load_from_peer(seed.url, **KEY), load_file(str(ckpt)))
            assert remote.last_report()["source"] == seed.url
        with pytest.raises(ValueError, match="device"):
            remote.load_from_peer(server.url, **KEY, device="tpu:0")


def test_serve_from_a_device(ckpt):
    # The source holds the tensors on the (emulated) device and serves that memory.
    with remote.serve(ckpt, **KEY, device="emulated:0") as server:
        same(remote.load_from_peer(server.url, **KEY), load_file(str(ckpt)))
    with pytest.raises(ValueError, match="device"):
        remote.serve(ckpt, **KEY, device="tpu:0")


def test_default_key_and_fallback(ckpt):
    with remote.serve(ckpt) as server:
        assert server.key["model"] == "m" and server.key["revision"].startswith("h:")
        got = remote.load_from_peer(server.url, fallback=ckpt)  # The key from the fallback path.
        assert remote.last_report()["source"] == server.url
        same(got, load_file(str(ckpt)))
        got = remote.load_from_peer(server.url, model="m", revision="other", fallback=ckpt)
        report = remote.last_report()
        assert report["source"] == f"disk:{ckpt}"
        assert "revision: 'other' (ours)" in report["failures"][0]
        same(got, load_file(str(ckpt)))


def test_stopped_pulls_fail_without_the_fallback(ckpt):
    """stop_pulls (a SIGTERM handler's job): pulls after it fail at once, the disk fallback
    refused too; in a process of its own, as it holds for the rest of the process."""
    script = (
        "import sys\n"
        "from tensorlift import remote\n"
        "with remote.serve(sys.argv[1], model='m', revision='r') as server:\n"
        "    remote.load_from_peer(server.url, model='m', revision='r', fallback=sys.argv[1])\n"
        "    remote.stop_pulls()\n"
        "    try:\n"
        "        remote.load_from_peer(server.url, model='m', revision='r', fallback=sys.argv[1])\n"
        "    except ConnectionError as e:\n"
        "        print('refused:', e)\n")
    r = subprocess.run([sys.executable, "-c", script, str(ckpt)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "refused:" in r.stdout and "stopped" in r.stdout, r.stdout + r.stderr


def test_errors_map_to_exceptions(ckpt):
    with pytest.raises(ConnectionError, match="no peer worked"):
        remote.load_from_peer("http://127.0.0.1:1", **KEY, timeout=2)
    with pytest.raises(ConnectionError, match="'nope' is not http://HOST:PORT"):
        remote.load_from_peer("nope", **KEY)
    with pytest.raises(ValueError, match="model"):
        remote.Peer("http://127.0.0.1:1")


def test_token_and_corruption(ckpt, monkeypatch):
    # The bad seed's served bytes differ from its manifest (TENSORLIFT_PEER_FAULTS, read by every
    # server as it starts serving: set for the second only).
    with remote.serve(ckpt, **KEY, token="t0ken") as server:
        monkeypatch.setenv("TENSORLIFT_PEER_FAULTS", "corrupt:big@100")
        bad = remote.serve(ckpt, **KEY, token="t0ken")
        monkeypatch.delenv("TENSORLIFT_PEER_FAULTS")
        with bad:
            with pytest.raises(ConnectionError, match="HTTP 401"):
                remote.load_from_peer(server.url, **KEY)
            # On this host the seed hands its memory over: verified, the bad chunk is caught there,
            # and again in the UCX pull that follows; the next seed is used.
            got = remote.load_from_peer([bad.url, server.url], **KEY, token="t0ken", handover_verify=True)
            report = remote.last_report()
            assert report["source"] == server.url
            assert "handed-over tensor 'big': chunk 0 does not match" in report["failures"][0]
            assert "tensor 'big' chunk 0" in report["failures"][1]
            same(got, load_file(str(ckpt)))
    # A malformed rule fails the serve, never silently does nothing.
    monkeypatch.setenv("TENSORLIFT_PEER_FAULTS", "flip:big")
    with pytest.raises(ValueError, match="TENSORLIFT_PEER_FAULTS"):
        remote.serve(ckpt, **KEY)


def test_serve_tensors_and_become_seed(ckpt):
    w = torch.randn(12, 8)
    v = np.arange(30, dtype=np.int16).reshape(5, 6)
    with remote.serve_tensors({"w": w, "v": v}, model="live", revision="7") as server:
        got, seed = remote.load_from_peer(server.url, model="live", revision="7", become_seed=True)
        assert torch.equal(got["w"], w) and np.array_equal(got["v"].numpy(), v)
        with seed:
            server.close()  # The new instance now serves what it got.
            again = remote.load_from_peer(seed.url, model="live", revision="7")
            assert torch.equal(again["w"], w)


def test_serve_tensors_takes_host_and_cuda_tensors():
    with pytest.raises(ValueError, match="is on meta: tensors on the CPU or a CUDA GPU are served"):
        remote.serve_tensors({"w": torch.empty(4, device="meta")}, model="live", revision="7")
    with pytest.raises(ValueError, match="not contiguous"):
        remote.serve_tensors({"w": torch.zeros(4, 4).t()}, model="live", revision="7")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (make gpu-check runs it)")
def test_serve_cuda_tensors_from_the_gpus_memory():
    w = torch.randn(1000, 33, device="cuda")
    v = torch.arange(77, dtype=torch.int16, device="cuda")
    try:
        server = remote.serve_tensors({"w": w, "v": v}, model="live", revision="g")
    except NotImplementedError as e:  # Debian's UCX: no CUDA memory
        assert "TENSORLIFT_UCX_LIB" in str(e)
        import os
        assert not os.environ.get("TENSORLIFT_UCX_LIB"), e
        return
    with server:
        for device in ("cpu", "cuda:0"):
            got = remote.load_from_peer(server.url, model="live", revision="g", device=device)
            assert str(got["w"].device) == device
            assert torch.equal(got["w"].cpu(), w.cpu()) and torch.equal(got["v"].cpu(), v.cpu())


def test_safe_open_takes_a_peer(ckpt):
    ref = load_file(str(ckpt))
    with remote.serve(ckpt, **KEY) as server:
        with tensorlift.safe_open(remote.Peer(server.url, **KEY), framework="pt") as f:
            assert sorted(f.keys()) == sorted(ref)
            assert torch.equal(f.get_tensor("a"), ref["a"])
            assert torch.equal(f.get_slice("big")[10:20, 5:7], ref["big"][10:20, 5:7])
            assert f.metadata() is None
        with tensorlift.safe_open(remote.Peer(server.url, **KEY), framework="np") as f:
            assert np.array_equal(f.get_tensor("b"), ref["b"].numpy())


def test_load_file_takes_a_peer(ckpt):
    import tensorlift.numpy
    import tensorlift.torch
    ref = load_file(str(ckpt))
    with remote.serve(ckpt, **KEY) as server:
        same(tensorlift.torch.load_file(remote.Peer(server.url, **KEY)), ref)
        got = tensorlift.numpy.load_file(remote.Peer(server.url, **KEY))
        assert np.array_equal(got["a"], ref["a"].numpy())


def test_content_names_exactly_the_bytes(ckpt, tmp_path):
    # tensorlift.content_root: the root `tensorlift load` prints, the same whether the reads hash
    # the pieces as they land (buffered) or a pass hashes views of the page cache (auto, cached).
    root = tensorlift.content_root(ckpt, mode="buffered")
    assert len(root) == 32 and set(root) <= set("0123456789abcdef")
    assert tensorlift.content_root(ckpt) == root
    # The native load hashes only when asked (Python's loading APIs hand back tensors, not the root).
    native = Checkpoint.open(str(ckpt))
    for asked, want in ((None, None), ("off", None), ("auto", root), ("on", root)):
        loaded = native.load(mode="buffered", **({} if asked is None else {"content_hash": asked}))
        assert loaded.content == want, asked
        loaded.release()
    with pytest.raises(ValueError, match="content_hash"):
        native.load(content_hash="yes")
    ref = load_file(str(ckpt))
    changed = {k: v.clone() for k, v in ref.items()}
    changed["a"][3, 4] += 1
    other_path = tmp_path / "other.safetensors"
    save_file(changed, str(other_path))
    other = tensorlift.content_root(other_path)
    assert other != root
    with remote.serve(ckpt, **KEY) as server:
        assert server.content == root
        # The right root: the seed's bytes (handed over on this host, or pulled) hash to it.
        for handover in ("auto", "off"):
            same(remote.load_from_peer(server.url, **KEY, content=root, handover=handover), ref)
            report = remote.last_report()
            assert report["source"] == server.url and report["failures"] == [], report
            assert report["content"] == root and bool(report["handover"]) == (handover == "auto"), report
        # Another root: the seed is skipped before any byte moves, and the fallback must hash to it.
        got = remote.load_from_peer(server.url, **KEY, content=other, fallback=other_path)
        report = remote.last_report()
        assert report["source"] == f"disk:{other_path}" and report["content"] == other
        assert f"content differs: expected {other}, the seed's is {root}" in report["failures"][0]
        same(got, changed)
        with pytest.raises(Exception, match=f"expected {other}"):
            remote.load_from_peer(server.url, **KEY, content=other, fallback=ckpt)
        # Without content the report names the root only when a load computed it.
        remote.load_from_peer(server.url, **KEY)
        assert remote.last_report()["content"] is None
    with pytest.raises(ValueError, match="32 lowercase hex"):
        remote.load_from_peer("http://127.0.0.1:1", **KEY, content=root.upper())
    with pytest.raises(ValueError, match="stripe"):
        remote.Peer("http://127.0.0.1:1", **KEY, content=root, stripe=True, fallback=ckpt)
