"""Loading from a running peer (R-Fork): serve loaded weights, pull them one-sided.

    import tensorlift.remote as remote

    # Source: load a checkpoint and serve it (until close() or exit).
    server = remote.serve("model_dir", model="llama-7b", revision="abc123")
    print(server.url)                       # http://127.0.0.1:PORT

    # Destination: pull from the peer (else the registry's seeds, else disk).
    tensors = remote.load_from_peer(server.url, model="llama-7b", revision="abc123",
                                    fallback="model_dir")
    # or, through the fast-load API:
    tensors = tensorlift.load(remote.Peer(server.url, model="llama-7b", revision="abc123"))

The key (model, revision, dtype, quantization, layout) must match before any
byte moves; every chunk's XXH3 is checked; on any failure (peer gone, corrupt
chunk, wrong key or token, registry down) what was pulled is dropped and the
next source is tried, then `fallback` is loaded from disk. `last_report()` says
which source was used and why the others failed. docs/remote.md has the
protocol; the C++ API is include/tensorlift/remote.h.
"""
import atexit
import os
import re
from typing import Callable, Dict, Iterable, Optional, Sequence, Union

from . import _tensorlift as _tl
from ._sources import is_object_url as _is_object_url
from ._sources import select_names as _select
from ._tensors import tensor_from

__all__ = ["Peer", "Server", "serve", "serve_tensors", "load_from_peer", "load_striped", "key_for", "last_report",
           "stop_pulls"]

_last_report: Optional[dict] = None


def _token(token: Optional[str], token_file: Optional[str]) -> str:
    if token is not None:
        return token
    if token_file is None:
        return ""
    st = os.stat(token_file)
    if st.st_mode & 0o077:
        raise PermissionError(f"token file {token_file} is readable by others: chmod 600 it")
    with open(token_file) as f:
        value = f.read().strip()
    if not value:
        raise ValueError(f"token file {token_file} is empty")
    return value


def key_for(path: Union[str, os.PathLike]) -> dict:
    """The default key of a checkpoint: its name and a digest of its headers."""
    return _tl.peer_key_for(os.fspath(path))


def _key(model, revision, dtype, quantization, layout, path=None, content=None) -> dict:
    key = {}
    if path is not None and (model is None or revision is None):
        key = {k: v for k, v in key_for(path).items() if k in ("model", "revision")}
    if model is not None:
        key["model"] = model
    if revision is not None:
        key["revision"] = revision
    if "model" not in key:
        raise ValueError("tensorlift.remote: model= is needed (or a checkpoint path to take it from)")
    key.setdefault("revision", "")
    key["dtype"] = dtype
    key["quantization"] = quantization
    key["layout"] = layout or ""
    if content:
        # PeerKey::content (docs/remote.md, "Content identity"): exactly the bytes of this root.
        key["content"] = content
    return key


class Server:
    """A running peer server; serves until close() (or garbage collection)."""

    def __init__(self, native, shared: Optional[Dict[str, object]] = None):
        self._native = native
        self._shared = shared

    @property
    def shared_tensors(self) -> Optional[Dict[str, object]]:
        """serve_tensors(handover=True): the served tensors' copies in shared memory, mapped
        copy-on-write for this process (use them in place of the originals: one copy of the bytes
        in the host's memory, whoever maps it; a page this process writes becomes its own and the
        served bytes stay as they were). None otherwise."""
        return self._shared

    @property
    def url(self) -> str:
        return self._native.url

    @property
    def port(self) -> int:
        return self._native.port

    @property
    def key(self) -> dict:
        return self._native.key

    @property
    def served_bytes(self) -> int:
        return self._native.served_bytes

    @property
    def active_sessions(self) -> int:
        return self._native.active_sessions

    @property
    def content(self) -> Optional[str]:
        """The content root this seed publishes (32 hex digits), or None (tensors in device memory)."""
        return self._native.content

    def close(self) -> None:
        if self._native is not None:
            self._native.close()
            self._native = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"tensorlift.remote.Server({self.url if self._native else 'closed'})"


def _serve_kwargs(host, port, token, token_file, rate_limit, max_sessions, tp_size, tp_rank, registry, transports,
                  chunk_bytes, registry_ttl, handover=True, resident=False):
    return dict(host=host, port=port, token=_token(token, token_file), rate_limit=int(rate_limit),
                max_sessions=max_sessions, tp_size=tp_size, tp_rank=tp_rank, registry=registry or "",
                transports=transports or "", chunk_bytes=chunk_bytes, registry_ttl=registry_ttl,
                handover=bool(handover), resident=bool(resident))


