"""One rank of one timed multi-rank load (issue #6), run by dist_bench.py under torchrun.

    torchrun --standalone --nproc-per-node N bench/dist/worker.py CONTENDER PLAN OUT

CONTENDER: tensorlift | fastsafetensors (tensorlift.fastsafetensors, or the
real fastsafetensors 0.5), both as SafeTensorsFileLoader(WORLD, "cpu",
nogds=True) over a gloo process group. PLAN: a JSON file from the harness with
"assignment" ({rank: [files]}, the same for both contenders) and "dims" ({name:
0 | -1}: 0 = get_sharded(name, 0), -1 = get_tensor(name)). OUT: rank 0 writes
every rank's figures there (one JSON object).

Imports, the process group and a barrier come first (not timed). Then each
rank times, from just before the loader is made: add_filenames,
copy_files_to_device, and one get_sharded / get_tensor per tensor in
get_keys() order (every rank makes the same calls, fastsafetensors' SPMD
contract); that is `load_s`. Then the checksum pass (XXH3-64 of each result,
XORed; the hasher of bench/load/contender.py) ends `total_s`. Every result
stays alive until the end. Per rank: read_bytes of /proc/self/io (the bytes
this process made the kernel fetch from storage), the bytes of its own files,
peak RSS (getrusage) and the RSS when the clock started.
"""

import json
import os
import resource
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "load"))


def read_bytes():
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    return 0


def rss_now():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main():
    contender, plan_path, out_path = sys.argv[1], sys.argv[2], sys.argv[3]
    import torch
    import torch.distributed as dist

    from contender import tensor_hash  # bench/load/contender.py: XXH3-64 through libxxhash

    with open(plan_path) as f:
        plan = json.load(f)
    assignment = {int(r): fs for r, fs in plan["assignment"].items()}
    dims = plan["dims"]
    if contender == "tensorlift":
        from tensorlift.fastsafetensors import SafeTensorsFileLoader
    elif contender == "fastsafetensors":
        from fastsafetensors import SafeTensorsFileLoader
    else:
        raise SystemExit(f"worker: unknown contender {contender!r}")

    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    pg = dist.group.WORLD
    own_bytes = sum(os.path.getsize(p) for p in assignment.get(rank, []))
    dist.barrier()

    io0, rss0 = read_bytes(), rss_now()
    t0 = time.perf_counter()
    loader = SafeTensorsFileLoader(pg, "cpu", nogds=True)
    loader.add_filenames(assignment)
    fb = loader.copy_files_to_device()
    t_read = time.perf_counter()
    keep = []
    sharded = whole = 0
    for name in loader.get_keys():
        if dims[name] == 0:
            keep.append(fb.get_sharded(name, 0))
            sharded += 1
        else:
            keep.append(fb.get_tensor(name))
            whole += 1
    t1 = time.perf_counter()
    xor = nbytes = 0
    for t in keep:
        h, n = tensor_hash(t.contiguous())
        xor ^= h
        nbytes += n
    t2 = time.perf_counter()
    io1 = read_bytes()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    mine = {"rank": rank, "load_s": t1 - t0, "copy_s": t_read - t0, "total_s": t2 - t0,
            "read_bytes": io1 - io0, "own_file_bytes": own_bytes, "own_files": len(assignment.get(rank, [])),
            "peak_rss_bytes": peak, "rss_at_start_bytes": rss0, "result_bytes": nbytes,
            "sharded": sharded, "whole": whole, "xor": f"{xor:016x}"}
    times = torch.tensor([t1 - t0, t2 - t0], dtype=torch.float64)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    ranks = [None] * world
    dist.all_gather_object(ranks, mine)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump({"contender": contender, "world": world, "load_s": float(times[0]),
                       "total_s": float(times[1]), "ranks": ranks}, f)
    del keep
    fb.close()
    loader.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
