"""Name by name against the installed safetensors (issue 17): every public and
semi-public attribute of `safetensors`, `safetensors.torch` and
`safetensors.numpy` exists in tensorlift's modules, and behaves the same on a
shared set of inputs (same results, or the same exception type).

What deliberately differs is listed in docs/python.md ("What differs from
safetensors"): deserialize's order (file order here, a hash map's there) and the
text after the "Error while ...: " prefixes.
"""
import io
import threading
import types

import numpy as np
import pytest
import torch

import safetensors
import safetensors.numpy as ref_np
import safetensors.torch as ref_pt
import tensorlift
import tensorlift.numpy as tl_np
import tensorlift.torch as tl_pt

MODULES = [(safetensors, tensorlift), (ref_pt, tl_pt), (ref_np, tl_np)]


def public_names(module):
    return sorted(n for n in dir(module) if not (n.startswith("__") and n.endswith("__"))
                  and not isinstance(getattr(module, n), types.ModuleType))


@pytest.mark.parametrize("ref,ours", MODULES, ids=lambda m: m.__name__)
def test_every_name_of_the_reference_exists(ref, ours):
    missing = [n for n in public_names(ref) if not hasattr(ours, n)]
    assert not missing, f"{ours.__name__} lacks {missing}"
    # Names that are the same kind of thing: callables stay callable, tables stay tables.
    for n in public_names(ref):
        r, o = getattr(ref, n), getattr(ours, n)
        assert callable(r) == callable(o), n
        if isinstance(r, dict):
            assert r == o, n


def outcome(fn, *args, **kwargs):
    """("ok", result) or ("error", exception type name): for comparing the two libraries."""
    try:
        return "ok", fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 (the type is what is compared)
        kind = type(e)
        # Both libraries' SafetensorError count as one type.
        if kind.__name__ == "SafetensorError" or isinstance(e, tensorlift.SafetensorError):
            return "error", "SafetensorError"
        return "error", kind.__name__


def both(name, *args, module=(safetensors, tensorlift), **kwargs):
    ref, ours = module
    return outcome(getattr(ref, name), *args, **kwargs), outcome(getattr(ours, name), *args, **kwargs)


# --- TensorSpec, serialize, serialize_file, deserialize -----------------------------

SPEC_DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16",
               "float32", "float64", "bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2",
               "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2", "complex64"]
BITS = {"bool": 8, "int8": 8, "uint8": 8, "int16": 16, "uint16": 16, "int32": 32, "uint32": 32, "int64": 64,
        "uint64": 64, "float16": 16, "float32": 32, "float64": 64, "bfloat16": 16, "complex64": 64,
        "float4_e2m1fn_x2": 8}


def spec_fields(spec):
    return spec.dtype, spec.shape, spec.data_ptr, spec.data_len, repr(spec)


@pytest.mark.parametrize("dtype", SPEC_DTYPES + ["F32", "BF16", "f32", "int4", "float6_e2m3fn", ""])
@pytest.mark.parametrize("shape", [[2, 3], [], [0, 4], (5,)])
def test_tensor_spec(dtype, shape):
    buf = np.zeros(64, np.uint8)
    kwargs = dict(dtype=dtype, shape=shape, data_ptr=buf.ctypes.data, data_len=24)
    (rk, r), (ok, o) = both("TensorSpec", **kwargs)
    assert rk == ok, (dtype, r, o)
    if rk == "ok":
        assert spec_fields(o) == spec_fields(r)
    else:
        assert o == r


@pytest.mark.parametrize("kwargs", [
    dict(dtype=np.float32, shape=[1], data_ptr=0, data_len=4),  # not a str
    dict(dtype="float32", shape=[-1], data_ptr=0, data_len=4),  # negative
    dict(dtype="float32", shape=[1], data_ptr=-8, data_len=4),
    dict(dtype="float32", shape=[1], data_ptr=0),  # missing data_len
])
def test_tensor_spec_bad_arguments(kwargs):
    r, o = both("TensorSpec", **kwargs)
    assert r[0] == o[0] == "error" and r[1] == o[1]
    r, o = both("TensorSpec", "float32", [1], 0, 4)  # keyword-only
    assert r == o == ("error", "TypeError")


