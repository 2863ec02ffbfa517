"""One timed load by one Python contender, in this (fresh) process.

    python bench/load/contender.py NAME SHARD...

NAME: st_load_file | st_safe_open | fastsafetensors | runai | tl_load | tl_stream
(tensorlift.load and tensorlift.stream with their defaults, from Python). Imports first (not
timed), then times the load of every tensor of every shard plus the pass that
reads each tensor's bytes once (XXH3-64 of each, XORed), keeping every tensor
alive until the end, and prints one JSON object: load_s (the loader's calls),
total_s (load and hash; what the benchmark compares), first_s (from the start to
the first tensor in hand), bytes, tensors, xor.

Hashing: XXH3_64bits from the system's libxxhash (the very library the C++
contenders link), called through ctypes on each tensor's data pointer, so there
is no copy and every contender pays the same cost per byte. The `xxhash` PyPI
package is used instead when libxxhash cannot be loaded.
"""

import ctypes
import ctypes.util
import json
import sys
import time


def _hasher():
    for name in ("libxxhash.so.0", ctypes.util.find_library("xxhash")):
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        fn = lib.XXH3_64bits
        fn.restype = ctypes.c_uint64
        fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        return lambda ptr, n, _fn=fn: _fn(ptr, n)
    import xxhash  # Fallback: the PyPI package (same algorithm, seed 0).

    def via_package(ptr, n):
        return xxhash.xxh3_64_intdigest((ctypes.c_char * n).from_address(ptr) if n else b"")

    return via_package


XXH3 = _hasher()


def tensor_hash(t):
    n = t.numel() * t.element_size()
    assert t.is_contiguous() and t.device.type == "cpu"
    return XXH3(t.data_ptr() if n else None, n), n


class Tally:
    def __init__(self):
        self.xor = 0
        self.bytes = 0
        self.tensors = 0
        self.keep = []  # Every tensor stays alive (loaded) until the end.
        self.first_t = None  # When the first tensor was in hand.

    def add(self, t):
        if self.first_t is None:
            self.first_t = time.perf_counter()
        h, n = tensor_hash(t)
        self.xor ^= h
        self.bytes += n
        self.tensors += 1
        self.keep.append(t)


def run_st_load_file(files, tally):
    from safetensors.torch import load_file

    t0 = time.perf_counter()
    dicts = [load_file(f) for f in files]
    t1 = time.perf_counter()
    for d in dicts:
        for t in d.values():
            tally.add(t)
    return t0, t1


def run_st_safe_open(files, tally):
    from safetensors import safe_open

    t0 = time.perf_counter()
    load_s = 0.0
    for f in files:
        with safe_open(f, framework="pt") as g:
            for k in g.keys():
                a = time.perf_counter()
                t = g.get_tensor(k)
                load_s += time.perf_counter() - a
                tally.add(t)
    return t0, t0 + load_s


def run_fastsafetensors(files, tally):
    from fastsafetensors import SafeTensorsFileLoader, SingleGroup

    t0 = time.perf_counter()
    # The documented CPU set-up: no GDS (its nogds copier reads with O_DIRECT by
    # default in 0.5.0, 16 threads, 16 MiB bounce buffers: its defaults).
    loader = SafeTensorsFileLoader(SingleGroup(), "cpu", nogds=True)
    loader.add_filenames({0: list(files)})
    buf = loader.copy_files_to_device()
    t1 = time.perf_counter()
    load_s = t1 - t0
    for k in loader.get_keys():
        a = time.perf_counter()
        t = buf.get_tensor(k)
        load_s += time.perf_counter() - a
        tally.add(t)
    # Tensors own their storage (shared ownership), so closing now is allowed;
    # it is not timed (tensorlift's time does not include freeing either).
    return t0, t0 + load_s, (buf, loader)


def drain(it, tally):
    """Takes every (name, tensor) of a streaming loader; returns the seconds spent in it."""
    load_s = 0.0
    while True:
        a = time.perf_counter()
        try:
            _, t = next(it)
        except StopIteration:
            return load_s + time.perf_counter() - a
        load_s += time.perf_counter() - a
        tally.add(t)


def run_runai(files, tally):
    from runai_model_streamer import SafetensorsStreamer

    t0 = time.perf_counter()
    with SafetensorsStreamer() as s:
        s.stream_files(list(files))  # owned=True (default): tensors stay valid.
        load_s = drain(s.get_tensors(), tally)
    return t0, t0 + load_s


def run_tl_load(files, tally):
    import tensorlift

    t0 = time.perf_counter()
    tensors = tensorlift.load(list(files))
    t1 = time.perf_counter()
    for t in tensors.values():
        tally.add(t)
    return t0, t1


def run_tl_stream(files, tally):
    import tensorlift

    t0 = time.perf_counter()
    load_s = drain(tensorlift.stream(list(files)), tally)
    return t0, t0 + load_s


CONTENDERS = {
    "tl_load": run_tl_load,
    "tl_stream": run_tl_stream,
    "st_load_file": run_st_load_file,
    "st_safe_open": run_st_safe_open,
    "fastsafetensors": run_fastsafetensors,
    "runai": run_runai,
}


def main():
    name, files = sys.argv[1], sys.argv[2:]
    import torch  # noqa: F401  (imported before the clock starts, for everyone)

    # Import each library before timing, like tensorlift's binary is loaded.
    if name == "st_load_file" or name == "st_safe_open":
        import safetensors.torch  # noqa: F401
    elif name == "fastsafetensors":
        import fastsafetensors  # noqa: F401
    elif name == "runai":
        import runai_model_streamer  # noqa: F401
    elif name.startswith("tl_"):
        import tensorlift  # noqa: F401
    tally = Tally()
    t_start = time.perf_counter()
    res = CONTENDERS[name](files, tally)
    t_end = time.perf_counter()
    t0, t1 = res[0], res[1]
    print(json.dumps({
        "contender": name,
        "load_s": t1 - t0,
        "total_s": t_end - t_start,
        "first_s": None if tally.first_t is None else tally.first_t - t_start,
        "bytes": tally.bytes,
        "tensors": tally.tensors,
        "xor": f"{tally.xor:016x}",
    }), flush=True)
    if len(res) > 2:
        buf, loader = res[2]
        buf.close()
        loader.close()


if __name__ == "__main__":
    main()
