"""What the inference-server load formats share (vLLM's and SGLang's `tensorlift`).

Options from the server's `--model-loader-extra-config` (parse_options), the
checkpoint read in ~256 MiB pieces one ahead (plan_groups, iterate_weights),
and R-Fork: a loaded instance serving its parameters (serve_parameters) and a
new one pulling them into its own (pull_parameters), rank for rank.
None of it imports a server: the loaders in `vllm.py` and `sglang.py` are thin
classes over these functions, so both servers get the same reads, the same
option rules and the same errors.
"""
from __future__ import annotations

import os
import re
from typing import Any, Dict, Iterator, List, Optional, Tuple

FORMAT = "tensorlift load format"  # how every error starts
ALLOWED_OPTIONS = ("mode", "threads", "filter", "progress", "peer", "registry", "fallback", "model", "revision",
                   "token_file", "timeout", "serve", "stripe", "handover")
STRIPE_OPTIONS = ("peer", "registry", "bucket", "token_file", "timeout", "page_cache")
SERVE_OPTIONS = ("host", "port", "registry", "token_file", "ready_file")
MODES = ("auto", "buffered", "direct", "mmap")
HANDOVER = ("auto", "off", "verify")


def parse_options(extra: Any) -> Dict[str, Any]:
    """Validates --model-loader-extra-config for the tensorlift format."""
    if extra is None:
        return {}
    if not isinstance(extra, dict):
        raise ValueError(f"{FORMAT}: --model-loader-extra-config must be a JSON object, "
                         f"not {type(extra).__name__}")
    unknown = sorted(set(extra) - set(ALLOWED_OPTIONS))
    if unknown:
        raise ValueError(f"{FORMAT}: unknown option(s) {unknown} in --model-loader-extra-config "
                         f"(allowed: {', '.join(ALLOWED_OPTIONS)})")
    opts = dict(extra)
    if "mode" in opts and opts["mode"] not in MODES:
        raise ValueError(f"{FORMAT}: mode must be one of {', '.join(MODES)}, not {opts['mode']!r}")
    if "threads" in opts and not (isinstance(opts["threads"], int) and not isinstance(opts["threads"], bool)
                                  and opts["threads"] > 0):
        raise ValueError(f"{FORMAT}: threads must be a positive integer, not {opts['threads']!r}")
    if "filter" in opts:
        if not isinstance(opts["filter"], str):
            raise ValueError(f"{FORMAT}: filter must be a regex string, not {opts['filter']!r}")
        try:
            re.compile(opts["filter"])
        except re.error as e:
            raise ValueError(f"{FORMAT}: filter {opts['filter']!r} is not a regex: {e}") from None
    if "progress" in opts and not isinstance(opts["progress"], bool):
        raise ValueError(f"{FORMAT}: progress must be true or false, not {opts['progress']!r}")
    if "peer" in opts:
        peers = [opts["peer"]] if isinstance(opts["peer"], str) else opts["peer"]
        if not isinstance(peers, list) or not peers or not all(isinstance(u, str) and u for u in peers):
            raise ValueError(f"{FORMAT}: peer must be a URL or a list of URLs, not {opts['peer']!r}")
        opts["peer"] = peers
    for k in ("registry", "model", "revision", "token_file"):
        if k in opts and not (isinstance(opts[k], str) and opts[k]):
            raise ValueError(f"{FORMAT}: {k} must be a non-empty string, not {opts[k]!r}")
    if "fallback" in opts and not isinstance(opts["fallback"], bool):
        raise ValueError(f"{FORMAT}: fallback must be true or false (the model's own files), "
                         f"not {opts['fallback']!r}")
    if "timeout" in opts and not (isinstance(opts["timeout"], (int, float)) and not isinstance(opts["timeout"], bool)
                                  and opts["timeout"] > 0):
        raise ValueError(f"{FORMAT}: timeout must be a positive number of seconds, "
                         f"not {opts['timeout']!r}")
    if "handover" in opts and opts["handover"] not in HANDOVER:
        raise ValueError(f"{FORMAT}: handover must be one of {', '.join(HANDOVER)}, not {opts['handover']!r}")
    if "handover" in opts and not ("peer" in opts or "registry" in opts or "serve" in opts):
        raise ValueError(f"{FORMAT}: handover applies to a peer load or serve: give peer, registry or serve")
    if "filter" in opts and ("peer" in opts or "registry" in opts):
        raise ValueError(f"{FORMAT}: filter selects checkpoint tensors; a peer load pulls every parameter "
                         "of the model: give filter or peer/registry, not both")
    if ("fallback" in opts or "timeout" in opts) and not ("peer" in opts or "registry" in opts):
        raise ValueError(f"{FORMAT}: fallback and timeout apply to a peer load: give peer or registry")
    if "stripe" in opts:
        stripe = opts["stripe"]
        if not isinstance(stripe, dict) or not stripe or set(stripe) - set(STRIPE_OPTIONS):
            raise ValueError(f"{FORMAT}: stripe must be an object with keys from {', '.join(STRIPE_OPTIONS)} "
                             f"(the other sources of the checkpoint), not {stripe!r}")
        stripe = dict(stripe)
        if "peer" in stripe:
            peers = [stripe["peer"]] if isinstance(stripe["peer"], str) else stripe["peer"]
            if not isinstance(peers, list) or not all(isinstance(u, str) and u for u in peers):
                raise ValueError(f"{FORMAT}: stripe.peer must be a URL or a list of URLs, not {stripe['peer']!r}")
            stripe["peer"] = peers
        for k in ("registry", "bucket", "token_file"):
            if k in stripe and not (isinstance(stripe[k], str) and stripe[k]):
                raise ValueError(f"{FORMAT}: stripe.{k} must be a non-empty string, not {stripe[k]!r}")
        if "page_cache" in stripe and not isinstance(stripe["page_cache"], bool):
            raise ValueError(f"{FORMAT}: stripe.page_cache must be true or false, not {stripe['page_cache']!r}")
        if "bucket" in stripe and not stripe["bucket"].startswith(("s3://", "gs://")):
            raise ValueError(f"{FORMAT}: stripe.bucket must be an s3:// or gs:// URL, not {stripe['bucket']!r}")
        if "mode" in opts and opts["mode"] != "auto":
            raise ValueError(f"{FORMAT}: stripe reads each source its own way: leave mode at auto")
        if "peer" in opts or "registry" in opts:
            raise ValueError(f"{FORMAT}: peer/registry pull a running instance's parameters; stripe shares the "
                             "checkpoint's reads with peers serving its files: give one of them")
        opts["stripe"] = stripe
    if "serve" in opts:
        serve = opts["serve"]
        if serve is True:
            serve = {}
        if not isinstance(serve, dict) or set(serve) - set(SERVE_OPTIONS):
            raise ValueError(f"{FORMAT}: serve must be true or an object with keys from "
                             f"{', '.join(SERVE_OPTIONS)}, not {opts['serve']!r}")
        opts["serve"] = serve
    return opts