def random_specs(seed, keep):
    """name -> TensorSpec over random bytes for every dtype (also empty and 0-d tensors)."""
    rng = np.random.default_rng(seed)
    specs = {}
    for i, dtype in enumerate(SPEC_DTYPES):
        for shape in ([3, 5], [], [0, 2]):
            if dtype == "float4_e2m1fn_x2" and not shape:
                continue  # Half a byte: refused by both (test_serialize_bad_arguments).
            n = int(np.prod(shape, dtype=np.int64))
            nbytes = n * BITS.get(dtype, 8) // 8
            data = rng.integers(0, 256, nbytes, dtype=np.uint8)
            keep.append(data)
            specs[f"t{i}_{len(shape)}_{n}"] = (dtype, shape, data)
    return specs


def build(module, specs):
    return {k: module.TensorSpec(dtype=d, shape=s, data_ptr=a.ctypes.data, data_len=a.nbytes)
            for k, (d, s, a) in specs.items()}


@pytest.mark.parametrize("metadata", [None, {}, {"z": "é \" \n"}])
def test_serialize_gives_the_reference_bytes(tmp_path, metadata):
    keep = []
    specs = random_specs(1, keep)
    ref = safetensors.serialize(build(safetensors, specs), metadata=metadata)
    ours = tensorlift.serialize(build(tensorlift, specs), metadata=metadata)
    assert isinstance(ours, bytes) and ours == ref
    safetensors.serialize_file(build(safetensors, specs), tmp_path / "ref.safetensors", metadata=metadata)
    tensorlift.serialize_file(build(tensorlift, specs), tmp_path / "ours.safetensors", metadata=metadata)
    assert (tmp_path / "ours.safetensors").read_bytes() == (tmp_path / "ref.safetensors").read_bytes() == ref
    assert tensorlift.serialize({}) == safetensors.serialize({})


def test_serialize_many_metadata_keys():
    # The reference orders 2+ metadata keys as its hash map does (from run to run): compare the
    # parsed headers and the data; tensorlift sorts them.
    keep = []
    specs = random_specs(3, keep)
    md = {"format": "pt", "z": "1", "a": "", "m": "é"}
    ref = safetensors.serialize(build(safetensors, specs), metadata=md)
    ours = tensorlift.serialize(build(tensorlift, specs), metadata=md)
    n = int.from_bytes(ref[:8], "little")
    assert len(ours) == len(ref) and ours[8 + n:] == ref[8 + n:]
    import json
    assert json.loads(ours[8:8 + n]) == json.loads(ref[8:8 + n])
    assert list(json.loads(ours[8:8 + n])["__metadata__"]) == sorted(md)


def test_serialize_bad_arguments(tmp_path):
    buf = np.zeros(16, np.float32)

    def spec(module, **kw):
        return module.TensorSpec(**{**dict(dtype="float32", shape=[4], data_ptr=buf.ctypes.data, data_len=16), **kw})

    cases = [
        lambda m: ([spec(m)], None),
        lambda m: ({1: spec(m)}, None),
        lambda m: ({"a": {"dtype": "F32", "shape": [4], "data": b"0" * 16}}, None),
        lambda m: ({"a": spec(m)}, {"k": 1}),
        lambda m: ({"a": spec(m)}, {1: "v"}),
        lambda m: ({"a": spec(m, data_len=12)}, None),  # too few bytes for the shape
        lambda m: ({"a": spec(m, shape=[5])}, None),
        lambda m: ({"a": spec(m, dtype="float4_e2m1fn_x2", shape=[], data_len=1)}, None),  # half a byte
    ]
    for case in cases:
        args_ref, args_ours = case(safetensors), case(tensorlift)
        r = outcome(safetensors.serialize, args_ref[0], metadata=args_ref[1])
        o = outcome(tensorlift.serialize, args_ours[0], metadata=args_ours[1])
        assert r[0] == o[0] == "error" and r[1] == o[1], (case, r, o)
    r = outcome(safetensors.serialize_file, {"a": spec(safetensors)}, tmp_path / "no" / "x.safetensors")
    o = outcome(tensorlift.serialize_file, {"a": spec(tensorlift)}, tmp_path / "no" / "x.safetensors")
    assert r == o == ("error", "SafetensorError")


