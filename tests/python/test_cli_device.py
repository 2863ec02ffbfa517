"""`tensorlift load --device/--dtype`: the staged (GPU) pipeline on the
emulated device and on the host gives the checksums of a plain host load, and
conversions the same bits on every device; cuda without a GPU is a clear error."""
import subprocess

import pytest
import torch
from safetensors.torch import save_file


@pytest.fixture()
def model(tmp_path):
    g = torch.Generator().manual_seed(3)
    save_file({"a": torch.randn(300, 257, generator=g).to(torch.bfloat16),
               "b": torch.randn(33, generator=g),
               "c": torch.arange(7, dtype=torch.int32),
               "d": torch.randn(1000, generator=g).to(torch.float8_e5m2)}, str(tmp_path / "m.safetensors"))
    return tmp_path / "m.safetensors"


def checksums(cli, path, *args):
    r = subprocess.run([str(cli), "load", "--checksum", "--no-progress", *args, str(path)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout, r.stderr


def test_every_device_gives_the_host_bytes(cli, model):
    want, _ = checksums(cli, model)
    assert want.count("\n") == 4
    for args in (["--device", "emulated"],
                 ["--device", "emulated", "--mode", "direct", "--staging-size", "1", "--staging-buffers", "1"]):
        got, err = checksums(cli, model, *args)
        assert got == want, args
        assert "memory plan on emulated" in err


@pytest.mark.parametrize("dtype", ["f32", "F16", "bf16"])
def test_conversions_agree_across_devices(cli, model, dtype):
    host, _ = checksums(cli, model, "--dtype", dtype)
    emulated, err = checksums(cli, model, "--dtype", dtype, "--device", "emulated")
    assert host == emulated
    assert "conversion slots" in err


def test_bad_device_and_dtype_are_usage_errors(cli, model):
    for args in (["--device", "tpu"], ["--dtype", "f8_e4m3x"]):
        r = subprocess.run([str(cli), "load", *args, str(model)], capture_output=True, text=True)
        assert r.returncode == 2, (args, r.stderr)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without a GPU")
def test_cuda_without_a_gpu(cli, model):
    r = subprocess.run([str(cli), "load", "--device", "cuda:0", str(model)], capture_output=True, text=True)
    assert r.returncode == 1
    assert "CUDA" in r.stderr or "cuda" in r.stderr