GROUP_BYTES = 256 << 20  # the unit read ahead (tensorlift.stream's pieces)


def plan_groups(files: List[str], regex: Optional[str],
                group_bytes: Optional[int] = None) -> List[Tuple[str, List[str]]]:
    """(file, [tensor names]) pieces in file order, each about group_bytes of stored bytes
    (tensorlift.stream's plan; the filter regex keeps matching names only)."""
    from .._stream import plan_pieces
    return plan_pieces(files, regex, GROUP_BYTES if group_bytes is None else group_bytes)


def read_plan(device: str, options: Dict[str, Any], ranks: int) -> Tuple[str, str]:
    """(device, mode) the weights are read with, for a model split over `ranks` ranks (tensor
    times pipeline parallel size).

    One rank: the model's device and the user's mode (default auto). Several ranks, unless the
    user chose a mode: views of the files on the CPU (mode mmap, lazy), as the servers' own
    safetensors formats do. Each rank's weight loaders narrow a tensor to the rank's slice (or
    skip another stage's layers) and copy only that to the device, so a rank touches, and the
    device reads, only the pages of its own slices, and the ranks share the page cache: each
    byte is read from the device once. Reading whole tensors (O_DIRECT or into memory) would read
    the checkpoint once per rank."""
    if ranks > 1 and "mode" not in options:
        return "cpu", "mmap"
    return device, options.get("mode", "auto")


