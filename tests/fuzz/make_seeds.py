#!/usr/bin/env python3
"""Writes the seed corpora of the decoder fuzz targets (issue 22) into tests/fuzz/seeds-*/.

    python3 tests/fuzz/make_seeds.py        # rewrites the seeds; they are committed

Each seed is a well-formed input of its decoder (and a few near misses), with the
target's selector byte first where the target has several decoders:
  seeds-peer-wire/  0: GET /v1/key answers, 1: framed UCX blobs, 2: auth headers, 3: URLs
  seeds-registry/   0: etcd range replies as they arrive, 1: "SUFFIX<TAB>VALUE" lines
  seeds-index/      model.safetensors.index.json files over index_fuzz's fixture shards
  seeds-sparse/     safetensors files with sparse-bitmask groups (2-D, 1-D, 3 dtypes)
  seeds-s3/         0: ListBucketResult pages, 1: <Error> bodies, 2: Content-Range, 3: keys
XXH3-64 (for frames) comes from Debian's libxxhash through ctypes.
"""
import base64
import ctypes
import hashlib
import hmac
import json
import pathlib
import struct

HERE = pathlib.Path(__file__).resolve().parent


def write(folder, name, data):
    d = HERE / folder
    d.mkdir(exist_ok=True)
    (d / name).write_bytes(data if isinstance(data, bytes) else data.encode())


def xxh3(data):
    lib = ctypes.CDLL("libxxhash.so.0")
    lib.XXH3_64bits.restype = ctypes.c_uint64
    lib.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    return lib.XXH3_64bits(data, len(data))


def frame(kind, payload):
    return b"TLUX" + kind + b"\0\0\0" + struct.pack("<QQ", len(payload), xxh3(payload)) + payload


def peer_wire():
    key = {"protocol": 1, "key": {"model": "meta-llama/Llama-2-7b-hf", "revision": "8cca527", "dtype": "as-stored",
                                  "quantization": "none", "layout": "(q|k|v)_proj\\.weight$=0", "protocol": 1},
           "digest": "0123456789abcdef", "parallel": {"size": 2, "rank": 1}, "tensors": 3, "total_bytes": 100,
           "sessions": 0}
    write("seeds-peer-wire", "key.bin", b"\0" + json.dumps(key).encode())
    key["parallel"]["rank"] = 2
    write("seeds-peer-wire", "key-bad-rank.bin", b"\0" + json.dumps(key).encode())
    write("seeds-peer-wire", "frame-address.bin", b"\1" + frame(b"A", bytes(range(64))))
    write("seeds-peer-wire", "frame-rkey.bin", b"\1" + frame(b"K", b"\x00\xff\x10" * 20))
    write("seeds-peer-wire", "frame-short.bin", b"\1TLUXA\0\0\0")
    nonce, now = "00112233445566778899aabbccddeeff", 1800000000
    msg = f"v1\nPOST\n/v1/session\n{now}\n{nonce}".encode()
    mac = hmac.new(b"fuzz-token", msg, hashlib.sha256).hexdigest()
    write("seeds-peer-wire", "auth.bin", b"\2" + f"v1:{now}:{nonce}:{mac}".encode())
    write("seeds-peer-wire", "auth-stale.bin", b"\2" + f"v1:{now - 3600}:{nonce}:{mac}".encode())
    for i, url in enumerate(["http://127.0.0.1:8470", "http://[::1]:8470/", "http://seed-0.local:1",
                             "https://x:1", "http://h:65536"]):
        write("seeds-peer-wire", f"url-{i}.bin", b"\3" + url.encode())


def registry():
    prefix = "/tensorlift/seeds/0123456789abcdef/"
    entry = {"url": "http://127.0.0.1:8470", "rank": 0, "world": 2, "load": 1.5, "id": "ab12"}
    b64 = lambda s: base64.b64encode(s.encode()).decode()
    reply = {"header": {"cluster_id": "1", "revision": "7"},
             "kvs": [{"key": b64(prefix + "0/ab12"), "create_revision": "5", "mod_revision": "5", "version": "1",
                      "value": b64(json.dumps(entry)), "lease": "694d7a1b2c3d4e5f"},
                     {"key": b64(prefix + "1/cd34"), "value": b64(json.dumps(dict(entry, rank=1, id="cd34")))}],
             "count": "2", "more": False}
    write("seeds-registry", "reply.bin", b"\0" + json.dumps(reply).encode())
    write("seeds-registry", "reply-more.bin", b"\0" + json.dumps(dict(reply, more=True)).encode())
    write("seeds-registry", "reply-empty.bin", b"\0" + b'{"header":{"revision":"3"}}')
    lines = "0/ab12\t" + json.dumps(entry) + "\n1/cd34\t" + json.dumps(dict(entry, rank=1, id="cd34")) + "\n"
    write("seeds-registry", "lines.bin", b"\1" + lines.encode())
    write("seeds-registry", "lines-mismatch.bin", b"\1" + ("1/ab12\t" + json.dumps(entry)).encode())


