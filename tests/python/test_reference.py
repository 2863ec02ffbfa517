"""tensorlift against the reference safetensors package (0.8).

(a) Differential: every corpus case through the reference reader; its verdict
    (and, for errors, the rule behind its message) must match the manifest.
(b) CLI: `tensorlift verify` gives the manifest's verdict, one line per bad
    file, and never crashes.
(c) Golden files: files written by the reference writer are rewritten by
    tensorlift's writer (tl_rewrite) byte for byte.
(d) `tensorlift inspect --json` on reference files and valid corpus cases.
"""

import ctypes
import json
import pathlib
import struct
import subprocess

import numpy as np
import pytest
import safetensors
from safetensors import TensorSpec
from safetensors.numpy import save_file

# The reference's error messages, by the rule that raises them.
REFERENCE_MESSAGES = {
    "header too small": "HeaderTooSmall",
    "header too large": "HeaderTooLarge",
    "invalid header length": "InvalidHeaderLength",
    "invalid UTF-8 in header": "InvalidHeader",
    "invalid JSON in header": "InvalidHeaderDeserialization",
    "invalid offset for tensor": "InvalidOffset",
    "overflow computing buffer size": "ValidationOverflow",
    "does not end up at a byte boundary": "MisalignedSlice",
    "invalid shape, data type, or offset for tensor": "TensorInvalidInfo",
    "incomplete metadata, file not fully covered": "MetadataIncompleteBuffer",
}

# Cases where tensorlift deliberately gives another verdict than the reference
# (besides duplicate tensor names): it is stricter, or the reference is wrong.
DIFFERENT_CASES = {"tensor_info_as_array", "dtype_as_enum_map",
                   "reference_quirk_float_near_max_in_unknown_field"}


def reference_open(path):
    """("ok", (tensors, metadata)) or ("error", rule-or-message) from the reference."""
    try:
        with safetensors.safe_open(str(path), "np") as f:
            names = list(f.keys())
            tensors = {}
            for name in names:
                s = f.get_slice(name)
                tensors[name] = (s.get_dtype(), list(s.get_shape()))
            return "ok", (tensors, f.metadata())
    except BaseException as e:  # pyo3's PanicException is a BaseException.
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        message = str(e)
        if type(e).__name__ == "PanicException":
            return "error", "panic: " + message
        for needle, rule in REFERENCE_MESSAGES.items():
            if needle in message:
                return "error", rule
        return "error", "unknown message: " + message


def run(args, **kwargs):
    r = subprocess.run([str(a) for a in args], capture_output=True, timeout=60, **kwargs)
    assert r.returncode >= 0, f"{args} died of signal {-r.returncode}: {r.stderr!r}"
    return r


def lines(data):
    return data.decode("utf-8", "replace").splitlines()


def inspect_json(cli, path):
    r = run([cli, "inspect", "--json", path])
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def split_file(data):
    n = struct.unpack("<Q", data[:8])[0]
    return n, json.loads(data[8:8 + n]), data[8 + n:]


# --- (a) the reference agrees with the manifest -------------------------------------


def test_reference_verdict(case):
    verdict, detail = reference_open(case.path)
    assert verdict == case.reference, f"reference says {verdict}: {detail}"
    if verdict == "error" and case.expected != "DuplicateTensor" and case.name not in DIFFERENT_CASES:
        # The reference fails for the same reason as tensorlift.
        assert detail == case.expected


def test_manifest_verdicts_differ_only_where_expected(corpus_cases):
    for c in corpus_cases:
        if (c.expected == "ok") != (c.reference == "ok"):
            assert c.expected == "DuplicateTensor" or c.name in DIFFERENT_CASES, c.name


