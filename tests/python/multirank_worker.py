"""One rank of test_fastsafetensors_multirank.py, run under torchrun (gloo, CPU).

    torchrun --standalone --nproc-per-node N multirank_worker.py DIR OUT MODE

DIR holds the *.safetensors written by the test; OUT gets rank<r>.json. MODE:
- ok: load with tensorlift.fastsafetensors (files from assign_files), check
  every result against the reference (safetensors.torch.load_file and
  fastsafetensors' slicing rule), and compare with fastsafetensors multi-rank
  where it works on gloo;
- fail: twice, "missing" (the last rank's list names a missing file, so
  add_filenames fails there) and "truncated" (the last rank's file is cut
  short after its header was read, so copy_files_to_device fails there).
  Every rank records the error it got, waits for the others (the group still
  works: the ranks agreed on the failure), and exits 3.
Not a test module itself (no test_ prefix).
"""
import json
import os
import shutil
import sys
import traceback

import torch
import torch.distributed as dist
from safetensors.torch import load_file

import tensorlift.fastsafetensors as tlf

opened, loads = [], []
_RealCheckpoint = tlf.Checkpoint


class _Counted:
    """Wraps a Checkpoint to record which files this rank opens and reads."""

    def __init__(self, ckpt, path):
        self._ckpt, self._path = ckpt, path

    def load(self, *args, **kwargs):
        loads.extend(self._path if isinstance(self._path, list) else [self._path])
        return self._ckpt.load(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._ckpt, name)


class _CountingCheckpoint:
    @staticmethod
    def open(path):
        opened.append(path)
        return _Counted(_RealCheckpoint.open(path), path)

    @staticmethod
    def open_files(paths):  # several of this rank's files as one load
        return _Counted(_RealCheckpoint.open_files(paths), list(paths))


tlf.Checkpoint = _CountingCheckpoint


def raw(t):
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def same(a, b):
    return a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape) and raw(a) == raw(b)


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


