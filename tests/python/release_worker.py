"""One rank of test_fastsafetensors_exit.py's release test, run under torchrun (gloo, CPU).

    torchrun --standalone --nproc-per-node 2 release_worker.py ROUNDS

Runs ROUNDS scatters and broadcasts through tensorlift.fastsafetensors'
collectives and checks, the moment each returns, that gloo's worker thread
holds no reference to the tensors and has no release of them pending: their
Python and C++ reference counts are back where they were. Exits 1 and says how
often that failed. Not a test module itself (no test_ prefix).
"""
import sys

import torch
import torch.distributed as dist

import tensorlift.fastsafetensors as tlf


def holders(tensors):
    return [(sys.getrefcount(t), t._use_count()) for t in tensors]


rounds = int(sys.argv[1])
dist.init_process_group("gloo")
pg = dist.group.WORLD
rank, world = dist.get_rank(), dist.get_world_size()
comm = tlf._Comm(pg, world, rank, "cpu")
late = 0
for i in range(rounds):
    out = torch.empty(4096, dtype=torch.uint8)
    chunks = [torch.full((4096,), r, dtype=torch.uint8) for r in range(world)] if rank == 0 else None
    tensors = [out] + (chunks or [])
    before = holders(tensors)
    comm._run("scatter", lambda: dist.scatter(out, scatter_list=chunks, src=0, group=pg), tensors)
    late += holders(tensors) != before
    assert int(out[0]) == rank
    buf = torch.full((4096,), i % 251, dtype=torch.uint8) if rank == 0 else torch.empty(4096, dtype=torch.uint8)
    before = holders([buf])
    comm.broadcast(buf, 0)
    late += holders([buf]) != before
    assert int(buf[-1]) == i % 251
print(f"rank {rank}: {late} of {2 * rounds} collectives returned before gloo let go of their tensors", flush=True)
dist.destroy_process_group()
sys.exit(1 if late else 0)