def test_valid_cases_read_the_same(cli, valid_case):
    """Where both accept a file, they see the same tensors and metadata."""
    case = valid_case
    verdict, detail = reference_open(case.path)
    assert verdict == "ok"
    ref_tensors, ref_metadata = detail
    r = run([cli, "inspect", "--json", case.path])
    if case.known_bug and r.returncode != 0:
        pytest.xfail(f"known bug: {case.known_bug}")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    ours = {t["name"]: (t["dtype"], t["shape"]) for t in out["tensors"]}
    assert ours == ref_tensors
    assert out["shards"][0]["metadata"] == ref_metadata


# --- (b) the CLI ---------------------------------------------------------------------


def test_cli_verify(cli, case):
    r = run([cli, "verify", case.path])
    out = lines(r.stdout)
    prefix = f"{case.path}: "
    got = "ok" if r.returncode == 0 else (out[0][len(prefix):].split(":")[0] if out else "?")
    if case.known_bug and got != case.expected:
        pytest.xfail(f"known bug: {case.known_bug}")
    if case.expected == "ok":
        assert r.returncode == 0, out
        assert len(out) == 1 and out[0].startswith(prefix + "OK"), out
    else:
        assert r.returncode == 1, out
        assert len(out) == 1, out
        assert out[0].startswith(prefix + case.expected + ": "), out
    assert b"warning" not in r.stderr


def test_cli_verify_many_files(cli, corpus_cases):
    paths = [str(c.path) for c in corpus_cases]
    bad = {str(c.path): c for c in corpus_cases if c.expected != "ok" and not c.known_bug}
    r = run([cli, "verify", "-q", *paths])
    assert r.returncode == 1
    out = lines(r.stdout)
    by_path = {}
    for line in out:
        path = next((p for p in paths if line.startswith(p + ": ")), None)
        assert path is not None, line
        assert path not in by_path, f"two lines for {path}"
        by_path[path] = line
    for path, c in bad.items():
        assert path in by_path, f"no line for {c.name}"
        assert by_path[path].startswith(f"{path}: {c.expected}: ")
    good = [c for c in corpus_cases if c.expected == "ok" and not c.known_bug]
    assert not any(str(c.path) in by_path for c in good)

    # Without -q, valid files get an OK line each; still one line per file.
    r = run([cli, "verify", *paths])
    assert r.returncode == 1
    assert len(lines(r.stdout)) == len(paths)

    # Only valid files: exit 0.
    r = run([cli, "verify", "-q", *[c.path for c in good]])
    assert r.returncode == 0, r.stdout
    assert r.stdout == b""


def test_cli_verify_missing_file(cli, tmp_path):
    missing = tmp_path / "missing.safetensors"
    r = run([cli, "verify", missing])
    assert r.returncode == 1
    out = lines(r.stdout)
    assert len(out) == 1 and out[0].startswith(f"{missing}: ")


# --- (c) golden files: tensorlift's writer against the reference writer ---------------

NUMPY_DTYPES = ["bool", "uint8", "int8", "int16", "uint16", "float16", "int32", "uint32",
                "float32", "complex64", "float64", "int64", "uint64"]


def sample(dtype, shape, seed):
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape)) if shape else 1
    raw = rng.integers(0, 256, size=n * np.dtype(dtype).itemsize, dtype=np.uint8)
    if dtype == "bool":
        raw = raw % 2
    return raw.view(dtype).reshape(shape)


def rewrite_and_compare(rewrite, path, tmp_path, exact=True):
    out = tmp_path / ("tl_" + pathlib.Path(path).name)
    r = run([rewrite, path, out])
    assert r.returncode == 0, r.stderr
    ref = pathlib.Path(path).read_bytes()
    ours = out.read_bytes()
    if exact:
        assert ours == ref
    else:
        # Same header length, same JSON, same data bytes.
        n1, h1, d1 = split_file(ref)
        n2, h2, d2 = split_file(ours)
        assert n1 == n2
        assert h1 == h2
        assert d1 == d2
    return ours


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_golden_one_dtype(rewrite, tmp_path, dtype):
    path = tmp_path / f"{dtype}.safetensors"
    save_file({"weight": sample(dtype, (2, 3), 1), "bias": sample(dtype, (3,), 2)}, str(path))
    rewrite_and_compare(rewrite, path, tmp_path)


