"""One rank of test_fastsafetensors_exit.py, run under torchrun (gloo, CPU).

    torchrun --standalone --nproc-per-node 2 exit_worker.py DIR

What a new user's two-rank script does: load every *.safetensors in DIR with
tensorlift.fastsafetensors (assign_files, SafeTensorsFileLoader,
copy_files_to_device, get_tensor, get_sharded), check every tensor against
safetensors' load_file, close, destroy the process group, and exit. It exits
0 when every tensor was right; the test requires that of every run (the
process used to abort at exit while gloo's worker still held a scatter's
tensors). Not a test module itself (no test_ prefix).
"""
import os
import sys

import torch
import torch.distributed as dist
from safetensors.torch import load_file

import tensorlift.fastsafetensors as tlf


# Module level, as a user's script is: the last tensors stay referenced until exit.
d = sys.argv[1]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
files = sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".safetensors"))
loader = tlf.SafeTensorsFileLoader(dist.group.WORLD, "cpu", nogds=True)
loader.add_filenames(tlf.assign_files(files, world))
fb = loader.copy_files_to_device()
fb.auto_mem_delete = False
ref = {}
for f in files:
    ref.update(load_file(f))
for name in fb.keys():
    t = fb.get_tensor(name)
    assert torch.equal(t, ref[name]), name
    s = fb.get_sharded(name, 0)
    block = (ref[name].shape[0] + world - 1) // world
    assert torch.equal(s, ref[name][rank * block:(rank + 1) * block]), name
fb.close()
loader.close()
dist.destroy_process_group()