def describe_plan(device: str, options: Dict[str, Any], ranks: int) -> str:
    """What read_plan chose, for the log."""
    dev, mode = read_plan(device, options, ranks)
    if (dev, mode) == ("cpu", "mmap") and "mode" not in options:
        return "views of the files on the CPU, each rank reads the pages of its own slices"
    return f"mode {mode} onto {dev}, whole tensors on every rank"


def iterate_weights(files: List[str], device: str, options: Dict[str, Any],
                    ranks: int = 1) -> Iterator[Tuple[str, Any]]:
    """(name, tensor) for every tensor of `files`, read with tensorlift.stream: pieces of about
    256 MiB in file order, each read on a worker thread while the caller consumes the previous
    one, so the model's copies start after the first piece, not after the whole checkpoint.
    `ranks` > 1: see read_plan."""
    from .._stream import stream
    device, mode = read_plan(device, options, ranks)
    yield from stream(files, device=device, filter=options.get("filter"), mode=mode,
                      threads=options.get("threads"), progress=options.get("progress", False),
                      piece_bytes=GROUP_BYTES)


def iterate_bucket(url: str, device: str, options: Dict[str, Any], log) -> Iterator[Tuple[str, Any]]:
    """(name, tensor) for every tensor of the checkpoint at an s3:// or gs:// URL (a prefix with its
    shards and index), streamed from the bucket in ~256 MiB pieces one ahead onto `device`. The
    server pulled the config and tokenizer to a local directory; every rank fetches the whole
    checkpoint (the model's weight loaders cut their slices). `mode` and `threads` are for local
    files (refused, as the loader refuses them for every checkpoint read through its store)."""
    from .._stream import shard_files, stream
    if options.get("mode", "auto") != "auto":
        raise ValueError(f"{FORMAT}: mode applies to local files; {url} is in object storage")
    if options.get("threads"):
        raise ValueError(f"{FORMAT}: threads apply to local files (pread threads); {url} is in object storage")
    log("tensorlift: weights from %s", url)
    yield from stream(shard_files(url), device=device, filter=options.get("filter"),
                      progress=options.get("progress", False), piece_bytes=GROUP_BYTES)


def iterate_striped(files: List[str], model_dir: str, device: str, options: Dict[str, Any],
                    log) -> Iterator[Tuple[str, Any]]:
    """(name, tensor) for every tensor of `files` (the checkpoint's local shards, or its shards in a
    bucket), each piece of about 256 MiB loaded from every source at once (options["stripe"]: peers
    serving the checkpoint's files, as `tensorlift serve DIR` does, found by URL or in the registry,
    and a bucket holding a copy): tensorlift.remote.load_striped, its ranges shared by work
    stealing, every chunk checked against a peer's manifest, a failed source's ranges moved to the
    others; a local shard in the page cache is read from alone (stripe.page_cache false: stripe
    anyway). One piece is loaded ahead while the caller consumes the previous one."""
    import concurrent.futures
    from .. import remote
    from .._core import tensor_from
    from .._sources import is_object_url
    from .._tensorlift import load_striped
    stripe = options["stripe"]
    # The peers serve the whole checkpoint under its key (its name and a digest of its headers).
    # (model and revision from the options when the peers serve a copy under another name.)
    key = {k: v for k, v in remote.key_for(model_dir).items()
           if k in ("model", "revision", "dtype", "quantization", "layout")}
    key.update({k: options[k] for k in ("model", "revision") if k in options})
    token = remote._token(None, stripe.get("token_file"))
    bucket = stripe.get("bucket", "").rstrip("/")
    pieces = plan_groups(files, options.get("filter"))
    used: Dict[str, int] = {}
    failed: Dict[str, str] = {}

    def read(piece: Tuple[str, List[str]]):
        file, names = piece
        local = "" if is_object_url(file) else file
        url = file if is_object_url(file) else (f"{bucket}/{os.path.basename(file)}" if bucket else "")
        loaded, report = load_striped(path=local, object_url=url, peers=stripe.get("peer", []),
                                      registry=stripe.get("registry", ""), token=token, key=key, device=device,
                                      timeout_ms=int(float(stripe.get("timeout", 10.0)) * 1000), names=names,
                                      use_page_cache=stripe.get("page_cache", True))
        for s in report["sources"]:
            # One entry per source, not per shard: "disk", the bucket, each peer.
            name = "disk" if s["name"].startswith("disk:") else s["name"]
            if is_object_url(name):
                name = bucket or os.path.dirname(name)
            used[name] = used.get(name, 0) + s["bytes"]
            if s["failure"]:
                failed[name] = f"{name}: {s['failure']}"
        for f in report["failures"]:
            failed.setdefault(f.split(": ")[0], f)
        try:
            return [(n, tensor_from(loaded, n, "pt")) for n in names]
        finally:
            loaded.release()

    if not pieces:
        return
    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="tensorlift-stripe") as pool:
        pending = pool.submit(read, pieces[0])
        for i in range(len(pieces)):
            got = pending.result()
            pending = pool.submit(read, pieces[i + 1]) if i + 1 < len(pieces) else None
            yield from got
            del got
    log("tensorlift: weights striped over %d sources: %s%s", len(used),
        ", ".join(f"{name} {n} bytes" for name, n in used.items()),
        "; " + "; ".join(failed.values()) if failed else "")


