"""mode="auto" (the default) on the CPU: a file in the page cache comes back as views of it
(a private mapping, no copy), copy=True reads it into memory of its own, and the views'
lifetime rules: they outlive the load, and a file replaced by rename leaves them as they were.
"""
import gc
import os

import torch
from safetensors.torch import load_file, save_file

import tensorlift
import tensorlift.fastsafetensors as tfs


def mapping_of(address):
    """The path of the mapping of this process that holds `address` ("" for anonymous memory)."""
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= address < hi:
                return fields[5].strip() if len(fields) > 5 else ""
    raise AssertionError(f"{address:#x} is in no mapping")


def cached_checkpoint(path, seed=0):
    g = torch.Generator().manual_seed(seed)
    tensors = {"a.weight": torch.randn(256, 64, generator=g).to(torch.bfloat16),
               "b.bias": torch.randn(64, generator=g), "c.ids": torch.arange(1000, dtype=torch.int64)}
    save_file(tensors, str(path))
    with open(path, "rb") as f:
        f.read()  # into the page cache
    return tensors


def test_a_cached_file_comes_back_as_views_of_the_page_cache(tmp_path):
    path = tmp_path / "m.safetensors"
    ref = cached_checkpoint(path)
    got = tensorlift.load(str(path))
    for name, t in ref.items():
        assert torch.equal(got[name], t), name
        assert mapping_of(got[name].data_ptr()) == str(path), name  # the file's own pages
    owned = tensorlift.load(str(path), copy=True)
    for name, t in ref.items():
        assert torch.equal(owned[name], t), name
        assert mapping_of(owned[name].data_ptr()) != str(path), name


def test_views_are_private_a_write_changes_neither_the_file_nor_other_loads(tmp_path):
    path = tmp_path / "m.safetensors"
    ref = cached_checkpoint(path)
    first = tensorlift.load(str(path))
    first["a.weight"].add_(1)  # copy-on-write: this process's page only
    second = tensorlift.load(str(path))
    assert torch.equal(second["a.weight"], ref["a.weight"])
    assert torch.equal(load_file(str(path))["a.weight"], ref["a.weight"])


def test_views_outlive_the_load_and_a_file_replaced_by_rename(tmp_path):
    path = tmp_path / "m.safetensors"
    ref = cached_checkpoint(path)
    kept = tensorlift.load(str(path))["a.weight"]  # the dict, the checkpoint and its handle are gone
    gc.collect()
    new = tmp_path / "new.safetensors"
    newer = cached_checkpoint(new, seed=1)
    os.replace(new, path)  # how checkpoints are updated: the old inode lives on under the views
    gc.collect()
    assert torch.equal(kept, ref["a.weight"])
    assert torch.equal(tensorlift.load(str(path))["a.weight"], newer["a.weight"])


def test_safe_open_and_load_file_view_the_page_cache_as_the_reference_does(tmp_path):
    path = tmp_path / "m.safetensors"
    ref = cached_checkpoint(path)
    from tensorlift.torch import load_file as tl_load_file
    got = tl_load_file(str(path))
    for name, t in ref.items():
        assert torch.equal(got[name], t)
    assert mapping_of(got["a.weight"].data_ptr()) == str(path)


def test_the_fastsafetensors_api_keeps_owned_buffers(tmp_path):
    path = tmp_path / "m.safetensors"
    ref = cached_checkpoint(path)
    loader = tfs.SafeTensorsFileLoader(tfs.SingleGroup(), "cpu")
    loader.add_filenames({0: [str(path)]})
    fb = loader.copy_files_to_device()
    try:
        t = fb.get_tensor("a.weight")
        assert torch.equal(t, ref["a.weight"])
        assert mapping_of(t.data_ptr()) != str(path)
    finally:
        fb.close()
        loader.close()


def odd_header_checkpoint(path):
    """A file whose header length is odd, as some writers leave it: every tensor is then
    misaligned for its dtype in the file."""
    import json
    import struct
    g = torch.Generator().manual_seed(7)
    tensors = {"w": torch.randn(128, 96, generator=g).to(torch.bfloat16), "b": torch.randn(96, generator=g)}
    blobs, meta, at = [], {}, 0
    for name, t in tensors.items():
        raw = t.contiguous().view(torch.uint8).numpy().tobytes()
        meta[name] = {"dtype": {torch.bfloat16: "BF16", torch.float32: "F32"}[t.dtype],
                      "shape": list(t.shape), "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    header = json.dumps(meta).encode()
    header += b" " * ((7 - len(header) % 8) % 8)  # odd: 8n + 7
    assert len(header) % 2 == 1
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + b"".join(blobs))
    with open(path, "rb") as f:
        f.read()  # into the page cache
    return tensors


def test_an_odd_header_file_comes_back_as_the_reference_views_it(tmp_path):
    """The reference hands out misaligned views of such a file; so does tensorlift.load (and
    safe_open), no copy; copy=True gives aligned copies."""
    path = tmp_path / "odd.safetensors"
    want = odd_header_checkpoint(path)
    ref = load_file(str(path))
    assert any(t.data_ptr() % t.element_size() for t in ref.values())  # the reference's views
    got = tensorlift.load(str(path))
    for name, t in want.items():
        assert torch.equal(got[name], t) and torch.equal(got[name], ref[name]), name
        assert mapping_of(got[name].data_ptr()) == str(path), name
    assert any(t.data_ptr() % t.element_size() for t in got.values())
    np_got = tensorlift.load(str(path), framework="numpy")
    assert not all(a.flags.aligned for a in np_got.values())
    assert (np_got["b"] == want["b"].numpy()).all()
    copies = tensorlift.load(str(path), copy=True)
    for name, t in want.items():
        assert torch.equal(copies[name], t), name
        assert copies[name].data_ptr() % t.element_size() == 0, name
        assert mapping_of(copies[name].data_ptr()) != str(path), name
    from tensorlift.torch import load_file as tl_load_file
    for name, t in tl_load_file(str(path)).items():
        assert torch.equal(t, want[name]), name
