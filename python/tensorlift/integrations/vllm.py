"""vLLM load format `tensorlift`: `vllm serve MODEL --load-format tensorlift`.

Installed with tensorlift, registered through the `vllm.general_plugins`
entry point (pyproject.toml), which vLLM calls in every process it starts:
`register()` adds `TensorliftModelLoader` under the name "tensorlift" with
`vllm.model_executor.model_loader.register_model_loader`. Nothing else to
configure, no fork of vLLM:

    vllm serve /models/llama --load-format tensorlift
    LLM(model="/models/llama", load_format="tensorlift")
    vllm serve ... --load-format tensorlift --model-loader-extra-config '{"mode": "direct", "threads": 8}'

What it does: finds the checkpoint's .safetensors files as vLLM's own
safetensors format does (local directory or the Hugging Face cache/download,
the sharded index deciding which files count), reads them with tensorlift
(`mode` auto: page-cached bytes from the page cache, cold bytes with O_DIRECT,
in large parallel blocks, the GIL released) straight into the model's device
(host memory on the CPU; GPU memory through tensorlift's pinned pipeline or
GPUDirect Storage on `cuda:N`), and hands `(name, tensor)` pairs to the
model's own `load_weights`, as vLLM's default loader does: stacked and packed
parameters (qkv, gate_up), tied embeddings and every model's name mapping
keep working. The tensors are read in pieces of about 256 MiB, one piece
ahead: while the model copies piece k's tensors into its parameters, piece
k+1 is being read. Sparse-bitmask
checkpoints come back dense. A malformed file stops start-up with
tensorlift's one-line FormatError naming the file and the rule; nothing is
returned half-loaded.

Tensor parallelism: every rank reads whole tensors of every shard once and
the model's weight loaders take their slices (vLLM's loaders slice after the
read; reading only a rank's byte ranges is not done yet).

`--model-loader-extra-config` (JSON), all optional:
  mode      "auto" | "buffered" | "direct" | "mmap" (tensorlift's I/O mode)
  threads   reader threads (a positive int; default: tensorlift's choice)
  filter    a regex: only matching tensor names are read
  progress  true: a progress bar per shard
Peer loading (R-Fork; tensor parallel size 1):
  serve     true or {"host", "port", "registry", "token_file", "ready_file"}:
            once loaded, this instance serves the checkpoint's tensors to new
            instances (tensorlift.remote; registered in etcd with registry;
            ready_file gets the URL). A disk load serves the checkpoint read
            again from the page cache (one more host copy of the weights); a
            peer load serves the very buffers it pulled.
  peer      a URL or a list of URLs of serving instances;
  registry  or an etcd endpoint to find them in;
  fallback  true (default): the model's own files when every peer fails;
  model, revision  the key, when the model is not a local directory
            (default: the directory's name and a digest of its headers);
  token_file, timeout  HMAC token file; seconds before a peer counts as dead.
  The key is checked before any byte moves and every chunk's checksum where
  it lands; a dead or lying peer falls back to the next, then to disk.
Any other key is refused with a ValueError naming the allowed ones.
"""
from __future__ import annotations

import os
import time
from typing import List, Optional

from .loading import (ALLOWED_OPTIONS, GROUP_BYTES, MODES, SERVE_OPTIONS, describe_plan, iterate_weights,  # noqa: F401
                      model_device, natural_key, parse_options, peer_weights, plan_groups, serve_checkpoint)


