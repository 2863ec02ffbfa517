"""`mpirun -n N tensorlift load --mpi`: each rank reads its balanced share once
(the C++ multi-rank loader), and --checksum prints the same lines as a
single-process load. Skipped where tensorlift was built without MPI or mpirun
is missing (tensorlift doctor says which)."""
import json
import os
import re
import shutil
import subprocess

import pytest
import torch

from conftest import save_sharded

ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


def mpi_or_skip(cli):
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun is not on PATH")
    doctor = json.loads(subprocess.run([str(cli), "doctor", "--json"], capture_output=True, text=True,
                                       check=True).stdout)
    if not doctor["comm"]["mpi_built"]:
        pytest.skip(f"tensorlift was built without MPI: {doctor['comm']['mpi_reason']}")
    return mpirun


def mpirun(cli, n, *args):
    cmd = [mpi_or_skip(cli), "-n", str(n), "--oversubscribe", str(cli), "load", *map(str, args), "--mpi"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=ENV)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """Three shards of uneven size, with an index."""
    g = torch.Generator().manual_seed(7)
    return save_sharded(tmp_path_factory.mktemp("mpi_model"), [
        {f"layers.{i}.w{j}": torch.randn(50 + 41 * i, 32 + j, generator=g).to(torch.bfloat16) for j in range(4)}
        for i in range(3)])


@pytest.mark.parametrize("ranks", [2, 3])
def test_checksums_match_a_single_process_load(cli, sharded, ranks):
    one = subprocess.run([str(cli), "load", str(sharded), "--checksum"], capture_output=True, text=True,
                         timeout=120, check=True)
    many = mpirun(cli, ranks, sharded, "--checksum")
    assert many.returncode == 0, many.stderr
    assert many.stdout == one.stdout
    assert len(many.stdout.splitlines()) == 12
    # Rank 0 reports every rank's share: together they read each byte once.
    shares = [int(m) for m in re.findall(r"^rank \d+ of \d+: read (\d+) bytes", many.stderr, re.M)]
    assert len(shares) == ranks, many.stderr
    total = sum(os.path.getsize(p) - 8 - int.from_bytes(open(p, "rb").read(8), "little")
                for p in sharded.glob("*.safetensors"))
    assert sum(shares) == total
    assert all(s > 0 for s in shares)


def test_filter_and_errors_are_the_same_on_every_rank(cli, sharded, tmp_path):
    got = mpirun(cli, 2, sharded, "--filter", r"^layers\.1\.")
    assert got.returncode == 0, got.stderr
    assert re.search(r"^loaded 4 tensors", got.stdout, re.M), got.stdout
    missing = mpirun(cli, 2, tmp_path / "nope")
    assert missing.returncode != 0
    # Printed once, by rank 0, with the rank whose error it is.
    assert missing.stderr.count("cannot open") == 1, missing.stderr
    assert "rank 0:" in missing.stderr


def test_emulated_device_and_dtype_are_refused(cli, sharded):
    for extra, words in ((["--device", "emulated"], "emulated device lives inside one process"),
                         (["--dtype", "f16"], "--dtype is not supported")):
        r = subprocess.run([str(cli), "load", str(sharded), "--mpi", *extra], capture_output=True, text=True,
                           timeout=60, env=ENV)
        assert r.returncode == 2, r.stderr
        assert words in r.stderr


def test_device_cuda_moves_tensors_over_nccl_or_every_rank_says_why_not(cli, sharded):
    # Each rank loads its share into its own GPU and the tensors move over NCCL.
    # With two GPUs and NCCL the checksums are a single-process load's; without
    # (here: no GPU), every rank fails with the same error, printed once.
    one = subprocess.run([str(cli), "load", str(sharded), "--checksum"], capture_output=True, text=True,
                         timeout=120, check=True)
    many = mpirun(cli, 2, sharded, "--device", "cuda", "--checksum")
    if many.returncode == 0:
        assert many.stdout == one.stdout
    else:
        said = [line for line in many.stderr.splitlines() if line.startswith("--device cuda: ")]
        assert len(said) == 1, many.stderr
        assert "rank " in said[0]
