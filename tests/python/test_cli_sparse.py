"""`tensorlift sparsify` and `tensorlift inspect` on sparse-bitmask checkpoints,
held to compressed-tensors' algorithm written out here: mask = t != 0, values =
t[mask], bitmask = numpy.packbits(mask, axis=-1, bitorder="little"),
row_offsets = the exclusive cumsum of the rows' counts; decoding is
numpy.unpackbits(..., bitorder="little") and a boolean scatter."""
import json
import math
import subprocess

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def run(cli, *args):
    r = subprocess.run([str(cli), *map(str, args)], capture_output=True, text=True, timeout=120)
    assert r.returncode >= 0, f"{args} died of signal {-r.returncode}: {r.stderr}"
    return r


def bits(t):
    """The raw bits of a tensor as unsigned integers (bf16 has no numpy dtype)."""
    return t.contiguous().view(INT[t.element_size()]).numpy().view(UINT[t.element_size()])


def magnitude_pruned(t, fraction):
    """The bits of `t` with floor(cols * fraction) smallest |x| of each row set
    to +0.0, ties to the lower column (a stable sort)."""
    b = bits(t).copy()
    k = math.floor(t.shape[1] * fraction)
    order = np.argsort(t.double().abs().numpy(), axis=1, kind="stable")
    b[np.arange(t.shape[0])[:, None], order[:, :k]] = 0
    return b


def ct_compress(t):
    """compressed-tensors' bitmask_compress, as its code does it."""
    mask = t != 0
    row_counts = mask.sum(dim=-1)
    row_offsets = torch.cumsum(row_counts, 0) - row_counts
    bitmask = torch.from_numpy(np.packbits(mask.numpy(), axis=-1, bitorder="little"))
    return {"shape": torch.tensor(list(t.shape)), "compressed": t[mask],
            "bitmask": bitmask, "row_offsets": row_offsets}


def ct_decode_bits(values_bits, bitmask, shape):
    """compressed-tensors' bitmask_decompress, on raw bits."""
    mask = np.unpackbits(bitmask, axis=-1, count=shape[-1], bitorder="little").reshape(shape).astype(bool)
    dense = np.zeros(shape, dtype=values_bits.dtype)
    dense[mask] = values_bits
    return dense


def inspect_json(cli, path):
    r = run(cli, "inspect", "--json", path)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture()
def dense_model(tmp_path):
    g = torch.Generator().manual_seed(7)
    tensors = {
        "model.layers.0.mlp.down_proj.weight": torch.randn(48, 203, generator=g).to(torch.bfloat16),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(32, 64, generator=g).to(torch.float16),
        "lm_head.weight": torch.randn(50, 32, generator=g),
        "model.layers.0.mlp.down_proj.bias": torch.randn(48, generator=g).to(torch.bfloat16),
        "model.norm.weight": torch.randn(203, generator=g),
    }
    # Values whose bits matter survive pruning: a row of signed zeros and
    # large values, NaN, infinity.
    w = tensors["model.layers.0.mlp.down_proj.weight"]
    w[3, :100] = -0.0
    w[3, 100] = float("nan")
    w[3, 101] = float("-inf")
    w[3, 102:] = 1000.0
    d = tmp_path / "in"
    d.mkdir()
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    (d / "config.json").write_text(json.dumps({"model_type": "llama", "rope_theta": 10000.0,
                                               "torch_dtype": "bfloat16"}, indent=2))
    (d / "tokenizer.json").write_text('{"version": "1.0"}')
    return d, tensors


def test_sparsify_can_leave_config_json_as_it_is(cli, dense_model, tmp_path):
    src, _ = dense_model
    out = tmp_path / "out"
    r = run(cli, "sparsify", src, out, "--prune", "magnitude:0.5", "--no-sparsity-config")
    assert r.returncode == 0, r.stderr
    assert "encoded     3 of 5 tensors (3 targets)" in r.stdout
    assert (out / "config.json").read_bytes() == (src / "config.json").read_bytes()
    assert {s["name"] for s in inspect_json(cli, out)["sparse"]}  # the weights are encoded all the same


