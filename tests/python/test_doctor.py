"""`tensorlift doctor`: what was built and what works here, for people and
for machines. Runs on any machine: every part that is missing must come with
a reason, in both forms, and the command always exits 0.
"""

import json
import os
import pathlib
import subprocess
import tempfile

import pytest

from conftest import tool

ROOT = pathlib.Path(__file__).resolve().parents[2]


def doctor(*args):
    # cuFile, when present, writes cufile.log into the working directory.
    result = subprocess.run([str(tool("tensorlift")), "doctor", *args],
                            capture_output=True, text=True, timeout=120,
                            cwd=tempfile.gettempdir())
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_json_parses_and_every_missing_part_has_a_reason(tmp_path):
    report = json.loads(doctor("--json", str(tmp_path)))
    assert report["version"]

    cuda = report["cuda"]
    assert isinstance(cuda["built"], bool)
    if cuda["built"]:
        assert cuda["runtime_version"] or cuda["runtime_reason"]
        assert cuda["driver_version"] or cuda["driver_reason"]
    else:
        assert "built without CUDA" in cuda["not_built_reason"]
    if not cuda["gpus"]:
        assert cuda["gpus_reason"]
    for gpu in cuda["gpus"]:
        assert gpu["name"] and gpu["memory_bytes"] > 0
        assert gpu["compute_capability"].count(".") == 1

    uring = report["io_uring"]
    assert uring["usable"] or uring["reason"]

    gds = report["gds"]
    for part in ("library", "nvidia_fs", "driver"):
        ok = gds["library_loaded"] if part == "library" else gds[
            "nvidia_fs" if part == "nvidia_fs" else "driver_open"]
        assert ok or gds[f"{part}_reason"], part
    if not os.path.exists("/proc/driver/nvidia-fs"):
        assert not gds["nvidia_fs"]
        assert "nvidia-fs kernel module" in gds["nvidia_fs_reason"]
        assert not gds["ready"]
    assert gds["path"] == str(tmp_path)
    assert gds["filesystem"] and gds["filesystem_reason"]
    assert isinstance(gds["filesystem_supported"], bool)


def test_text_states_the_reasons():
    out = doctor()
    report = json.loads(doctor("--json"))
    lines = out.splitlines()
    assert lines[0] == "tensorlift " + report["version"]
    by_key = {line.split(":", 1)[0].strip(): line.split(":", 1)[1].strip()
              for line in lines[1:] if ":" in line}
    for key in ("CUDA", "GPUs", "io_uring", "GPUDirect Storage", "cuFile library",
                "nvidia-fs", "cuFileDriverOpen"):
        assert key in by_key, (key, out)
    if not report["cuda"]["gpus"]:
        # e.g. "GPUs: none (cudaGetDeviceCount: no CUDA-capable device is detected ...)"
        assert by_key["GPUs"] == f"none ({report['cuda']['gpus_reason']})"
    if not report["gds"]["library_loaded"]:
        assert report["gds"]["library_reason"] in by_key["cuFile library"]
    if not report["gds"]["nvidia_fs"]:
        assert by_key["nvidia-fs"].startswith("missing (")


def test_filesystem_of_a_path(tmp_path):
    out = doctor(str(tmp_path))
    assert f"filesystem of '{tmp_path}'" in out
    if os.path.isdir("/dev/shm"):
        shm = json.loads(doctor("--json", "/dev/shm"))["gds"]
        if shm["filesystem"] == "tmpfs":
            assert not shm["filesystem_supported"]
            assert "not supported" in shm["filesystem_reason"]


def test_communicators_are_reported(monkeypatch):
    report = json.loads(doctor("--json"))
    comm = report["comm"]
    assert comm["mpi_library"] or comm["mpi_reason"]
    if comm["mpi_built"] and comm["mpi_library"]:
        assert f"MPI: built, {comm['mpi_library']}" in doctor()
    assert comm["nccl_loaded"] == bool(comm["nccl_version"])
    assert comm["nccl_loaded"] or comm["nccl_reason"]
    if comm["nccl_built"]:
        # A library that cannot be loaded is reported with dlopen's reason.
        monkeypatch.setenv("TENSORLIFT_NCCL_LIB", "/nonexistent/libnccl.so.2")
        missing = json.loads(doctor("--json"))["comm"]
        assert not missing["nccl_loaded"]
        assert "/nonexistent/libnccl.so.2" in missing["nccl_reason"]
        assert f"NCCL: built ({missing['nccl_reason']})" in doctor()
    else:
        assert "built without" in comm["nccl_reason"]
    if comm["mpi_built"]:
        # MPI is opened at run time too: a missing one is reported with dlopen's reason, and the
        # MPI communicator says the same.
        monkeypatch.setenv("TENSORLIFT_MPI_LIB", "/nonexistent/libmpi.so.40")
        missing = json.loads(doctor("--json"))["comm"]
        assert not missing["mpi_library"]
        assert "MPI not found: dlopen(/nonexistent/libmpi.so.40)" in missing["mpi_reason"]
        assert f"MPI: built ({missing['mpi_reason']})" in doctor()


def test_peer_loading_is_reported():
    remote = json.loads(doctor("--json"))["remote"]
    assert remote["ucx_built"] == bool(remote["ucx_version"])
    assert remote["ucx_built"] or "UCX" in remote["ucx_reason"]
    text = doctor()
    if remote["ucx_built"]:
        assert f"UCX (peer loading): built, {remote['ucx_version']}" in text
        # Its transports, and whether it maps CUDA memory (Debian's UCX has no CUDA transport).
        assert remote["ucx_transports"] and "tcp" in remote["ucx_transports"].split(","), remote
        assert f"  UCX transports: {remote['ucx_transports']}\n" in text
        # Why that build (a source tree's CLI is not a Python package: the system's).
        assert remote["ucx_choice"] and f"  UCX chosen: {remote['ucx_choice']}\n" in text, remote
        cuda_tl = any(t.startswith("cuda") for t in remote["ucx_transports"].split(","))
        assert remote["ucx_cuda_memory"] == cuda_tl, remote
        if cuda_tl:
            assert "  UCX CUDA memory: yes" in text
        elif remote["ucx_cuda_module"]:  # a CUDA build (PyPI's libucx-cu12) where no driver loads it
            assert f"  UCX CUDA memory: no (this build's CUDA transport, {remote['ucx_cuda_module']}, did not" in text
        else:  # Debian's UCX
            assert "  UCX CUDA memory: no (this UCX build has no CUDA transport" in text
    assert ("etcd (registry tests): " + (remote["etcd"] or "not on PATH")) in text
    assert remote["s3_built"] and remote["s3_version"].startswith("libcurl ")  # libcurl4-openssl-dev: setup.sh
    assert f"S3 client (object storage): built, {remote['s3_version']}" in text


def test_a_cuda_build_of_ucx_is_told_apart(monkeypatch):
    import glob
    lib = sorted(glob.glob(str(ROOT / ".venv-ucx/lib/python*/site-packages/libucx/lib/libucp.so.0")))
    if not lib:
        pytest.skip("no PyPI libucx-cu12 in .venv-ucx (scripts/setup.sh makes it)")
    monkeypatch.setenv("TENSORLIFT_UCX_LIB", lib[0])
    remote = json.loads(doctor("--json"))["remote"]
    assert remote["ucx_version"].endswith(f"({lib[0]})"), remote
    assert remote["ucx_cuda_module"].endswith("/ucx/libuct_cuda.so.0"), remote
    assert remote["ucx_choice"] == "named by TENSORLIFT_UCX_LIB", remote
