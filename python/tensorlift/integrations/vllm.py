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

import concurrent.futures
import os
import re
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple

ALLOWED_OPTIONS = ("mode", "threads", "filter", "progress", "peer", "registry", "fallback", "model", "revision",
                   "token_file", "timeout", "serve")
SERVE_OPTIONS = ("host", "port", "registry", "token_file", "ready_file")
MODES = ("auto", "buffered", "direct", "mmap")


def parse_options(extra: Any) -> Dict[str, Any]:
    """Validates --model-loader-extra-config for the tensorlift format."""
    if extra is None:
        return {}
    if not isinstance(extra, dict):
        raise ValueError(f"tensorlift load format: --model-loader-extra-config must be a JSON object, "
                         f"not {type(extra).__name__}")
    unknown = sorted(set(extra) - set(ALLOWED_OPTIONS))
    if unknown:
        raise ValueError(f"tensorlift load format: unknown option(s) {unknown} in --model-loader-extra-config "
                         f"(allowed: {', '.join(ALLOWED_OPTIONS)})")
    opts = dict(extra)
    if "mode" in opts and opts["mode"] not in MODES:
        raise ValueError(f"tensorlift load format: mode must be one of {', '.join(MODES)}, not {opts['mode']!r}")
    if "threads" in opts and not (isinstance(opts["threads"], int) and not isinstance(opts["threads"], bool)
                                  and opts["threads"] > 0):
        raise ValueError(f"tensorlift load format: threads must be a positive integer, not {opts['threads']!r}")
    if "filter" in opts:
        if not isinstance(opts["filter"], str):
            raise ValueError(f"tensorlift load format: filter must be a regex string, not {opts['filter']!r}")
        try:
            re.compile(opts["filter"])
        except re.error as e:
            raise ValueError(f"tensorlift load format: filter {opts['filter']!r} is not a regex: {e}") from None
    if "progress" in opts and not isinstance(opts["progress"], bool):
        raise ValueError(f"tensorlift load format: progress must be true or false, not {opts['progress']!r}")
    if "peer" in opts:
        peers = [opts["peer"]] if isinstance(opts["peer"], str) else opts["peer"]
        if not isinstance(peers, list) or not peers or not all(isinstance(u, str) and u for u in peers):
            raise ValueError(f"tensorlift load format: peer must be a URL or a list of URLs, not {opts['peer']!r}")
        opts["peer"] = peers
    for k in ("registry", "model", "revision", "token_file"):
        if k in opts and not (isinstance(opts[k], str) and opts[k]):
            raise ValueError(f"tensorlift load format: {k} must be a non-empty string, not {opts[k]!r}")
    if "fallback" in opts and not isinstance(opts["fallback"], bool):
        raise ValueError(f"tensorlift load format: fallback must be true or false (the model's own files), "
                         f"not {opts['fallback']!r}")
    if "timeout" in opts and not (isinstance(opts["timeout"], (int, float)) and not isinstance(opts["timeout"], bool)
                                  and opts["timeout"] > 0):
        raise ValueError(f"tensorlift load format: timeout must be a positive number of seconds, "
                         f"not {opts['timeout']!r}")
    if ("fallback" in opts or "timeout" in opts) and not ("peer" in opts or "registry" in opts):
        raise ValueError("tensorlift load format: fallback and timeout apply to a peer load: give peer or registry")
    if "serve" in opts:
        serve = opts["serve"]
        if serve is True:
            serve = {}
        if not isinstance(serve, dict) or set(serve) - set(SERVE_OPTIONS):
            raise ValueError(f"tensorlift load format: serve must be true or an object with keys from "
                             f"{', '.join(SERVE_OPTIONS)}, not {opts['serve']!r}")
        opts["serve"] = serve
    return opts


GROUP_BYTES = 256 << 20  # the unit read ahead: large reads, small wait for the first tensors


def plan_groups(files: List[str], regex: Optional[str], group_bytes: int = GROUP_BYTES) -> List[Tuple[str, List[str]]]:
    """(file, [tensor names]) pieces in file order, each about group_bytes of stored bytes.

    A file with sparse-bitmask groups (whose dense tensors have no single byte
    range) is one piece; the filter regex keeps matching names only.
    """
    from .._tensorlift import Checkpoint
    pattern = re.compile(regex) if regex else None
    pieces: List[Tuple[str, List[str]]] = []
    for path in files:
        ckpt = Checkpoint.open(path)
        stored = ckpt.shard_tensors(0)  # (name, dtype, shape, begin, end), in file order
        dense = ckpt.load_names()
        if len(ckpt.shards()) != 1 or set(dense) != {t[0] for t in stored}:
            names = [n for n in dense if pattern is None or pattern.search(n)]
            if names:
                pieces.append((path, names))
            continue
        group: List[str] = []
        size = 0
        for name, _, _, begin, end in stored:
            if pattern is not None and not pattern.search(name):
                continue
            group.append(name)
            size += end - begin
            if size >= group_bytes:
                pieces.append((path, group))
                group, size = [], 0
        if group:
            pieces.append((path, group))
    return pieces