def index():
    good = {"metadata": {"total_size": 12}, "weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
        "c": "model-00002-of-00002.safetensors"}}
    write("seeds-index", "good.json", json.dumps(good))
    write("seeds-index", "missing-shard.json", json.dumps({"weight_map": {"a": "model-00003-of-00003.safetensors"}}))
    write("seeds-index", "escape.json", json.dumps({"weight_map": {"a": "../model-00001-of-00002.safetensors"}}))
    write("seeds-index", "duplicate.json", json.dumps({"weight_map": {
        "a": "model-00001-of-00002.safetensors", "c": "sub/extra.safetensors"}}))


def safetensors(tensors):
    """tensors: [(name, dtype, shape, bytes)] -> a safetensors file."""
    header, data = {}, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def sparse_group(prefix, rows, cols, elem, fmt, one_d=False):
    values, mask, offsets = b"", b"", []
    k = 0
    for r in range(rows):
        offsets.append(k)
        bits = 0
        for c in range(cols):
            if (r * 7 + c * 3) % 4 != 0:
                bits |= 1 << c
                values += struct.pack(fmt, (r * cols + c) % 100 + 1)
                k += 1
        mask += bits.to_bytes((cols + 7) // 8, "little")
    dtype = {2: "BF16", 4: "F32", 1: "U8"}[elem]
    shape = [cols] if one_d else [rows, cols]
    return [(prefix + ".shape", "I64", [len(shape)], struct.pack(f"<{len(shape)}q", *shape)),
            (prefix + ".compressed", dtype, [k], values),
            (prefix + ".bitmask", "U8", [(cols + 7) // 8] if one_d else [rows, (cols + 7) // 8], mask),
            (prefix + ".row_offsets", "I64", [] if one_d else [rows], struct.pack(f"<{rows}q", *offsets))]


def sparse():
    write("seeds-sparse", "f32-2d.safetensors", safetensors(sparse_group("model.layers.0.mlp", 4, 10, 4, "<f")))
    write("seeds-sparse", "bf16-2d.safetensors", safetensors(sparse_group("layer.q_proj", 3, 17, 2, "<H")
                                                              + [("dense", "F32", [2], b"\0" * 8)]))
    write("seeds-sparse", "u8-1d.safetensors", safetensors(sparse_group("norm.bias", 1, 12, 1, "<B", one_d=True)))


def s3():
    page = ("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/"
            "2006-03-01/\"><Name>models</Name><Prefix>llama/</Prefix><KeyCount>2</KeyCount><MaxKeys>1000</MaxKeys>"
            "<EncodingType>url</EncodingType><IsTruncated>true</IsTruncated><NextContinuationToken>1ueGcxLPRx1Tr"
            "</NextContinuationToken><Contents><Key>llama/model-00001-of-00002.safetensors</Key><LastModified>"
            "2026-11-25T00:00:00.000Z</LastModified><ETag>&quot;9b2cf535f27731c974343645a3985328&quot;</ETag>"
            "<Size>4987654321</Size><StorageClass>STANDARD</StorageClass></Contents><Contents><Key>llama/a+b%2Bc"
            "%E2%9C%93.json</Key><Size>120</Size></Contents></ListBucketResult>")
    write("seeds-s3", "list.bin", b"\0" + page.encode())
    write("seeds-s3", "list-plain.bin", b"\0" + page.replace("<EncodingType>url</EncodingType>", "")
          .replace("<IsTruncated>true", "<IsTruncated>false").encode())
    error = ("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SignatureDoesNotMatch</Code><Message>The "
             "request signature we calculated does not match the signature you provided.</Message><RequestId>"
             "4442587FB7D0A2F9</RequestId></Error>")
    write("seeds-s3", "error.bin", b"\1" + error.encode())
    write("seeds-s3", "error-entity.bin", b"\1" + b"<!DOCTYPE Error [<!ENTITY a \"aaaaaaaaaa\"><!ENTITY b "
          b"\"&a;&a;&a;&a;&a;&a;&a;&a;\">]><Error><Code>&b;</Code><Message>&b;&b;</Message></Error>")
    for i, cr in enumerate(["bytes 0-1023/4096", "bytes 100-199/*", "bytes */4096", "bytes 5-4/10"]):
        write("seeds-s3", f"range-{i}.bin", b"\2" + cr.encode())
    write("seeds-s3", "key.bin", b"\3" + b"llama/a+b%2Bc%E2%9C%93.json")


if __name__ == "__main__":
    peer_wire()
    registry()
    index()
    sparse()
    s3()