def test_serialize_file_never_changes_a_mapped_file(tmp_path):
    """serialize_file writes a new file and renames it over the old one: tensors over the old
    file's bytes (views of its page cache, an open safe_open) keep the old bytes."""
    path = tmp_path / "m.safetensors"
    old = {"w": torch.arange(4096, dtype=torch.float32)}
    tl_pt.save_file(old, path)
    views = tensorlift.load(path)  # views of the page cache
    f = tensorlift.safe_open(path, "pt")
    new = np.full(4096, 7, np.float32)
    tensorlift.serialize_file({"w": tensorlift.TensorSpec(dtype="float32", shape=[4096], data_ptr=new.ctypes.data,
                                                         data_len=new.nbytes)}, path)
    assert torch.equal(views["w"], old["w"])
    assert torch.equal(f.get_tensor("w"), old["w"])
    assert torch.equal(tl_pt.load_file(path)["w"], torch.full((4096,), 7.0))
    assert [p.name for p in tmp_path.iterdir()] == ["m.safetensors"]  # no temporary file left


def as_dict(items):
    return {name: (v["dtype"], list(v["shape"]), bytes(v["data"])) for name, v in items}


def test_deserialize_matches_the_reference():
    keep = []
    data = safetensors.serialize(build(safetensors, random_specs(2, keep)), metadata={"a": "b"})
    ref, ours = safetensors.deserialize(data), tensorlift.deserialize(data)
    assert as_dict(ours) == as_dict(ref)
    assert all(isinstance(v["data"], bytearray) and isinstance(v["shape"], list) for _, v in ours)
    assert sorted(ours[0][1]) == sorted(ref[0][1])
    # tensorlift's order: the file's.
    import json
    header = json.loads(data[8:8 + int.from_bytes(data[:8], "little")])
    header.pop("__metadata__")
    assert [n for n, _ in ours] == sorted(header, key=lambda n: header[n]["data_offsets"])
    for bad in (b"", b"garbage", data[:-1], data[:8] + b"[" + data[9:]):
        assert both("deserialize", bad) == (("error", "SafetensorError"),) * 2
    for bad in ("str", bytearray(data), memoryview(data)):
        assert both("deserialize", bad) == (("error", "TypeError"),) * 2


# --- _safe_open_handle ---------------------------------------------------------------

@pytest.mark.parametrize("framework", ["pt", "np"])
@pytest.mark.parametrize("mode", ["rb", "r"])
def test_safe_open_handle(tmp_path, framework, mode):
    path = tmp_path / "m.safetensors"
    tl_pt.save_file({"a": torch.randn(3, 4), "b": torch.arange(5, dtype=torch.int16)}, path, metadata={"k": "v"})
    results = []
    for module in (safetensors, tensorlift):
        with open(path, mode) as f:
            f.seek(3)
            with module._safe_open_handle(f, framework=framework, device="cpu") as g:
                got = (g.keys(), g.offset_keys(), g.metadata(),
                       {k: np.asarray(g.get_tensor(k)).tobytes() for k in g.keys()},
                       np.asarray(g.get_slice("a")[1:]).tobytes(),
                       {k: np.asarray(v).tobytes() for k, v in g.get_tensors().items()})
            assert not f.closed and f.tell() == 3  # The caller's file, untouched.
        results.append(got)
    assert results[0] == results[1]
    for arg in (io.BytesIO(path.read_bytes()), str(path), 3):
        assert both("_safe_open_handle", arg, "np") == (("error", "AttributeError"),) * 2


def test_safe_open_handle_outlives_the_callers_file(tmp_path):
    path = tmp_path / "m.safetensors"
    tl_pt.save_file({"a": torch.arange(6.0)}, path)
    with open(path, "rb") as f:
        g = tensorlift._safe_open_handle(f, "pt")
    assert torch.equal(g.get_tensor("a"), torch.arange(6.0))


# --- safetensors.torch's helpers ---------------------------------------------------

def torch_cases():
    base = torch.arange(24, dtype=torch.float32)
    m = torch.arange(12, dtype=torch.int16).reshape(3, 4)
    return {
        "whole": base,
        "view": base.view(4, 6),
        "front": base[:12],
        "back": base[12:],
        "middle": base[6:18],
        "strided": base[::2],
        "transposed": m.t(),
        "m": m,
        "empty": torch.empty(0),
        "scalar": torch.tensor(3.5),
        "meta": torch.empty(4, device="meta"),
        "bf16": torch.ones(3, dtype=torch.bfloat16),
        "f8": torch.zeros(4, dtype=torch.float8_e4m3fn),
        "f4": torch.zeros(2, 2, dtype=torch.uint8).view(torch.float4_e2m1fn_x2),
        "bool": torch.tensor([True, False]),
        "u32": torch.zeros(3, dtype=torch.uint32),
    }


