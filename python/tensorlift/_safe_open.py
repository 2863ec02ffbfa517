"""tensorlift.safe_open: the safetensors `safe_open` API over tensorlift's
validating reader and loader.

The file is opened once and its descriptor is kept until the last user of it
(the safe_open object, or a slice taken from it) is gone. Every later read goes
to that same file (the C++ loader reopens it through /proc/self/fd), so a file
replaced on disk after the open is never mixed with the header read before:
this is what the reference gets from its memory map, without the SIGBUS a
truncated mapped file would raise. A file shrunk in place is reported as an
error instead.
"""
from __future__ import annotations

import errno
import operator
import os
import stat
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from . import _dtypes
from ._tensors import _DLPackBytes, tensor_from
from ._framework_table import FRAMEWORKS, FROM_NUMPY, REFERENCE_NAMES
from ._framework_table import framework as framework_module
from ._errors import FormatError, SafetensorError, deserializing, not_instance, path_argument
from ._tensorlift import Checkpoint

__all__ = ["safe_open"]

# Tensors of at least this many bytes are read by the C++ loader (parallel
# block reads); smaller ones with one pread here, which costs a few
# microseconds instead of the loader's ~50-100 (thread start-up, planning).
_LOADER_MIN_BYTES = 8 << 20

_BACKENDS = ("mmap", "pread")


class _TensorNotFound(SafetensorError, KeyError):
    """A tensor name the file does not contain; both a KeyError and a SafetensorError."""

    __str__ = BaseException.__str__  # The message, not KeyError's repr of it.


# numpy's indexing errors in numpy slices, also SafetensorErrors: the reference's numpy slices
# raise SafetensorError where numpy raises these (tensorlift slices with numpy's semantics).
class _SliceIndexError(SafetensorError, IndexError):
    """An index numpy rejects in a numpy slice (out of range, too many, a bad type)."""


class _SliceValueError(SafetensorError, ValueError):
    """A value numpy rejects in a numpy slice (a step of 0)."""


class _SliceTypeError(SafetensorError, TypeError):
    """A type numpy rejects in a numpy slice."""


_SLICE_ERRORS = ((IndexError, _SliceIndexError), (ValueError, _SliceValueError), (TypeError, _SliceTypeError))


def _closed() -> SafetensorError:
    return SafetensorError("File is closed")


def _check_name(name) -> None:
    """pyo3's TypeError, as the reference, for a tensor name that is not a str."""
    if not isinstance(name, str):
        raise not_instance("name", name, "str")


def _header_error(e: Exception) -> Exception:
    """A FormatError of a file's header worded as the reference's ("Error while deserializing
    header: <its words for the rule>: " and tensorlift's message); other errors as they are."""
    if isinstance(e, FormatError):
        return deserializing(e, "Error while deserializing header: ")
    return e


class _Tensors:
    """What safe_open's files share: `info`, name -> (dtype, shape, begin, end)."""

    __slots__ = ()

    def lookup(self, name: str):
        try:
            return self.info[name]
        except (KeyError, TypeError):
            raise _TensorNotFound(f"File does not contain tensor {name}") from None


