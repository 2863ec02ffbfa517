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