def serve(path: Union[str, os.PathLike], *, model: Optional[str] = None, revision: Optional[str] = None,
          dtype: str = "as-stored", quantization: str = "none", layout: str = "", host: str = "127.0.0.1",
          port: int = 0, token: Optional[str] = None, token_file: Optional[str] = None, rate_limit: float = 0,
          max_sessions: int = 16, tp_size: int = 1, tp_rank: int = 0, registry: Optional[str] = None,
          transports: Optional[str] = None, chunk_bytes: int = 0, registry_ttl: int = 10,
          device: str = "cpu", handover: bool = True, resident: bool = False) -> Server:
    """Loads a checkpoint (this rank's slices under `layout`) and serves it.

    rate_limit: bytes/s all clients may pull in total (0: none). registry: an
    etcd endpoint ("http://host:2379") to register with (a lease renewed in the
    background). token / token_file: require HMAC-signed requests. device:
    where the served tensors live ("cpu", or "cuda:N": GPU memory, served
    through a UCX built with CUDA, docs/remote.md "Devices"). handover: host
    tensors in sealed shared memory, handed to clients on this host (mapped, no
    copy; docs/remote.md "Same-host handover"). resident: found on this host by
    its key alone (clients need no URL), as `tensorlift serve --resident`.
    chunk_bytes: the checksum granularity clients check (0: 4 MiB, smaller for
    checkpoints under 512 MiB: at least 128 chunks of at least 64 KiB).
    """
    path = os.fspath(path)
    key = _key(model, revision, dtype, quantization, layout, path)
    return Server(_tl.serve_checkpoint(path, key, device=str(device), **_serve_kwargs(
        host, port, token, token_file, rate_limit, max_sessions, tp_size, tp_rank, registry, transports,
        chunk_bytes, registry_ttl, handover, resident)))


def serve_tensors(tensors: Dict[str, object], *, model: str, revision: str, dtype: str = "as-stored",
                  quantization: str = "none", layout: str = "", shards: Optional[Dict[str, tuple]] = None,
                  host: str = "127.0.0.1", port: int = 0, token: Optional[str] = None,
                  token_file: Optional[str] = None, rate_limit: float = 0, max_sessions: int = 16,
                  tp_size: int = 1, tp_rank: int = 0, registry: Optional[str] = None,
                  transports: Optional[str] = None, chunk_bytes: int = 0, registry_ttl: int = 10,
                  handover: bool = False, resident: bool = False) -> Server:
    """Serves tensors you hold (torch tensors on the CPU or a GPU, or numpy arrays), by name.

    They must stay unchanged while served (the server keeps references to
    them). shards: name -> (dim, start, full_shape) for tensors that are this
    rank's slice of a larger one; others are whole.

    handover=True (host tensors, whole): the tensors are copied once into
    sealed shared memory, which is served and handed to clients on this host
    (mapped, no copy; docs/remote.md "Same-host handover"); the server's
    `shared_tensors` are that memory mapped copy-on-write for this process, to
    use in place of the originals so that the host holds one copy. resident:
    found on this host by its key alone, as `tensorlift serve --resident`.

    GPU tensors are served from the GPU's memory, with no host copy; that
    needs a UCX built with CUDA (libucx-cu12, named in TENSORLIFT_UCX_LIB):
    without one this raises NotImplementedError saying so, and a caller that
    can afford it serves host copies instead (as the vLLM and SGLang formats do).
    """
    from ._dtypes import safetensors_name
    specs = []
    for name, t in tensors.items():
        if hasattr(t, "is_contiguous"):  # torch
            if t.device.type == "cpu":
                device = "cpu"
            elif t.device.type == "cuda":
                device = f"cuda:{t.device.index if t.device.index is not None else 0}"
            else:
                raise ValueError(f"tensor {name!r} is on {t.device}: tensors on the CPU or a CUDA GPU are served")
            if not t.is_contiguous():
                raise ValueError(f"tensor {name!r} is not contiguous")
            dt, shape, ptr = safetensors_name(t.dtype), list(t.shape), t.data_ptr()
        else:  # numpy
            if not t.flags["C_CONTIGUOUS"]:
                raise ValueError(f"array {name!r} is not C-contiguous")
            dt, shape, ptr, device = safetensors_name(t.dtype), list(t.shape), t.ctypes.data, "cpu"
        dim, start, full = (shards or {}).get(name, (-1, 0, []))
        specs.append((name, dt, shape, ptr, dim, start, list(full), device))
    key = _key(model, revision, dtype, quantization, layout)
    kwargs = _serve_kwargs(host, port, token, token_file, rate_limit, max_sessions, tp_size, tp_rank, registry,
                           transports, chunk_bytes, registry_ttl, handover, resident)
    if handover:
        if shards:
            raise ValueError("serve_tensors: handover=True shares whole tensors; shards are not supported with it")
        if any(spec[7] != "cpu" for spec in specs):
            raise ValueError("serve_tensors: handover=True shares host tensors; these are on a GPU")
        framework = "pt" if any(hasattr(t, "is_contiguous") for t in tensors.values()) else "np"
        sealed, mine = _tl.share_tensors(specs, re.sub(r"[^\w.-]", "_", model)[:200])
        shared = {name: tensor_from(mine, name, framework) for name in mine.names()}
        return Server(_tl.serve_loaded(sealed, key, **kwargs), shared)
    return Server(_tl.serve_buffers(specs, dict(tensors), key, **kwargs))



