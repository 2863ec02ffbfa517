"""SGLang load format `tensorlift`: `python -m sglang.launch_server --model-path M --load-format tensorlift`.

Installed with tensorlift, registered through the `sglang.srt.plugins` entry
point (pyproject.toml), which SGLang runs in each of its processes (launcher,
engine, scheduler) before it parses arguments or builds a model. `register()`:
- adds "tensorlift" to SGLang's `--load-format` choices (its own
  `add_load_format_choices`);
- hooks `LoadConfig._verify_load_format` (SGLang's HookRegistry, AROUND) so
  that the name "tensorlift" becomes `TensorliftSGLangLoader`; SGLang's
  `get_model_loader` takes a loader class as a load format.

    python -m sglang.launch_server --model-path /models/llama --load-format tensorlift
    sglang.Engine(model_path="/models/llama", load_format="tensorlift")
    ... --model-loader-extra-config '{"mode": "direct", "threads": 8}'

The loader is SGLang's own DefaultModelLoader (its file discovery, the model's
`load_weights`, post-processing and quantization steps, the draft-model
filter) with tensorlift reading the bytes: `.safetensors` files in ~256 MiB
pieces one ahead, onto the model's device, sparse-bitmask checkpoints dense,
a malformed file stopping start-up with tensorlift's one-line FormatError.
The options are vLLM's `tensorlift` format's (tensorlift.integrations.loading:
mode, threads, filter, progress, and peer / registry / fallback / serve / handover
for loading from a running instance: every rank serves its parameters as loaded,
before SGLang's post-processing, and rank r of a new instance pulls rank r's,
under a key naming SGLang's version and the tensor parallel size; on one host the
serving instance's shared memory is handed over and mapped, not copied); any other
key is refused. Tensor parallelism: unless a mode is set, every rank gets views
of the files on the CPU and the model's weight loaders take their slices.

An s3:// or gs:// model path (`--model-path s3://bucket/model/`): SGLang pulls
the config and tokenizer to a local directory and keeps the URL in
ModelConfig.model_weights; `register()` keeps the load format "tensorlift"
(SGLang's handle_load_format turns it into runai_streamer otherwise) and the
loader streams the shards from the bucket (docs/object-storage.md).
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any, Optional

from .loading import (FORMAT, check_reload, checkpoint_shapes, describe_plan, iterate_bucket, iterate_striped,
                      iterate_weights, loaded, model_device, parse_options, peer_layout, pull_parameters,
                      remember_loaded, serve_parameters)

NAME = "tensorlift"
_loader_class: Optional[type] = None


def loader_class() -> type:
    """TensorliftSGLangLoader, made once (importing SGLang only when SGLang asks)."""
    global _loader_class
    if _loader_class is None:
        _loader_class = _make_loader_class()
    return _loader_class


def _make_loader_class() -> type:
    from sglang.srt.model_loader.loader import BaseModelLoader, DefaultModelLoader

    logger = logging.getLogger("sglang.srt.model_loader.tensorlift")  # under SGLang's log handler

    class TensorliftSGLangLoader(DefaultModelLoader):
        """SGLang's model loader for --load-format tensorlift (see the module docstring)."""

        def __init__(self, load_config):
            # DefaultModelLoader.__init__ only checks its own extra-config keys; ours are checked here.
            BaseModelLoader.__init__(self, load_config)
            self.options = parse_options(load_config.model_loader_extra_config)
            self.from_peer = bool(self.options.get("peer") or self.options.get("registry"))
            self._device = "cpu"
            # An s3:// or gs:// model: SGLang pulled its config and tokenizer to a local directory
            # (ModelConfig.model_path) and keeps the URL in model_weights; local directory -> URL.
            self._buckets = {}

        def _note(self, model_config) -> None:
            from .._sources import is_object_url
            self._model_config = model_config
            url = getattr(model_config, "model_weights", None) or ""
            if is_object_url(url):
                self._buckets[model_config.model_path] = url

        def _prepare_weights(self, model_name_or_path, revision, fall_back_to_pt, allow_patterns_overrides=None):
            # SGLang's own discovery (local directory or the Hub, the index filtering
            # duplicate shards, its file order), as its "safetensors" format runs it.
            # An s3:// or gs:// model: its shards, from the bucket's listing and index.
            url = self._buckets.get(model_name_or_path)
            if url:
                from .._stream import shard_files
                return url, shard_files(url), True
            from sglang.srt.configs.load_config import LoadFormat
            ours, self.load_config.load_format = self.load_config.load_format, LoadFormat.SAFETENSORS
            try:
                return super()._prepare_weights(model_name_or_path, revision, False, allow_patterns_overrides)
            finally:
                self.load_config.load_format = ours

        def _files(self, source):
            _, files, use_safetensors = self._prepare_weights(
                source.model_or_path, source.revision, False, source.allow_patterns_overrides)
            if not use_safetensors:
                raise ValueError(f"{FORMAT}: {source.model_or_path} has no .safetensors weights "
                                 f"(found {[os.path.basename(f) for f in files][:4]})")
            return list(files)

        def _get_weights_iterator(self, source, *, resolved_source=None, **_prefetch_flags: Any):
            from .._sources import is_object_url
            config = getattr(source, "model_config", None)
            if is_object_url(source.model_or_path):  # update_weights_from_disk("s3://...")
                self._buckets[source.model_or_path] = source.model_or_path
            if config is not None and loaded(config) is not None and resolved_source is None:
                # A reload (update_weights_from_disk: SGLang has pointed model_path at the new
                # checkpoint): every new file is checked whole, and its tensors against what this
                # engine loaded, before SGLang starts writing them into the model (its rollback
                # reads the failed path again). This runs when SGLang asks for the iterator, which
                # SGLang reports as "Failed to get weights iterator" with nothing written.
                def restore(fields):
                    for field, value in fields.items():
                        setattr(config, field, value)

                url = self._buckets.get(source.model_or_path, "")
                sources, shapes = check_reload(
                    config, url or source.model_or_path, lambda: [(source.prefix, self._files(source))],
                    self.options, restore, compare=source.prefix == "")
                files = sources[0][1]
                self._loaded = (config, source.prefix, files, shapes if source.prefix == "" else None)
            else:
                if resolved_source is None:
                    files = self._files(source)
                else:
                    files, use_safetensors = list(resolved_source.weight_files), resolved_source.use_safetensors
                    if not use_safetensors:
                        raise ValueError(f"{FORMAT}: {source.model_or_path} has no .safetensors weights "
                                         f"(found {[os.path.basename(f) for f in files][:4]})")
                self._loaded = (config, source.prefix, files, None)
            url = self._buckets.get(source.model_or_path)
            if "stripe" in self.options:  # every source of the checkpoint at once
                weights = iterate_striped(list(files), url or os.path.dirname(files[0]), self._device, self.options,
                                          logger.info)
            elif url:  # an s3:// or gs:// model
                weights = iterate_bucket(url, self._device, self.options, logger.info)
            else:
                weights = iterate_weights(list(files), self._device, self.options, self._ranks())  # SGLang's order
            if self.load_config.draft_model_idx is not None:
                return self._filter_mtp_weights(weights, source.prefix, self.load_config.draft_model_idx)
            if self.counter_before_loading_weights == 0.0:
                self.counter_before_loading_weights = time.perf_counter()
            return ((source.prefix + name, tensor) for name, tensor in weights)

        @staticmethod
        def _ranks() -> int:
            """Ranks the model is split over: tensor times pipeline parallel size."""
            from sglang.srt.distributed.parallel_state import get_pp_group, get_tensor_model_parallel_world_size
            return get_tensor_model_parallel_world_size() * get_pp_group().world_size

        def _peer_layout(self):
            import sglang
            from sglang.srt.distributed.parallel_state import (get_pp_group, get_tensor_model_parallel_rank,
                                                               get_tensor_model_parallel_world_size,
                                                               get_world_group)
            config = self._model_config
            return peer_layout(get_pp_group().world_size, get_tensor_model_parallel_world_size(),
                               get_tensor_model_parallel_rank(), get_world_group().cpu_group, config.model_path,
                               self.options, f"sglang-{sglang.__version__}", config.dtype,
                               getattr(config, "quantization", None))

        def load_weights_and_postprocess(self, model, weights, target_device):
            # Both of SGLang's paths (load_model, and commit_model_weights when start-up
            # overlaps the load) come here with the lazy weights iterator: the device is
            # set before its first read, and a peer load never starts it.
            import torch
            self._device = model_device(torch.device(target_device))
            peer = self._peer_layout() if self.from_peer or "serve" in self.options else None
            if self.from_peer and getattr(model, "secondary_weights", ()):
                raise ValueError(f"{FORMAT}: {type(model).__name__} has secondary weights; "
                                 "a peer load serves one model's parameters")
            t0 = time.perf_counter()
            if not (self.from_peer and pull_parameters(model, self._model_config.model_path, self.options,
                                                       *peer[:3], logger.info)):
                ranks = self._ranks()
                if ranks > 1:
                    logger.info("tensorlift: %d ranks: %s", ranks, describe_plan(self._device, self.options, ranks))
                DefaultModelLoader.load_weights_only(model, weights, target_device)
            if self.options.get("serve") is not None:
                # As loaded, before SGLang's post-processing: a new instance pulls these
                # and post-processes them itself.
                serve_parameters(model, self.options, *peer, logger.info)
            DefaultModelLoader.postprocess_weights(model, target_device)
            self._remember()
            logger.info("tensorlift: loading weights took %.2f seconds", time.perf_counter() - t0)

        def _remember(self) -> None:
            """Records what this engine loaded (its own checkpoint), for a reload's checks."""
            config, prefix, files, shapes = getattr(self, "_loaded", (None, "", [], None))
            if config is None or prefix != "":
                return
            if shapes is None:
                try:
                    shapes = checkpoint_shapes(files, None, self.options.get("filter"))
                except (OSError, ValueError):  # a peer load whose own files are not all there
                    shapes = None
            remember_loaded(config, {f: getattr(config, f) for f in ("model_path", "model_weights")
                                     if hasattr(config, f)}, shapes)

        def download_model(self, model_config):
            self._note(model_config)
            return super().download_model(model_config)

        def resolve_model_weights(self, model_config, model):
            self._note(model_config)
            return super().resolve_model_weights(model_config, model)

        def load_model(self, *, model_config, device_config):
            self._note(model_config)
            return super().load_model(model_config=model_config, device_config=device_config)

        def commit_model_weights(self, *, model, model_config, **kwargs):
            self._note(model_config)
            return super().commit_model_weights(model=model, model_config=model_config, **kwargs)

    return TensorliftSGLangLoader