# --- reloading weights into a running engine -------------------------------------------------
#
# vLLM's reload_weights (and sleep mode level 2, and the RL frameworks' weight updates) and
# SGLang's update_weights_from_disk write the new checkpoint into the running model as it is read:
# neither can undo a half-written model (vLLM's in-place reload has moved every layer to the meta
# device before the first tensor arrives; SGLang rolls back by reading the failed directory again).
# So a reload reads nothing until every new file has been checked whole and its tensors match the
# ones the engine loaded: what each engine loaded is remembered per model config (the object the
# engine keeps, and passes to its loader again on a reload).

_LOADED: Dict[int, Tuple[Any, Dict[str, Any]]] = {}  # id(model config) -> (the config, what it loaded)


def remember_loaded(model_config, source: Dict[str, Any], shapes: Optional[Dict[str, Any]]) -> None:
    """Records what an engine loaded: `source` (the config fields that name the weights, to put back
    when a reload is refused) and `shapes` (checkpoint_shapes of its files; None when unknown)."""
    _LOADED[id(model_config)] = (model_config, {"source": dict(source), "shapes": shapes})


def loaded(model_config) -> Optional[Dict[str, Any]]:
    """What remember_loaded recorded for this model config (None before its first load)."""
    entry = _LOADED.get(id(model_config))
    return entry[1] if entry is not None and entry[0] is model_config else None


def checkpoint_shapes(files: List[str], directory: Optional[str] = None,
                      regex: Optional[str] = None) -> Dict[str, Tuple[str, Optional[Tuple[int, ...]]]]:
    """name -> (file, header shape) of every tensor the checkpoint's `files` load (a sparse-bitmask
    tensor's dense name: shape None), the filter regex keeping matching names only. Opening each
    file checks it whole: its header, every tensor's offsets, and its length against them (a
    truncated file is a FormatError naming it); a `directory` with an index must have every shard
    the index names (a FileNotFoundError naming the missing one)."""
    import glob
    from .._tensorlift import Checkpoint
    if directory and os.path.isdir(directory) and glob.glob(os.path.join(glob.escape(directory), "*.index.json")):
        Checkpoint.open(directory)  # every shard its index names, each checked
    keep = re.compile(regex).search if regex else None
    shapes: Dict[str, Tuple[str, Optional[Tuple[int, ...]]]] = {}
    for f in files:
        ckpt = Checkpoint.open(f)
        stored = {t[0]: tuple(t[2]) for t in ckpt.tensors()}
        for name in ckpt.load_names():
            if keep is None or keep(name):
                shapes[name] = (f, stored.get(name))
    return shapes


