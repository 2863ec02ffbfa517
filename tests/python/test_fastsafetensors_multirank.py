"""tensorlift.fastsafetensors with several ranks: torchrun (gloo, CPU) on multirank_worker.py.

Each launch runs N ranks; every rank checks its own results (against
safetensors' full tensors and fastsafetensors' slicing rule, and against
fastsafetensors 0.5 multi-rank where that works on gloo) and writes
rank<r>.json, which the test reads back.
"""
import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file

import tensorlift.fastsafetensors as tlf

pytest.importorskip("torch.distributed")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multirank_worker.py")


@pytest.fixture(scope="module")
def files_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("multirank")
    g = torch.Generator().manual_seed(0)
    save_file({  # uneven dims: 10 rows (4 ranks: 3, 3, 3, 1), 7 columns
        "w": torch.randn(10, 6, generator=g),
        "w2": torch.randn(10, 4, generator=g),
        "bf": torch.randn(8, 7, generator=g).to(torch.bfloat16),
    }, str(d / "a.safetensors"))
    save_file({
        "h": torch.randn(4, 9, generator=g).to(torch.float16),
        "ids": torch.arange(30, dtype=torch.int64).reshape(6, 5),
    }, str(d / "b.safetensors"))
    save_file({  # 3 rows: with 4 ranks the last one gets an empty slice
        "f8": torch.randn(8, 4, generator=g).to(torch.float8_e4m3fn),
        "small": torch.randn(3, 2, generator=g),
    }, str(d / "c.safetensors"))
    save_file({
        "big": torch.randn(64, 32, generator=g),
        "scalar": torch.tensor(2.5, dtype=torch.float64),
        "empty": torch.zeros(0, 3),
    }, str(d / "d.safetensors"))
    return d


def launch(n, files_dir, out_dir, mode):
    os.makedirs(out_dir, exist_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}",
           WORKER, str(files_dir), str(out_dir), mode]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    # A watchdog (a hung rank fails the test), not a bound: up to five processes that import torch
    # share two cores here with the suites CI runs beside.
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    reports = {}
    for r in range(n):
        path = os.path.join(out_dir, f"rank{r}.json")
        if os.path.exists(path):
            with open(path) as f:
                reports[r] = json.load(f)
    return proc, reports


@pytest.mark.parametrize("n", [1, 2, 4])
def test_ranks_get_the_reference_tensors(files_dir, tmp_path, n):
    proc, reports = launch(n, files_dir, tmp_path / "out", "ok")
    failures = {r: rep.get("failure") for r, rep in reports.items() if rep.get("failure")}
    assert proc.returncode == 0 and not failures, (failures, proc.stderr[-4000:])
    assert sorted(reports) == list(range(n))
    assignment = {int(k): v for k, v in reports[0]["assignment"].items()}
    assert assignment == tlf.assign_files(sorted(str(p) for p in files_dir.glob("*.safetensors")), n)
    for r, rep in reports.items():
        assert rep["checks"] > 40
        # Each rank opened and read only its own files (the second and third loads read them again).
        assert set(rep["opened"]) == set(assignment[r]) and set(rep["loaded"]) == set(assignment[r])
        fst = rep["fastsafetensors"]
        if "skipped" not in fst or isinstance(fst["skipped"], list):
            assert len(fst["compared"]) >= 10
            if n == 1:
                assert fst["skipped"] == []


def test_one_rank_failing_fails_every_rank(files_dir, tmp_path):
    n = 4
    proc, reports = launch(n, files_dir, tmp_path / "out", "fail")
    assert proc.returncode != 0  # the launcher fails (within the timeout: no hang)
    assert sorted(reports) == list(range(n)), proc.stderr[-4000:]
    bad = n - 1
    for mode in ("missing", "truncated"):
        bad_err = reports[bad][mode]["error"]
        assert bad_err is not None, mode
        if mode == "missing":  # the failing rank raises its own error
            assert bad_err["type"] == "FileNotFoundError", bad_err
        for r, rep in reports.items():
            assert not rep.get("failure"), rep["failure"]
            err = rep[mode]["error"]
            if r != bad:
                assert err["type"] == "DistributedLoadError", (mode, r, err)
                assert f"rank {bad}: {bad_err['type']}" in err["message"], (mode, err)


def test_assign_files_balances_bytes(tmp_path):
    sizes = {"a": 100, "b": 70, "c": 60, "d": 30, "e": 30, "f": 10}
    got = tlf.assign_files(list(sizes), 2, sizes=sizes)
    # Largest first to the lightest rank: a->0, b->1, c->1, d->0, e->0 (130 vs 130: lowest rank), f->1.
    assert got == {0: ["a", "d", "e"], 1: ["b", "c", "f"]}
    assert tlf.assign_files(list(reversed(list(sizes))), 2, sizes=sizes) == got  # order does not matter
    assert tlf.assign_files(list(sizes), 8, sizes=sizes)[7] == []
    p = tmp_path / "x.safetensors"
    save_file({"x": torch.zeros(4)}, str(p))
    assert tlf.assign_files([p], 1) == {0: [str(p)]}
    with pytest.raises(ValueError, match="world_size"):
        tlf.assign_files([p], 0)
    with pytest.raises(ValueError, match="more than once"):
        tlf.assign_files([p, str(p)], 2)


def test_shard_ranges_are_the_cpp_rule():
    """_shard_ranges is the C++ ShardRange (one rule for the project): ceil blocks, the last clipped."""
    from tensorlift import _tensorlift
    from tensorlift.fastsafetensors import _shard_ranges
    assert _shard_ranges(10, 4) == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert _shard_ranges(6, 4) == [(0, 2), (2, 4), (4, 6), (6, 6)]
    assert _shard_ranges(0, 3) == [(0, 0)] * 3
    for size in range(0, 30):
        for world in range(1, 9):
            chunks = [len(c) for c in torch.arange(size).chunk(world)] if size else []
            got = [b - a for a, b in _shard_ranges(size, world)]
            assert got[:len(chunks)] == chunks and not any(got[len(chunks):]), (size, world)
    with pytest.raises(ValueError, match="rank"):
        _tensorlift.shard_range(10, 4, 4)
    with pytest.raises(ValueError, match="world"):
        _tensorlift.shard_range(10, 0, 0)
