"""tensorlift.load: the fast path, against the reference loader."""
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import tensorlift


@pytest.fixture()
def ckpt(tmp_path):
    tensors = {
        "a": torch.randn(64, 33),
        "b": torch.arange(10, dtype=torch.int64),
        "c": torch.randn(7, 5).to(torch.bfloat16),
        "d": torch.zeros(0, 3),
        "e": torch.tensor(3.5, dtype=torch.float64),
        "f8": torch.randn(16).to(torch.float8_e4m3fn),
    }
    path = tmp_path / "m.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    return path


@pytest.mark.parametrize("mode", ["auto", "buffered", "direct", "mmap"])
def test_load_equals_reference(ckpt, mode):
    ref = load_file(str(ckpt))
    got = tensorlift.load(ckpt, mode=mode)
    assert sorted(got) == sorted(ref)
    for k, v in ref.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape
        assert got[k].reshape(-1).view(torch.uint8).numpy().tobytes() == v.reshape(-1).view(torch.uint8).numpy().tobytes()


def test_tensors_outlive_everything(ckpt):
    t = tensorlift.load(ckpt)["a"]
    import gc
    gc.collect()
    assert torch.equal(t, load_file(str(ckpt))["a"])


def test_filters_and_numpy(ckpt):
    got = tensorlift.load(ckpt, framework="np", filter="^(a|b)$")
    assert sorted(got) == ["a", "b"]
    assert isinstance(got["a"], np.ndarray) and got["b"].dtype == np.int64
    assert sorted(tensorlift.load(ckpt, filter=["c", "e"])) == ["c", "e"]
    assert sorted(tensorlift.load(ckpt, filter=lambda n: n.startswith("f"))) == ["f8"]


def test_errors(tmp_path, ckpt):
    with pytest.raises(FileNotFoundError):
        tensorlift.load(tmp_path / "missing.safetensors")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(ckpt.read_bytes()[:-1])
    with pytest.raises(tensorlift.FormatError, match="MetadataIncompleteBuffer"):
        tensorlift.load(bad)
    assert issubclass(tensorlift.FormatError, ValueError)


def test_a_list_of_files_loads_as_one_checkpoint(tmp_path):
    """Several files are the shards of one checkpoint (their reads planned together, as a
    directory's are): the same tensors as the reference, a filter across them, and the errors."""
    from tensorlift._tensorlift import Checkpoint
    s1, s2 = tmp_path / "s1.safetensors", tmp_path / "s2.safetensors"
    ref1 = {"a": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(5, dtype=torch.bfloat16)}
    ref2 = {"c": torch.arange(4, dtype=torch.int64)}
    save_file(ref1, str(s1))
    save_file(ref2, str(s2))
    ckpt = Checkpoint.open_files([str(s2), str(s1)])
    assert [s for s in ckpt.shards()] == [str(s2), str(s1)]
    for files in ([s1, s2], [s2, s1]):
        got = tensorlift.load(files)
        assert sorted(got) == ["a", "b", "c"]
        for k, v in {**ref1, **ref2}.items():
            assert got[k].dtype == v.dtype and torch.equal(got[k], v)
    assert sorted(tensorlift.load([s1, s2], filter=["a", "c"])) == ["a", "c"]
    assert sorted(tensorlift.load([s1, s2], filter="^[bc]$")) == ["b", "c"]
    # A directory among the paths: each path is opened on its own, as before.
    sub = tmp_path / "sub"
    sub.mkdir()
    save_file({"d": torch.zeros(2)}, str(sub / "x.safetensors"))
    assert sorted(tensorlift.load([s1, sub])) == ["a", "b", "d"]
    dup = tmp_path / "dup.safetensors"
    save_file({"a": torch.zeros(1)}, str(dup))
    with pytest.raises(ValueError, match="'a' is in more than one of the files") as e:
        tensorlift.load([s1, dup])
    assert str(s1) in str(e.value) and str(dup) in str(e.value)
    with pytest.raises(ValueError, match="named twice"):
        tensorlift.load([s1, s2, s1])