class _OpenFile(_Tensors):
    """One open, validated safetensors file, shared by a safe_open and its slices.

    The descriptor is closed when the last reference goes (CPython frees it at
    once), which is how close() releases eagerly while slices stay usable.
    """

    __slots__ = ("fd", "name", "load_path", "ckpt", "metadata", "order", "info", "data_offset", "__weakref__")

    def __init__(self, filename, handle_fd: Optional[int] = None, opened=None):
        """opened: called once the file is open, before anything is read (safe_open's last
        argument check, where the reference makes it)."""
        self.fd = -1
        path = os.fspath(filename)
        self.name = os.fsdecode(path)
        # An open file of the caller's (_safe_open_handle): a descriptor of our own for the
        # same open file, so that the caller may close theirs meanwhile.
        fd = os.dup(handle_fd) if handle_fd is not None else self._open(path)
        try:
            if opened is not None:
                opened()
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                if stat.S_ISDIR(st.st_mode):
                    raise IsADirectoryError(21, "Is a directory (safe_open reads one .safetensors file)", self.name)
                raise OSError(19, "Not a regular file", self.name)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        proc = f"/proc/self/fd/{fd}"
        self.load_path = proc if os.path.exists(proc) else self.name
        try:
            self.ckpt = Checkpoint.open(self.load_path)
        except Exception as e:
            err = _header_error(self._renamed(e))
            os.close(fd)  # Now, not when the traceback (which holds self) goes.
            self.fd = -1
            raise err from None
        self.metadata = self.ckpt.metadata(0)
        self.data_offset = self.ckpt.data_offset(0)
        tensors = self.ckpt.shard_tensors(0)  # File (offset) order.
        self.order = [t[0] for t in tensors]
        self.info: Dict[str, Tuple[str, Tuple[int, ...], int, int]] = {
            t[0]: (t[1], tuple(t[2]), t[3], t[4]) for t in tensors}

    def _open(self, path) -> int:
        """A descriptor of `path`. A missing file (or a missing directory on its path) is the
        reference's FileNotFoundError("No such file or directory: PATH"); other failures
        (PermissionError, ...) are the OSError the system gives."""
        try:
            return os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except (FileNotFoundError, NotADirectoryError):
            err = FileNotFoundError(f"No such file or directory: {self.name}")
            err.errno = errno.ENOENT  # (Set after: the reference's message, without "[Errno 2]".)
            raise err from None

    def __del__(self):
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = -1

    def _renamed(self, e: Exception) -> Exception:
        """`e` with the /proc path in its message replaced by the user's file name."""
        if not isinstance(self.load_path, str) or not self.load_path.startswith("/proc/self/fd/"):
            return e
        msg = str(e)
        if self.load_path not in msg:
            return e
        try:
            return type(e)(msg.replace(self.load_path, self.name))
        except Exception:
            return e


    def _pread(self, buf: np.ndarray, offset: int) -> None:
        """Fills the uint8 array `buf` from the file at `offset` (short reads, EINTR handled)."""
        mv = memoryview(buf).cast("B")
        done, total = 0, len(mv)
        while done < total:
            n = os.preadv(self.fd, [mv[done:]], offset + done)
            if n == 0:
                raise FormatError(
                    f"{self.name}: the file ends at byte {offset + done} but its header says the tensor data "
                    f"runs to byte {offset + total}: it changed after its header was read")
            done += n

    def read_range(self, framework: str, offset: int, nbytes: int):
        """An owned 1-D uint8 torch tensor or numpy array with `nbytes` bytes at data offset `offset`."""
        if framework == "pt":
            import torch
            raw = torch.empty(nbytes, dtype=torch.uint8)
            if nbytes:
                self._pread(raw.numpy(), self.data_offset + offset)
            return raw
        raw = np.empty(nbytes, dtype=np.uint8)
        if nbytes:
            self._pread(raw, self.data_offset + offset)
        return raw

    def read_tensor(self, name: str, framework: str):
        """The whole tensor `name`, in its own buffer, as a framework tensor."""
        dtype, shape, begin, end = self.lookup(name)
        if end - begin >= _LOADER_MIN_BYTES:
            try:
                loaded = self.ckpt.load(names=[name], mode="buffered", decode_sparse=False)
            except Exception as e:
                raise self._renamed(e) from None
            try:
                return tensor_from(loaded, name, framework)
            finally:
                loaded.release()
        raw = self.read_range(framework, begin, end - begin)
        return _view(raw, dtype, shape, framework)

    def read_all(self, framework: str) -> Dict[str, Any]:
        """Every tensor, in file order, through the C++ loader (one planned load)."""
        if not self.order:
            return {}
        try:
            # Views as the reference gives, misaligned ones too (odd header sizes).
            loaded = self.ckpt.load(mode="auto", decode_sparse=False, misaligned_views=True)
        except Exception as e:
            raise self._renamed(e) from None
        try:
            return {name: tensor_from(loaded, name, framework) for name in self.order}
        finally:
            loaded.release()


