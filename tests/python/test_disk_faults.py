"""Disk faults (docs/security.md, "Disk faults"): EIO, short reads and ENOSPC injected into
tensorlift's own reads and writes through the seam in io/ (TENSORLIFT_IO_FAULTS, io/faults.h).
A load either hands out every tensor exactly or fails with a clear error and hands out nothing;
`sparsify` and `fetch --out` leave no partial file, and a file they would replace stays intact
for whoever has it mapped."""
import mmap
import os
import subprocess

import pytest
import torch
from safetensors.torch import save_file

from tensorlift._tensorlift import ucx_version

READ_PATHS = [("buffered", "threads"), ("buffered", "uring"), ("direct", "threads"), ("direct", "uring")]


def run(cli, *args, faults=None):
    env = dict(os.environ)
    env.pop("TENSORLIFT_IO_FAULTS", None)
    if faults:
        env["TENSORLIFT_IO_FAULTS"] = faults
    r = subprocess.run([str(cli), *map(str, args)], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode >= 0, f"{args} died of signal {-r.returncode}: {r.stderr}"
    return r


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """Two shards, 9 MB, tensors that span many reads."""
    d = tmp_path_factory.mktemp("disk_faults")
    g = torch.Generator().manual_seed(11)
    save_file({f"layers.{i}.w": torch.randn(512, 1024, generator=g).to(torch.bfloat16) for i in range(4)},
              str(d / "model-00001-of-00002.safetensors"))
    save_file({"big": torch.randn(1000, 1003, generator=g), "tiny": torch.ones(3)},
              str(d / "model-00002-of-00002.safetensors"))
    return d


@pytest.fixture(scope="module")
def checksums(cli, model):
    r = run(cli, "load", model, "--checksum", "--no-progress")
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize("mode,engine", READ_PATHS)
def test_short_reads_everywhere_still_load_exactly(cli, model, checksums, mode, engine):
    r = run(cli, "load", model, "--mode", mode, "--engine", engine, "--checksum", "--no-progress",
            faults="read:short")
    assert r.returncode == 0, r.stderr
    assert r.stdout == checksums


@pytest.mark.parametrize("mode,engine", READ_PATHS)
@pytest.mark.parametrize("faults", ["read:eio@1", "read:eio@2", "read:eio@3",
                                    # Reads made short (many more of them): an error deep in a tensor.
                                    "read:eio@9,read:short", "read:eio@33,read:short"])
def test_an_io_error_at_any_read_fails_the_load_and_hands_out_nothing(cli, model, mode, engine, faults):
    r = run(cli, "load", model, "--mode", mode, "--engine", engine, "--checksum", "--no-progress",
            faults=faults)
    assert r.returncode == 1, r.stderr
    assert r.stdout == ""  # No tensor's checksum: nothing was handed out.
    assert "Input/output error" in r.stderr and "model-0000" in r.stderr, r.stderr


@pytest.mark.parametrize("nth", [12, 20])  # A header read, a tensor's bytes (3 tensors out).
def test_an_io_error_mid_stream_hands_out_only_whole_tensors(model, nth):
    """The streaming interface (tensorlift.stream): the tensors it yields before the error are
    exactly the checkpoint's, then the error, never a tensor with bytes missing."""
    import tensorlift
    from safetensors.torch import load_file
    want = {}
    for f in sorted(model.glob("*.safetensors")):
        want.update(load_file(str(f)))
    code = (
        "import sys, torch, tensorlift\n"
        "got = []\n"
        "try:\n"
        "    for name, t in tensorlift.stream(sys.argv[1], mode='buffered', framework='pt', piece_bytes=1 << 20):\n"
        "        torch.save(t.clone(), sys.argv[2] + '/' + name)\n"
        "        got.append(name)\n"
        "except Exception as e:\n"
        "    print('ERROR', e)\n"
        "print('GOT', ','.join(got))\n")
    if not hasattr(tensorlift, "stream"):
        pytest.skip("no tensorlift.stream")
    import sys
    import tempfile
    with tempfile.TemporaryDirectory() as out:
        env = dict(os.environ, TENSORLIFT_IO_FAULTS=f"read:eio@{nth}")
        r = subprocess.run([sys.executable, "-c", code, str(model), out], capture_output=True, text=True,
                           env=env, timeout=120)
        assert r.returncode == 0, r.stderr
        assert "ERROR" in r.stdout and "Input/output error" in r.stdout, r.stdout
        names = [n for n in r.stdout.split("GOT ", 1)[1].strip().split(",") if n]
        assert 0 < len(names) < len(want), r.stdout
        for n in names:
            assert torch.equal(torch.load(os.path.join(out, n)), want[n]), n


def test_sparsify_out_of_space_leaves_no_partial_file(cli, model, tmp_path):
    out = tmp_path / "sparse"
    for nth in (1, 2, 5):
        r = run(cli, "sparsify", model, out, "--prune", "magnitude:0.5", faults=f"write:enospc@{nth}")
        assert r.returncode != 0, r.stderr
        assert "No space left on device" in r.stderr, r.stderr
        assert not out.exists() or not any(out.iterdir()), list(out.iterdir())
    r = run(cli, "sparsify", model, out, "--prune", "magnitude:0.5", faults="write:short")
    assert r.returncode == 0, r.stderr
    names = sorted(p.name for p in out.iterdir())
    assert names and not any(n.endswith(".partial") or n.startswith(".") for n in names), names
    assert run(cli, "load", out, "--checksum", "--no-progress").returncode == 0


@pytest.mark.skipif(ucx_version() is None, reason="tensorlift was built without UCX (Debian libucx-dev)")
def test_fetch_out_of_space_keeps_the_old_file_intact_for_its_readers(cli, model, checksums, tmp_path):
    """`fetch --out DIR` over a DIR/model.safetensors that another process has mapped: out of
    space mid-write, the old file is exactly as it was (in the mapping and on disk), and no
    temporary file is left; with short writes, the new file is whole."""
    out = tmp_path / "out"
    out.mkdir()
    old = {"old": torch.arange(1000, dtype=torch.int32)}
    save_file(old, str(out / "model.safetensors"))
    before = (out / "model.safetensors").read_bytes()
    with open(out / "model.safetensors", "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mapped:
        for nth in (1, 2, 4):
            r = run(cli, "fetch", "http://127.0.0.1:9", "--model", "m", "--revision", "r", "--fallback", model,
                    "--out", out, "--timeout-ms", "500", faults=f"write:enospc@{nth}")
            assert r.returncode != 0, r.stderr
            assert "No space left on device" in r.stderr, r.stderr
            assert mapped[:] == before
            assert (out / "model.safetensors").read_bytes() == before
            assert sorted(p.name for p in out.iterdir()) == ["model.safetensors"]
        r = run(cli, "fetch", "http://127.0.0.1:9", "--model", "m", "--revision", "r", "--fallback", model,
                "--out", out, "--timeout-ms", "500", faults="write:short")
        assert r.returncode == 0, r.stderr
        assert mapped[:] == before  # The reader's mapping is the old file's, still.
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors"]
    r = run(cli, "load", out / "model.safetensors", "--checksum", "--no-progress")
    assert r.returncode == 0 and r.stdout == checksums, r.stderr


def test_a_malformed_fault_spec_is_said_and_ignored(cli, model, checksums):
    r = run(cli, "load", model, "--checksum", "--no-progress", faults="read:sometimes")
    assert r.returncode == 0 and r.stdout == checksums
    assert "TENSORLIFT_IO_FAULTS ignored" in r.stderr and "eio, enospc or short" in r.stderr