def wait_for_relays(timeout: float = 120.0) -> int:
    """Waits until the relays of this process's pulls have stopped (docs/remote.md, "Relaying": a
    relay serves the pullers that registered after it until they are done, at most a minute); how
    many still serve after `timeout` seconds. Called at exit."""
    return _tl.wait_for_relays(int(timeout * 1000))


atexit.register(wait_for_relays)


def stop_pulls() -> None:
    """Ends this process's peer pulls cleanly, for the rest of the process (a SIGTERM handler's
    job; `tensorlift fetch` does it on SIGINT and SIGTERM): no get is posted any more, the gets in
    flight land, and each pull (load_from_peer, a Peer load) fails without falling back to the disk;
    relays stop serving. A process that exits with gets in flight can abort its source (UCX's
    software RMA over TCP: docs/security.md)."""
    _tl.stop_pulls()

class Peer:
    """A peer source for tensorlift.load (and load_from_peer): URLs and/or a registry, the key, a fallback."""

    def __init__(self, urls: Union[None, str, Sequence[str]] = None, *, model: Optional[str] = None,
                 revision: Optional[str] = None, dtype: str = "as-stored", quantization: str = "none",
                 layout: str = "", registry: Optional[str] = None,
                 fallback: Union[None, str, os.PathLike, Sequence[Union[str, os.PathLike]]] = None,
                 token: Optional[str] = None, token_file: Optional[str] = None, tp_size: int = 1, tp_rank: int = 0,
                 timeout: float = 10.0, transports: Optional[str] = None, mode: str = "auto",
                 device: str = "cpu", stripe: bool = False, use_page_cache: bool = True,
                 handover: str = "auto", handover_copy_on_write: bool = True, handover_verify: bool = False,
                 content: Optional[str] = None):
        self.urls = [urls] if isinstance(urls, str) else list(urls or [])
        fallbacks = [] if fallback is None else (
            [fallback] if isinstance(fallback, (str, os.PathLike)) else list(fallback))
        fallbacks = [os.fspath(f) for f in fallbacks]
        # stripe: the peers and the fallbacks (a local copy and/or a bucket) share the load's ranges
        # (tensorlift.remote.load_striped); otherwise the peers are tried in turn, then the fallback.
        self.stripe = bool(stripe)
        # With stripe: a local copy in the page cache is loaded from alone (its views cost nothing);
        # False stripes anyway.
        self.use_page_cache = bool(use_page_cache)
        self.local = [f for f in fallbacks if not _is_object_url(f)]
        self.buckets = [f for f in fallbacks if _is_object_url(f)]
        if len(self.local) > 1 or len(self.buckets) > 1:
            raise ValueError(f"fallback: at most one local path and one s3:// or gs:// URL, got {fallbacks}")
        if len(fallbacks) > 1 and not self.stripe:
            raise ValueError("fallback: a local path and a bucket together need stripe=True "
                             "(they are used at once); without it give one")
        if self.stripe and mode != "auto":
            raise ValueError("stripe=True chooses the mode per source: leave mode auto")
        self.fallback = fallbacks[0] if fallbacks else ""
        # content: a content root (32 lowercase hex digits, as tensorlift.content_root or `tensorlift
        # load` print it): a seed publishing another root is skipped, the bytes received (pulled or
        # handed over) and a disk fallback are hashed and refused unless they hash to it; whole
        # tensors only (not with stripe=True, nor a tp_size > 1 layout).
        if content is not None and self.stripe:
            raise ValueError("content= checks one source's bytes: not with stripe=True")
        self.key = _key(model, revision, dtype, quantization, layout, self.fallback or None, content)
        self.registry = registry or ""
        self.token = _token(token, token_file)
        self.tp_size, self.tp_rank = tp_size, tp_rank
        self.timeout_ms = int(timeout * 1000)
        self.transports = transports or ""
        self.mode = mode
        # Where the tensors go ("cpu", "cuda:N"): straight into the device's memory when UCX can write
        # it, else through host memory (docs/remote.md, "Devices"); a seed serves them from there.
        self.device = str(device)
        # Same-host handover (docs/remote.md, "Same-host handover"): a seed on this host hands its
        # memory over (mapped, no copy) instead of sending it. "auto" takes it when offered, "off"
        # always pulls over UCX. Python's tensors are writable: copy_on_write (the default) makes a
        # page written this process's own; False maps them read-only, where a write is a crash
        # (torch has no read-only tensors). verify checks every chunk against the seed's manifest.
        if handover not in ("auto", "off"):
            raise ValueError(f'handover must be "auto" or "off", got {handover!r}')
        if stripe and handover != "auto":
            raise ValueError("stripe=True reads ranges from every source: handover does not apply")
        self.handover = handover
        self.handover_copy_on_write = bool(handover_copy_on_write)
        self.handover_verify = bool(handover_verify)

    def pull(self, become_seed: bool = False, seed_host: Optional[str] = None, relay: bool = True,
             relay_rate_limit: float = 0):
        """(Loaded, report, seed Server or None). seed_host: the address a seed or relay listens on
        and advertises (None: 127.0.0.1 for a seed; for a relay this host's address toward the
        registry)."""
        global _last_report
        if self.stripe:
            if not self.local and not self.buckets:
                raise ValueError("stripe=True needs a fallback (a local path or a bucket) for the headers")
            if become_seed and self.tp_size != 1:
                raise ValueError("become_seed with stripe=True serves whole tensors; a tensor-parallel "
                                 "rank's slices (tp_size > 1) are not served")
            loaded, report = _tl.load_striped(
                path=self.local[0] if self.local else "", object_url=self.buckets[0] if self.buckets else "",
                peers=self.urls, registry=self.registry, token=self.token, key=self.key, device=self.device,
                timeout_ms=self.timeout_ms, transports=self.transports, use_page_cache=self.use_page_cache,
                tp_size=self.tp_size, tp_rank=self.tp_rank, layout=self.key.get("layout", ""))
            _last_report = report
            seed = None
            if become_seed:
                seed = Server(_tl.serve_loaded(loaded, self.key, host=seed_host or "127.0.0.1", token=self.token,
                                               registry=self.registry, transports=self.transports))
            return loaded, report, seed
        loaded, report, seed = _tl.load_from_peer(
            self.key, peers=self.urls, registry=self.registry, token=self.token, tp_size=self.tp_size,
            tp_rank=self.tp_rank, fallback=self.fallback, mode=self.mode, timeout_ms=self.timeout_ms,
            transports=self.transports, become_seed=become_seed, seed_host=seed_host or "127.0.0.1",
            device=self.device, handover=self.handover, handover_copy_on_write=self.handover_copy_on_write,
            handover_verify=self.handover_verify, relay=relay, relay_host=seed_host or "",
            relay_rate_limit=relay_rate_limit)
        _last_report = report
        return loaded, report, (Server(seed) if seed is not None else None)

    def __repr__(self):
        return f"tensorlift.remote.Peer({self.urls}, registry={self.registry!r}, key={self.key})"