def test_golden_all_dtypes_together(rewrite, tmp_path):
    tensors = {f"t.{d}": sample(d, (3, 1), i) for i, d in enumerate(NUMPY_DTYPES)}
    tensors.update({f"u.{d}": sample(d, (1,), 50 + i) for i, d in enumerate(NUMPY_DTYPES)})
    path = tmp_path / "all.safetensors"
    save_file(tensors, str(path))
    rewrite_and_compare(rewrite, path, tmp_path)


@pytest.mark.parametrize("metadata", [None, {}, {"format": "pt"}, {"k": "v \"q\" \\ \n \u00e9"}],
                         ids=["none", "empty", "one", "escaped"])
def test_golden_edge_cases(rewrite, tmp_path, metadata):
    tensors = {
        "zero": np.zeros((0,), np.float32),
        "zero3": np.zeros((3, 0, 2), np.int64),
        "scalar": np.array(3.5, np.float32),
        "scalar_bool": np.array(True),
        "caf\u00e9": sample("uint8", (5,), 3),
        "\u540d\u524d/\U0001F600": sample("float16", (2,), 4),
        "q\"b\\s\n\t\x01\x7f": sample("int16", (1,), 5),
        "": sample("int8", (3,), 6),
        "a.b.c": sample("float64", (1, 1, 1), 7),
    }
    path = tmp_path / "edge.safetensors"
    save_file(tensors, str(path), metadata=metadata)
    rewrite_and_compare(rewrite, path, tmp_path)


def test_golden_metadata_only(rewrite, tmp_path):
    path = tmp_path / "meta.safetensors"
    save_file({}, str(path), metadata={"framework": "pt"})
    rewrite_and_compare(rewrite, path, tmp_path)
    path = tmp_path / "none.safetensors"
    save_file({}, str(path))
    rewrite_and_compare(rewrite, path, tmp_path)


def test_golden_several_metadata_keys(rewrite, tmp_path):
    # The reference's key order is random for 2+ keys: compare parsed headers.
    path = tmp_path / "keys.safetensors"
    save_file({"w": sample("float32", (4, 4), 8), "b": sample("float32", (4,), 9)}, str(path),
              metadata={"format": "pt", "version": "2", "author": "\u00e9", "": ""})
    ours = rewrite_and_compare(rewrite, path, tmp_path, exact=False)
    # tensorlift sorts the keys.
    _, header, _ = split_file(ours)
    assert list(header["__metadata__"]) == ["", "author", "format", "version"]


def test_reference_writes_invalid_json_for_no_tensors_and_empty_metadata(rewrite, tmp_path):
    """A reference bug (reference.md §1.11 quirk 2); tensorlift writes valid JSON."""
    data = bytes(safetensors.serialize({}, {}))
    assert data[8:].rstrip(b" ") == b'{},"__metadata__":{}}'
    empty = tmp_path / "empty_meta.safetensors"
    empty.write_bytes(data)
    assert reference_open(empty)[0] == "error"
    # tensorlift's writer, through a file that carries empty metadata.
    src = tmp_path / "src.safetensors"
    src.write_bytes(struct.pack("<Q", 24) + b'{"__metadata__":{}}     ')
    out = tmp_path / "out.safetensors"
    assert run([rewrite, src, out]).returncode == 0
    assert out.read_bytes() == src.read_bytes()
    assert reference_open(out) == ("ok", ({}, {}))


# Dtypes numpy lacks, through the reference's TensorSpec: name -> (dtype, bytes per element).
SPEC_DTYPES = {
    "bfloat16": ("BF16", 2),
    "float8_e5m2": ("F8_E5M2", 1),
    "float8_e4m3fn": ("F8_E4M3", 1),
    "float8_e8m0fnu": ("F8_E8M0", 1),
    "float8_e4m3fnuz": ("F8_E4M3FNUZ", 1),
    "float8_e5m2fnuz": ("F8_E5M2FNUZ", 1),
}