def check_same_tensors(new: Dict[str, Tuple[str, Optional[Tuple[int, ...]]]],
                       old: Dict[str, Tuple[str, Optional[Tuple[int, ...]]]], where: str) -> None:
    """Raises ValueError, naming the file, unless the new checkpoint's tensors are the old one's:
    the same names and, where both headers give one, the same shapes (dtypes may differ: the model's
    weight loaders convert)."""
    missing = sorted(set(old) - set(new))
    if missing:
        raise ValueError(f"{where}: {len(missing)} of the engine's tensors are in none of its files, e.g. "
                         f"{missing[:3]} (in {os.path.basename(old[missing[0]][0])} before)")
    extra = sorted(set(new) - set(old))
    if extra:
        raise ValueError(f"{new[extra[0]][0]}: tensor {extra[0]!r} is not one of the engine's "
                         f"({len(extra)} such: another model?)")
    for name in sorted(new):
        file, shape = new[name]
        before = old[name][1]
        if shape is not None and before is not None and shape != before:
            raise ValueError(f"{file}: tensor {name!r} has shape {list(shape)}, the engine's {list(before)} "
                             "(another model's shapes?)")


Shapes = Dict[str, Tuple[str, Optional[Tuple[int, ...]]]]  # name -> (file, header shape): checkpoint_shapes


def check_reload(model_config, where: str, find_files, options: Dict[str, Any], restore,
                 compare: bool = True) -> Tuple[List[Tuple[str, List[str]]], Shapes]:
    """Checks a reload's new checkpoint (at `where`: a directory or a bucket URL) before any byte of
    it is read into the model: find_files() (the server's discovery: [(prefix, files)]), every file
    whole (checkpoint_shapes) and its tensors against what this engine loaded
    (check_same_tensors; compare False: the files only, for a source the engine's record does not
    cover). Returns (the sources, their shapes). On any problem: restore(source) puts
    back the config fields the server changed to the new path (to what was loaded, so that the
    engine's config still names the weights it serves), and one ValueError says why, naming the
    file."""
    before = loaded(model_config)
    try:
        if not os.path.exists(where) and os.path.isabs(where):
            raise FileNotFoundError(f"{where}: no such directory")
        sources = find_files()
        shapes: Dict[str, Tuple[str, Optional[Tuple[int, ...]]]] = {}
        for prefix, files in sources:
            got = checkpoint_shapes(files, where if prefix == "" else None, options.get("filter"))
            shapes.update({prefix + name: v for name, v in got.items()})
        if compare and before is not None and before["shapes"] is not None:
            check_same_tensors(shapes, before["shapes"], where)
        return sources, shapes
    except (OSError, ValueError, RuntimeError) as e:
        if before is not None:
            restore(before["source"])
        raise ValueError(f"{FORMAT}: reloading the weights from {where} was refused before any weight was "
                         f"written; the engine keeps serving the weights it had: {e}") from e


# The peer servers this process runs (kept for the life of the process: a
# seed serves until the server exits).
SERVERS: List[Any] = []


def parameter_key(model_dir: str, options: Dict[str, Any], server: str, dtype: Any, quantization: Optional[str],
                  tp_size: int) -> Dict[str, str]:
    """The peer key a server's parameters are served and pulled under (R-Fork: a new instance
    pulls the running one's parameters, rank for rank).

    model and revision are the user's (options) or the checkpoint's default key (its directory's
    name and a digest of its headers); the revision is extended with the server and its version
    (`server`, e.g. "vllm-0.32.0": its parameter names and shapes), "parameters" and the tensor
    parallel size, so that only an instance of the same model, server and layout matches, and a
    checkpoint served by `tensorlift serve` never does. dtype and quantization are the model's."""
    from .. import remote
    model, revision = options.get("model"), options.get("revision")
    if model is None or revision is None:
        if not os.path.isdir(model_dir):
            raise ValueError(f"{FORMAT}: a peer load or serve of a model that is not a local directory needs "
                             "model and revision in --model-loader-extra-config (the seed's key)")
        default = remote.key_for(model_dir)
        model = model or default["model"]
        revision = revision if revision is not None else default["revision"]
    return {"model": model, "revision": f"{revision}+{server}-parameters-tp{tp_size}",
            "dtype": str(dtype).replace("torch.", ""), "quantization": str(quantization or "none")}


