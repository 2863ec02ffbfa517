"""tensorlift.stream: every tensor, the reference's bytes, in file order, piece by piece."""

import pytest
import torch
from safetensors.torch import load_file

from conftest import save_sharded

import tensorlift
import tensorlift._core as core


@pytest.fixture
def model_dir(tmp_path):
    g = torch.Generator().manual_seed(3)
    shards = []
    for k in range(3):
        tensors = {f"layers.{k}.w{i}": torch.randn(64, 32, generator=g).to(torch.bfloat16) for i in range(4)}
        tensors[f"layers.{k}.ids"] = torch.arange(10 * k, 10 * k + 10)
        shards.append(tensors)
    return save_sharded(tmp_path, shards)


def reference(model_dir):
    out = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


@pytest.mark.parametrize("where", ["dir", "index", "files"])
def test_every_tensor_in_file_order(model_dir, where):
    paths = {"dir": str(model_dir), "index": str(model_dir / "model.safetensors.index.json"),
             "files": sorted(str(f) for f in model_dir.glob("*.safetensors"))}[where]
    ref = reference(model_dir)
    got = list(tensorlift.stream(paths, piece_bytes=2 * 64 * 32 * 2))
    assert sorted(n for n, _ in got) == sorted(ref)
    # File after file: every tensor of shard k comes before any of shard k+1.
    shard_of = [int(n.split(".")[1]) for n, _ in got]
    assert shard_of == sorted(shard_of)
    for name, t in got:
        assert t.dtype == ref[name].dtype and torch.equal(t, ref[name]), name


def test_the_first_tensor_comes_before_the_rest_is_read(model_dir, monkeypatch):
    calls = []
    real = core.load

    def counting_load(*args, **kwargs):
        calls.append(kwargs.get("filter"))
        return real(*args, **kwargs)

    monkeypatch.setattr(core, "load", counting_load)
    it = tensorlift.stream(str(model_dir), piece_bytes=1)  # one tensor per piece: 15 pieces
    name, t = next(it)
    assert len(calls) <= 2  # this piece and at most the one read ahead
    rest = list(it)
    assert len(calls) == 15 and len(rest) == 14


@pytest.mark.parametrize("filter", [r"\.w[01]$", ["layers.0.w0", "layers.0.w1", "layers.1.w0", "layers.1.w1",
                                                   "layers.2.w0", "layers.2.w1"],
                                    lambda n: n.endswith((".w0", ".w1"))])
def test_filters(model_dir, filter):
    got = dict(tensorlift.stream(str(model_dir), filter=filter))
    assert sorted(got) == sorted(f"layers.{k}.w{i}" for k in range(3) for i in range(2))


def test_options_reach_the_load(model_dir):
    ref = reference(model_dir)
    got = dict(tensorlift.stream(str(model_dir), mode="buffered", threads=2, copy=True, dtype=torch.float32))
    for name, t in got.items():
        want = ref[name].to(torch.float32) if ref[name].is_floating_point() else ref[name]
        assert torch.equal(t, want), name


def test_a_bad_file_raises_while_streaming(model_dir):
    bad = sorted(model_dir.glob("*.safetensors"))[2]
    bad.write_bytes(bad.read_bytes()[:-10])
    it = tensorlift.stream(sorted(str(f) for f in model_dir.glob("*.safetensors")))
    with pytest.raises(tensorlift.FormatError, match=bad.name):
        for _ in it:
            pass


def _recording_pools(monkeypatch):
    import tensorlift._tensorlift as ext
    pools = []
    real = ext.ArenaPool

    def make(max_free):
        pools.append(real(max_free))
        return pools[-1]

    monkeypatch.setattr(ext, "ArenaPool", make)
    return pools


@pytest.mark.parametrize("mode", ["direct", "buffered"])
def test_pieces_reuse_the_memory_of_dropped_pieces(model_dir, monkeypatch, mode):
    """A consumer that copies and drops each tensor: later pieces land in the memory of earlier ones."""
    pools = _recording_pools(monkeypatch)
    ref = reference(model_dir)
    seen = 0
    for name, t in tensorlift.stream(str(model_dir), piece_bytes=1, mode=mode):
        assert torch.equal(t.clone(), ref[name]), name
        seen += 1
        del t
    assert seen == len(ref)
    stats = pools[0].stats()
    assert stats["reused"] > 0, stats
    assert stats["fresh"] + stats["reused"] == len(ref)


def test_tensors_kept_by_the_consumer_are_never_overwritten(model_dir, monkeypatch):
    pools = _recording_pools(monkeypatch)
    ref = reference(model_dir)
    kept = dict(tensorlift.stream(str(model_dir), piece_bytes=1, copy=True))
    assert pools[0].stats()["reused"] == 0  # every piece's memory is still held
    for name, t in kept.items():
        assert torch.equal(t, ref[name]), name