def test_golden_dtypes_beyond_numpy(rewrite, tmp_path):
    buf = ctypes.create_string_buffer(bytes(range(256)), 256)
    ptr = ctypes.addressof(buf)
    specs = {f"t.{name}": TensorSpec(dtype=name, shape=[2, 3], data_ptr=ptr, data_len=6 * size)
             for name, (_, size) in SPEC_DTYPES.items()}
    # F4: the storage shape [2, 2] (two elements per byte) is [2, 4] in the header.
    specs["t.f4"] = TensorSpec(dtype="float4_e2m1fn_x2", shape=[2, 2], data_ptr=ptr + 7,
                               data_len=4)
    specs["t.f32"] = TensorSpec(dtype="float32", shape=[1], data_ptr=ptr + 3, data_len=4)
    data = bytes(safetensors.serialize(specs, {"k": "v"}))
    path = tmp_path / "spec.safetensors"
    path.write_bytes(data)
    _, header, _ = split_file(data)
    assert header["t.f4"]["dtype"] == "F4" and header["t.f4"]["shape"] == [2, 4]
    for name, (dtype, _) in SPEC_DTYPES.items():
        assert header[f"t.{name}"]["dtype"] == dtype
    rewrite_and_compare(rewrite, path, tmp_path)


def test_golden_reference_python_test_file(rewrite, tmp_path):
    # bindings/tests/python/test_simple.py: "test" I32 [2,2] -> N = 64 ("@").
    path = tmp_path / "simple.safetensors"
    save_file({"test": np.zeros((2, 2), np.int32)}, str(path))
    data = path.read_bytes()
    assert data[:8] == b"@\0\0\0\0\0\0\0"
    assert rewrite_and_compare(rewrite, path, tmp_path) == data


# --- (d) inspect --json -------------------------------------------------------------


def test_inspect_json_on_a_reference_file(cli, tmp_path):
    tensors = {
        "layers.0.w": sample("float32", (4, 3), 10),
        "layers.0.b": sample("float32", (3,), 11),
        "emb": sample("float16", (5, 2), 12),
        "mask": sample("bool", (7,), 13),
        "step": np.array(9, np.int64),
        "caf\u00e9": sample("uint8", (0,), 14),
    }
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path), metadata={"format": "np"})
    data = path.read_bytes()
    n, header, _ = split_file(data)
    out = inspect_json(cli, path)
    assert out["kind"] == "file"
    assert out["path"] == str(path)
    (shard,) = out["shards"]
    assert shard["header_size"] == n
    assert shard["data_offset"] == 8 + n
    assert shard["file_size"] == len(data)
    assert shard["metadata"] == {"format": "np"}
    assert [t["name"] for t in out["tensors"]] == sorted(tensors, key=lambda s: s.encode())
    for t in out["tensors"]:
        info = header[t["name"]]
        assert t["dtype"] == info["dtype"]
        assert t["shape"] == info["shape"] == list(tensors[t["name"]].shape)
        assert t["offset"] == info["data_offsets"][0]
        assert t["bytes"] == info["data_offsets"][1] - info["data_offsets"][0]
        assert t["shard"] == 0
    assert out["total_bytes"] == len(data) - 8 - n
    assert out["warnings"] == []
    # The data itself is where the offsets say.
    for t in out["tensors"]:
        start = 8 + n + t["offset"]
        assert data[start:start + t["bytes"]] == tensors[t["name"]].tobytes()


def test_inspect_fails_cleanly_on_a_bad_file(cli, corpus_cases):
    bad = next(c for c in corpus_cases if c.expected == "InvalidOffset")
    r = run([cli, "inspect", "--json", bad.path])
    assert r.returncode == 1
    assert r.stdout == b""
    assert lines(r.stderr)[0].startswith(f"{bad.path}: InvalidOffset: ")