class _PeerFile(_Tensors):
    """safe_open's file for a tensorlift.remote.Peer: the tensors pulled once
    (verified, else from the peer's fallback), laid out as one virtual data
    section in name order so that slices read byte ranges as from a file."""

    __slots__ = ("name", "loaded", "metadata", "order", "info", "__weakref__")

    def __init__(self, peer):
        self.loaded, report, _ = peer.pull()
        self.name = report["source"]
        self.metadata = None
        self.order = sorted(self.loaded.names())
        self.info: Dict[str, Tuple[str, Tuple[int, ...], int, int]] = {}
        offset = 0
        for n in self.order:
            dtype, shape, nbytes = self.loaded.info(n)
            self.info[n] = (dtype, tuple(shape), offset, offset + nbytes)
            offset += nbytes


    def read_range(self, framework: str, offset: int, nbytes: int):
        """A copy of `nbytes` bytes at `offset` of the virtual data section (within one tensor)."""
        for n in self.order:
            _, _, begin, end = self.info[n]
            if begin <= offset and offset + nbytes <= end:
                raw = np.from_dlpack(_DLPackBytes(self.loaded, n))[offset - begin:offset - begin + nbytes].copy()
                if framework == "pt":
                    import torch
                    return torch.from_numpy(raw)
                return raw
        raise IndexError(f"{self.name}: bytes [{offset}, {offset + nbytes}) are not within one tensor")

    def read_tensor(self, name: str, framework: str):
        self.lookup(name)
        return tensor_from(self.loaded, name, framework)

    def read_all(self, framework: str) -> Dict[str, Any]:
        return {n: tensor_from(self.loaded, n, framework) for n in self.order}


class _ObjectFile(_Tensors):
    """safe_open's file for an s3:// or gs:// object: the header fetched and validated at open
    (one small ranged GET), each tensor fetched when asked for (its byte range, with parallel
    ranged GETs for a large one), a slice's rows fetched alone (docs/object-storage.md)."""

    __slots__ = ("name", "ckpt", "metadata", "order", "info", "data_offset", "__weakref__")

    def __init__(self, url: str):
        self.name = url
        try:
            self.ckpt = Checkpoint.open(url)
        except FormatError as e:
            raise _header_error(e) from None
        if self.ckpt.shards() != [url]:
            raise IsADirectoryError(21, "Is a prefix or an index (safe_open reads one .safetensors object)", url)
        self.metadata = self.ckpt.metadata(0)
        self.data_offset = self.ckpt.data_offset(0)
        tensors = self.ckpt.shard_tensors(0)  # File (offset) order.
        self.order = [t[0] for t in tensors]
        self.info: Dict[str, Tuple[str, Tuple[int, ...], int, int]] = {
            t[0]: (t[1], tuple(t[2]), t[3], t[4]) for t in tensors}


    def read_range(self, framework: str, offset: int, nbytes: int):
        """An owned 1-D uint8 tensor or array of `nbytes` bytes at data offset `offset`."""
        from ._tensorlift import read_object_range
        if framework == "pt":
            import torch
            raw = torch.empty(nbytes, dtype=torch.uint8)
            address = raw.data_ptr()
        else:
            raw = np.empty(nbytes, dtype=np.uint8)
            address = raw.ctypes.data
        if nbytes:
            read_object_range(self.name, self.data_offset + offset, address, nbytes)
        return raw

    def read_tensor(self, name: str, framework: str):
        self.lookup(name)
        loaded = self.ckpt.load(names=[name], decode_sparse=False, misaligned_views=True)
        try:
            return tensor_from(loaded, name, framework)
        finally:
            loaded.release()

    def read_all(self, framework: str) -> Dict[str, Any]:
        if not self.order:
            return {}
        loaded = self.ckpt.load(decode_sparse=False, misaligned_views=True)
        try:
            return {name: tensor_from(loaded, name, framework) for name in self.order}
        finally:
            loaded.release()


def _view(raw, dtype: str, shape, framework: str):
    if framework == "pt":
        return _dtypes.torch_view(raw, dtype, shape)
    return _dtypes.numpy_view(raw, dtype, shape)


def _framework_elem(dtype: str, shape, framework: str):
    """The framework's element type for this tensor, or None when it comes back
    as raw uint8 bytes (the rule of _dtypes)."""
    if framework == "pt":
        tdt = _dtypes.torch_dtype(dtype)
        if dtype == "F4" and not (shape and shape[-1] % 2 == 0):
            return None
        return tdt
    return _dtypes.numpy_dtype(dtype)