def load_peer(peer: Peer, framework: str = "pt",
              filter: Union[None, str, Iterable[str], Callable[[str], bool]] = None) -> Dict[str, object]:
    """tensorlift.load for a Peer: name -> tensor (zero-copy over the pulled buffer)."""
    loaded, _, _ = peer.pull()
    out = {name: tensor_from(loaded, name, framework) for name in _select(loaded.names(), filter)}
    loaded.release()
    return out


def load_from_peer(urls: Union[None, str, Sequence[str]] = None, *, model: Optional[str] = None,
                   revision: Optional[str] = None, dtype: str = "as-stored", quantization: str = "none",
                   layout: str = "", registry: Optional[str] = None, fallback: Union[None, str, os.PathLike] = None,
                   token: Optional[str] = None, token_file: Optional[str] = None, tp_size: int = 1,
                   tp_rank: int = 0, timeout: float = 10.0, transports: Optional[str] = None,
                   framework: str = "pt", become_seed: bool = False, seed_host: Optional[str] = None,
                   device: str = "cpu", stripe: bool = False, use_page_cache: bool = True,
                   handover: str = "auto", handover_copy_on_write: bool = True, handover_verify: bool = False,
                   content: Optional[str] = None, relay: bool = True, relay_rate_limit: float = 0):
    """Pulls this rank's tensors from a peer; returns name -> tensor.

    With a registry the pull relays (docs/remote.md, "Relaying"): it serves what it has received
    to later pullers while it receives, and takes from the one registered before it; relay=False
    turns it off, relay_rate_limit (MB/s) caps what its children take, seed_host is the address it
    listens on and advertises (default: this host's address toward the registry).
    last_report()["sources"] says what each source gave, ["relay"] this pull's relay, and
    ["relay_behind"] whether it found itself behind a slower link and moved to the chain's end.

    stripe=True: the peers and the fallback(s) (a local path and/or an s3:// URL) are used at once,
    sharing the load's ranges (see load_striped); the peers must serve whole tensors.

    With become_seed, returns (tensors, Server): the process serves what it got.
    device ("cpu", "cuda:N"): where the tensors go (torch tensors on that GPU with framework "pt").
    handover ("auto", "off"): a seed on this host hands its memory over instead of sending it (no
    copy; last_report()["handover"] says so); handover_copy_on_write (default) keeps the tensors
    writable, each page written becoming this process's own; handover_verify checks every chunk.
    content: a content root (docs/remote.md, "Content identity"): only bytes that hash to it are
    accepted (a seed with another root, or whose bytes do not hash to it, is a failure in
    last_report() and the next source is tried); last_report()["content"] is the root checked.
    last_report() says which source was used and why the others failed.
    """
    peer = Peer(urls, model=model, revision=revision, dtype=dtype, quantization=quantization, layout=layout,
                registry=registry, fallback=fallback, token=token, token_file=token_file, tp_size=tp_size,
                tp_rank=tp_rank, timeout=timeout, transports=transports, device=device, stripe=stripe,
                use_page_cache=use_page_cache, handover=handover,
                handover_copy_on_write=handover_copy_on_write, handover_verify=handover_verify,
                content=content)
    loaded, _, seed = peer.pull(become_seed=become_seed, seed_host=seed_host, relay=relay,
                                relay_rate_limit=relay_rate_limit)
    out = {name: tensor_from(loaded, name, framework) for name in loaded.names()}
    if not become_seed:
        loaded.release()
        return out
    return out, seed


