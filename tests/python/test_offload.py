"""tensorlift.offload.stream_model on a tiny transformers Llama: streamed under a
quarter of its weights' bytes, from a dense checkpoint of pruned weights and
from the sparse-bitmask checkpoint `tensorlift sparsify` made of them, it gives
the logits of the fully loaded pruned model, bit for bit.

The CLI comes from TENSORLIFT_BUILD (default: the repository's build/)."""
import os
import pathlib
import subprocess

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import pytest  # noqa: E402
import torch  # noqa: E402

transformers = pytest.importorskip("transformers")

from safetensors.torch import save_file  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

import tensorlift  # noqa: E402
from tensorlift.offload import stream_model  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("TENSORLIFT_BUILD", ROOT / "build"))

# 16 blocks: the budget holds the parts outside the blocks and two blocks in
# flight (the streamer's reserve) with a quarter of the weights' bytes.
CONFIG = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=16, num_attention_heads=4,
              num_key_value_heads=4, vocab_size=128, max_position_embeddings=64,
              tie_word_embeddings=False)


def cli():
    path = BUILD / "tensorlift"
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise RuntimeError(f"{path} is missing: build it (cmake --build {BUILD} --target tensorlift_cli) "
                           f"or point TENSORLIFT_BUILD at a build directory that has it")
    return path


def new_model():
    return LlamaForCausalLM(LlamaConfig(**CONFIG)).to(torch.bfloat16).eval()


def weight_bytes(model):
    return sum(p.numel() * p.element_size() for p in model.parameters())


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """(dense checkpoint of the pruned weights, sparse checkpoint directory, pruned weights)."""
    tmp = tmp_path_factory.mktemp("offload")
    torch.manual_seed(0)
    model = new_model()
    original = tmp / "original.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(original))
    sparse = tmp / "sparse"
    subprocess.run([str(cli()), "sparsify", str(original), str(sparse), "--prune", "magnitude:0.5"],
                   check=True, capture_output=True)
    pruned = {k: v.clone() for k, v in tensorlift.load(str(sparse)).items()}
    dense = tmp / "pruned.safetensors"
    save_file(pruned, str(dense))
    return dense, sparse, pruned


