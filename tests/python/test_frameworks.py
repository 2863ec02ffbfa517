"""tensorlift.flax / .tensorflow / .mlx against safetensors' modules of the same name
(issue 17): the same bytes and arrays where the framework installs (jax on this
machine's CPU), and the reference's ModuleNotFoundError where it does not."""
import importlib
import importlib.util

import numpy as np
import pytest

import tensorlift.numpy as tl_np

try:
    # paddle before tensorflow: paddle 3.3's import crashes (SIGSEGV in its protobuf
    # registration) in a process that imported tensorflow 2.21 first; the other way works.
    import paddle  # noqa: F401
except ImportError:
    pass

FRAMEWORKS = {"flax": "jax", "tensorflow": "tensorflow", "mlx": "mlx"}


def installed(module):
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


@pytest.mark.parametrize("name", [n for n, fw in FRAMEWORKS.items() if not installed(fw)] or ["none"])
def test_a_missing_framework_raises_the_references_error(tmp_path, name):
    if name == "none":
        pytest.skip("every framework is installed")
    with pytest.raises(ModuleNotFoundError) as ref:
        importlib.import_module(f"safetensors.{name}")
    ours = importlib.import_module(f"tensorlift.{name}")  # imports without its framework
    path = tmp_path / "m.safetensors"
    tl_np.save_file({"a": np.ones(3, np.float32)}, path)
    for call in (lambda: ours.save({}), lambda: ours.save_file({}, tmp_path / "x.safetensors"),
                 lambda: ours.load(path.read_bytes()), lambda: ours.load_file(path)):
        with pytest.raises(ModuleNotFoundError) as e:
            call()
        assert str(e.value) == str(ref.value) and e.value.name == ref.value.name
    assert not (tmp_path / "x.safetensors").exists()


def flax_arrays(jnp):
    rng = np.random.default_rng(5)
    return {
        "f32": jnp.array(rng.standard_normal((3, 4)).astype(np.float32)),
        "bf16": jnp.array(rng.standard_normal(5), dtype=jnp.bfloat16),
        "f16": jnp.array(rng.standard_normal((2, 2)).astype(np.float16)),
        "i32": jnp.arange(7, dtype=jnp.int32),
        "u8": jnp.arange(9, dtype=jnp.uint8).reshape(3, 3),
        "b": jnp.array([True, False, True]),
        "s": jnp.array(2.5, dtype=jnp.float32),
        "e": jnp.zeros((0, 3), dtype=jnp.float32),
    }


def test_flax_matches_the_reference(tmp_path):
    jnp = pytest.importorskip("jax.numpy")
    import safetensors.flax as ref
    import tensorlift.flax as ours
    arrays = flax_arrays(jnp)
    for md in (None, {"format": "flax"}):
        data = ours.save(arrays, metadata=md)
        assert data == ref.save(arrays, metadata=md)
        ours.save_file(arrays, tmp_path / "ours.safetensors", metadata=md)
        ref.save_file(arrays, tmp_path / "ref.safetensors", metadata=md)
        assert (tmp_path / "ours.safetensors").read_bytes() == (tmp_path / "ref.safetensors").read_bytes() == data
    # The reference's load(bytes) goes through safetensors.numpy's _TYPES, which has no BF16
    # (KeyError); tensorlift's gives the bfloat16 array (docs/python.md, what differs).
    with pytest.raises(KeyError):
        ref.load(data)
    assert np.asarray(ours.load(data)["bf16"]).tobytes() == np.asarray(arrays["bf16"]).tobytes()
    plain = {k: v for k, v in arrays.items() if k != "bf16"}
    plain_data = ref.save(plain)
    for got, want in ((ours.load(plain_data), ref.load(plain_data)),
                      (ours.load_file(tmp_path / "ref.safetensors"), ref.load_file(tmp_path / "ref.safetensors"))):
        assert sorted(got) == sorted(want)
        for k in want:
            assert type(got[k]) is type(want[k]) and got[k].dtype == want[k].dtype and got[k].shape == want[k].shape
            assert np.asarray(got[k]).tobytes() == np.asarray(want[k]).tobytes()
    np_dict = ours._jnp2np(arrays)
    assert all(isinstance(v, np.ndarray) for v in np_dict.values())
    assert {k: v.tobytes() for k, v in np_dict.items()} == {k: v.tobytes() for k, v in ref._jnp2np(arrays).items()}
    back = ours._np2jnp(np_dict)
    assert all(np.asarray(back[k]).tobytes() == np.asarray(arrays[k]).tobytes() for k in arrays)


# --- every framework, side by side with the reference (where it is installed) ----------

def numpy_arrays():
    rng = np.random.default_rng(9)
    return {
        "f32": rng.standard_normal((3, 4)).astype(np.float32),
        "f16": rng.standard_normal((2, 2)).astype(np.float16),
        "f64": rng.standard_normal(3),
        "i64": np.arange(5, dtype=np.int64),
        "i32": np.arange(7, dtype=np.int32).reshape(7, 1),
        "u8": np.arange(9, dtype=np.uint8).reshape(3, 3),
        "i8": np.arange(-3, 3, dtype=np.int8),
        "b": np.array([True, False, True]),
        "s": np.array(2.5, dtype=np.float32),
    }


def raw(x):
    """A framework tensor's type, dtype name, shape and bytes, for comparing two of the same framework."""
    a = x.numpy() if hasattr(x, "numpy") and not isinstance(x, np.ndarray) else np.asarray(x)
    return type(x).__name__, str(x.dtype), tuple(a.shape), np.ascontiguousarray(a).tobytes()


