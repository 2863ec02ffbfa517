"""One timed load of the GPU benchmark (bench/gpu/gpu_bench.py), in its own process.

    python bench/gpu/contender.py NAME DEVICE FILE...

Loads every tensor of FILE... into DEVICE's memory (cuda:N; "emulated" for
tensorlift's emulated device, tensorlift contenders only) and prints one
JSON object: load_s (from just before the first loader call to the moment
every tensor is in device memory, the device synchronized), bytes, tensors,
peak RSS, and a checksum of every tensor's bytes computed on the device after
the clock stopped (the benchmark checks that every contender got the same
bytes). Imports happen before the clock starts, for every contender.

Contenders:
  tensorlift            tensorlift.load(files, device) with its defaults
                        (cuFile when GDS works here, else the pinned pipeline)
  tensorlift_pinned     the same with gds=False: the pinned pipeline
  st_load_file          safetensors.torch.load_file(file, device=DEVICE)
  fastsafetensors_gds   fastsafetensors 0.5 SafeTensorsFileLoader(nogds=False)
  fastsafetensors_nogds the same with nogds=True
  instanttensor         instanttensor.safe_open(files, device=N), each tensor cloned
                        (its tensors live in a reused buffer, as its README says)
  runai                 runai-model-streamer's SafetensorsStreamer (to host),
                        each tensor then .to(DEVICE)
  tensorlift_scheduling the emulated device only, a diagnostic: tensorlift with
                        TENSORLIFT_EMULATED_DISCARD_COPIES=1 (copies take the
                        copy model's time, move no bytes: its tensors are wrong)
"""
import json
import os
import resource
import sys
import time


def checksum(tensors):
    """A position-dependent sum of every tensor's bytes, computed on the device."""
    import torch
    total = 0
    for name in sorted(tensors):
        t = tensors[name]
        b = t.contiguous().reshape(-1).view(torch.uint8)
        n = b.numel()
        if n == 0:
            continue
        w = (torch.arange(n, device=b.device, dtype=torch.int64) % 65521) + 1
        total = (total * 1000003 + int((b.to(torch.int64) * w).sum().item())) % (1 << 61)
    return f"{total:016x}"


def run_tensorlift(files, device):
    import tensorlift
    t0 = time.perf_counter()
    out = tensorlift.load(files, device=device)
    sync(device)
    return t0, out


def run_tensorlift_checkpoint(files, device, gds, torch_tensors):
    """Every file in one Checkpoint.load, one pipeline over all of them, as tensorlift.load does
    (tensorlift.load has no GDS switch). With torch_tensors False (the emulated device, which torch
    cannot touch) the result is the Loaded object, {"all": Loaded}; the emulated device is opened
    before the clock starts (with TENSORLIFT_EMULATED_PREFAULT_GB its memory is faulted in then, as a
    GPU's exists before a load)."""
    from tensorlift._core import tensor_from
    from tensorlift._tensorlift import Checkpoint
    if device == "emulated":
        Checkpoint.open(files[0]).load(device=device, names=[])  # opens the device, loads nothing
    t0 = time.perf_counter()
    loaded = Checkpoint.open_files(list(files)).load(device=device, gds=gds)
    out = {n: tensor_from(loaded, n, "pt") for n in loaded.names()} if torch_tensors else {"all": loaded}
    sync(device)
    return t0, out


def run_st_load_file(files, device):
    from safetensors.torch import load_file
    t0 = time.perf_counter()
    out = {}
    for f in files:
        out.update(load_file(f, device=device))
    sync(device)
    return t0, out


def run_fastsafetensors(files, device, nogds):
    from fastsafetensors import SafeTensorsFileLoader, SingleGroup
    t0 = time.perf_counter()
    loader = SafeTensorsFileLoader(SingleGroup(), device, nogds=nogds)
    loader.add_filenames({0: list(files)})
    fb = loader.copy_files_to_device()
    out = {k: fb.get_tensor(k) for k in loader.get_keys()}
    sync(device)
    return t0, out


def run_instanttensor(files, device):
    from instanttensor import safe_open
    index = int(device.split(":", 1)[1]) if ":" in device else 0
    t0 = time.perf_counter()
    out = {}
    with safe_open(list(files), framework="pt", device=index) as f:
        for name, t in f.tensors():
            out[name] = t.clone()
    sync(device)
    return t0, out


def run_runai(files, device):
    from runai_model_streamer import SafetensorsStreamer
    t0 = time.perf_counter()
    out = {}
    with SafetensorsStreamer() as s:
        s.stream_files(list(files))
        for name, t in s.get_tensors():
            out[name] = t.to(device, non_blocking=False)
    sync(device)
    return t0, out


def sync(device):
    if device.startswith("cuda"):
        import torch
        torch.cuda.synchronize(device)


def main():
    name, device, files = sys.argv[1], sys.argv[2], sys.argv[3:]
    if name == "tensorlift_scheduling":
        if device != "emulated":
            sys.exit("contender tensorlift_scheduling: a diagnostic of the emulated device")
        os.environ["TENSORLIFT_EMULATED_DISCARD_COPIES"] = "1"  # Before the device is opened.
    import torch  # before the clock, for every contender (tensorlift imports it lazily)
    if device.startswith("cuda"):
        torch.cuda.init()
        torch.empty(1, device=device)  # the CUDA context, before the clock (every contender needs one)
    imports = {"tensorlift": "tensorlift", "tensorlift_pinned": "tensorlift", "tensorlift_scheduling": "tensorlift",
               "st_load_file": "safetensors.torch",
               "fastsafetensors_gds": "fastsafetensors", "fastsafetensors_nogds": "fastsafetensors",
               "instanttensor": "instanttensor", "runai": "runai_model_streamer"}
    __import__(imports[name])
    if device == "emulated":
        if name not in ("tensorlift", "tensorlift_scheduling"):
            sys.exit(f"contender {name}: needs a GPU (torch cannot use the emulated device)")
        t0, out = run_tensorlift_checkpoint(files, device, True, False)
    elif name == "tensorlift":
        t0, out = run_tensorlift(files, device)
    elif name == "tensorlift_pinned":
        t0, out = run_tensorlift_checkpoint(files, device, False, True)
    elif name == "st_load_file":
        t0, out = run_st_load_file(files, device)
    elif name.startswith("fastsafetensors"):
        t0, out = run_fastsafetensors(files, device, name.endswith("nogds"))
    elif name == "instanttensor":
        t0, out = run_instanttensor(files, device)
    elif name == "runai":
        t0, out = run_runai(files, device)
    else:
        sys.exit(f"unknown contender {name}")
    load_s = time.perf_counter() - t0
    if device == "emulated":
        names = [n for lo in out.values() for n in lo.names()]
        nbytes = sum(lo.info(n)[2] for lo in out.values() for n in lo.names())
        sums = "n/a (emulated)"
        count = len(names)
    else:
        nbytes = sum(t.numel() * t.element_size() for t in out.values())
        count = len(out)
        sums = checksum(out)
    print(json.dumps({"contender": name, "load_s": load_s, "bytes": nbytes, "tensors": count, "checksum": sums,
                      "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}), flush=True)


if __name__ == "__main__":
    main()
