"""A two-rank torchrun script through tensorlift.fastsafetensors exits 0, every time, under CPU load.

It used to abort at exit in about 4 runs of 10 on a busy machine ("terminate
called without an active exception"): gloo's worker thread destroyed a
finished scatter, holding tensors whose release needs the GIL, after the
interpreter had begun to shut down. Collectives now return only once the
backend has released their tensors (tensorlift.fastsafetensors._Comm._run).
At the old rate, 20 clean runs in a row happen by chance with probability
0.6**20 (about 4e-5).
"""
import os
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import save_file

pytest.importorskip("torch.distributed")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "exit_worker.py")
RUNS = 20


@pytest.fixture(scope="module")
def files_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("exit")
    g = torch.Generator().manual_seed(0)
    save_file({f"a{i}": torch.randn(64, 256, generator=g) for i in range(8)}, str(d / "a.safetensors"))
    save_file({f"b{i}": torch.randn(32, 128, generator=g).to(torch.bfloat16) for i in range(8)},
              str(d / "b.safetensors"))
    return d


def test_two_ranks_exit_zero_every_time_under_load(files_dir):
    # CPU load: one busy process per core, stopped by PID at the end.
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", WORKER,
           str(files_dir)]
    failures = []
    try:
        # Two launches at a time (each with its own free port): more load, half the wall time.
        for start in range(0, RUNS, 2):
            procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                     for _ in range(min(2, RUNS - start))]
            deadline = time.monotonic() + 180
            for i, p in enumerate(procs):
                try:
                    out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    p.kill()
                    out, _ = p.communicate()
                    failures.append((start + i, "timed out", out[-2000:]))
                    continue
                if p.returncode != 0 or "terminate called" in out:
                    failures.append((start + i, p.returncode, out[-2000:]))
    finally:
        for b in burners:
            b.kill()
            b.wait()
    assert not failures, f"{len(failures)} of {RUNS} runs failed: {failures}"