def peer_layout(pp_size: int, tp_size: int, tp_rank: int, cpu_group, model_dir: str, options: Dict[str, Any],
                server: str, dtype: Any, quantization: Optional[str]):
    """(key, tp_size, tp_rank, gather) for a server's peer loading and serving: rank r of a new
    instance pulls from rank r of a running one with the same model and layout. The server passes
    its own parallel sizes, this rank, its CPU process group and its model's key fields;
    gather(url) returns every rank's URL in rank order (a collective over cpu_group: every rank
    calls it). Pipeline parallel size > 1 is refused."""
    if pp_size > 1:
        raise ValueError(f"{FORMAT}: peer loading and serving take pipeline parallel size 1 "
                         f"(this instance has {pp_size} stages)")
    key = parameter_key(model_dir, options, server, dtype, quantization, tp_size)

    def gather(url: str) -> List[str]:
        if tp_size == 1:
            return [url]
        import torch
        urls: List[Optional[str]] = [None] * tp_size
        torch.distributed.all_gather_object(urls, url, group=cpu_group)
        return [u for u in urls if u]
    return key, tp_size, tp_rank, gather


def _parameters(model) -> Dict[str, Any]:
    """The model's parameters by name (shared ones once), without empty or meta ones."""
    return {name: p for name, p in model.named_parameters() if p.numel() > 0 and not p.is_meta}


def _announce(server, serve: Dict[str, Any], rank: int, gather) -> None:
    """Keeps the server; every rank's URL to `ready_file` (one a line, rank order, written by rank 0)."""
    SERVERS.append(server)
    urls = gather(server.url)
    if serve.get("ready_file") and rank == 0:
        tmp = serve["ready_file"] + ".tmp"
        with open(tmp, "w") as f:
            f.write("".join(u + "\n" for u in urls))
        os.replace(tmp, serve["ready_file"])


def serve_parameters(model, options: Dict[str, Any], key: Dict[str, str], tp_size: int, tp_rank: int, gather,
                     log) -> None:
    """Serves this rank's parameters as they are now (loaded, before the server's post-processing)
    to new instances of the same model and layout (options["serve"]; see docs/inference-servers.md).

    Host parameters are served where they are; the server keeps them alive, so a parameter that
    post-processing replaces (vLLM's CPU backend repacks its linear weights) stays in memory as
    loaded for as long as this instance serves. GPU parameters are served from the GPU's memory
    (no host copy) where UCX can reach it (a UCX built with CUDA, TENSORLIFT_UCX_LIB); otherwise
    host copies are served, and the log says why. gather(url) returns every rank's URL (a
    collective: every rank calls it)."""
    from .. import remote
    serve = options["serve"]
    params = {name: p.detach() for name, p in _parameters(model).items()}
    settings = dict(**key, host=serve.get("host", "127.0.0.1"), port=int(serve.get("port", 0)),
                    registry=serve.get("registry"), token_file=serve.get("token_file"), tp_size=tp_size,
                    tp_rank=tp_rank)
    server, where = None, "host memory"
    on_gpu = any(t.device.type != "cpu" for t in params.values())
    if on_gpu:
        try:
            server = remote.serve_tensors({n: t.contiguous() for n, t in params.items()}, **settings)
            where = "the GPU's memory"
        except NotImplementedError as e:  # no UCX that reaches GPU memory
            log("tensorlift: serving host copies of the weights: %s", e)
    if server is None and not on_gpu and options.get("handover", "auto") != "off":
        # Same-host handover: the parameters move into sealed shared memory, which the server
        # hands to new instances on this host (they map it: no copy), and this model's
        # parameters become the same memory mapped copy-on-write: one copy on the host.
        server = remote.serve_tensors({n: t.contiguous() for n, t in params.items()}, handover=True, **settings)
        shared = server.shared_tensors
        for name, p in _parameters(model).items():
            p.data = shared[name]
        where = "shared memory"
    if server is None:
        server = remote.serve_tensors({n: t.cpu() if t.device.type != "cpu" else t.contiguous()
                                       for n, t in params.items()}, **settings)
    _announce(server, serve, tp_rank, gather)
    log("tensorlift: serving the weights from %s at %s (rank %d of %d)", where, server.url, tp_rank, tp_size)


