"""Writes a small random-weight model with transformers, as a user's checkpoint is saved.

    python make_model.py ARCH OUT_DIR      # ARCH: llama (untied) | qwen2 (tied embeddings) | mixtral (MoE)

bf16, sharded by save_pretrained (max_shard_size) with model.safetensors.index.json.
head_dim is 64: vLLM's CPU attention does not take smaller heads.
"""
import sys

import torch


def main():
    arch, out = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    common = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    if arch == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM
        model = LlamaForCausalLM(LlamaConfig(tie_word_embeddings=False, **common))
    elif arch == "qwen2":
        from transformers import Qwen2Config, Qwen2ForCausalLM
        model = Qwen2ForCausalLM(Qwen2Config(tie_word_embeddings=True, **common))
    elif arch == "mixtral":  # mixture of experts: 4 experts, 2 per token
        from transformers import MixtralConfig, MixtralForCausalLM
        model = MixtralForCausalLM(MixtralConfig(tie_word_embeddings=False, num_local_experts=4,
                                                 num_experts_per_tok=2, **dict(common, intermediate_size=256)))
    else:
        sys.exit(f"unknown architecture {arch}")
    model = model.to(torch.bfloat16)
    model.config.torch_dtype = torch.bfloat16
    model.save_pretrained(out, max_shard_size="400KB")


if __name__ == "__main__":
    main()