@pytest.mark.parametrize("name", ["storage_ptr", "storage_size", "_end_ptr", "_is_complete"])
def test_torch_tensor_helpers(name):
    for case, t in torch_cases().items():
        r, o = both(name, t, module=(ref_pt, tl_pt))
        assert r == o, (name, case, r, o)


SHARED_STATE_DICTS = {
    "tied": lambda c: {"a": c["whole"], "b": c["view"], "c": c["m"]},
    "halves": lambda c: {"front": c["front"], "back": c["back"]},
    "overlaps": lambda c: {"front": c["front"], "middle": c["middle"], "back": c["back"]},
    "chain": lambda c: {"whole": c["whole"], "front": c["front"], "back": c["back"]},
    # The reference cuts a group where a tensor starts past the end of the one before it in
    # address order, even inside a larger tensor: {whole, small}, {late}.
    "cut": lambda c: {"whole": c["whole"], "small": c["whole"][2:4], "late": c["whole"][10:12]},
    "no_complete": lambda c: {"front": c["front"], "middle": c["middle"]},
    "meta_and_empty": lambda c: {"meta": c["meta"], "empty": c["empty"], "s": c["scalar"]},
    "independent": lambda c: {"x": torch.ones(3), "y": torch.ones(3)},
}


@pytest.mark.parametrize("case", SHARED_STATE_DICTS)
def test_torch_shared_tensor_helpers(case):
    sd = SHARED_STATE_DICTS[case](torch_cases())
    assert both("_find_shared_tensors", sd, module=(ref_pt, tl_pt)) == \
        (outcome(ref_pt._find_shared_tensors, sd),) * 2
    groups = [set(sd)]
    assert outcome(ref_pt._filter_shared_not_shared, [set(g) for g in groups], sd) == \
        outcome(tl_pt._filter_shared_not_shared, [set(g) for g in groups], sd)
    for kwargs in ({}, {"preferred_names": sorted(sd)[-1:]}, {"discard_names": sorted(sd)[:1]},
                   {"preferred_names": ["nope"], "discard_names": list(sd)}):
        r, o = both("_remove_duplicate_names", sd, module=(ref_pt, tl_pt), **kwargs)
        assert r[0] == o[0] and (r[1] == o[1] if r[0] == "error" else dict(r[1]) == dict(o[1])), (kwargs, r, o)
    r, o = both("_evaluate_tensors_for_save", {k: v for k, v in sd.items() if k != "meta"}, module=(ref_pt, tl_pt))
    assert r == o


def test_torch_dtype_tables_and_getdtype():
    for name in ("_float8_e4m3fn", "_float8_e4m3fnuz", "_float8_e5m2", "_float8_e5m2fnuz", "_float8_e8m0",
                 "_float4_e2m1_x2", "_SIZE", "_TYPES"):
        assert getattr(tl_pt, name) == getattr(ref_pt, name), name
    for code in list(ref_pt._TYPES) + ["F4", "F8_E8M0", "X"]:
        assert both("_getdtype", code, module=(ref_pt, tl_pt)) == (outcome(ref_pt._getdtype, code),) * 2
    for code in list(ref_np._TYPES) + ["BF16", "X"]:
        assert both("_getdtype", code, module=(ref_np, tl_np)) == (outcome(ref_np._getdtype, code),) * 2
    assert tl_np._TYPES == ref_np._TYPES


