"""tensorlift inside other libraries.

- `tensorlift.integrations.transformers`: `enable()` / `disable()` / `use_tensorlift()`
  make Hugging Face transformers read .safetensors checkpoints through tensorlift.
- `tensorlift.integrations.vllm`: vLLM's `--load-format tensorlift`, registered by
  the `vllm.general_plugins` entry point when tensorlift is installed.
- `tensorlift.integrations.sglang`: SGLang's `--load-format tensorlift`, added by
  the `sglang.srt.plugins` entry point when tensorlift is installed.
- `tensorlift.integrations.loading`: what those two share (options, the reads one
  piece ahead, the peer pull and serving), importing neither server.
"""
