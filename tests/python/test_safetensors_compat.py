"""tensorlift's safetensors-compatible API side by side with the reference
`safetensors` package (0.8) on the same files.

- writers: tensorlift.torch / tensorlift.numpy write the reference's bytes;
- readers: the same tensors (dtype, shape, bytes) for every dtype both support;
- round trips through bytes, including the dtypes the reference cannot load;
- safe_open: keys, offset_keys, metadata, get_tensor, get_slice (shape, dtype,
  indexing against the reference's results), the context manager and errors;
- save_model / load_model with tied weights;
- the corrupt-file corpus of the foundation issue (build/tl_make_corpus): where
  the reference errors, tensorlift raises FormatError; where both accept, the
  same keys and tensors.

Differences from the reference that are deliberate are asserted as such (see
docs/python.md, "Differences from safetensors").
"""
import json
import os
import pathlib
import pickle
import subprocess

import ml_dtypes
import numpy as np
import pytest
import safetensors
import safetensors.numpy as ref_np
import safetensors.torch as ref_pt
import torch
from safetensors import safe_open as ref_open

import tensorlift
import tensorlift.numpy as tl_np
import tensorlift.torch as tl_pt
from tensorlift import safe_open as tl_open
from tensorlift._tensorlift import parse_header

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("TENSORLIFT_BUILD", ROOT / "build"))

TORCH_DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.uint16, torch.float16, torch.bfloat16,
    torch.int32, torch.uint32, torch.float32, torch.complex64, torch.float64, torch.int64, torch.uint64,
    torch.float8_e5m2, torch.float8_e4m3fn, torch.float8_e8m0fnu, torch.float8_e4m3fnuz,
    torch.float8_e5m2fnuz, torch.float4_e2m1fn_x2,
]
NUMPY_DTYPES = [
    np.bool_, np.uint8, np.int8, np.int16, np.uint16, np.float16, np.int32, np.uint32, np.float32,
    np.complex64, np.float64, np.int64, np.uint64, ml_dtypes.bfloat16, ml_dtypes.float8_e5m2,
    ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e8m0fnu, ml_dtypes.float8_e4m3fnuz, ml_dtypes.float8_e5m2fnuz,
]


INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def raw(t) -> bytes:
    """The bytes of a torch tensor or numpy array, in row-major order."""
    if isinstance(t, torch.Tensor):
        t = t.view(INT_OF_SIZE[t.element_size()]).numpy()  # Any dtype, any strides.
    return np.array(t, order="C").tobytes()


def same(a, b):
    assert type(a) is type(b)
    assert a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape)
    assert raw(a) == raw(b)


def random_tensors(seed=0):
    g = torch.Generator().manual_seed(seed)
    out = {}
    for i, d in enumerate(TORCH_DTYPES):
        bits = torch.randint(0, 256, (3, 16), dtype=torch.uint8, generator=g)
        name = str(d).split(".")[-1]
        out[name] = (bits % 2).bool() if d == torch.bool else bits.view(d)
    out["empty"] = torch.zeros(0, 7)
    out["scalar"] = torch.tensor(2.5, dtype=torch.float64)
    out["vector"] = torch.arange(11, dtype=torch.int16)
    return out


