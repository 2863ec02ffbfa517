"""Hugging Face transformers reads .safetensors through tensorlift.

    import tensorlift.integrations.transformers as tl_hf

    tl_hf.enable()                                  # from now on ...
    model = AutoModel.from_pretrained(path)         # ... every Auto class loads through tensorlift
    tl_hf.disable()                                 # the stock reader again

    with tl_hf.use_tensorlift():                    # or only inside a block
        model = AutoModelForCausalLM.from_pretrained(path)

How: transformers 5.x opens every checkpoint shard with `safetensors.safe_open`
(imported by name into transformers.modeling_utils, modeling_layers,
integrations.accelerate and quantizers.quantizer_torchao) and takes each tensor
with `get_slice(name)[...]` or `get_tensor(name)`. `enable()` replaces that name
in those modules with `TensorliftSafeOpen`, which has the same methods. Opening
a file reads and validates only its header; the first tensor asked for reads
the whole file at once with tensorlift (parallel reads, GIL released, page
cache aware: the `mode` option), and every tensor is then a zero-copy view over
tensorlift's buffer: the model's parameters are those bytes, with no second
copy. Tensors own their memory (DLPack), so they outlive the reader.

Falls back to the stock reader for what it does not cover: a framework other
than "pt", a device other than the CPU. `disable_mmap=True` (and hf-mount
filesystems) keep transformers' own read-the-bytes path. Malformed files raise
tensorlift.FormatError (a ValueError) with the rule they break.

`stats()` counts what went through tensorlift (files, tensors, bytes, seconds).
"""
from __future__ import annotations

import contextlib
import importlib
import os
import threading
from typing import Any, Dict, Iterator, List, Optional, Tuple

from .._core import tensor_from
from .._tensorlift import Checkpoint

__all__ = ["TensorliftSafeOpen", "disable", "enable", "is_enabled", "reset_stats", "stats", "use_tensorlift"]

# Modules of transformers that import `safe_open` by name.
_TARGETS = (
    "transformers.modeling_utils",
    "transformers.modeling_layers",
    "transformers.integrations.accelerate",
    "transformers.quantizers.quantizer_torchao",
)

_lock = threading.Lock()
_patched: List[Tuple[Any, Any]] = []  # (module, the safe_open it had)
_options: Dict[str, Any] = {"mode": "auto", "threads": 0}
_stats: Dict[str, Any] = {"opened": 0, "files": 0, "tensors": 0, "bytes": 0, "seconds": 0.0, "fallbacks": 0}


def stats() -> Dict[str, Any]:
    """What went through tensorlift since the last reset: files opened (headers), files loaded,
    tensors handed out, bytes read, seconds spent reading, and calls passed to the stock reader."""
    with _lock:
        return dict(_stats)


def reset_stats() -> None:
    with _lock:
        for k in _stats:
            _stats[k] = 0.0 if k == "seconds" else 0


def _count(**kw: Any) -> None:
    with _lock:
        for k, v in kw.items():
            _stats[k] += v


class _Slice:
    """safetensors' slice object: get_shape(), get_dtype(), and indexing (reads on first use)."""

    __slots__ = ("_reader", "_name", "_dtype", "_shape")

    def __init__(self, reader: "TensorliftSafeOpen", name: str, dtype: str, shape: Tuple[int, ...]):
        self._reader = reader
        self._name = name
        self._dtype = dtype
        self._shape = shape

    def get_shape(self) -> List[int]:
        return list(self._shape)

    def get_dtype(self) -> str:
        return self._dtype

    def __getitem__(self, index: Any):
        return self._reader.get_tensor(self._name)[index]


