"""The inference servers' GPU path by proxy (issue 42): vLLM and SGLang serve their live
parameters through remote.serve_tensors and a new instance pulls them into its own parameters.
Here a transformers Llama plays the running instance: its parameters are served where they
live (a GPU's memory on a GPU machine, else host memory), a second process builds the same model
with other weights, pulls the seed's into its parameters on the same device, and generates:
the greedy tokens equal those of the model loaded from disk, and of the seed itself."""
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tensorlift import remote
from tensorlift._tensorlift import ucx_version

HERE = pathlib.Path(__file__).resolve().parent
PROMPT = [[1, 17, 42, 7, 99, 3]]

pytestmark = pytest.mark.skipif(ucx_version() is None, reason="tensorlift was built without UCX (Debian libucx-dev)")


def device():
    return "cuda:0" if torch.cuda.is_available() else "cpu"


def worker(*args):
    p = subprocess.run([sys.executable, str(HERE / "peer_model_worker.py"), *map(str, args)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_a_new_instance_pulls_a_running_models_parameters_and_generates_the_same_tokens(tmp_path):
    dev = device()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    model = LlamaForCausalLM(config).to(dev).eval()
    model.save_pretrained(tmp_path, safe_serialization=True)
    with torch.no_grad():
        seed_tokens = model.generate(torch.tensor(PROMPT, device=dev), max_new_tokens=16, do_sample=False,
                                     pad_token_id=0)[0].tolist()
    # The parameters where they are (a GPU's memory on a GPU: that needs UCX with CUDA, else the
    # servers serve host copies, as their formats do).
    live = {name: t.detach() for name, t in model.state_dict().items()}
    try:
        server = remote.serve_tensors(live, model="tiny-llama", revision="r1")
    except NotImplementedError:
        live = {name: t.cpu() for name, t in live.items()}
        server = remote.serve_tensors(live, model="tiny-llama", revision="r1")
    url = server.url
    with server:
        pulled = worker("peer", tmp_path, dev, url)
    disk = worker("disk", tmp_path, dev)
    assert pulled["source"] == url, pulled  # the seed, not a fallback (there is none)
    assert pulled["tokens"] == disk["tokens"] == seed_tokens, (pulled, disk, seed_tokens)
    assert len(seed_tokens) == len(PROMPT[0]) + 16
