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

Tensor and pipeline parallelism: unless a mode is set, every rank gets views
of the files on the CPU and vLLM's weight loaders narrow them to the rank's
slice, so each rank touches only the pages of its slices (loading.read_plan).

`--model-loader-extra-config` (JSON), all optional:
  mode      "auto" | "buffered" | "direct" | "mmap" (tensorlift's I/O mode)
  threads   reader threads (a positive int; default: tensorlift's choice)
  filter    a regex: only matching tensor names are read
  progress  true: a progress bar per shard
Peer loading (R-Fork; any tensor parallel size, pipeline parallel size 1):
  serve     true or {"host", "port", "registry", "token_file", "ready_file"}:
            once loaded, every rank serves its parameters as loaded (before
            vLLM's post-processing) to new instances (tensorlift.remote;
            registered in etcd with registry; ready_file gets every rank's
            URL, one a line). A peer load's seed serves the buffers it pulled.
  peer      a URL or a list of URLs of a seed's ranks;
  registry  or an etcd endpoint to find seeds in;
  fallback  true (default): the model's own files when every peer fails;
  model, revision  the key, when the model is not a local directory
            (default: the directory's name and a digest of its headers);
  token_file, timeout  HMAC token file; seconds before a peer counts as dead.
  Rank r pulls from rank r of a seed with the same model, vLLM version,
  dtype, quantization and tensor parallel size (all in the key, checked
  before any byte moves), every chunk's checksum where it lands, every
  parameter's name, dtype and shape before any is replaced; on the CPU the
  pulled buffers become the parameters. A dead or lying peer falls back to
  the next, then to disk.
  handover  "auto" (default) | "off" | "verify": on one host, a serving
            instance keeps its host parameters in sealed shared memory (its
            model maps it copy-on-write) and hands it to new instances, whose
            parameters become the same memory, mapped: no copy, one copy of
            the weights on the host (docs/remote.md, "Same-host handover").
            "off" copies over UCX; "verify" checks every chunk of the mapping.
Many sources at once (the checkpoint's files, not parameters):
  stripe    {"peer", "registry", "bucket", "token_file", "timeout", "page_cache"}: each piece
            of the checkpoint is read from the local files (or the bucket vLLM
            was given), peers serving the same files (`tensorlift serve DIR`,
            by URL or found in the registry under the checkpoint's key) and a
            copy in a bucket, all at once, faster sources taking more; every
            chunk is checked against a peer's manifest, and a source that fails
            or lies has its ranges moved to the others (docs/object-storage.md).
            A local copy in the page cache is read from alone (its views cost
            nothing); page_cache false stripes anyway.
Any other key is refused with a ValueError naming the allowed ones.

Reloading in place (`llm.collective_rpc("reload_weights", kwargs={"weights_path": DIR})`, or
without weights_path; sleep mode level 2; RL frameworks' weight updates): vLLM asks the loader
for get_all_weights, which yields what load_weights reads, after checking the new checkpoint
whole (every shard the index names, every file's header, offsets and length) and its tensors
against the ones this engine loaded (names and shapes). A bad directory is refused with one
ValueError naming the file before any byte is written, and vLLM's config is pointed back at the
weights the engine still serves (docs/inference-servers.md, "Reloading weights").
"""
from __future__ import annotations

import os
import time
from typing import List, Optional, Tuple

from .loading import (ALLOWED_OPTIONS, FORMAT, GROUP_BYTES, MODES, SERVE_OPTIONS, check_reload,  # noqa: F401
                      checkpoint_shapes, describe_plan, iterate_bucket, iterate_striped, iterate_weights, loaded,
                      model_device, natural_key, parameter_key, parse_options, plan_groups, peer_layout,
                      pull_parameters, remember_loaded, serve_parameters)


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
            if not _weights_url(model_config):
                self._files(model_config.model, model_config.revision)

        def _sources(self, model: nn.Module, model_config: ModelConfig) -> List[Tuple[str, List[str]]]:
            """(prefix, files) of every checkpoint the model loads: its own (local, from the Hugging
            Face cache, or its shards in the bucket vLLM was given) and any secondary weights."""
            url = _weights_url(model_config)
            if url:
                from .._stream import shard_files
                return [("", shard_files(url))]
            sources = [("", model_config.model, model_config.revision, None,
                        getattr(model, "allow_patterns_overrides", None))]
            for s in getattr(model, "secondary_weights", ()):
                sources.append((s.prefix, s.model_or_path, s.revision, s.subfolder, s.allow_patterns_overrides))
            return [(prefix, self._files(path, revision, subfolder, patterns))
                    for prefix, path, revision, subfolder, patterns in sources]

        def _weights(self, model: nn.Module, model_config: ModelConfig, device: str,
                     sources: List[Tuple[str, List[str]]]):
            url = _weights_url(model_config)
            if "stripe" in self.options:
                # Every source at once: the local files (or the bucket vLLM was given), a copy in a
                # bucket and peers serving the files.
                files = sources[0][1]
                key_dir = model_config.model if os.path.isdir(model_config.model) else files[0]
                yield from iterate_striped(files, key_dir if not url else url, device, self.options, logger.info)
                return
            if url:
                # An s3:// or gs:// model: vLLM pulled its config and tokenizer into a local
                # directory (model_config.model); the weights stream from the bucket.
                yield from iterate_bucket(url, device, self.options, logger.info)
                return
            for prefix, files in sources:
                for name, tensor in iterate_weights(files, device, self.options, self._ranks()):
                    yield prefix + name, tensor

        def _remember(self, model_config: ModelConfig, sources: Optional[List[Tuple[str, List[str]]]],
                      shapes=None) -> None:
            """Records what this engine loaded, for a reload's checks (loading.check_reload)."""
            if shapes is None and sources is not None:
                shapes = {}
                for prefix, files in sources:
                    got = checkpoint_shapes(files, None, self.options.get("filter"))
                    shapes.update({prefix + name: v for name, v in got.items()})
            remember_loaded(model_config, _source_fields(model_config), shapes)

        def get_all_weights(self, model_config: ModelConfig, model: nn.Module):
            """What load_weights would load, for vLLM's in-place reload (reload_weights, with or
            without weights_path; sleep mode level 2's wake-up; RL frameworks' weight updates).
            vLLM has already pointed model_config at the new path; nothing is read into the model
            until every new file has been checked whole and its tensors (names, shapes) are those
            the engine loaded: otherwise one ValueError names the file, model_config names the
            weights the engine still has, and the model is untouched (vLLM cannot undo a failed
            in-place reload). Not a generator: the checks run when vLLM asks, before it prepares
            the model for loading."""
            url = _weights_url(model_config)
            where = url or model_config.model

            def restore(source):
                for field, value in source.items():
                    setattr(model_config, field, value)

            def find():
                if self.from_peer and not url and not os.path.isdir(model_config.model):
                    raise ValueError(f"{model_config.model} is not a local directory: this engine pulled its weights "
                                     "from a peer (the peer / registry option of --model-loader-extra-config) and "
                                     "has no checkpoint files to reload: give reload_weights a weights_path")
                return self._sources(model, model_config)

            try:
                sources, shapes = check_reload(model_config, where, find, self.options, restore)
                refused = None
            except ValueError as e:
                refused = e
            # Every rank checks the same files; the ranks agree before any of them answers. vLLM's
            # multiprocess executor (0.32) raises on the first failed rank's answer and leaves the
            # later ranks' answers queued, where the next call to collective_rpc reads them as its
            # own: a good reload after a refused one would report the refusal. So only the last
            # rank raises; the others load nothing (vLLM puts every layer's tensors back) and
            # answer after it, in order.
            said, last = _agree(None if refused is None else str(refused))
            if said is not None:
                if refused is None:  # this rank's files were fine, another rank's were not
                    before = loaded(model_config)
                    if before is not None:
                        restore(before["source"])
                if last:
                    if refused is not None:
                        raise refused
                    raise ValueError(said)
                logger.warning("tensorlift: %s (the last rank raises it; this rank loads nothing)", said)
                return iter(())
            param = next(model.parameters(), None)
            device = model_device(param.device if param is not None else torch.device("cpu"))

            def weights():
                t0 = time.perf_counter()
                yield from self._weights(model, model_config, device, sources)
                self._remember(model_config, sources, shapes)
                logger.info("tensorlift: read the new weights from %s in %.2f seconds", where,
                            time.perf_counter() - t0)
            return weights()

        @staticmethod
        def _ranks() -> int:
            """Ranks the model is split over: tensor times pipeline parallel size."""
            from vllm.distributed import get_pp_group, get_tensor_model_parallel_world_size
            return get_tensor_model_parallel_world_size() * get_pp_group().world_size

        def _peer_layout(self, model_config: ModelConfig):
            import vllm
            from vllm.distributed import (get_pp_group, get_tensor_model_parallel_rank,
                                          get_tensor_model_parallel_world_size, get_world_group)
            return peer_layout(get_pp_group().world_size, get_tensor_model_parallel_world_size(),
                               get_tensor_model_parallel_rank(), get_world_group().cpu_group, model_config.model,
                               self.options, f"vllm-{vllm.__version__}", model_config.dtype,
                               model_config.quantization)

        def load_weights(self, model: nn.Module, model_config: ModelConfig) -> None:
            param = next(model.parameters(), None)
            dev = param.device if param is not None else torch.device("cpu")
            device = model_device(dev)
            t0 = time.perf_counter()
            ranks = self._ranks()
            peer = self._peer_layout(model_config) if self.from_peer or "serve" in self.options else None
            if self.from_peer and getattr(model, "secondary_weights", ()):
                raise ValueError(f"{FORMAT}: {type(model).__name__} has secondary weights; "
                                 "a peer load serves one model's parameters")
            loaded = None
            if not (self.from_peer and pull_parameters(model, model_config.model, self.options, *peer[:3],
                                                       logger.info)):
                if ranks > 1:
                    logger.info("tensorlift: %d ranks: %s", ranks, describe_plan(device, self.options, ranks))
                sources = self._sources(model, model_config)
                loaded = model.load_weights(self._weights(model, model_config, device, sources))
                self._remember(model_config, sources)
            elif os.path.isdir(model_config.model):
                # From a peer: a reload checks new files against this model's own.
                try:
                    self._remember(model_config, self._sources(model, model_config))
                except (OSError, ValueError):
                    self._remember(model_config, None)
            else:
                self._remember(model_config, None)
            if self.options.get("serve") is not None:
                # As loaded, before vLLM's post-processing (next, in load_model): a new
                # instance pulls these and post-processes them itself.
                serve_parameters(model, self.options, *peer, logger.info)
            logger.info("tensorlift: loading weights took %.2f seconds", time.perf_counter() - t0)
            # vLLM's own check that every parameter got a weight, under its rule
            # (unquantized models that report what they loaded; not with a filter).
            # A peer load has checked every parameter's name, dtype and shape.
            if loaded is not None and model_config.quantization is None and not self.options.get("filter"):
                self._finder.track_weights_loading(model, loaded)

    return TensorliftModelLoader


def _agree(refusal: Optional[str]) -> Tuple[Optional[str], bool]:
    """(the first refusal of any rank of vLLM's world group, or None; whether this is the last rank):
    every rank passes its own (None: its checks passed). A collective over the group's CPU group."""
    from vllm.distributed import get_world_group
    try:
        group = get_world_group()
    except AssertionError:  # no engine around this loader (vLLM's distributed state is not set up)
        return refusal, True
    if group.world_size == 1:
        return refusal, True
    import torch
    said: List[Optional[str]] = [None] * group.world_size
    torch.distributed.all_gather_object(said, refusal, group=group.cpu_group)
    first = next(((rank, text) for rank, text in enumerate(said) if text), None)
    text = None if first is None else (first[1] if first[1] == refusal else f"rank {first[0]}: {first[1]}")
    return text, group.rank_in_group == group.world_size - 1


def _source_fields(model_config) -> dict:
    """The fields of vLLM's ModelConfig that name its weights (vLLM's reload_weights changes them to
    the new path before it asks the loader; a refused reload puts them back)."""
    return {f: getattr(model_config, f) for f in ("model", "revision", "model_weights") if hasattr(model_config, f)}


def _weights_url(model_config) -> str:
    """The s3:// or gs:// URL of the model's weights ("" for a local or Hugging Face model): vLLM
    keeps it in model_weights once it has pulled the config and tokenizer to a local directory."""
    from .._sources import is_object_url
    url = getattr(model_config, "model_weights", "") or ""
    return url if is_object_url(url) else ""


def _allow_object_storage() -> None:
    """Lets `vllm serve s3://bucket/model --load-format tensorlift` start.

    vLLM (0.32) pulls an object-storage model's config and tokenizer to a local directory for any
    load format (ModelConfig, with runai-model-streamer), and then, in
    VllmConfig.try_verify_and_update_config, refuses every load format but its own object-storage
    ones. tensorlift reads object storage itself, so during that check (only) a tensorlift load
    format reads as runai_streamer, the check's one use of it; anything else is vLLM's as is. A
    vLLM without that method is left alone."""
    try:
        from vllm.config.vllm import VllmConfig
    except ImportError:
        return
    check = getattr(VllmConfig, "try_verify_and_update_config", None)
    if check is None or getattr(check, "_tensorlift", False):
        return

    def try_verify_and_update_config(self):
        load_config = getattr(self, "load_config", None)
        model_config = getattr(self, "model_config", None)
        if (load_config is not None and load_config.load_format == "tensorlift" and model_config is not None
                and _weights_url(model_config)):
            load_config.load_format = "runai_streamer"
            try:
                return check(self)
            finally:
                load_config.load_format = "tensorlift"
        return check(self)

    try_verify_and_update_config._tensorlift = True
    VllmConfig.try_verify_and_update_config = try_verify_and_update_config


_registered = None


def register() -> None:
    """The vllm.general_plugins entry point: registers --load-format tensorlift (and lets it take
    s3:// and gs:// models)."""
    global _registered
    if _registered is not None:
        return
    from vllm.model_executor.model_loader import register_model_loader
    _registered = register_model_loader("tensorlift")(_make_loader_class())
    _allow_object_storage()