class TensorliftSafeOpen:
    """A `safetensors.safe_open` for framework "pt" on the CPU, reading with tensorlift.

    keys() (sorted), offset_keys(), metadata(), get_tensor(), get_tensors(),
    get_slice() and the context manager behave as safetensors' do; using the
    object after close raises ValueError. Tensors are zero-copy views over one
    buffer per file: two get_tensor calls for the same name share memory.
    Thread-safe (transformers materializes tensors from a thread pool).
    """

    def __init__(self, filename: Any, framework: str = "pt", device: Any = "cpu", *,
                 backend: Optional[str] = None, mode: Optional[str] = None, threads: Optional[int] = None):
        self._path = os.fspath(filename)
        self._ckpt = Checkpoint.open(self._path)
        # name -> (dtype, shape, begin)
        self._info = {t[0]: (t[1], tuple(t[2]), t[3]) for t in self._ckpt.tensors()}
        self._mode = mode or _options["mode"]
        self._threads = _options["threads"] if threads is None else threads
        self._loaded = None
        self._closed = False
        self._lock = threading.Lock()
        _count(opened=1)

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"tensorlift: {self._path} is closed")

    def _ensure_loaded(self):
        self._check_open()
        loaded = self._loaded
        if loaded is None:
            with self._lock:
                self._check_open()
                if self._loaded is None:
                    self._loaded = self._ckpt.load(mode=self._mode, threads=self._threads or 0)
                    _count(files=1, bytes=self._loaded.total_bytes, seconds=self._loaded.seconds)
                loaded = self._loaded
        return loaded

    def keys(self) -> List[str]:
        self._check_open()
        return sorted(self._info)

    def offset_keys(self) -> List[str]:
        self._check_open()
        return sorted(self._info, key=lambda n: self._info[n][2])

    def metadata(self) -> Optional[Dict[str, str]]:
        self._check_open()
        return self._ckpt.metadata(0)

    def get_slice(self, name: str) -> _Slice:
        self._check_open()
        if name not in self._info:
            raise KeyError(name)
        dtype, shape, _ = self._info[name]
        return _Slice(self, name, dtype, shape)

    def get_tensor(self, name: str):
        loaded = self._ensure_loaded()
        if name not in self._info:
            raise KeyError(name)
        t = tensor_from(loaded, name, "pt")
        _count(tensors=1)
        return t

    def get_tensors(self) -> Dict[str, Any]:
        return {name: self.get_tensor(name) for name in self.offset_keys()}

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._loaded is not None:
                self._loaded.release()  # tensors handed out keep their own references
                self._loaded = None

    def __enter__(self) -> "TensorliftSafeOpen":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _is_cpu(device: Any) -> bool:
    if device is None:
        return True
    kind = getattr(device, "type", None)
    if kind is None:
        kind = str(device).split(":", 1)[0]
    return kind == "cpu"


def _make_safe_open(original: Any):
    def safe_open(filename, framework="pt", device="cpu", *args, **kwargs):
        if framework in ("pt", "torch", "pytorch") and _is_cpu(device) and not args \
                and set(kwargs) <= {"backend"}:
            return TensorliftSafeOpen(filename, framework, device, backend=kwargs.get("backend"))
        _count(fallbacks=1)
        return original(filename, framework, device, *args, **kwargs)

    safe_open.__doc__ = "tensorlift's safe_open for transformers (see tensorlift.integrations.transformers)."
    safe_open._tensorlift_original = original  # type: ignore[attr-defined]
    return safe_open


def is_enabled() -> bool:
    return bool(_patched)


def enable(mode: str = "auto", threads: Optional[int] = None) -> None:
    """Makes transformers (`from_pretrained` of every Auto class and model class) read
    .safetensors through tensorlift. mode: auto | buffered | direct | mmap; threads:
    tensorlift's reader threads (None: automatic). Calling it again updates the options."""
    if mode not in ("auto", "buffered", "direct", "mmap"):
        raise ValueError(f"tensorlift: unknown mode {mode!r} (auto, buffered, direct or mmap)")
    with _lock:
        _options["mode"] = mode
        _options["threads"] = threads or 0
    if _patched:
        return
    for name in _TARGETS:
        try:
            module = importlib.import_module(name)
        except ImportError:  # an optional dependency is missing: nothing there to patch
            continue
        current = module.__dict__.get("safe_open")
        if current is None or getattr(current, "_tensorlift_original", None) is not None:
            continue
        module.safe_open = _make_safe_open(current)
        _patched.append((module, current))
    if not _patched:
        raise RuntimeError("tensorlift: found no safe_open to replace in transformers "
                           f"{_transformers_version()}; this integration supports transformers 5.x")


def disable() -> None:
    """Restores transformers' own safetensors reader."""
    while _patched:
        module, original = _patched.pop()
        module.safe_open = original


@contextlib.contextmanager
def use_tensorlift(mode: str = "auto", threads: Optional[int] = None) -> Iterator[None]:
    """enable() inside the block; on exit the previous state (and options) comes back."""
    was, old = is_enabled(), dict(_options)
    enable(mode=mode, threads=threads)
    try:
        yield
    finally:
        if was:
            _options.update(old)
        else:
            disable()


def _transformers_version() -> str:
    try:
        import transformers
        return transformers.__version__
    except Exception:  # pragma: no cover
        return "(not importable)"
