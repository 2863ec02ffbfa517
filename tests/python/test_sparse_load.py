"""Sparse-bitmask checkpoints in Python: tensorlift.load returns the dense
tensors (decoded in C++ while reading), bit-exact with compressed-tensors'
decoding written out with numpy; the safetensors and fastsafetensors drop-ins
show the stored parts, as the libraries they replace do."""
import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import tensorlift
from tensorlift import fastsafetensors as tfst
from tensorlift.torch import safe_open

INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(t):
    return t.contiguous().view(INT[t.element_size()]).numpy().copy()


def ct_compress(t):
    """compressed-tensors' bitmask_compress (>= 0.9 naming is the caller's)."""
    mask = t.view(INT[t.element_size()]) != 0  # bitwise: -0.0 stays
    row_counts = mask.sum(dim=-1)
    return {"shape": torch.tensor(list(t.shape)), "compressed": t[mask],
            "bitmask": torch.from_numpy(np.packbits(mask.numpy(), axis=-1, bitorder="little")),
            "row_offsets": torch.cumsum(row_counts, 0) - row_counts}


@pytest.fixture
def sparse_ckpt(tmp_path):
    g = torch.Generator().manual_seed(0)
    dense = {}
    for i, (dtype, shape) in enumerate([(torch.bfloat16, (64, 100)), (torch.float16, (3, 9)),
                                        (torch.float32, (17, 33)), (torch.float8_e4m3fn, (8, 64))]):
        t = torch.randn(shape, generator=g).to(dtype)
        keep = torch.rand(shape, generator=g) < 0.5
        t = torch.where(keep, t.float(), torch.zeros(shape)).to(dtype)
        if dtype in (torch.bfloat16, torch.float16):
            t.view(torch.int16)[0, 0] = -32768  # -0.0
        dense[f"model.layers.{i}.mlp.down_proj.weight"] = t
    stored = {}
    for name, t in dense.items():
        prefix = name[: -len(".weight")] if name != "model.layers.3.mlp.down_proj.weight" else name
        for part, v in ct_compress(t).items():
            stored[f"{prefix}.{part}"] = v
    stored["model.norm.weight"] = dense["model.norm.weight"] = torch.ones(100, dtype=torch.bfloat16)
    path = tmp_path / "model.safetensors"
    save_file(stored, str(path), metadata={"format": "pt"})
    return path, dense, stored


def test_load_returns_dense_bit_exact(sparse_ckpt):
    path, dense, _ = sparse_ckpt
    for mode in ("auto", "buffered", "mmap"):
        got = tensorlift.load(str(path), mode=mode)
        assert sorted(got) == sorted(dense)
        for name, t in dense.items():
            assert got[name].dtype == t.dtype and got[name].shape == t.shape, name
            assert np.array_equal(bits(got[name]), bits(t)), name


def test_filter_applies_to_dense_names(sparse_ckpt):
    path, dense, _ = sparse_ckpt
    got = tensorlift.load(str(path), filter="layers\\.[01]\\.")
    assert sorted(got) == ["model.layers.0.mlp.down_proj.weight", "model.layers.1.mlp.down_proj.weight"]


def test_drop_ins_show_the_stored_parts(sparse_ckpt):
    path, _, stored = sparse_ckpt
    with safe_open(str(path), framework="pt") as f:
        assert sorted(f.keys()) == sorted(stored)
        assert torch.equal(f.get_tensor("model.layers.0.mlp.down_proj.bitmask"),
                           stored["model.layers.0.mlp.down_proj.bitmask"])
    loader = tfst.SafeTensorsFileLoader(None, "cpu")
    loader.add_filenames({0: [str(path)]})
    fb = loader.copy_files_to_device()
    try:
        assert torch.equal(fb.get_tensor("model.layers.1.mlp.down_proj.row_offsets"),
                           stored["model.layers.1.mlp.down_proj.row_offsets"])
    finally:
        fb.close()
        loader.close()


def test_corrupt_group_is_a_clear_error(sparse_ckpt, tmp_path):
    _, _, stored = sparse_ckpt
    bad = dict(stored)
    offsets = bad["model.layers.0.mlp.down_proj.row_offsets"].clone()
    offsets[5] += 1
    bad["model.layers.0.mlp.down_proj.row_offsets"] = offsets
    path = tmp_path / "bad.safetensors"
    save_file(bad, str(path))
    with pytest.raises(Exception, match="down_proj.weight"):
        tensorlift.load(str(path))


def test_callable_filter_sees_dense_names(sparse_ckpt):
    path, dense, _ = sparse_ckpt
    seen = []

    def keep(name):
        seen.append(name)
        return name.endswith("down_proj.weight") and ".1." in name

    got = tensorlift.load(str(path), filter=keep)
    assert sorted(seen) == sorted(dense)  # dense names, not the stored parts
    assert list(got) == ["model.layers.1.mlp.down_proj.weight"]