def test_sparsify_prunes_and_encodes_as_compressed_tensors(cli, dense_model, tmp_path):
    src, tensors = dense_model
    out = tmp_path / "out"
    r = run(cli, "sparsify", src, out, "--prune", "magnitude:0.5")
    assert r.returncode == 0, r.stderr
    assert "encoded     3 of 5 tensors (3 targets)" in r.stdout
    assert "kept dense  2" in r.stdout
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    assert (out / "tokenizer.json").read_text() == '{"version": "1.0"}'
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        assert f.metadata() == {"format": "pt"}
    got = load_file(str(out / "model.safetensors"))

    zeros = elements = 0
    targets = []
    for name, t in tensors.items():
        if t.dim() != 2:
            assert bits(got[name]).tobytes() == bits(t).tobytes()
            continue
        prefix = name[: -len(".weight")]
        targets.append(prefix)
        assert name not in got
        rows, cols = t.shape
        assert got[prefix + ".shape"].tolist() == [rows, cols]
        assert got[prefix + ".shape"].dtype == torch.int64
        bitmask = got[prefix + ".bitmask"].numpy()
        assert bitmask.dtype == np.uint8 and bitmask.shape == (rows, (cols + 7) // 8)
        values = got[prefix + ".compressed"]
        assert values.dtype == t.dtype and values.dim() == 1
        dense = ct_decode_bits(bits(values), bitmask, (rows, cols))
        want = magnitude_pruned(t, 0.5)
        np.testing.assert_array_equal(dense, want)
        counts = np.unpackbits(bitmask, axis=-1, count=cols, bitorder="little").sum(axis=1)
        np.testing.assert_array_equal(got[prefix + ".row_offsets"].numpy(), np.cumsum(counts) - counts)
        assert (counts <= cols - cols // 2).all()  # At least floor(cols / 2) zeros per row.
        zeros += int((want == 0).sum())
        elements += rows * cols

    # Row 3 loses its 100 signed zeros (they come back as +0.0) and the first
    # of its equal 1000.0s; NaN ranks above infinity, both stay.
    row3 = ct_decode_bits(bits(got["model.layers.0.mlp.down_proj.compressed"]),
                          got["model.layers.0.mlp.down_proj.bitmask"].numpy(), (48, 203))[3]
    thousand = bits(torch.tensor([1000.0]).to(torch.bfloat16))[0]
    assert (row3[:100] == 0).all() and row3[102] == 0 and (row3[103:] == thousand).all()
    assert row3[100] == bits(tensors["model.layers.0.mlp.down_proj.weight"])[3, 100] and row3[101] == 0xFF80

    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "llama" and config["rope_theta"] == 10000.0
    assert config["quantization_config"]["quant_method"] == "compressed-tensors"
    sc = config["quantization_config"]["sparsity_config"]
    assert sc["format"] == "sparse-bitmask"
    assert sc["sparsity_structure"] == "unstructured"
    assert sc["targets"] == sorted(targets)
    assert sc["ignore"] == []
    assert sc["global_sparsity"] == pytest.approx(zeros / elements, abs=1e-15)

    info = inspect_json(cli, out)
    sparse = {s["name"]: s for s in info["sparse"]}
    assert set(sparse) == {p + ".weight" for p in targets}
    for name, s in sparse.items():
        assert s["shape"] == list(tensors[name].shape)
        assert s["dtype"] == {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}[tensors[name].dtype]
        rows, cols = tensors[name].shape
        assert s["stored_bytes"] == 16 + s["nnz"] * tensors[name].element_size() + rows * ((cols + 7) // 8) + 8 * rows
        assert s["density"] == pytest.approx(s["nnz"] / (rows * cols))


def test_half_pruned_bf16_is_nine_sixteenths(cli, tmp_path):
    g = torch.Generator().manual_seed(1)
    src = tmp_path / "m.safetensors"
    save_file({f"layers.{i}.weight": torch.randn(512, 1024, generator=g).to(torch.bfloat16) for i in range(2)},
              str(src))
    out = tmp_path / "out"
    r = run(cli, "sparsify", src, out, "--prune", "magnitude:0.5")
    assert r.returncode == 0, r.stderr
    dense = 2 * 512 * 1024 * 2
    stored = inspect_json(cli, out)["total_bytes"]
    # 8 bytes of row_offsets per 2048-byte row: 0.39%, and 16 per shape.
    assert stored == 2 * (512 * 512 * 2 + 512 * 128 + 512 * 8 + 16)
    assert abs(stored / dense - (0.5 * 16 + 1) / 16) < 0.005
    assert f"{dense} -> {stored} (" in r.stdout


def test_shards_and_index(cli, dense_model, tmp_path):
    src, tensors = dense_model
    out = tmp_path / "out"
    r = run(cli, "sparsify", src, out, "--max-shard-size", "12KB")
    assert r.returncode == 0, r.stderr
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(shards) > 1
    assert all(s.endswith(f"-of-{len(shards):05d}.safetensors") for s in shards)
    names = {}
    total = 0
    for s in shards:
        with safe_open(str(out / s), framework="pt") as f:  # The reference reader accepts each shard.
            for k in f.keys():
                names[k] = s
                t = f.get_tensor(k)
                total += t.numel() * t.element_size()
    assert index["weight_map"] == names
    assert index["metadata"]["total_size"] == total
    # No pruning: every target decodes to its input bits exactly.
    got = {}
    for s in shards:
        got.update(load_file(str(out / s)))
    for name, t in tensors.items():
        if name in got:
            assert bits(got[name]).tobytes() == bits(t).tobytes()
            continue
        p = name[: -len(".weight")]
        dense = ct_decode_bits(bits(got[p + ".compressed"]), got[p + ".bitmask"].numpy(), tuple(t.shape))
        np.testing.assert_array_equal(dense, bits(t))


@pytest.mark.parametrize("generation", ["current", "old"])
def test_inspect_reads_checkpoints_written_by_compressed_tensors(cli, tmp_path, generation):
    g = torch.Generator().manual_seed(5)
    model = {
        "model.layers.0.mlp.up_proj.weight": torch.randn(40, 70, generator=g).to(torch.bfloat16),
        "model.layers.0.self_attn.o_proj.weight": torch.randn(16, 16, generator=g).to(torch.float16),
        "model.layers.0.mlp.up_proj.bias": torch.randn(40, generator=g).to(torch.bfloat16),
    }
    for t in model.values():
        t[t.abs() < 0.7] = 0  # About half.
    state = {}
    if generation == "current":
        # >= 0.9: only the Linear weights, named by module.
        for name, t in model.items():
            if name.endswith(".weight"):
                state.update({f"{name[:-len('.weight')]}.{k}": v for k, v in ct_compress(t).items()})
            else:
                state[name] = t
    else:
        # <= 0.8.1: every tensor, named by parameter.
        for name, t in model.items():
            state.update({f"{name}.{k}": v for k, v in ct_compress(t).items()})
    path = tmp_path / "model.safetensors"
    save_file(state, str(path))

    info = inspect_json(cli, path)
    sparse = {s["name"]: s for s in info["sparse"]}
    expected = [n for n in model if generation == "old" or n.endswith(".weight")]
    assert sorted(sparse) == sorted(expected)
    for name in expected:
        s, t = sparse[name], model[name]
        assert s["prefix"] == (name if generation == "old" else name[: -len(".weight")])
        assert s["shape"] == list(t.shape)
        assert s["nnz"] == int((t != 0).sum())
        assert s["dense_bytes"] == t.numel() * t.element_size()
        assert s["parts"]["bitmask"] == s["prefix"] + ".bitmask"
    r = run(cli, "inspect", path)
    assert r.returncode == 0, r.stderr
    assert "sparse density=" in r.stdout
    assert "model.layers.0.mlp.up_proj.weight" in r.stdout


def test_sparse_errors(cli, dense_model, tmp_path):
    src, _ = dense_model
    t = torch.ones(4, 8)
    parts = ct_compress(t)
    broken = tmp_path / "broken.safetensors"
    save_file({"a.compressed": parts["compressed"], "a.bitmask": parts["bitmask"]}, str(broken))
    r = run(cli, "inspect", "--json", broken)
    assert r.returncode == 1 and r.stdout == ""
    assert "sparse group 'a' has 'a.compressed', 'a.bitmask' but lacks 'a.shape', 'a.row_offsets'" in r.stderr
    assert run(cli, "sparsify", broken, tmp_path / "o1").returncode == 1

    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("x")
    r = run(cli, "sparsify", src, busy)
    assert r.returncode == 1 and "must be new or empty" in r.stderr

    for args in (["--prune", "magnitude"], ["--prune", "top:0.5"], ["--min-sparsity", "2"],
                 ["--max-shard-size", "lots"]):
        r = run(cli, "sparsify", src, tmp_path / "o2", *args)
        assert r.returncode == 2, (args, r.stderr)
    r = run(cli, "sparsify", src, tmp_path / "o3", "--prune", "magnitude:1.5")
    assert r.returncode == 1 and "in [0, 1]" in r.stderr
    assert not (tmp_path / "o3").exists()


def test_verify_checks_sparse_groups(cli, tmp_path):
    g = torch.Generator().manual_seed(3)
    t = torch.randn(16, 40, generator=g).to(torch.bfloat16)
    t[torch.rand(16, 40, generator=g) < 0.5] = 0
    parts = {f"m.q_proj.{k}": v for k, v in ct_compress(t).items()}
    good = tmp_path / "good.safetensors"
    save_file(parts, str(good))
    r = run(cli, "verify", good)
    assert r.returncode == 0 and "1 sparse-bitmask groups checked" in r.stdout, r.stdout + r.stderr
    # A row offset that does not match the bitmask: verify says which group.
    offsets = parts["m.q_proj.row_offsets"].clone()
    offsets[3] += 1
    bad = tmp_path / "bad.safetensors"
    save_file({**parts, "m.q_proj.row_offsets": offsets}, str(bad))
    r = run(cli, "verify", good, bad)
    assert r.returncode == 1
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"{good}: OK")
    assert lines[1].startswith(f"{bad}: ") and "m.q_proj.weight" in lines[1] and "row_offsets" in lines[1], lines
