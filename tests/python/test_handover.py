"""Same-host handover between processes (docs/remote.md, "Same-host handover"): a resident
`tensorlift serve --resident` found by its key alone, its sealed shared memory mapped by
`tensorlift fetch` and by Python's load_from_peer with no byte copied; the seed killed with
SIGKILL while a client maps its memory (the tensors stay right); Python's copy-on-write tensors
written without touching the seed; and a seed that does not offer it."""
import os
import signal
import subprocess
import uuid

import pytest
import torch
from safetensors.torch import save_file

import tensorlift
import tensorlift.remote as remote
from tensorlift._tensorlift import ucx_version

from test_cli_remote import Serving, load_checksums, run

pytestmark = pytest.mark.skipif(ucx_version() is None, reason="tensorlift was built without UCX (Debian libucx-dev)")


@pytest.fixture()
def ckpt(tmp_path):
    g = torch.Generator().manual_seed(11)
    t = {f"layers.{i}.w": torch.randn(256, 512, generator=g).to(torch.bfloat16) for i in range(4)}
    t["big"] = torch.randn(1 << 20, generator=g)
    save_file(t, str(tmp_path / "model.safetensors"))
    return tmp_path


@pytest.fixture()
def model():
    """A model name of this test alone: resident seeds are found by key, host-wide."""
    return ["--model", "handover-" + uuid.uuid4().hex[:12], "--revision", "r1"]


@pytest.fixture()
def resident(cli, ckpt, model):
    started = []

    def start(*args):
        s = Serving(cli, ckpt, *model, "--resident", *args, handover=True)
        started.append(s)
        return s
    yield start
    for s in started:
        s.kill()


def test_fetch_finds_the_resident_seed_by_key_and_maps_its_memory(cli, ckpt, model, resident):
    s = resident()
    r = run(cli, "fetch", *model, "--checksum")  # No URL, no registry, no fallback.
    assert r.returncode == 0, r.stderr
    assert f"from {s.url} (1 source ranks, handed over)" in r.stderr, r.stderr
    assert "sealed shared memory mapped read-only" in r.stderr
    assert r.stdout == load_checksums(cli, ckpt)
    # Pulled over UCX when asked, from the same seed; the same bytes.
    r = run(cli, "fetch", *model, "--checksum", "--handover", "off")
    assert r.returncode == 0, r.stderr
    assert "handed over" not in r.stderr and f"from {s.url}" in r.stderr
    assert r.stdout == load_checksums(cli, ckpt)
    r = run(cli, "fetch", *model, "--checksum", "--handover-verify")
    assert r.returncode == 0 and "every chunk checked" in r.stderr, r.stderr


def test_a_second_resident_seed_of_the_same_key_is_refused(cli, ckpt, model, resident):
    resident()
    with pytest.raises(RuntimeError, match="already taken"):
        resident()


def test_the_tensors_outlive_a_seed_killed_with_sigkill(cli, ckpt, model, resident):
    s = resident()
    name, revision = model[1], model[3]
    got = remote.load_from_peer(model=name, revision=revision)
    report = remote.last_report()
    assert report["handover"] and report["source"] == s.url, report
    s.proc.send_signal(signal.SIGKILL)
    s.proc.wait(timeout=30)
    want = tensorlift.load(str(ckpt / "model.safetensors"))
    assert set(got) == set(want)
    for k in want:
        assert torch.equal(got[k], want[k]), k
    # With no seed left, the key finds nothing and the fallback loads from disk.
    again = remote.load_from_peer(model=name, revision=revision, fallback=str(ckpt))
    assert remote.last_report()["source"] == f"disk:{ckpt}"
    assert torch.equal(again["big"], want["big"])


def test_python_tensors_are_copy_on_write_and_leave_the_seed_alone(cli, ckpt, model, resident):
    s = resident()
    name, revision = model[1], model[3]
    a = remote.load_from_peer(s.url, model=name, revision=revision)
    assert remote.last_report()["handover"]
    before = a["big"][:8].clone()
    a["big"][:8] += 1  # This process's own page from now on.
    assert torch.equal(a["big"][:8], before + 1)
    b = remote.load_from_peer(s.url, model=name, revision=revision, handover_verify=True)
    assert remote.last_report()["handover"]
    assert torch.equal(b["big"][:8], before)
    with pytest.raises(ValueError, match='"auto" or "off"'):
        remote.load_from_peer(s.url, model=name, revision=revision, handover="always")


def test_a_seed_without_handover_is_pulled_from(cli, ckpt, model, resident):
    s = resident("--no-handover")
    r = run(cli, "fetch", *model, "--checksum")
    assert r.returncode == 0, r.stderr
    assert f"from {s.url}" in r.stderr and "handed over" not in r.stderr
    assert r.stdout == load_checksums(cli, ckpt)


def test_fetch_content_checks_the_handed_over_bytes(cli, ckpt, model, resident):
    r = run(cli, "load", ckpt / "model.safetensors", "--mode", "buffered", "--no-progress")
    assert r.returncode == 0, r.stderr
    roots = [line.split()[1] for line in r.stdout.splitlines() if line.startswith("content ")]
    assert len(roots) == 1 and len(roots[0]) == 32, r.stdout
    root = roots[0]
    s = resident()
    r = run(cli, "fetch", *model, "--checksum", "--content", root)
    assert r.returncode == 0, r.stderr
    assert f"from {s.url} (1 source ranks, handed over)" in r.stderr, r.stderr
    assert f"content {root}: the bytes received hash to it" in r.stderr
    assert r.stdout == load_checksums(cli, ckpt)
    other = ("0" if root[0] != "0" else "1") + root[1:]
    r = run(cli, "fetch", *model, "--content", other)
    assert r.returncode != 0
    assert f"content differs: expected {other}" in r.stderr, r.stderr
    r = run(cli, "load", ckpt / "model.safetensors", "--mode", "buffered", "--no-progress", "--no-content-hash")
    assert r.returncode == 0 and "content " not in r.stdout, r.stdout
