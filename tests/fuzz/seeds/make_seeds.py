"""Writes the fuzzing seeds in this directory (small safetensors files, valid and not).

    .venv/bin/python tests/fuzz/seeds/make_seeds.py

Valid files come from the reference writer (safetensors.numpy.save_file) where numpy
has the dtype, and are hand-built otherwise (F4, F6_*, F8_*); a few invalid files sit
just across one rule each, so the fuzzer starts next to every error path.
"""
import json
import os
import struct

import numpy as np
from safetensors.numpy import save_file

HERE = os.path.dirname(os.path.abspath(__file__))


def raw(name, header_json: bytes, data: bytes = b"", pad=True):
    if pad:
        header_json += b" " * ((8 - len(header_json) % 8) % 8)
    with open(os.path.join(HERE, name + ".safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(header_json)) + header_json + data)


def hand(name, tensors, metadata=None, data=None):
    """tensors: list of (name, dtype, shape, nbytes); laid out in order."""
    h = {}
    if metadata is not None:
        h["__metadata__"] = metadata
    off = 0
    for n, dt, shape, nb in tensors:
        h[n] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + nb]}
        off += nb
    body = json.dumps(h, separators=(",", ":"), ensure_ascii=False).encode()
    raw(name, body, data if data is not None else bytes(range(256)) * (off // 256) + bytes(off % 256))


def main():
    rng = np.random.default_rng(0)
    save_file({"w": rng.standard_normal((2, 3)).astype(np.float32)},
              os.path.join(HERE, "ref_f32.safetensors"))
    save_file({"a": np.arange(4, dtype=np.int64), "b": np.array(True), "c": np.zeros((0, 3), np.float16),
               "model.layers.0.mlp.up_proj.weight": np.ones((2, 2), np.uint8)},
              os.path.join(HERE, "ref_mixed.safetensors"), metadata={"format": "pt", "k": "v"})
    save_file({"z": np.zeros((), np.float64), "c": np.zeros(2, np.complex64), "i": np.arange(3, dtype=np.int8),
               "u16": np.arange(2, dtype=np.uint16), "u32": np.arange(2, dtype=np.uint32),
               "u64": np.arange(2, dtype=np.uint64), "i16": np.arange(2, dtype=np.int16),
               "i32": np.arange(2, dtype=np.int32)},
              os.path.join(HERE, "ref_dtypes.safetensors"))
    save_file({}, os.path.join(HERE, "ref_empty.safetensors"))
    save_file({"caf\u00e9 \"q\"\n\\x": np.zeros(1, np.uint8)}, os.path.join(HERE, "ref_escapes.safetensors"),
              metadata={"\u00e9": "\t\u0001"})

    hand("sub_byte", [("f4", "F4", [2, 3], 3), ("f6a", "F6_E2M3", [4], 3), ("f6b", "F6_E3M2", [1, 4], 3),
                      ("bf", "BF16", [2], 4), ("e8", "F8_E8M0", [1], 1), ("e4", "F8_E4M3", [1], 1),
                      ("e5", "F8_E5M2", [1], 1), ("fz", "F8_E4M3FNUZ", [1], 1), ("f5z", "F8_E5M2FNUZ", [1], 1)])
    hand("no_meta", [("x", "U8", [1], 1)])
    raw("meta_null_explicit", b'{"__metadata__":null,"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\0")
    raw("unsorted", b'{"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]},'
        b'"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"e":{"dtype":"U8","shape":[0],"data_offsets":[3,3]}}',
        b"abc")
    raw("extra_fields", b'{"x":{"data_offsets":[0,2],"dtype":"I16","shape":[1],"extra":[1,{"y":null}]}}', b"\0\0")
    raw("whitespace", b'\n{ "x" : { "dtype" : "U8" , "shape" : [ 1 ] , "data_offsets" : [ 0 , 1 ] } }\t', b"\0")

    # Invalid: one rule each.
    with open(os.path.join(HERE, "bad_too_small.safetensors"), "wb") as f:
        f.write(b"\x01\x00\x00")
    raw("bad_trailing", b'{"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\0\0")
    raw("bad_hole", b'{"x":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', b"\0\0")
    raw("bad_size", b'{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,2]}}', b"\0\0")
    raw("bad_misaligned", b'{"x":{"dtype":"F4","shape":[3],"data_offsets":[0,1]}}', b"\0")
    raw("bad_overflow", b'{"x":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0]}}')
    raw("bad_negzero", b'{"x":{"dtype":"U8","shape":[-0],"data_offsets":[0,0]}}')
    raw("bad_dup", b'{"x":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},'
        b'"x":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}}')
    raw("bad_dtype", b'{"x":{"dtype":"bf16","shape":[0],"data_offsets":[0,0]}}')
    raw("bad_meta", b'{"__metadata__":{"a":1}}')
    raw("bad_utf8", b'{"\xff":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}}')
    raw("bad_deep", b'{"x":' + b"[" * 130 + b"]" * 130 + b"}")
    raw("bad_trailing_comma", b'{"x":{"dtype":"U8","shape":[0],"data_offsets":[0,0],},}')
    with open(os.path.join(HERE, "bad_len.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", 100_000_001) + b"{}")


if __name__ == "__main__":
    main()
