"""The C++ examples (examples/): multi-rank loading under mpirun and loading
from a peer, run on a small sharded checkpoint and checked against torch."""
import json
import os
import re
import shutil
import subprocess

import pytest
import torch
from safetensors.torch import load_file

from conftest import save_sharded, tool

ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


def doctor(cli):
    return json.loads(subprocess.run([str(cli), "doctor", "--json"], capture_output=True, text=True,
                                     check=True).stdout)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    g = torch.Generator().manual_seed(3)
    return save_sharded(tmp_path_factory.mktemp("example_model"), [
        {f"layers.{i}.w": torch.randn(9 + 4 * i, 6, generator=g), f"layers.{i}.b": torch.randn(6, generator=g)}
        for i in range(2)])


@pytest.mark.parametrize("ranks", [2, 3])
def test_distributed_load_example(cli, model, ranks):
    if shutil.which("mpirun") is None or not doctor(cli)["comm"]["mpi_built"]:
        pytest.skip("no MPI here (mpirun missing or tensorlift built without it)")
    exe = tool("tl_example_distributed_load")
    r = subprocess.run(["mpirun", "-n", str(ranks), "--oversubscribe", str(exe), str(model)],
                       capture_output=True, text=True, timeout=120, env=ENV)
    assert r.returncode == 0, r.stderr
    want = {}
    for f in model.glob("*.safetensors"):
        want.update(load_file(str(f)))
    read = [int(m) for m in re.findall(r"^rank \d+ read (\d+) bytes$", r.stdout, re.M)]
    assert len(read) == ranks and sum(read) == sum(t.nbytes for t in want.values())
    for rank in range(ranks):
        for name, t in want.items():
            shape = list(t.shape)
            if t.dim() >= 2:  # This rank's rows: blocks of ceil(n / ranks), the last clipped.
                block = -(-shape[0] // ranks)
                start = min(rank * block, shape[0])
                shape[0] = min(block, shape[0] - start)
            nbytes = t.element_size() * (torch.Size(shape).numel() if shape else 1)
            line = f"rank {rank}: {name} [{','.join(map(str, shape))}] {nbytes} bytes"
            assert line in r.stdout.splitlines(), (line, r.stdout)


def test_peer_load_example(cli, model):
    remote = doctor(cli)["remote"]
    if not remote["ucx_built"]:
        pytest.skip(f"tensorlift was built without UCX: {remote['ucx_reason']}")
    r = subprocess.run([str(tool("tl_example_peer_load")), str(model)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert re.search(r"^pulled 4 tensors, \d+ bytes from http://127\.0\.0\.1:\d+ in ", r.stdout, re.M), r.stdout
    assert "every tensor matches the disk load" in r.stdout