def load_striped(path: Union[None, str, os.PathLike] = None, url: Optional[str] = None, *,
                 peers: Union[None, str, Sequence[str]] = None, registry: Optional[str] = None,
                 token: Optional[str] = None, token_file: Optional[str] = None, model: Optional[str] = None,
                 revision: Optional[str] = None, framework: str = "pt", device: str = "cpu",
                 timeout: float = 10.0, transports: Optional[str] = None, range_bytes: int = 8 << 20,
                 endpoint: Optional[str] = None, region: Optional[str] = None,
                 use_page_cache: bool = True) -> Dict[str, object]:
    """Loads a checkpoint from every source that holds it at once; returns name -> tensor.

    path: the local copy; url: the same files in a bucket (s3://, gs://); peers / registry: running
    peers serving it whole (by default under the key of its headers, as `tensorlift serve` keys it).
    The headers come from the local copy, else the bucket. The ranges are shared out by work
    stealing (faster sources take more), every chunk is checked against a peer's manifest where one
    is at hand, and a source that fails or lies has its ranges moved to the others. last_report()
    has each source's bytes and failure. A local copy in the page cache is loaded from alone (its
    views cost no copy; report "note" says so); use_page_cache=False stripes anyway.
    """
    global _last_report
    key = None
    if model is not None or revision is not None:
        key = _key(model, revision, "as-stored", "none", "", os.fspath(path) if path else url)
    loaded, report = _tl.load_striped(
        path=os.fspath(path) if path else "", object_url=url or "",
        peers=[peers] if isinstance(peers, str) else list(peers or []), registry=registry or "",
        token=_token(token, token_file), key=key, device=str(device), timeout_ms=int(timeout * 1000),
        transports=transports or "", range_bytes=int(range_bytes), endpoint=endpoint or "",
        region=region or "", use_page_cache=bool(use_page_cache))
    _last_report = report
    out = {name: tensor_from(loaded, name, framework) for name in loaded.names()}
    loaded.release()
    return out


def last_report() -> Optional[dict]:
    """The report of this process's last peer load: source, failures, bytes, seconds, source_ranks."""
    return _last_report