def iterate_weights(files: List[str], device: str, options: Dict[str, Any]) -> Iterator[Tuple[str, Any]]:
    """(name, tensor) for every tensor of `files`, read with tensorlift one piece ahead.

    The tensors are cut into pieces of about 256 MiB in file order
    (plan_groups); each piece is read on a worker thread (tensorlift releases
    the GIL) while the caller consumes the previous one, so the model's copies
    start after the first piece, not after the whole checkpoint. A piece's
    buffer is freed once the caller has dropped its tensors.
    """
    import tensorlift
    kwargs = {"device": device, "mode": options.get("mode", "auto"), "progress": options.get("progress", False)}
    if options.get("threads"):
        kwargs["threads"] = options["threads"]
    pieces = plan_groups(files, options.get("filter"))

    def read(piece: Tuple[str, List[str]]):
        return tensorlift.load(piece[0], filter=piece[1], **kwargs)

    if not pieces:
        return
    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="tensorlift-vllm") as pool:
        pending = pool.submit(read, pieces[0])
        try:
            for i in range(len(pieces)):
                tensors = pending.result()
                pending = pool.submit(read, pieces[i + 1]) if i + 1 < len(pieces) else None
                for name in list(tensors):
                    yield name, tensors.pop(name)
                del tensors
        finally:
            if pending is not None:
                pending.cancel()


# The peer servers this process runs (kept for the life of the process: a
# seed serves until vLLM exits).
SERVERS: List[Any] = []


def _announce(server, serve: Dict[str, Any]) -> None:
    SERVERS.append(server)
    if serve.get("ready_file"):
        tmp = serve["ready_file"] + ".tmp"
        with open(tmp, "w") as f:
            f.write(server.url + "\n")
        os.replace(tmp, serve["ready_file"])


def peer_weights(model_dir: str, device: str, options: Dict[str, Any], log) -> Iterator[Tuple[str, Any]]:
    """(name, tensor) pulled from a running peer (options peer / registry), checked by key and
    chunk checksums; on any failure the next peer, then (fallback) the model's own files.
    With serve, this process then serves what it pulled (a seed)."""
    from .. import remote
    from .._core import tensor_from
    local = os.path.isdir(model_dir)
    model, revision = options.get("model"), options.get("revision")
    if model is None or revision is None:
        if not local:
            raise ValueError("tensorlift load format: a peer load of a model that is not a local directory "
                             "needs model and revision in --model-loader-extra-config (the seed's key)")
        default = remote.key_for(model_dir)  # what a seed of this directory serves under
        model = model or default["model"]
        revision = revision if revision is not None else default["revision"]
    peer = remote.Peer(options.get("peer"), model=model, revision=revision, registry=options.get("registry"),
                       fallback=model_dir if options.get("fallback", True) and local else None,
                       token_file=options.get("token_file"), timeout=float(options.get("timeout", 10.0)),
                       mode=options.get("mode", "auto"))
    serve = options.get("serve")
    loaded, report, seed = peer.pull(become_seed=serve is not None, seed_host=(serve or {}).get("host", "127.0.0.1"))
    log("tensorlift: weights from %s (%s bytes)%s", report.get("source"), report.get("bytes"),
        "; " + "; ".join(report.get("failures") or []) if report.get("failures") else "")
    if seed is not None:
        _announce(seed, serve)
        log("tensorlift: serving the pulled weights at %s", seed.url)
    pattern = re.compile(options["filter"]) if options.get("filter") else None
    try:
        for name in loaded.names():
            if pattern is None or pattern.search(name):
                t = tensor_from(loaded, name, "pt")
                yield name, (t if device == "cpu" else t.to(device))
    finally:
        if seed is None:
            loaded.release()


def serve_checkpoint(model_dir: str, options: Dict[str, Any], log) -> None:
    """Serves the model's checkpoint (read again, from the page cache) as a seed for new instances."""
    from .. import remote
    serve = options["serve"]
    server = remote.serve(model_dir, model=options.get("model"), revision=options.get("revision"),
                          host=serve.get("host", "127.0.0.1"), port=int(serve.get("port", 0)),
                          registry=serve.get("registry"), token_file=serve.get("token_file"))
    _announce(server, serve)
    log("tensorlift: serving the weights at %s", server.url)


def _natural_key(path: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", os.path.basename(path))]


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
            return sorted(files, key=_natural_key)

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
                for name, tensor in iterate_weights(files, device, self.options):
                    yield prefix + name, tensor

        def load_weights(self, model: nn.Module, model_config: ModelConfig) -> None:
            param = next(model.parameters(), None)
            dev = param.device if param is not None else torch.device("cpu")
            device = "cpu" if dev.type == "cpu" else f"cuda:{dev.index or 0}" if dev.type == "cuda" else None
            if device is None:
                raise ValueError(f"tensorlift load format: the model is on {dev}, tensorlift loads to cpu or cuda")
            t0 = time.perf_counter()
            from vllm.distributed import get_tensor_model_parallel_world_size
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
