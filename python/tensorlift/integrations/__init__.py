"""tensorlift inside other libraries.

- `tensorlift.integrations.transformers`: `enable()` / `disable()` / `use_tensorlift()`
  make Hugging Face transformers read .safetensors checkpoints through tensorlift.
- `tensorlift.integrations.vllm`: vLLM's `--load-format tensorlift`, registered by
  the `vllm.general_plugins` entry point when tensorlift is installed.
"""