@pytest.fixture(scope="module")
def input_ids():
    return torch.randint(0, CONFIG["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def reference_logits(files, input_ids):
    _, _, pruned = files
    model = new_model()
    model.load_state_dict(pruned, strict=True)
    with torch.no_grad():
        return model(input_ids).logits


@pytest.mark.parametrize("which", ["dense", "sparse"])
def test_streamed_logits_are_the_loaded_model_s(files, input_ids, reference_logits, which):
    dense, sparse, pruned = files
    model = new_model()
    budget = weight_bytes(model) // 4
    handle = stream_model(model, dense if which == "dense" else sparse, budget)
    streamed = handle.streamed_layers()
    assert len(streamed) > CONFIG["num_hidden_layers"] // 2, handle.resident_layers()
    passes = 2
    for _ in range(passes):  # The second pass starts from the wrap-around prefetch.
        with torch.no_grad():
            logits = model(input_ids).logits
        assert torch.equal(logits, reference_logits)
    stats = handle.stats()
    # Each streamed block is prefetched while the one before computes; only
    # the very first Acquire can miss (when block 0 is streamed).
    assert stats["prefetch_misses"] <= 1, stats
    assert stats["prefetch_hits"] >= passes * len(streamed) - 1, stats
    assert stats["bytes_read"] > 0 and stats["loads"] >= passes * len(streamed), stats
    # Between forwards the blocks hold nothing.
    assert all(p.numel() == 0 for p in model.model.layers.parameters())
    handle.remove()
    assert all(not b._forward_pre_hooks and not b._forward_hooks for b in model.model.layers)


def test_budget_too_small_is_a_value_error(files):
    dense, _, _ = files
    model = new_model()
    with pytest.raises(ValueError, match="budget"):
        stream_model(model, dense, weight_bytes(model) // 16)


def test_streamed_generation_matches(files, input_ids, reference_logits):
    _, sparse, pruned = files
    reference = new_model()
    reference.load_state_dict(pruned, strict=True)
    model = new_model()
    stream_model(model, sparse, weight_bytes(model) // 4)
    kwargs = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        assert torch.equal(model.generate(input_ids, **kwargs), reference.generate(input_ids, **kwargs))


def test_tied_embeddings_stay_with_the_rest(tmp_path, input_ids):
    torch.manual_seed(2)
    config = LlamaConfig(**dict(CONFIG, tie_word_embeddings=True))
    reference = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    assert reference.lm_head.weight is reference.model.embed_tokens.weight
    path = tmp_path / "tied.safetensors"
    # One copy of the tied tensor, as transformers saves it.
    save_file({k: v.contiguous() for k, v in reference.state_dict().items() if k != "lm_head.weight"}, str(path))
    model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    handle = stream_model(model, path, weight_bytes(model) // 4)
    assert handle.streamed_layers()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    with torch.no_grad():
        assert torch.equal(model(input_ids).logits, reference(input_ids).logits)


# Onto a device: the emulated one here (torch cannot touch its memory, so each
# block's tensors are copied to the host for the forward), a GPU when there is one.

@pytest.mark.parametrize("which", ["dense", "sparse"])
def test_streamed_onto_the_device_gives_the_loaded_model_s_logits(files, input_ids, reference_logits, which):
    dense, sparse, _ = files
    model = new_model()
    budget = weight_bytes(model) // 4
    handle = stream_model(model, dense if which == "dense" else sparse, budget, device="emulated")
    streamed = handle.streamed_layers()
    assert len(streamed) > CONFIG["num_hidden_layers"] // 2, handle.resident_layers()
    held = handle.stats()["device_bytes"]
    assert 0 < held <= budget
    for _ in range(2):
        with torch.no_grad():
            assert torch.equal(model(input_ids).logits, reference_logits)
    stats = handle.stats()
    # The ring was allocated once: the device memory held has not moved.
    assert stats["device_bytes"] == held and stats["budget_bytes"] == budget
    assert stats["prefetch_misses"] <= 1 and stats["prefetch_hits"] >= 2 * len(streamed) - 1, stats
    ring = 2 * max(handle.streamer.device_bytes(i) for i in streamed)
    resident = sum(handle.streamer.device_bytes(i) for i in handle.resident_layers())
    assert handle.streamer.device_memory == ring + resident


def test_a_device_budget_too_small_names_the_numbers(files):
    dense, _, _ = files
    model = new_model()
    with pytest.raises(ValueError, match=r"emulated:0 is below its ring of two buffers .*2 x \d+ bytes"):
        stream_model(model, dense, weight_bytes(model) // 12, device="emulated")
    # The model is left as it was.
    assert all(p.numel() > 0 for p in model.parameters())
    with pytest.raises(ValueError, match="does not hold the parameters outside the blocks"):
        stream_model(model, dense, 1000, device="emulated")


@pytest.mark.parametrize("device", ["cpu", "emulated"])
def test_a_read_error_mid_stream_surfaces_in_the_forward(files, tmp_path, input_ids, device):
    """The second half of the blocks in a shard of their own, which disappears
    after the model is set up: the forward raises, naming the block."""
    _, _, pruned = files
    half = CONFIG["num_hidden_layers"] // 2
    late = {k: v for k, v in pruned.items() if k.startswith("model.layers.") and int(k.split(".")[2]) >= half}
    save_file({k: v for k, v in pruned.items() if k not in late}, str(tmp_path / "a.safetensors"))
    save_file(late, str(tmp_path / "b.safetensors"))
    model = new_model()
    handle = stream_model(model, tmp_path, weight_bytes(model) // 4, device=device)
    assert half in handle.streamed_layers()
    (tmp_path / "b.safetensors").unlink()
    with pytest.raises(OSError, match=f"layer {half}"), torch.no_grad():
        model(input_ids)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
@pytest.mark.parametrize("which", ["dense", "sparse"])
def test_streamed_onto_a_gpu_generates_the_loaded_model_s_tokens(files, input_ids, which):
    dense, sparse, pruned = files
    reference = new_model()
    reference.load_state_dict(pruned, strict=True)
    reference = reference.to("cuda:0")
    ids = input_ids.to("cuda:0")
    model = new_model()
    budget = weight_bytes(model) // 4
    handle = stream_model(model, dense if which == "dense" else sparse, budget, device="cuda:0")
    assert handle.streamed_layers() and handle.stats()["device_bytes"] <= budget
    kwargs = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, reference(ids).logits, rtol=0, atol=1e-2)
        assert torch.equal(model.generate(ids, **kwargs), reference.generate(ids, **kwargs))
    assert handle.stats()["prefetch_misses"] <= 1