def pull_parameters(model, model_dir: str, options: Dict[str, Any], key: Dict[str, str], tp_size: int, tp_rank: int,
                    log) -> bool:
    """Pulls this rank's parameters from a running instance (options peer / registry) straight
    into the model: the parameters become the pulled buffers themselves (no copy), pulled into
    the model's device (a GPU's memory straight from the peer's where UCX can write it, else
    through host memory). The key is checked before any byte moves, every chunk's checksum where
    it lands, and every parameter's name, dtype and shape before any is replaced.

    True when the weights came from a peer. False when every peer failed and `fallback` is on:
    the caller then loads the model's own files (the parameters are untouched). A caller with
    `serve` then serves the parameters (serve_parameters), which are the very buffers pulled."""
    from .. import remote
    from .._core import tensor_from
    params = _parameters(model)
    devices = {p.device for p in params.values()}
    device = model_device(next(iter(devices))) if len(devices) == 1 else "cpu"
    handover = options.get("handover", "auto")
    peer = remote.Peer(options.get("peer"), registry=options.get("registry"), token_file=options.get("token_file"),
                       timeout=float(options.get("timeout", 10.0)), tp_size=tp_size, tp_rank=tp_rank,
                       device=device, handover="off" if handover == "off" else "auto",
                       handover_verify=handover == "verify", **key)
    fallback = options.get("fallback", True) and os.path.isdir(model_dir)
    try:
        loaded, report, _ = peer.pull()
    except ConnectionError as e:  # no peer worked
        why = "; ".join(line.strip() for line in str(e).splitlines()[1:]) or str(e)
        if not fallback:
            raise RuntimeError(f"{FORMAT}: {e}") from None
        log("tensorlift: weights from disk:%s; %s", model_dir, why)
        return False
    try:
        pulled = {name: tensor_from(loaded, name, "pt") for name in loaded.names()}
    finally:
        loaded.release()  # the tensors hold what they use
    problem = None
    if set(params) != set(pulled):
        missing, extra = sorted(set(params) - set(pulled)), sorted(set(pulled) - set(params))
        problem = f"the peer's parameters differ from this model's: missing {missing[:3]}, extra {extra[:3]}"
    else:
        for name, p in params.items():
            t = pulled[name]
            if t.dtype != p.dtype or tuple(t.shape) != tuple(p.shape):
                problem = (f"parameter '{name}': the peer has {t.dtype} {list(t.shape)}, "
                           f"this model {p.dtype} {list(p.shape)}")
                break
    if problem is not None:
        if not fallback:
            raise RuntimeError(f"{FORMAT}: {report.get('source')}: {problem}")
        log("tensorlift: weights from disk:%s; %s: %s", model_dir, report.get("source"), problem)
        return False
    for name, p in params.items():
        if pulled[name].device == p.device:
            p.data = pulled[name]  # the pulled buffer is the parameter: no copy
        else:
            p.data.copy_(pulled[name])
    log("tensorlift: weights from %s (%s bytes%s)%s%s", report.get("source"), report.get("bytes"),
        ", handed over: mapped, not copied" if report.get("handover") else "",
        "; relayed at " + report["relay"] if report.get("relay") else "",
        "; " + "; ".join(report.get("failures") or []) if report.get("failures") else "")
    return True


def model_device(dev) -> str:
    """tensorlift's device name for a model on torch device `dev`: "cpu" or "cuda:N"."""
    if dev.type == "cpu":
        return "cpu"
    if dev.type == "cuda":
        import torch
        return f"cuda:{dev.index if dev.index is not None else torch.cuda.current_device()}"
    raise ValueError(f"{FORMAT}: the model is on {dev}, tensorlift loads to cpu or cuda")


def natural_key(path: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", os.path.basename(path))]