def _framework_shape(dtype: str, shape, nbytes: int, framework: str) -> Tuple[int, ...]:
    """The shape of the framework tensor get_tensor returns (the rules of _dtypes)."""
    if _framework_elem(dtype, shape, framework) is None:
        return _dtypes.raw_shape(dtype, shape, nbytes)
    if framework == "pt" and dtype == "F4":
        return tuple(shape[:-1]) + (shape[-1] // 2,)
    return tuple(shape)


_DEVICE_KINDS = ("cuda", "musa", "npu", "xpu", "xla", "mlu", "hpu")  # alone (index 0) or "KIND:N"


def _rust_usize(text: str) -> int:
    """`text` as Rust's usize::from_str parses it: an optional "+", then ASCII digits (ValueError
    with Rust's words otherwise, which the reference raises for a device index)."""
    if not text:
        raise ValueError("cannot parse integer from empty string")
    digits = text[1:] if text[0] == "+" else text
    if not digits or any(c not in "0123456789" for c in digits):
        raise ValueError("invalid digit found in string")
    n = int(digits)
    if n >= 1 << 64:
        raise ValueError("number too large to fit in target type")
    return n


def _device(device):
    """None for the CPU, else the device to move tensors to (a str, or an int for torch to choose
    the accelerator), by the reference's rules and in its words: None or "cpu" (the CPU); "mps"
    or "mps:0"; a kind of _DEVICE_KINDS alone (index 0) or "KIND:N" (N as Rust parses an unsigned
    integer, ValueError otherwise); an int N >= 0. Anything else is a SafetensorError. Whether
    torch has that device shows when a tensor is moved (RuntimeError)."""
    if device is None:
        return None
    if isinstance(device, str):
        if device == "cpu":
            return None
        if device == "mps":
            return device
        if device in _DEVICE_KINDS:
            return f"{device}:0"
        kind, sep, _ = device.partition(":")
        if sep and (kind in _DEVICE_KINDS or kind == "mps"):
            tokens = device.split(":")
            if len(tokens) != 2:
                raise SafetensorError(f"device {device} is invalid")
            index = _rust_usize(tokens[1])
            if kind != "mps":
                return f"{kind}:{index}"
            if index != 0:
                raise SafetensorError(f"device {device} is invalid: only mps or mps:0 is supported")
            return "mps"
        raise SafetensorError(f"device {device} is invalid")
    try:
        index = operator.index(device)  # An int, a bool, a numpy integer.
    except TypeError:
        index = -1
    if 0 <= index < 1 << 64:
        return index
    raise SafetensorError(f"device {device!r} is invalid")


class _SafeSlice:
    """What safe_open.get_slice returns: the shape and dtype of one tensor, and
    indexing that reads only the rows it needs (see __getitem__)."""

    __slots__ = ("_file", "_name", "_framework", "_post", "_dtype", "_shape", "_begin", "_end")

    def __init__(self, file: _OpenFile, name: str, framework: str, post):
        self._file = file
        self._name = name
        self._framework = framework
        self._post = post  # None, or what safe_open applies to each tensor (a move, a conversion)
        self._dtype, self._shape, self._begin, self._end = file.lookup(name)

    def get_shape(self) -> List[int]:
        """The tensor's shape as the file's header gives it (F4: logical 4-bit elements)."""
        return list(self._shape)

    def get_dtype(self) -> str:
        """The safetensors dtype string, e.g. "F32", "BF16", "F8_E4M3"."""
        return self._dtype

    def __repr__(self) -> str:
        return f"<tensorlift slice {self._name!r} {self._dtype} {list(self._shape)}>"

    def __getitem__(self, index):
        """The tensor indexed with torch semantics (framework "pt") or numpy
        semantics ("np"), over the framework tensor get_tensor would return.
        The result is contiguous and owns its memory. When the first index is
        an int or a slice with a positive step, only the rows of the first
        dimension it touches are read from the file. The index is applied as
        given (a tuple, or one index alone, as the reference hands it to
        torch); numpy's IndexError, ValueError and TypeError are also
        SafetensorErrors, which the reference's numpy slices raise."""
        tupled = isinstance(index, tuple)
        idx = index if tupled else (index,)
        nbytes = self._end - self._begin
        fshape = _framework_shape(self._dtype, self._shape, nbytes, self._framework)
        rows = _row_window(idx, fshape)
        if rows is not None and nbytes % fshape[0] == 0:
            lo, hi, first = rows
            row_bytes = nbytes // fshape[0]
            raw = self._file.read_range(self._framework, self._begin + lo * row_bytes, (hi - lo) * row_bytes)
            base = _reshape_rows(raw, self._dtype, self._shape, fshape, hi - lo, self._framework)
            key = (first,) + idx[1:] if tupled else first
        else:
            base = self._file.read_tensor(self._name, self._framework)
            key = index
        try:
            out = _index_owned(base, key, self._framework)
        except (IndexError, ValueError, TypeError) as e:
            if self._framework != "np":
                raise
            kind = next(k for builtin, k in _SLICE_ERRORS if isinstance(e, builtin))
            raise kind(_reference_slice_error(index, self._shape) or str(e)) from None
        if self._post is not None:
            out = self._post(out)
        return out


def _reference_slice_error(index, shape) -> Optional[str]:
    """The message the reference's numpy slices give for `index` on a tensor of `shape` (the
    header's), where numpy rejects it too; None where the reference's own error is not one of its
    messages (pyo3's OverflowError for a negative slice bound, a SystemError for a start past the
    stop), and numpy's message stands. Its rules, in its order (safetensors 0.8):
    more than one Ellipsis; then each index left to right: a slice's bounds (not negative) and then
    its step must be positive, an int
    (a bool, a numpy integer) below -size is invalid (its dimension counted after the Ellipsis is
    expanded; past the last, a size of 0), a list, None or any other type is unsupported (its
    position, too, counted with the Ellipsis expanded; a bare
    [] is the slice 0:0; a bare non-empty list is not implemented); then more indexes than
    dimensions; then each dimension from the last to the first: an index, or a slice's start, at or
    past the size, or a slice's stop past it."""
    shape = list(shape)
    if isinstance(index, list):
        if index:
            return "Non empty lists are not implemented"
        index = slice(0, 0)
    items = index if isinstance(index, tuple) else (index,)
    if sum(1 for x in items if x is Ellipsis) > 1:
        return "Only one ellipsis (...) is allowed in slice index"
    expanded = []  # (kind, value): ("int", i) or ("slice", (start, stop, step)), Ellipsis expanded
    for x in items:
        pos = len(expanded)  # an index's position, the Ellipsis expanded
        if x is Ellipsis:
            expanded.extend([("slice", (None, None, None))] * max(len(shape) - (len(items) - 1), 0))
            continue
        if isinstance(x, slice):
            bounds = []
            for v in (x.start, x.stop, x.step):
                if v is not None and not isinstance(v, (int, np.integer)):
                    return None  # pyo3's TypeError: not one of the reference's messages
                bounds.append(None if v is None else int(v))
            start, stop, step = bounds
            if (start is not None and start < 0) or (stop is not None and stop < 0):
                return None  # pyo3's OverflowError (a negative bound to an unsigned int), before the step
            if step is not None and step <= 0:
                return f"Slice step must be a positive integer, got {step}"
            expanded.append(("slice", (start, stop, step)))
        elif isinstance(x, (bool, np.bool_, int, np.integer)):
            i = int(x)
            size = shape[pos] if pos < len(shape) else 0
            if i < 0:
                if i + size < 0:
                    return f"Invalid index {i} for dimension {pos} of size {size}"
                i += size
            expanded.append(("int", i))
        else:
            return f"Unsupported slice index at position {pos}: expected slice, int, or ellipsis"

    def text(kind, value):
        if kind == "int":
            return str(value)
        start, stop, step = value
        out = f"{'' if start is None else start}:{'' if stop is None else stop}"
        return out + (f":{step}" if step not in (None, 1) else "")

    where = f"Error during slicing [{', '.join(text(k, v) for k, v in expanded)}] with shape {shape}: "
    if len(expanded) > len(shape):
        return where + "more slicing indexes than dimensions in tensor"
    for dim in reversed(range(len(expanded))):
        kind, value = expanded[dim]
        size = shape[dim]
        if kind == "int":
            asked = value if value >= size else None
        else:
            start, stop, _ = value
            start = 0 if start is None else start
            stop = size if stop is None else stop
            asked = start if start >= size else (stop - 1 if stop > size else None)
        if asked is not None:
            return where + f"index {asked} out of bounds for tensor dimension #{dim} of size {size}"
    return None  # in bounds: a start past its stop is the reference's SystemError (a negative size)


def _row_window(idx: tuple, fshape) -> Optional[Tuple[int, int, Any]]:
    """(lo, hi, first index relative to lo) when idx[0] selects a window of rows."""
    if not idx or not fshape or fshape[0] == 0:
        return None
    n = fshape[0]
    first = idx[0]
    if isinstance(first, (bool, np.bool_)):
        return None
    if isinstance(first, (int, np.integer)):
        i = int(first)
        if i < 0:
            i += n
        if not 0 <= i < n:
            return None  # The full path raises the framework's own IndexError.
        return i, i + 1, 0
    if isinstance(first, slice):
        try:
            start, stop, step = first.indices(n)
        except (TypeError, ValueError):
            return None
        if step <= 0:
            return None
        r = range(start, stop, step)
        if len(r) == 0:
            return 0, 0, slice(0, 0, 1)
        lo, hi = r[0], r[-1] + 1
        if lo == 0 and hi == n:
            return None
        return lo, hi, slice(0, hi - lo, step)
    return None


def _reshape_rows(raw, dtype: str, shape, fshape, rows: int, framework: str):
    """The framework tensor of `rows` whole rows (first dimension) held in `raw`."""
    target = (rows,) + tuple(fshape[1:])
    elem = _framework_elem(dtype, shape, framework)
    if elem is None:
        return raw.reshape(target)
    return raw.view(elem).reshape(target)


_TORCH_INT_OF_SIZE = {}


def _torch_int_of_size(size: int):
    import torch
    if not _TORCH_INT_OF_SIZE:
        _TORCH_INT_OF_SIZE.update({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64})
    return _TORCH_INT_OF_SIZE[size]


def _row_major_strides(shape) -> Tuple[int, ...]:
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= max(d, 1)
    return tuple(reversed(strides))


def _index_owned(base, idx, framework: str):
    """base[idx], contiguous and owning exactly its bytes."""
    if framework == "pt":
        # Index an integer view of the same element size: indexing only moves
        # elements, and torch lacks index kernels for some dtypes (float4).
        ity = _torch_int_of_size(base.element_size())
        out = base.view(ity)[idx]
        if not (out.storage_offset() == 0 and out.stride() == _row_major_strides(out.shape)
                and out.untyped_storage().nbytes() == out.numel() * out.element_size()):
            import torch
            out = torch.empty(out.shape, dtype=ity).copy_(out)
        return out.view(base.dtype)
    out = base[idx]
    if not isinstance(out, np.ndarray):
        return np.asarray(out)  # A numpy scalar: a new 0-d array.
    if out.flags.c_contiguous and out.nbytes == base.nbytes:
        return out
    return np.array(out, order="C", copy=True)


class safe_open:
    """Opens a safetensors file lazily, like safetensors.safe_open.

    safe_open(filename, framework, device="cpu", *, backend="mmap")

    filename: a .safetensors file, an s3:// or gs:// object (its header
    fetched at open, each tensor or slice fetched when asked for), or a
    tensorlift.remote.Peer (its tensors are pulled once, verified, and served
    from memory; metadata() is None).
    framework: "pt" (also "torch", "pytorch") or "np" (also "numpy").
    device: "cpu"; with "pt", any torch device (tensors are read into host
    memory, then moved). backend: accepted for compatibility ("mmap" or
    "pread"); tensorlift always reads with pread through its own descriptor.

    The header is fully validated here: a corrupt file raises
    tensorlift.FormatError (a ValueError and a tensorlift.SafetensorError), a
    missing one FileNotFoundError. Usable with or without `with`; close() (or
    leaving the `with` block) releases the file, after which every method
    raises SafetensorError("File is closed"). Slices taken before stay usable.
    """

    def __init__(self, filename, framework, device="cpu", *, backend: str = "mmap"):
        # The reference's order: the arguments (filename, framework, device, backend), then
        # opening the file, then whether the framework takes the device, then the header.
        self._file = None
        from ._sources import is_object_url
        from .remote import Peer
        peer, url = isinstance(filename, Peer), is_object_url(filename)
        if not (peer or url):
            filename = path_argument(filename)
        self._arguments(framework, device, backend)
        if peer or url:
            self._check_device()
            self._file = _PeerFile(filename) if peer else _ObjectFile(filename)
        else:
            self._file = _OpenFile(filename, opened=self._check_device)
        self._opened()

    def _arguments(self, framework, device, backend: str = "mmap") -> None:
        """Checks the arguments as the reference does, in its order and words."""
        self._file = None
        if not isinstance(framework, str):
            raise not_instance("framework", framework, "str")
        fw = FRAMEWORKS.get(framework)
        if fw is None:
            raise SafetensorError(f"framework {framework} is invalid")
        dev = _device(device)
        if not isinstance(backend, str):
            raise not_instance("backend", backend, "str")
        if backend not in _BACKENDS:
            raise SafetensorError(f'backend "{backend}" is invalid (expected one of: "mmap", "pread")')
        # Other frameworks are read as numpy, then handed to the framework.
        convert = FROM_NUMPY.get(fw)
        self._framework = "pt" if fw == "pt" else "np"
        self._post = convert if convert is not None else (None if dev is None else (lambda t: t.to(dev)))
        self._paddle = fw == "paddle"
        self._device_error = None
        if dev is not None and fw != "pt":  # Only torch moves tensors to a device.
            self._device_error = f"Device {dev} is not supported for framework {REFERENCE_NAMES.get(fw, fw)}"

    def _check_device(self) -> None:
        # (paddle: after its import, in _opened; the reference moves paddle Tensors to devices, so
        # without paddle it fails on the import.)
        if self._device_error is not None and not self._paddle:
            raise SafetensorError(self._device_error)

    def _opened(self) -> None:
        if self._paddle:
            framework_module("paddle")  # The reference imports paddle once the header is read.
            if self._device_error is not None:
                raise SafetensorError(self._device_error)

    def _open(self) -> _OpenFile:
        f = self._file
        if f is None:
            raise _closed()
        return f

    def __enter__(self) -> "safe_open":
        return self

    def __exit__(self, exc_type, exc_value, traceback) -> None:
        self.close()

    def close(self) -> None:
        """Releases the file now (slices already taken keep it open until they go)."""
        self._file = None

    def keys(self) -> List[str]:
        """Tensor names, sorted."""
        return sorted(self._open().order)

    def offset_keys(self) -> List[str]:
        """Tensor names in the order of their data in the file."""
        return list(self._open().order)

    def metadata(self) -> Optional[Dict[str, str]]:
        """The header's __metadata__ as a dict, or None when it has none."""
        m = self._open().metadata
        return None if m is None else dict(m)

    def get_tensor(self, name: str):
        """Reads one tensor (only its bytes) into memory it owns."""
        _check_name(name)
        f = self._open()
        t = f.read_tensor(name, self._framework)
        return self._post(t) if self._post is not None else t

    def get_tensors(self) -> Dict[str, Any]:
        """Every tensor, in file order, read in one planned load (zero-copy views of its buffers)."""
        f = self._open()
        out = f.read_all(self._framework)
        if self._post is not None:
            out = {k: self._post(v) for k, v in out.items()}
        return out

    def get_slice(self, name: str) -> _SafeSlice:
        """A slice object for `name`: get_shape(), get_dtype() and indexing."""
        _check_name(name)
        return _SafeSlice(self._open(), name, self._framework, self._post)

    def __repr__(self) -> str:
        state = "closed" if self._file is None else repr(self._file.name)
        return f"<tensorlift.safe_open {state} framework={self._framework!r}>"


class _safe_open_handle(safe_open):
    """safe_open over a file the caller has opened: _safe_open_handle(f, framework, device="cpu").

    `f` is a file object with fileno() and name (as `open(path, "rb")` returns, or
    "r"); the file is read through a duplicate of its descriptor, so `f` stays open,
    its position untouched, after this object is closed. The rest is safe_open's.
    """

    def __init__(self, f, framework, device="cpu"):
        fileno = f.fileno  # AttributeError, as the reference, for objects without them.
        name = f.name
        fd = fileno()
        self._arguments(framework, device)
        self._file = _OpenFile(name if isinstance(name, (str, bytes, os.PathLike)) else f"<fd {fd}>", handle_fd=fd,
                               opened=self._check_device)
        self._opened()