def test_torch_flatten_to_ndarray_and_view2torch():
    c = torch_cases()
    tensors = {k: c[k] for k in ("m", "scalar", "bf16", "f8", "f4", "bool", "u32", "empty")}
    specs = []
    for module in (ref_pt, tl_pt):
        keep = []
        flat = module._flatten_as_ptr(tensors, keep)
        specs.append({k: (s.dtype, s.shape, s.data_len) for k, s in flat.items()})
        assert len(keep) == len(tensors)
        assert module.serialize(flat) == ref_pt.save(tensors)
    assert specs[0] == specs[1]
    for t in tensors.values():
        (rk, (ra, rt)), (ok, (oa, ot)) = both("_to_ndarray", t, module=(ref_pt, tl_pt))
        assert rk == ok == "ok" and ra.tobytes() == oa.tobytes() and ra.dtype == oa.dtype
    for bad in ({"t": c["transposed"]}, {"s": c["strided"]}, [c["m"]], {"x": 3},
                {"sp": torch.eye(3).to_sparse()}, {"a": c["whole"], "b": c["front"]}):
        r, o = both("_flatten_as_ptr", bad, [], module=(ref_pt, tl_pt))
        assert r[0] == o[0] == "error" and r[1] == o[1], (bad, r, o)
    data = ref_pt.save({k: v for k, v in tensors.items() if v.dtype in ref_pt._TYPES.values()})
    ref, ours = ref_pt._view2torch(ref_pt.deserialize(data)), tl_pt._view2torch(tl_pt.deserialize(data))
    assert ref.keys() == ours.keys()
    for k in ref:
        assert ref[k].dtype == ours[k].dtype and ref[k].shape == ours[k].shape
        assert ref[k].reshape(-1).view(torch.uint8).numpy().tobytes() == \
            ours[k].reshape(-1).view(torch.uint8).numpy().tobytes()


def test_numpy_helpers():
    arrays = {"f": np.arange(6, dtype=np.float32).reshape(2, 3), "big": np.arange(4, dtype=">i4"),
              "native": np.arange(3, dtype="=f8"), "u8": np.arange(5, dtype=np.uint8), "b": np.array([True]),
              "c": np.array([1 + 2j], dtype=np.complex64), "s": np.array(2.5, dtype=np.float16)}
    for a in arrays.values():
        assert both("_is_little_endian", a, module=(ref_np, tl_np)) == (outcome(ref_np._is_little_endian, a),) * 2
    flat = []
    for module in (ref_np, tl_np):
        keep = []
        specs = module._flatten(arrays, keep)
        flat.append(({k: (s.dtype, s.shape, s.data_len) for k, s in specs.items()}, module.serialize(specs)))
        assert len(keep) == 1  # the byteswapped copy of the big-endian array
    assert flat[0] == flat[1]
    ref, ours = ref_np._view2np(ref_np.deserialize(flat[0][1])), tl_np._view2np(tl_np.deserialize(flat[0][1]))
    assert ref.keys() == ours.keys()
    for k in ref:
        assert ref[k].dtype == ours[k].dtype and ref[k].shape == ours[k].shape
        assert ref[k].tobytes() == ours[k].tobytes()


# --- safe_open from several threads --------------------------------------------------

def test_safe_open_from_many_threads(tmp_path):
    path = tmp_path / "m.safetensors"
    tensors = {f"t{i}": torch.randn(64, 33) for i in range(32)}
    tl_pt.save_file(tensors, path)
    for module in (safetensors, tensorlift):
        errors, got = [], {}
        with module.safe_open(path, framework="pt") as f:
            def work(i):
                try:
                    for k in sorted(tensors)[i::4]:
                        got[k] = (f.get_tensor(k), f.get_slice(k)[3:9, ::2])
                except Exception as e:  # noqa: BLE001
                    errors.append(e)
            threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        assert not errors, (module.__name__, errors)
        for k, t in tensors.items():
            assert torch.equal(got[k][0], t) and torch.equal(got[k][1], t[3:9, ::2])


# --- device= -----------------------------------------------------------------------------

DEVICES = ["cpu", None, "cuda", "cuda:0", 0, 3, "mps", "npu", "npu:1", "xpu:1", "hpu", "meta", "bogus", "cuda:x",
           "cuda:", "cuda:-1", -1, "cpu:0", "CPU", torch.device("cpu"), 1.5]


@pytest.mark.parametrize("device", DEVICES, ids=repr)
@pytest.mark.parametrize("framework", ["pt", "np"])
def test_device_strings(tmp_path, framework, device):
    """Where (open or read) and with what type each device fails or works, as the reference."""
    path = tmp_path / "m.safetensors"
    tl_pt.save_file({"a": torch.ones(2)}, path)

    def where(lib):
        try:
            f = lib.safe_open(path, framework, device=device)
        except Exception as e:  # noqa: BLE001
            return "open", outcome(lambda: (_ for _ in ()).throw(e))[1]
        r = outcome(f.get_tensor, "a")
        return ("read", r[1]) if r[0] == "error" else ("ok", str(getattr(r[1], "device", "cpu")))

    assert where(tensorlift) == where(safetensors)