def _verify_load_format(original, config, *args, **kwargs):
    """Around LoadConfig._verify_load_format: "tensorlift" names our loader class."""
    if isinstance(config.load_format, str) and config.load_format.lower() == NAME:
        config.load_format = loader_class()
        return None
    return original(config, *args, **kwargs)


def _keep_format_for_object_storage(server_args, previous) -> None:
    """Around SGLang's handle_load_format (a resolution hook): for an s3:// or gs:// model path it
    turns every load format into runai_streamer; tensorlift reads object storage itself, so
    "tensorlift" stays. SGLang still pulls the config and tokenizer to a local directory (its
    handle_model_source_paths, with runai-model-streamer) and ModelConfig keeps the URL in
    model_weights, where the loader finds it."""
    from sglang.srt.arg_groups.overrides import declare_resolution, resolving_view
    from .._sources import is_object_url
    cfg = resolving_view(server_args)
    ours = isinstance(cfg.load_format, str) and cfg.load_format.lower() == NAME
    previous(server_args)
    if ours and is_object_url(str(cfg.model_path or "")) and cfg.load_format != NAME:
        declare_resolution(server_args, "tensorlift", load_format=NAME)


_registered = False


def register() -> None:
    """The sglang.srt.plugins entry point: adds --load-format tensorlift."""
    global _registered
    if _registered:
        return
    from sglang.srt.arg_groups.choices import LOAD_FORMAT_CHOICES, add_load_format_choices
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    if NAME not in LOAD_FORMAT_CHOICES:
        add_load_format_choices([NAME])
    HookRegistry.register("sglang.srt.configs.load_config.LoadConfig._verify_load_format",
                          _verify_load_format, HookType.AROUND)
    try:  # s3:// and gs:// models (SGLang's resolution hooks, 0.5.23)
        from sglang.srt.arg_groups.resolution_hooks import register_resolution_hook
    except ImportError:
        pass
    else:
        register_resolution_hook("handle_load_format")(_keep_format_for_object_storage)
    _registered = True