def shard(full, dim, world, rank):
    """fastsafetensors' rule, written independently: block = ceil(n / world), Python slicing clips."""
    block = -(-full.shape[dim] // world)
    index = [slice(None)] * dim + [slice(rank * block, (rank + 1) * block)]
    return full[tuple(index)]


def run_ok(files, world, rank, pg, report):
    ref = {}
    for f in files:
        ref.update(load_file(f))
    assignment = tlf.assign_files(files, world)
    report["assignment"] = assignment
    loader = tlf.SafeTensorsFileLoader(pg, "cpu", nogds=True)
    loader.add_filenames(assignment)
    expect(sorted(loader.get_keys()) == sorted(ref), f"keys {loader.get_keys()}")
    expect(sorted(opened) == sorted(assignment[rank]), f"opened {opened}, own {assignment[rank]}")
    for name, want in ref.items():
        expect(loader.get_shape(name) == list(want.shape), f"shape of {name}")

    fb = loader.copy_files_to_device()
    expect(sorted(loads) == sorted(assignment[rank]), f"read {loads}, own {assignment[rank]}")
    owner = {name: r for r, fs in assignment.items() for f in fs for name in load_file(f)}
    expect({k: v[0] for k, v in fb.key_to_rank_lidx.items()} == owner, "key_to_rank_lidx owners")
    fb.auto_mem_delete = False  # several requests per tensor in this pass
    checks = 0
    for name in sorted(ref):
        full = ref[name]
        expect(same(fb.get_tensor(name), full), f"get_tensor({name})")
        expect(same(fb.get_sharded(name, -1), full), f"get_sharded({name}, -1)")
        checks += 2
        for dim in range(full.dim()):
            got = fb.get_sharded(name, dim)
            expect(same(got, shard(full, dim, world, rank)), f"get_sharded({name}, {dim}) {tuple(got.shape)}")
            if full.shape[dim] % world == 0:
                expect(same(got, torch.chunk(full, world, dim)[rank]), f"chunk({name}, {dim})")
            checks += 1
        if full.dim() == 0 and world > 1:
            try:
                fb.get_sharded(name, 0)
                expect(False, f"get_sharded({name}, 0) of a scalar did not raise")
            except ValueError:
                checks += 1
    got = fb.get_multi_cols(["w", "w2"], 1).get_raw()
    want = torch.cat([shard(ref["w"], 1, world, rank), shard(ref["w2"], 1, world, rank)], dim=1)
    expect(same(got, want), "get_multi_cols(w, w2, 1)")
    d = fb.as_dict({"h": 0, "bf": 1, "ids": -1})
    expect(same(d["h"].get_raw(), shard(ref["h"], 0, world, rank)), "as_dict h")
    expect(same(d["bf"].get_raw(), shard(ref["bf"], 1, world, rank)), "as_dict bf")
    expect(same(d["ids"].get_raw(), ref["ids"]), "as_dict ids")
    pushed = fb.push_tensor("f8", world - 1)
    if rank == world - 1:
        expect(pushed is not None and same(pushed, ref["f8"]), "push_tensor f8")
    else:
        expect(pushed is None, "push_tensor on another rank")
    checks += 5
    fb.close()

    # Auto release, as fastsafetensors: each tensor once, then its file's buffer is gone.
    fb = loader.copy_files_to_device()
    expect(fb.auto_mem_delete == (world > 1), "auto_mem_delete default")
    for name in sorted(ref):
        expect(same(fb.get_tensor(name), ref[name]), f"second pass get_tensor({name})")
    if world > 1:
        expect(all(e.released and e.tensors is None for e in fb._entries), "buffers released")
        try:
            fb.get_tensor("w")
            expect(False, "a released tensor was handed out again")
        except ValueError as e:
            expect("released" in str(e), str(e))
    fb.close()
    loader.close()
    report["checks"] = checks
    report["fastsafetensors"] = compare_fastsafetensors(files, assignment, world, rank, pg, ref)


def compare_fastsafetensors(files, assignment, world, rank, pg, ref):
    """The same calls on fastsafetensors 0.5 (gloo, cpu, nogds), where it works there."""
    try:
        import fastsafetensors as fst
    except ImportError:
        return {"skipped": "fastsafetensors is not installed"}
    rl = fst.SafeTensorsFileLoader(pg, "cpu", nogds=True)
    rl.add_filenames(assignment)
    ol = tlf.SafeTensorsFileLoader(pg, "cpu", nogds=True)
    ol.add_filenames(assignment)
    expect(ol.get_keys() == rl.get_keys(), f"get_keys {ol.get_keys()} vs {rl.get_keys()}")
    rfb, ofb = rl.copy_files_to_device(), ol.copy_files_to_device()
    expect(sorted(ofb.key_to_rank_lidx.items()) == sorted(rfb.key_to_rank_lidx.items()), "key_to_rank_lidx")
    rfb.auto_mem_delete = ofb.auto_mem_delete = False
    compared, skipped = [], []
    for name in sorted(ref):
        full = ref[name]
        for dim in [-1] + list(range(full.dim())):
            # Known fastsafetensors 0.5 failures on gloo (they end the process group, so skip them):
            # float8 ("Invalid scalar type"), uneven sizes ("invalid tensor size" in scatter),
            # and sharding a zero-size tensor ("invalid tensor size ... expected ()").
            if world > 1 and dim >= 0 and full.numel() == 0:
                skipped.append(f"{name}@{dim}: zero-size tensor")
                continue
            if world > 1 and full.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
                skipped.append(f"{name}@{dim}: float8 over gloo")
                continue
            if world > 1 and dim >= 0 and full.shape[dim] % world:
                skipped.append(f"{name}@{dim}: {full.shape[dim]} not divisible by {world}")
                continue
            r, o = rfb.get_sharded(name, dim), ofb.get_sharded(name, dim)
            expect(same(o, r), f"fastsafetensors get_sharded({name}, {dim})")
            compared.append(f"{name}@{dim}")
    rfb.close()
    ofb.close()
    rl.close()
    ol.close()
    return {"compared": compared, "skipped": skipped}


def run_failure(files, world, rank, pg, mode, out_dir, report):
    assignment = tlf.assign_files(files, world)
    bad_rank = world - 1
    if mode == "missing":
        assignment[bad_rank] = assignment[bad_rank] + [os.path.join(os.path.dirname(files[0]), "missing.safetensors")]
    elif mode == "truncated" and rank == bad_rank:
        victim = os.path.join(out_dir, f"cut{rank}.safetensors")
        shutil.copyfile(assignment[bad_rank][0], victim)
    if mode == "truncated":  # every rank names the same path for the last rank's copy
        assignment[bad_rank] = [os.path.join(out_dir, f"cut{bad_rank}.safetensors")] + assignment[bad_rank][1:]
        dist.barrier()
    loader = tlf.SafeTensorsFileLoader(pg, "cpu", nogds=True)
    try:
        loader.add_filenames(assignment)
        if mode == "truncated" and rank == bad_rank:
            with open(assignment[bad_rank][0], "r+b") as f:  # header read; now cut the data
                f.truncate(os.path.getsize(assignment[bad_rank][0]) - 16)
        loader.copy_files_to_device()
        report["error"] = None
    except Exception as e:  # noqa: BLE001
        report["error"] = {"type": type(e).__name__, "message": str(e)}
    if world > 1:
        dist.barrier()  # every rank got here: the failure was agreed, nobody hangs


def main():
    files_dir, out_dir, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    pg = dist.group.WORLD
    files = sorted(os.path.join(files_dir, f) for f in os.listdir(files_dir) if f.endswith(".safetensors"))
    report = {"rank": rank, "world": world, "mode": mode}
    code = 0
    try:
        if mode == "ok":
            run_ok(files, world, rank, pg, report)
        else:  # "fail": one rank fails opening, then (same group, still usable) one fails reading
            for sub in ("missing", "truncated"):
                report[sub] = {}
                run_failure(files, world, rank, pg, sub, out_dir, report[sub])
            code = 3 if all(report[sub]["error"] for sub in ("missing", "truncated")) else 0
        report["opened"], report["loaded"] = opened, loads
    except Exception:  # noqa: BLE001
        report["failure"] = traceback.format_exc()
        code = 1
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(report, f, indent=1)
    if code == 0:
        dist.destroy_process_group()
    sys.exit(code)


if __name__ == "__main__":
    main()
