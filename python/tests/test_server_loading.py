"""What vLLM's and SGLang's `tensorlift` load formats share and which needs neither server
(tensorlift.integrations.loading): option checking, the read-ahead pieces, and the weights
they yield. The formats inside a real vLLM and SGLang are tested by tests/vllm and
tests/sglang (make test, .venv-vllm)."""
import pytest
import torch
from safetensors.torch import load_file, save_file

from tensorlift.integrations import loading as tlv
from tensorlift.integrations import vllm as tl_vllm


def test_the_vllm_module_imports_without_vllm_and_shares_the_options():
    assert tl_vllm.parse_options is tlv.parse_options and tl_vllm.iterate_weights is tlv.iterate_weights


def test_options_are_checked():
    assert tlv.parse_options(None) == {}
    assert tlv.parse_options({"mode": "direct", "threads": 4, "filter": "^a", "progress": False})["threads"] == 4
    for bad, msg in [({"bogus": 1}, "unknown option(s) ['bogus']"), ({"mode": "fast"}, "mode must be one of"),
                     ({"threads": 0}, "threads must be a positive integer"), ({"threads": True}, "threads"),
                     ({"filter": "("}, "is not a regex"), ({"progress": "yes"}, "progress must be"),
                     ([1], "must be a JSON object")]:
        with pytest.raises(ValueError, match=msg.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
            tlv.parse_options(bad)


@pytest.fixture
def shards(tmp_path):
    g = torch.Generator().manual_seed(5)
    paths = []
    for k in range(2):
        p = tmp_path / f"model-0000{k + 1}-of-00002.safetensors"
        save_file({f"layers.{k}.w{i}": torch.randn(64, 32, generator=g).to(torch.bfloat16) for i in range(6)}
                  | {f"layers.{k}.norm": torch.ones(32)}, str(p))
        paths.append(str(p))
    return paths


def test_pieces_follow_file_order_and_size(shards):
    from tensorlift._tensorlift import Checkpoint
    w = 64 * 32 * 2
    pieces = tlv.plan_groups(shards, None, group_bytes=2 * w)
    for f in shards:
        in_file = [g for p, g in pieces if p == f]
        # File order (the writer puts the small F32 norm first), cut once a piece reaches 2 w's bytes.
        order = [t[0] for t in Checkpoint.open(f).shard_tensors(0)]
        assert [n for g in in_file for n in g] == order
        assert [len(g) for g in in_file] == [3, 2, 2]
    assert [p for p, _ in pieces] == [shards[0]] * 3 + [shards[1]] * 3
    only = tlv.plan_groups(shards, r"\.w[01]$", group_bytes=1 << 30)
    assert [sorted(g) for _, g in only] == [["layers.0.w0", "layers.0.w1"], ["layers.1.w0", "layers.1.w1"]]


def test_the_weights_are_the_reference_tensors(shards, monkeypatch):
    monkeypatch.setattr(tlv, "GROUP_BYTES", 3 * 64 * 32 * 2)  # several pieces per file
    assert len(tlv.plan_groups(shards, None)) == 4  # not 2: the patched size counts
    ref = {n: t for f in shards for n, t in load_file(f).items()}
    got = dict(tlv.iterate_weights(shards, "cpu", {"mode": "buffered", "threads": 2}))
    assert got.keys() == ref.keys()
    for n, t in ref.items():
        assert got[n].dtype == t.dtype and torch.equal(got[n], t), n


def test_a_bad_file_raises_the_format_error(shards, tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(open(shards[0], "rb").read()[:-10])
    import tensorlift
    with pytest.raises(tensorlift.FormatError, match="bad.safetensors"):
        list(tlv.iterate_weights([shards[1], str(bad)], "cpu", {}))


def test_a_model_split_over_ranks_reads_views_on_the_cpu(shards, monkeypatch):
    """Tensor or pipeline parallel ranks get views of the files (each touches only its slices, the
    device reads each byte once); one rank reads as asked; a mode the user chose is kept."""
    assert tlv.read_plan("cuda:1", {}, 1) == ("cuda:1", "auto")
    assert tlv.read_plan("cuda:1", {}, 2) == ("cpu", "mmap")
    assert tlv.read_plan("cuda:1", {"mode": "direct"}, 4) == ("cuda:1", "direct")
    assert tlv.read_plan("cpu", {"mode": "buffered"}, 1) == ("cpu", "buffered")
    import tensorlift._stream as st
    seen = []
    real = st.stream

    def recording(*args, **kwargs):
        seen.append((kwargs["device"], kwargs["mode"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(st, "stream", recording)
    ref = {n: t for f in shards for n, t in load_file(f).items()}
    got = dict(tlv.iterate_weights(shards, "cpu", {}, ranks=2))
    assert seen == [("cpu", "mmap")]
    assert got.keys() == ref.keys() and all(torch.equal(got[n], t) for n, t in ref.items())
