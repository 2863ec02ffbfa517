"""The client side of test_peer_model_proxy.py, in a process of its own.

    python peer_model_worker.py MODE CHECKPOINT_DIR DEVICE [URL]

Builds the tiny Llama of CHECKPOINT_DIR's config.json on DEVICE and greedily
generates from a fixed prompt. MODE "disk": the weights from the checkpoint
(transformers' from_pretrained). MODE "peer": the model is built with other,
random weights, which are then overwritten in place with the tensors pulled from
the seed at URL into DEVICE's memory (tensorlift.remote.load_from_peer, as vLLM's
and SGLang's formats fill their parameters), with no fallback. Prints one JSON
line: the tokens, and for "peer" which source the pull used.
Not a test module itself (no test_ prefix).
"""
import json
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

PROMPT = [[1, 17, 42, 7, 99, 3]]


def main():
    mode, ckpt, device = sys.argv[1:4]
    if mode == "disk":
        model = LlamaForCausalLM.from_pretrained(ckpt, torch_dtype=torch.float32).to(device)
        source = "disk"
    else:
        from tensorlift import remote
        torch.manual_seed(1234)  # Not the seed's weights: the pull must replace every one.
        model = LlamaForCausalLM(LlamaConfig.from_pretrained(ckpt)).to(device)
        pulled = remote.load_from_peer(sys.argv[4], model="tiny-llama", revision="r1", device=device,
                                       timeout=30)
        # Every parameter must come from the seed (the state dict it serves); buffers it serves
        # are taken too (non-persistent ones, such as rotary frequencies, are computed here).
        missing = sorted(set(dict(model.named_parameters())) - set(pulled))
        params = dict(model.named_parameters())
        params.update(dict(model.named_buffers()))
        if missing:
            sys.exit(f"the seed did not serve {missing}")
        with torch.no_grad():
            for name, t in pulled.items():
                if name in params:
                    if t.device != params[name].device:
                        sys.exit(f"{name} landed on {t.device}, not {params[name].device}")
                    params[name].copy_(t)
        report = remote.last_report() or {}
        source = report.get("source", "")
    model.eval()
    with torch.no_grad():
        out = model.generate(torch.tensor(PROMPT, device=device), max_new_tokens=16, do_sample=False,
                             pad_token_id=0)
    print(json.dumps({"tokens": out[0].tolist(), "source": source}))


if __name__ == "__main__":
    main()
