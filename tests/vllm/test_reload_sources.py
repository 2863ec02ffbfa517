"""The vLLM loader's get_all_weights for each source it reads (issue 54), without an engine: the
local files, a bucket (s3://, served by rclone on loopback) and striped sources (the files and a
peer serving them). Each yields the checkpoint's tensors, and a second call checks them against
what the first loaded; a peer-only engine has nothing to reload and is told which option it is.
The reloads inside running engines are in test_vllm.py and tests/sglang."""
import pytest
import torch
from safetensors.torch import load_file

import servers



@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A two-shard checkpoint with its index (no model is built: a few tensors do)."""
    import json
    from safetensors.torch import save_file
    d = tmp_path_factory.mktemp("llama")
    g = torch.Generator().manual_seed(54)
    weight_map = {}
    for k in range(2):
        f = f"model-0000{k + 1}-of-00002.safetensors"
        tensors = {f"model.layers.{k}.mlp.w{i}.weight": torch.randn(96, 64, generator=g).to(torch.bfloat16)
                   for i in range(3)}
        save_file(tensors, str(d / f), metadata={"format": "pt"})
        weight_map.update({n: f for n in tensors})
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return d


bucket = pytest.fixture(scope="module", name="bucket")(servers.llama_bucket)


class Config:
    """The fields of vLLM's ModelConfig the loader reads."""

    def __init__(self, model, weights=""):
        self.model, self.revision, self.model_weights, self.quantization = str(model), None, weights, None


def loader(extra=None):
    from vllm.config.load import LoadConfig
    from tensorlift.integrations import vllm as tl_vllm
    tl_vllm.register()
    from vllm.model_executor.model_loader import get_model_loader
    ld = get_model_loader(LoadConfig(load_format="tensorlift", model_loader_extra_config=extra or {}))
    ld._ranks = lambda: 1  # one rank (no engine: vLLM's parallel state is not set up)
    return ld


def reference(model_dir):
    return {n: t for f in sorted(model_dir.glob("*.safetensors")) for n, t in load_file(str(f)).items()}


def check(weights, ref):
    got = dict(weights)
    assert got.keys() == ref.keys()
    for n, t in ref.items():
        assert torch.equal(got[n].to(t.dtype), t), n


def test_local_files(llama):
    ld, config, model = loader(), Config(llama), torch.nn.Linear(2, 2)
    check(ld.get_all_weights(config, model), reference(llama))
    check(ld.get_all_weights(config, model), reference(llama))  # checked against the first


def test_a_bucket(llama, bucket, monkeypatch):
    for k, v in servers.s3_env(bucket).items():
        monkeypatch.setenv(k, v)
    config, model = Config(llama, "s3://models/llama/"), torch.nn.Linear(2, 2)
    check(loader().get_all_weights(config, model), reference(llama))
    check(loader().get_all_weights(config, model), reference(llama))


def test_striped_sources(llama):
    from tensorlift import remote
    with remote.serve(llama, chunk_bytes=256 << 10) as server:
        ld = loader({"stripe": {"peer": server.url, "page_cache": False}})
        check(ld.get_all_weights(Config(llama), torch.nn.Linear(2, 2)), reference(llama))


def test_a_peer_only_engine_is_told_to_give_a_path():
    ld = loader({"peer": "http://127.0.0.1:9", "model": "m", "revision": "r", "fallback": False})
    with pytest.raises(ValueError, match="pulled its weights from a peer .the peer / registry option.*give "
                                         "reload_weights a weights_path"):
        ld.get_all_weights(Config("org/model-on-the-hub"), torch.nn.Linear(2, 2))