def _make_loader_class():
    import torch
    from torch import nn
    from vllm.config import ModelConfig
    from vllm.config.load import LoadConfig
    from vllm.logger import init_logger
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    logger = init_logger("vllm.model_executor.model_loader.tensorlift")  # under vLLM's log handler

    class TensorliftModelLoader(BaseModelLoader):
        """vLLM's model loader for --load-format tensorlift (see the module docstring)."""

        def __init__(self, load_config: LoadConfig):
            super().__init__(load_config)
            self.options = parse_options(load_config.model_loader_extra_config)
            self.from_peer = bool(self.options.get("peer") or self.options.get("registry"))
            # vLLM's own file discovery (local directory or Hugging Face, the
            # index filtering duplicate shards), as its "safetensors" format does.
            finder_config = LoadConfig(load_format="safetensors", download_dir=load_config.download_dir,
                                       ignore_patterns=load_config.ignore_patterns)
            self._finder = DefaultModelLoader(finder_config)

        def _files(self, model_or_path: str, revision: Optional[str], subfolder: Optional[str] = None,
                   allow_patterns_overrides: Optional[List[str]] = None) -> List[str]:
            _, files, use_safetensors, _ = self._finder._prepare_weights(
                model_or_path, subfolder, revision, False, allow_patterns_overrides)
            if not use_safetensors:
                raise ValueError(f"tensorlift load format: {model_or_path} has no .safetensors weights "
                                 f"(found {[os.path.basename(f) for f in files][:4]})")
            return sorted(files, key=natural_key)

        def download_model(self, model_config: ModelConfig) -> None:
            self._files(model_config.model, model_config.revision)

        def _weights(self, model: nn.Module, model_config: ModelConfig, device: str):
            if self.from_peer:
                yield from peer_weights(model_config.model, device, self.options, logger.info)
                for s in getattr(model, "secondary_weights", ()):
                    raise ValueError(f"tensorlift load format: {type(model).__name__} has secondary weights "
                                     f"({s.model_or_path}); a peer load serves one checkpoint")
                return
            sources = [("", model_config.model, model_config.revision, None,
                        getattr(model, "allow_patterns_overrides", None))]
            for s in getattr(model, "secondary_weights", ()):
                sources.append((s.prefix, s.model_or_path, s.revision, s.subfolder, s.allow_patterns_overrides))
            for prefix, path, revision, subfolder, patterns in sources:
                files = self._files(path, revision, subfolder, patterns)
                for name, tensor in iterate_weights(files, device, self.options, self._ranks()):
                    yield prefix + name, tensor

        @staticmethod
        def _ranks() -> int:
            """Ranks the model is split over: tensor times pipeline parallel size."""
            from vllm.distributed import get_pp_group, get_tensor_model_parallel_world_size
            return get_tensor_model_parallel_world_size() * get_pp_group().world_size

        def load_weights(self, model: nn.Module, model_config: ModelConfig) -> None:
            param = next(model.parameters(), None)
            dev = param.device if param is not None else torch.device("cpu")
            device = model_device(dev)
            t0 = time.perf_counter()
            from vllm.distributed import get_tensor_model_parallel_world_size
            ranks = self._ranks()
            if ranks > 1 and not self.from_peer:
                logger.info("tensorlift: %d ranks: %s", ranks, describe_plan(device, self.options, ranks))
            if (self.from_peer or "serve" in self.options) and get_tensor_model_parallel_world_size() > 1:
                raise ValueError("tensorlift load format: peer loading and serving take tensor parallel size 1 "
                                 "for now (each rank would need its own layout and key)")
            loaded = model.load_weights(self._weights(model, model_config, device))
            logger.info("tensorlift: loading weights took %.2f seconds", time.perf_counter() - t0)
            if self.options.get("serve") is not None and not self.from_peer:  # a peer load's seed serves already
                serve_checkpoint(model_config.model, self.options, logger.info)
            # vLLM's own check that every parameter got a weight, under its rule
            # (unquantized models that report what they loaded; not with a filter).
            if loaded is not None and model_config.quantization is None and not self.options.get("filter"):
                self._finder.track_weights_loading(model, loaded)

    return TensorliftModelLoader


_registered = None


def register() -> None:
    """The vllm.general_plugins entry point: registers --load-format tensorlift."""
    global _registered
    if _registered is not None:
        return
    from vllm.model_executor.model_loader import register_model_loader
    _registered = register_model_loader("tensorlift")(_make_loader_class())