def make(name, arrays):
    if name == "flax":
        import jax.numpy as jnp
        return {k: jnp.array(v) for k, v in arrays.items()}
    if name == "tensorflow":
        import tensorflow as tf
        return {k: tf.convert_to_tensor(v) for k, v in arrays.items()}
    if name == "mlx":
        import mlx.core as mx
        return {k: mx.array(v) for k, v in arrays.items()}
    import paddle
    return {k: paddle.to_tensor(v) for k, v in arrays.items()}


ALL = {"flax": "jax", "tensorflow": "tensorflow", "mlx": "mlx", "paddle": "paddle"}


@pytest.mark.parametrize("name", list(ALL))
def test_framework_module_matches_the_reference(tmp_path, name):
    pytest.importorskip(ALL[name])
    ref = importlib.import_module(f"safetensors.{name}")
    ours = importlib.import_module(f"tensorlift.{name}")
    names = [n for n in dir(ref) if not n.startswith("__") and not isinstance(getattr(ref, n), type(np))]
    assert [n for n in names if not hasattr(ours, n)] == []
    arrays = numpy_arrays()
    if name == "tensorflow":
        # A 0-d tf Tensor's .numpy() is a numpy scalar, which safetensors.tensorflow cannot save
        # (AttributeError: no ctypes); tensorlift saves it (docs/python.md, what differs).
        scalar = make(name, {"s": arrays.pop("s")})
        with pytest.raises(AttributeError):
            ref.save(dict(scalar))
        assert tl_np.load(ours.save(scalar))["s"].tobytes() == np.float32(2.5).tobytes()
    tensors = make(name, arrays)
    given = dict(tensors)
    for md in (None, {"format": name}):
        data = ours.save(tensors, metadata=md)
        assert data == ref.save(dict(tensors), metadata=md)  # (the reference converts its argument in place)
        ours.save_file(tensors, tmp_path / "ours.safetensors", metadata=md)
        ref.save_file(dict(tensors), tmp_path / "ref.safetensors", metadata=md)
        assert (tmp_path / "ours.safetensors").read_bytes() == data
        assert all(tensors[k] is given[k] for k in given)  # tensorlift leaves the caller's dict alone
    for got, want in ((ours.load(data), ref.load(data)),
                      (ours.load_file(tmp_path / "ref.safetensors"), ref.load_file(tmp_path / "ref.safetensors"))):
        assert sorted(got) == sorted(want)
        assert {k: raw(v) for k, v in got.items()} == {k: raw(v) for k, v in want.items()}
    assert list(ours.load_file(tmp_path / "ref.safetensors")) == list(ref.load_file(tmp_path / "ref.safetensors"))


@pytest.mark.parametrize("framework", ["flax", "jax", "tf", "tensorflow", "mlx", "paddle"])
def test_safe_open_hands_out_the_frameworks_tensors(tmp_path, framework):
    module = {"flax": "jax", "jax": "jax", "tf": "tensorflow"}.get(framework, framework)
    pytest.importorskip(module)
    import safetensors
    import tensorlift
    path = tmp_path / "m.safetensors"
    tl_np.save_file(numpy_arrays(), path)
    got = []
    for lib in (safetensors, tensorlift):
        with lib.safe_open(path, framework) as f:
            got.append(({k: raw(f.get_tensor(k)) for k in f.keys()}, raw(f.get_slice("f32")[1:3]),
                        {k: raw(v) for k, v in f.get_tensors().items()} if hasattr(f, "get_tensors") else None))
    assert got[0] == got[1]


def test_paddle_helpers_match_the_reference():
    paddle = pytest.importorskip("paddle")
    import safetensors.paddle as ref
    import tensorlift.paddle as ours
    assert ours._TYPES == ref._TYPES and ours._SIZE == ref._SIZE and ours.NPDTYPES == ref.NPDTYPES
    for code in list(ref._TYPES) + ["U16", "X"]:
        try:
            want = ("ok", ref._getdtype(code))
        except Exception as e:  # noqa: BLE001
            want = ("error", type(e).__name__)
        try:
            have = ("ok", ours._getdtype(code))
        except Exception as e:  # noqa: BLE001
            have = ("error", type(e).__name__)
        assert have == want, code
    tensors = make("paddle", numpy_arrays())
    tensors["bf16"] = paddle.to_tensor(np.ones(3, np.float32)).astype(paddle.bfloat16)
    k1, k2 = [], []
    a, b = ref._flatten(tensors, k1), ours._flatten(tensors, k2)
    assert {k: (s.dtype, s.shape, s.data_len) for k, s in a.items()} == \
        {k: (s.dtype, s.shape, s.data_len) for k, s in b.items()}
    data = ref.save(tensors)
    assert ours.save(tensors) == data
    assert {k: raw(v) for k, v in ours._view2paddle(ours.deserialize(data), "cpu").items()} == \
        {k: raw(v) for k, v in ref._view2paddle(ref.deserialize(data), "cpu").items()}
    for bad in ([1], {"x": np.ones(2)}, {"t": paddle.to_tensor(np.ones((3, 4))).transpose([1, 0])}):
        with pytest.raises(Exception) as want:
            ref._flatten(bad, [])
        with pytest.raises(type(want.value)):
            ours._flatten(bad, [])
