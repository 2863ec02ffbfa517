"""tensorlift inside other libraries.

- `tensorlift.integrations.transformers`: `enable()` / `disable()` / `use_tensorlift()`
  make Hugging Face transformers read .safetensors checkpoints through tensorlift.
"""