def random_arrays(seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for d in NUMPY_DTYPES:
        bits = rng.integers(0, 256, size=(4, 16), dtype=np.uint8)
        name = np.dtype(d).name
        out[name] = (bits % 2).astype(bool) if d is np.bool_ else bits.view(d)
    out["empty"] = np.zeros((3, 0), dtype=np.float32)
    out["scalar"] = np.array(7, dtype=np.int64)
    return out


# --- writers: the same bytes ---------------------------------------------------

@pytest.mark.parametrize("metadata", [None, {}, {"format": "pt"}])
def test_torch_writer_bytes(tmp_path, metadata):
    t = random_tensors()
    assert tl_pt.save(t, metadata=metadata) == ref_pt.save(t, metadata=metadata)
    ref_pt.save_file(t, tmp_path / "ref.safetensors", metadata=metadata)
    tl_pt.save_file(t, tmp_path / "tl.safetensors", metadata=metadata)
    assert (tmp_path / "tl.safetensors").read_bytes() == (tmp_path / "ref.safetensors").read_bytes()


@pytest.mark.parametrize("metadata", [None, {}, {"k": "v \" é \n"}])
def test_numpy_writer_bytes(tmp_path, metadata):
    a = random_arrays()
    assert tl_np.save(a, metadata=metadata) == ref_np.save(a, metadata=metadata)
    ref_np.save_file(a, str(tmp_path / "ref.safetensors"), metadata=metadata)
    tl_np.save_file(a, str(tmp_path / "tl.safetensors"), metadata=metadata)
    assert (tmp_path / "tl.safetensors").read_bytes() == (tmp_path / "ref.safetensors").read_bytes()


def test_writer_many_metadata_keys():
    # The reference orders 2+ metadata keys randomly (its HashMap): compare parsed headers.
    t = random_tensors()
    md = {f"key{i}": f"value{i}" for i in range(5)}
    ours, ref = tl_pt.save(t, metadata=md), ref_pt.save(t, metadata=md)
    assert len(ours) == len(ref)
    assert parse_header(ours) == parse_header(ref)
    header_len = int.from_bytes(ours[:8], "little")
    assert ours[8 + header_len:] == ref[8 + header_len:]
    assert list(parse_header(ours)[1]) == sorted(md)  # Ours: sorted keys, reproducible.


def test_writer_names_and_order():
    t = {"b": torch.ones(3), "a": torch.ones(2, dtype=torch.int64), "é😀": torch.zeros(1, dtype=torch.bfloat16),
         "": torch.zeros(2, dtype=torch.uint8), 'q"\\': torch.zeros(0)}
    assert tl_pt.save(t) == ref_pt.save(t)


def test_writer_views_of_one_storage():
    z = torch.arange(8, dtype=torch.float32)
    for t in ({"a": z[:4], "b": z[4:]}, {"a": z[1:3]}, {"a": z.reshape(2, 4)[1]}):
        assert tl_pt.save(t) == ref_pt.save(t)


def test_writer_empty_metadata_without_tensors():
    # The reference writes invalid JSON here ({},"__metadata__":{}}), which its
    # own reader rejects; tensorlift writes a valid file.
    ours = tl_pt.save({}, metadata={})
    assert parse_header(ours) == ([], {}, len(ours))
    with pytest.raises(safetensors.SafetensorError):
        safetensors.deserialize(ref_pt.save({}, metadata={}))
    assert safetensors.deserialize(ours) == []
    assert tl_pt.save({}) == ref_pt.save({})


def test_numpy_writer_layouts():
    # Non-native byte order is written little-endian, as the reference does.
    a = {"be": np.arange(6, dtype=">f4").reshape(2, 3), "le": np.arange(3, dtype="<i2")}
    assert tl_np.save(a) == ref_np.save(a)
    # Views: the reference writes the bytes under the pointer (wrong values);
    # tensorlift writes the values the array shows.
    strided = np.arange(10, dtype=np.int64)[::2]
    fortran = np.asfortranarray(np.arange(6, dtype=np.int32).reshape(2, 3))
    back = tl_np.load(tl_np.save({"s": strided, "f": fortran}))
    np.testing.assert_array_equal(back["s"], strided)
    np.testing.assert_array_equal(back["f"], fortran)
    np.testing.assert_array_equal(ref_np.load(ref_np.save({"s": np.ascontiguousarray(strided)}))["s"], back["s"])


def test_torch_save_errors_match():
    z = torch.zeros(4)
    cases = [
        ([1], ValueError),                                      # not a dict
        ({"a": 1}, ValueError),                                 # not a tensor
        ({"a": torch.zeros(3).to_sparse()}, ValueError),        # sparse
        ({"a": torch.zeros(2, 3).t()}, ValueError),             # not contiguous
        ({"a": torch.zeros(2)[None].expand(3, 2)}, ValueError),  # not contiguous
        ({"a": z, "b": z}, RuntimeError),                       # shared memory
        ({"a": z[:3], "b": z[2:]}, RuntimeError),               # overlapping views
        ({1: torch.zeros(2)}, TypeError),                       # name not a str
    ]
    for tensors, kind in cases:
        with pytest.raises(kind):
            ref_pt.save(tensors)
        with pytest.raises(kind):
            tl_pt.save(tensors)
    for md in ({"a": 1}, {1: "a"}):
        with pytest.raises(TypeError):
            ref_pt.save({"x": torch.zeros(1)}, metadata=md)
        with pytest.raises(TypeError):
            tl_pt.save({"x": torch.zeros(1)}, metadata=md)
    # No safetensors dtype: the reference raises KeyError (a lookup miss), tensorlift ValueError;
    # in numpy both raise SafetensorError("Unknown dtype ...") (test_error_compat.py).
    with pytest.raises(KeyError):
        ref_pt.save({"c": torch.zeros(2, dtype=torch.complex128)})
    with pytest.raises(ValueError, match="complex128"):
        tl_pt.save({"c": torch.zeros(2, dtype=torch.complex128)})
    with pytest.raises(tensorlift.SafetensorError, match='Unknown dtype "float128"'):
        tl_np.save({"f": np.zeros(2, dtype=np.float128)})


def test_torch_save_lazy_views_and_grad():
    x = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    assert tl_pt.load(tl_pt.save({"c": x.conj()}))["c"].equal(x.conj().resolve_conj())
    p = torch.nn.Parameter(torch.ones(3))
    assert tl_pt.save({"p": p}) == ref_pt.save({"p": p})


# --- readers: the same tensors --------------------------------------------------

def test_torch_load_file_matches_reference(tmp_path):
    path = tmp_path / "m.safetensors"
    ref_pt.save_file(random_tensors(1), path, metadata={"format": "pt"})
    ref, ours = ref_pt.load_file(path), tl_pt.load_file(path)
    assert list(ours) == list(ref)  # File order, as the reference's get_tensors.
    for k in ref:
        same(ours[k], ref[k])
    # Each tensor owns distinct memory: it can be saved back unchanged.
    assert tl_pt.save(ours, metadata={"format": "pt"}) == path.read_bytes()
    assert ref_pt.save(ours, metadata={"format": "pt"}) == path.read_bytes()


def test_numpy_load_file_matches_reference(tmp_path):
    path = tmp_path / "m.safetensors"
    ref_np.save_file(random_arrays(2), str(path))
    ours = tl_np.load_file(path)
    with ref_open(path, "np") as f:
        for k in f.offset_keys():
            try:
                expected = f.get_tensor(k)
            except AttributeError:
                # The reference has no numpy dtype for F8 (numpy.float8_* does
                # not exist); tensorlift returns the ml_dtypes type.
                assert f.get_slice(k).get_dtype().startswith("F8")
                assert ours[k].dtype.name.startswith("float8")
                continue
            same(ours[k], expected)
    assert list(ours) == safe_offset_keys(path)


def safe_offset_keys(path):
    with ref_open(path, "np") as f:
        return f.offset_keys()


def test_round_trips():
    t = random_tensors(3)
    back = tl_pt.load(tl_pt.save(t))
    assert sorted(back) == sorted(t)
    for k in t:
        same(back[k], t[k])
    ref_back = ref_pt.load(tl_pt.save({k: v for k, v in t.items() if "e8m0" not in k and "float4" not in k}))
    for k, v in ref_back.items():
        same(back[k], v)
    a = random_arrays(4)
    back_np = tl_np.load(tl_np.save(a))
    for k in a:
        same(back_np[k], a[k])
    # bytes-like input and independent, writable results.
    data = bytearray(tl_pt.save({"x": torch.arange(4.0)}))
    x = tl_pt.load(data)["x"]
    x += 1
    assert tl_pt.load(bytes(data))["x"].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_f4_header_shape_and_unsupported_dtypes(tmp_path):
    f4 = torch.randint(0, 256, (2, 3), dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    data = tl_pt.save({"f4": f4})
    assert data == ref_pt.save({"f4": f4})
    assert parse_header(data)[0][0][1:3] == ("F4", (2, 6))
    path = tmp_path / "f4.safetensors"
    path.write_bytes(data)
    with ref_open(path, "pt") as r, tl_open(path, "pt") as t:
        same(t.get_tensor("f4"), r.get_tensor("f4"))
        assert t.get_slice("f4").get_shape() == r.get_slice("f4").get_shape() == [2, 6]
    # numpy has no F4: the raw uint8 rule (last dimension scaled by 4/8 bits).
    with tl_open(path, "np") as t:
        got = t.get_tensor("f4")
    assert got.dtype == np.uint8 and got.shape == (2, 3) and got.tobytes() == raw(f4)
    # F6 (no framework has it): raw uint8 too, in both frameworks.
    f6 = b'{"x":{"dtype":"F6_E2M3","shape":[2,4],"data_offsets":[0,6]}}'
    f6 = len(f6).to_bytes(8, "little") + f6 + bytes(range(6))
    assert tl_pt.load(f6)["x"].shape == (2, 3) and tl_np.load(f6)["x"].dtype == np.uint8


# --- safe_open -----------------------------------------------------------------

@pytest.fixture()
def model_file(tmp_path):
    g = torch.Generator().manual_seed(5)
    t = {
        "w": torch.randn(7, 5, 3, generator=g),
        "bf": torch.randn(9, 4, generator=g).to(torch.bfloat16),
        "mask": torch.rand(6, 2, generator=g) > 0.5,
        "f8": torch.randn(8, 4, generator=g).to(torch.float8_e4m3fn),
        "f4": torch.randint(0, 256, (4, 3), dtype=torch.uint8, generator=g).view(torch.float4_e2m1fn_x2),
        "ids": torch.arange(10, dtype=torch.int64),
        "c": torch.randn(3, 2, dtype=torch.complex64, generator=g),
        "empty": torch.zeros(0, 4),
        "scalar": torch.tensor(1.25),
    }
    path = tmp_path / "model.safetensors"
    ref_pt.save_file(t, path, metadata={"format": "pt", "note": "x"})
    return path


@pytest.mark.parametrize("framework", ["pt", "np", "torch", "numpy", "pytorch"])
def test_safe_open_listing(model_file, framework):
    with ref_open(model_file, framework) as r, tl_open(model_file, framework) as t:
        assert t.keys() == r.keys()
        assert t.offset_keys() == r.offset_keys()
        assert t.metadata() == r.metadata()
        for k in r.keys():
            assert t.get_slice(k).get_shape() == r.get_slice(k).get_shape()
            assert t.get_slice(k).get_dtype() == r.get_slice(k).get_dtype()


def test_safe_open_get_tensor(model_file):
    with ref_open(model_file, "pt") as r, tl_open(model_file, "pt") as t:
        for k in r.keys():
            same(t.get_tensor(k), r.get_tensor(k))
        ours = t.get_tensors()
        assert list(ours) == list(r.get_tensors())
        for k in r.keys():
            same(ours[k], r.get_tensor(k))
    with ref_open(model_file, "np") as r, tl_open(model_file, "np") as t:
        for k in r.keys():
            if r.get_slice(k).get_dtype() in ("F8_E4M3", "F4"):
                continue  # The reference cannot make these numpy arrays.
            same(t.get_tensor(k), r.get_tensor(k))


def test_safe_open_no_metadata_and_without_with(tmp_path):
    path = tmp_path / "plain.safetensors"
    ref_pt.save_file({"a": torch.ones(2)}, path)
    f = tl_open(path, "pt")
    assert f.metadata() is None and f.keys() == ["a"]
    assert f.get_tensor("a").tolist() == [1.0, 1.0]
    f.close()
    with pytest.raises(tensorlift.SafetensorError):
        f.keys()


def test_close_releases_the_file(model_file):
    bad = model_file.parent / "bad.safetensors"

    def open_fds():
        """This process's descriptors open on the test's two files. Not all of its descriptors: other
        threads (a server a test before left to wind down) and the garbage collector (an object of
        an earlier test in a reference cycle) open and close their own at any moment."""
        ours = {os.path.realpath(model_file), os.path.realpath(bad)}
        n = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                n += os.readlink(f"/proc/self/fd/{fd}") in ours
            except OSError:
                pass  # closed since the listing (the listing's own descriptor, for one)
        return n

    before = open_fds()
    f = tl_open(model_file, "pt")
    s = f.get_slice("w")
    assert open_fds() == before + 1
    f.close()
    assert open_fds() == before + 1  # The slice still holds it ...
    assert s[0].shape == (5, 3)
    del s
    assert open_fds() == before  # ... until it goes.
    with tl_open(model_file, "np") as f:
        t = f.get_tensor("w")
    assert open_fds() == before and t.shape == (7, 5, 3)  # Tensors do not hold the file.
    bad.write_bytes(b"12345678abc")
    for _ in range(20):
        with pytest.raises(tensorlift.FormatError):
            tl_open(bad, "pt")
    assert open_fds() == before  # A failed open closes its descriptor at once.


PT_INDICES = [
    (), 0, 3, -1, -7, slice(None), slice(2, 5), slice(1, None, 2), slice(-3, None), slice(None, -2),
    slice(0, 20), slice(5, 2), slice(6, 7), [], [1, 2], [0, -1, 3], Ellipsis, (Ellipsis, 1), None,
    (None, 1), (slice(None), 2), (slice(None), slice(1, 4)), (slice(None), slice(None), 0), (2, 1, 0),
    (slice(1, 5, 3), -1), (slice(None), [0, 2]), 100, -100, (0, 0, 0, 0), (slice(None), 9),
]


@pytest.mark.parametrize("name", ["w", "bf", "mask", "f8", "ids", "c", "empty", "scalar"])
def test_get_slice_torch_semantics_match_reference(model_file, name):
    # The reference's torch slices apply torch indexing to the whole tensor;
    # tensorlift gives the same results, and the same error kinds.
    with ref_open(model_file, "pt") as r, tl_open(model_file, "pt") as t:
        rs, ts = r.get_slice(name), t.get_slice(name)
        for idx in PT_INDICES:
            try:
                expected = rs[idx]
            except Exception as e:  # noqa: BLE001
                with pytest.raises(type(e)):
                    ts[idx]
                continue
            got = ts[idx]
            same(got, expected.contiguous())
            assert got.is_contiguous()
            assert got.untyped_storage().nbytes() == got.numel() * got.element_size()  # Owns just its bytes.


def test_get_slice_f4_torch(model_file):
    # The reference fails on F4 slices (it reshapes with the header shape); tensorlift
    # indexes the float4_e2m1fn_x2 tensor that get_tensor returns.
    with tl_open(model_file, "pt") as t:
        full = t.get_tensor("f4")
        s = t.get_slice("f4")
        for idx in [0, slice(1, 3), (slice(None), 1), (slice(None), slice(0, 2)), Ellipsis]:
            same(s[idx], full.view(torch.uint8)[idx].contiguous().view(full.dtype))


NP_INDICES = PT_INDICES + [slice(None, None, -1), (slice(None), slice(None, None, -2)), np.int64(2)]


@pytest.mark.parametrize("name", ["w", "bf", "mask", "ids", "c", "empty", "scalar", "f8", "f4"])
def test_get_slice_numpy(model_file, name):
    # numpy semantics over the array get_tensor returns; equal to the
    # reference's results wherever the reference gives one (it rejects
    # negative bounds, out-of-range stops and lists).
    with ref_open(model_file, "np") as r, tl_open(model_file, "np") as t:
        full = t.get_tensor(name)
        rs, ts = r.get_slice(name), t.get_slice(name)
        for idx in NP_INDICES:
            try:
                want = np.asarray(full[idx])
            except IndexError:
                with pytest.raises(IndexError):
                    ts[idx]
                continue
            got = ts[idx]
            same(got, np.array(want, order="C"))
            assert got.flags.c_contiguous and (got.base is None or got.base.nbytes == got.nbytes)
            if name in ("f8", "f4") or isinstance(idx, np.integer):
                continue
            try:
                expected = rs[idx]
            except Exception:  # noqa: BLE001 - the reference's own limits, see above.
                continue
            same(got, expected)


def test_get_slice_rows_read_from_file(tmp_path):
    # Row windows are read on their own; check them on a larger tensor against the full read.
    path = tmp_path / "big.safetensors"
    big = torch.randn(1000, 37)
    ref_pt.save_file({"big": big, "h": torch.randn(3, 4).half()}, path)
    with tl_open(path, "pt") as t, ref_open(path, "pt") as r:
        s = t.get_slice("big")
        for idx in [slice(10, 20), slice(999, None), slice(0, 1000, 7), (slice(500, 501), slice(3, 9)),
                    (17, slice(None, None, 2)), slice(998, 2000), slice(200, 100)]:
            same(s[idx], r.get_slice("big")[idx].contiguous())


def test_closed_and_missing(model_file):
    for framework in ("pt", "np"):
        r, t = ref_open(model_file, framework), tl_open(model_file, framework)
        rs, ts = r.get_slice("ids"), t.get_slice("ids")
        with pytest.raises(safetensors.SafetensorError, match="does not contain tensor nope"):
            r.get_tensor("nope")
        with pytest.raises(KeyError, match="does not contain tensor nope"):
            t.get_tensor("nope")
        with pytest.raises(tensorlift.SafetensorError):
            t.get_slice("nope")
        r.__exit__(None, None, None)
        with t:
            pass
        for method, args in [("keys", ()), ("offset_keys", ()), ("metadata", ()), ("get_tensor", ("ids",)),
                             ("get_slice", ("ids",)), ("get_tensors", ())]:
            with pytest.raises(safetensors.SafetensorError, match="File is closed"):
                getattr(r, method)(*args)
            with pytest.raises(tensorlift.SafetensorError, match="File is closed"):
                getattr(t, method)(*args)
        # Slices taken before the close stay usable, in both.
        same(ts[2:5], rs[2:5])
        assert ts.get_shape() == rs.get_shape() == [10]
        t.close()  # Idempotent.


def test_open_errors(tmp_path, model_file):
    missing = tmp_path / "missing.safetensors"
    with pytest.raises(FileNotFoundError):
        ref_open(missing, "pt")
    with pytest.raises(FileNotFoundError):
        tl_open(missing, "pt")
    with pytest.raises(OSError):
        ref_open(tmp_path, "pt")
    with pytest.raises(OSError):
        tl_open(tmp_path, "pt")
    for kwargs in ({"framework": "jax-nope"}, {"framework": "np", "device": "cuda"},
                   {"framework": "pt", "backend": "zz"}, {"framework": "pt", "device": "meta"}):
        with pytest.raises(safetensors.SafetensorError):
            ref_open(model_file, **kwargs)
        with pytest.raises(tensorlift.SafetensorError):
            tl_open(model_file, **kwargs)
    with tl_open(model_file, "pt", backend="pread") as f:
        assert f.keys()


def test_error_types():
    assert issubclass(tensorlift.FormatError, ValueError)
    assert issubclass(tensorlift.FormatError, tensorlift.SafetensorError)
    e = pickle.loads(pickle.dumps(tensorlift.FormatError("x")))
    assert type(e) is tensorlift.FormatError and str(e) == "x"


def test_corrupt_file_message_names_the_path(tmp_path, model_file):
    bad = tmp_path / "bad.json"  # A .json name: still one safetensors file, not an index.
    bad.write_bytes(model_file.read_bytes()[:-1])
    with pytest.raises(tensorlift.FormatError, match="MetadataIncompleteBuffer") as e:
        tl_open(bad, "pt")
    assert str(bad) in str(e.value) and "/proc/" not in str(e.value)
    good = tmp_path / "good.json"
    good.write_bytes(model_file.read_bytes())
    with tl_open(good, "pt") as f:
        assert f.keys() == sorted(["w", "bf", "mask", "f8", "f4", "ids", "c", "empty", "scalar"])


def test_file_replaced_or_truncated_after_open(tmp_path):
    # Like the reference's mapping, tensorlift reads the file it opened, even
    # when another one is renamed over the path; a file cut short in place is
    # an error (the reference's mapping would SIGBUS).
    path = tmp_path / "m.safetensors"
    big = torch.arange(3 << 20, dtype=torch.int32)  # 12 MiB: read by the C++ loader.
    small = torch.arange(10.0)
    ref_pt.save_file({"big": big, "small": small}, path)
    with tl_open(path, "pt") as t, ref_open(path, "pt") as r:
        ref_pt.save_file({"big": big + 1, "small": small + 1}, path)  # Temporary file + rename.
        for f in (t, r):
            assert torch.equal(f.get_tensor("small"), small)
            assert torch.equal(f.get_tensor("big"), big)
            assert torch.equal(f.get_slice("big")[5:9], big[5:9])
        assert torch.equal(t.get_tensors()["big"], big)
    with tl_open(path, "pt") as t:
        os.truncate(path, 100)
        with pytest.raises(tensorlift.FormatError):
            t.get_tensor("small")
        with pytest.raises(tensorlift.FormatError):
            t.get_tensor("big")
        with pytest.raises(tensorlift.FormatError):
            t.get_slice("small")[1:2]


# --- save_model / load_model with tied weights ------------------------------------

class Tied(torch.nn.Module):
    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = torch.nn.Embedding(11, 6)
        self.body = torch.nn.Linear(6, 6)
        self.head = torch.nn.Linear(6, 11, bias=False)
        self.head.weight = self.embed.weight  # Tied.
        self.register_buffer("scale", torch.ones(6))


def test_save_model_matches_reference(tmp_path):
    m = Tied()
    for md in (None, {"format": "pt"}):
        ref_pt.save_model(m, tmp_path / "ref.safetensors", metadata=None if md is None else dict(md))
        user_md = None if md is None else dict(md)
        tl_pt.save_model(m, tmp_path / "tl.safetensors", metadata=user_md)
        if md is None:
            assert (tmp_path / "tl.safetensors").read_bytes() == (tmp_path / "ref.safetensors").read_bytes()
        else:
            assert parse_header((tmp_path / "tl.safetensors").read_bytes()) == \
                parse_header((tmp_path / "ref.safetensors").read_bytes())
            assert user_md == md  # Not modified (the reference adds the dropped names to it).
    with tl_open(tmp_path / "tl.safetensors", "pt") as f:
        assert f.keys() == ["body.bias", "body.weight", "embed.weight", "scale"]
        assert f.metadata() == {"format": "pt", "head.weight": "embed.weight"}


def test_load_model_matches_reference(tmp_path):
    path = tmp_path / "m.safetensors"
    ref_pt.save_model(Tied(1), path)
    a, b = Tied(2), Tied(2)
    assert tl_pt.load_model(a, path) == ref_pt.load_model(b, path) == (set(), [])
    for k, v in b.state_dict().items():
        same(a.state_dict()[k], v)
    assert a.head.weight is a.embed.weight and torch.equal(a.head.weight, Tied(1).embed.weight)
    # Missing and unexpected names, strict=False: the same (set, list).
    partial = tmp_path / "partial.safetensors"
    ref_pt.save_file({"embed.weight": torch.zeros(11, 6), "extra": torch.zeros(1)}, partial)
    got, want = tl_pt.load_model(Tied(), partial, strict=False), ref_pt.load_model(Tied(), partial, strict=False)
    assert got == want and isinstance(got[0], set) and isinstance(got[1], list)
    with pytest.raises(RuntimeError) as ours:
        tl_pt.load_model(Tied(), partial)
    with pytest.raises(RuntimeError) as ref:
        ref_pt.load_model(Tied(), partial)
    assert str(ours.value) == str(ref.value)
    # A file saved under the other tied name loads the same way.
    other = tmp_path / "other.safetensors"
    sd = {k: v.contiguous() for k, v in Tied(3).state_dict().items() if k != "embed.weight"}
    ref_pt.save_file(sd, other)
    assert tl_pt.load_model(Tied(), other) == ref_pt.load_model(Tied(), other)


def test_save_model_no_whole_name(tmp_path):
    class Overlap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            z = torch.zeros(4)
            self.register_buffer("a", z[:3])
            self.register_buffer("b", z[1:])

    for mod in (ref_pt, tl_pt):
        with pytest.raises(RuntimeError, match="no suitable name to keep"):
            mod.save_model(Overlap(), tmp_path / "never.safetensors")
    assert not (tmp_path / "never.safetensors").exists()


# --- the corrupt-file corpus ----------------------------------------------------

@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    tool = BUILD / "tl_make_corpus"
    if not tool.exists():
        subprocess.run(["cmake", "--build", str(BUILD), "--target", "tl_make_corpus"], check=True,
                       capture_output=True)
    directory = tmp_path_factory.mktemp("corpus")
    subprocess.run([str(tool), str(directory)], check=True, capture_output=True)
    rows = [line.split("\t") for line in (directory / "manifest.tsv").read_text().splitlines() if line]
    assert len(rows) > 150
    return directory, rows


def _verdict(fn):
    try:
        return "ok", fn()
    except Exception as e:  # noqa: BLE001
        return e, None


def _offsets(path):
    """name -> (begin, end) from the header, parsed with json (independently of both readers)."""
    data = path.read_bytes()
    header = json.loads(data[8:8 + int.from_bytes(data[:8], "little")])
    return {k: tuple(v["data_offsets"]) for k, v in header.items() if k != "__metadata__"}


def test_corpus_safe_open(corpus):
    directory, rows = corpus
    problems = []
    counts = {"both_error": 0, "both_ok": 0, "stricter": 0, "reference_bug": 0}

    def listing(opener, path):
        with opener(path, "pt") as f:
            return f.keys(), f.offset_keys(), f.metadata()

    for name, expected, _ in rows:
        path = directory / f"{name}.safetensors"
        ref, ref_list = _verdict(lambda: listing(ref_open, path))
        ours, our_list = _verdict(lambda: listing(tl_open, path))
        if ref != "ok":
            if not isinstance(ref, safetensors.SafetensorError):
                problems.append(f"{name}: the reference raised {type(ref).__name__}")
            if ours == "ok":
                if expected == "ok":
                    counts["reference_bug"] += 1  # Documented: the reference rejects a valid file.
                    continue
                problems.append(f"{name}: the reference errors, tensorlift accepts")
            elif not isinstance(ours, tensorlift.FormatError):
                problems.append(f"{name}: {type(ours).__name__}, not FormatError: {ours}")
            else:
                counts["both_error"] += 1
        elif ours == "ok":
            counts["both_ok"] += 1
            (our_keys, our_offset_keys, our_md), (ref_keys, ref_offset_keys, ref_md) = our_list, ref_list
            if our_keys != ref_keys or our_md != ref_md or sorted(our_offset_keys) != ref_keys:
                problems.append(f"{name}: {our_list} != {ref_list}")
            # Zero-size tensors at one offset tie; the reference orders ties
            # randomly (its HashMap), tensorlift by header order. Same offsets.
            offsets = _offsets(path)
            if [offsets[k] for k in our_offset_keys] != [offsets[k] for k in ref_offset_keys]:
                problems.append(f"{name}: offset_keys {our_offset_keys} != {ref_offset_keys}")
        else:
            # tensorlift is stricter here on purpose (duplicate names, struct encodings).
            counts["stricter"] += 1
            if expected == "ok" or not isinstance(ours, tensorlift.FormatError):
                problems.append(f"{name}: tensorlift rejects a file the manifest says is valid: {ours}")
        if ours != "ok" and expected != "ok" and expected not in str(ours):
            problems.append(f"{name}: message does not name {expected}: {ours}")
    assert not problems, "\n".join(problems)
    assert counts["both_error"] > 150 and counts["both_ok"] > 40, counts
    assert counts["stricter"] <= 7 and counts["reference_bug"] <= 1, counts


def test_corpus_tensors_and_bytes(corpus):
    # Valid corpus files: the same tensors from every reader wherever the
    # reference can make the tensor; invalid ones: FormatError from load(bytes) too.
    directory, rows = corpus
    problems = []
    for name, expected, _ in rows:
        path = directory / f"{name}.safetensors"
        data = path.read_bytes()
        ref, _ = _verdict(lambda: safetensors.deserialize(data))
        ours, loaded = _verdict(lambda: tl_pt.load(data))
        ours_np, loaded_np = _verdict(lambda: tl_np.load(data))
        if ref != "ok":
            for got in (ours, ours_np):
                if not (got == "ok" and expected == "ok") and not isinstance(got, tensorlift.FormatError):
                    problems.append(f"{name}: load(bytes) gave {got!r}, not FormatError")
            continue
        if expected != "ok":
            continue  # A stricter tensorlift rule (checked in test_corpus_safe_open).
        for framework, whole in (("pt", (ours, loaded)), ("np", (ours_np, loaded_np))):
            with ref_open(path, framework) as r, tl_open(path, framework) as t:
                all_ours = _verdict(t.get_tensors)
                for k in r.keys():
                    ok, want = _verdict(lambda: r.get_tensor(k))
                    got_ok, got = _verdict(lambda: t.get_tensor(k))
                    if ok != "ok":
                        # Dtypes the reference cannot make (F6, numpy F4/F8): ours are
                        # raw uint8 / ml_dtypes; shapes torch cannot hold fail in both.
                        if got_ok != "ok" and not isinstance(got_ok, ValueError):
                            problems.append(f"{name}/{k!r} {framework}: {got_ok!r}")
                        continue
                    if got_ok != "ok":
                        problems.append(f"{name}/{k!r} {framework}: {got_ok!r}")
                        continue
                    for other in (all_ours, whole):
                        if other[0] == "ok":
                            if raw(other[1][k]) != raw(got) or other[1][k].dtype != got.dtype:
                                problems.append(f"{name}/{k!r} {framework}: get_tensors/load differ")
                        else:
                            problems.append(f"{name} {framework}: {other[0]!r}")
                    if got.dtype != want.dtype or tuple(got.shape) != tuple(want.shape) or raw(got) != raw(want):
                        problems.append(f"{name}/{k!r} {framework}: {got.dtype} {tuple(got.shape)} != reference")
    assert not problems, "\n".join(problems)
