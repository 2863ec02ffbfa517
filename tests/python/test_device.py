"""Devices and load-time conversion from Python: device="cuda:N" in every API
(runs for real only where torch sees a GPU; here the error must be clear),
the emulated device through the core module, and dtype conversions while
loading, against torch's own conversions."""
import pytest
import torch
from safetensors.torch import load_file, save_file

import tensorlift
import tensorlift.fastsafetensors as tlf
from tensorlift._tensorlift import Checkpoint

HAVE_GPU = torch.cuda.is_available()


@pytest.fixture()
def ckpt(tmp_path):
    g = torch.Generator().manual_seed(7)
    tensors = {
        "w.f32": torch.randn(64, 33, generator=g),
        "w.bf16": torch.randn(300, 70, generator=g).to(torch.bfloat16),
        "w.f16": torch.randn(9, 17, generator=g).to(torch.float16),
        "w.f8": torch.randn(129, generator=g).to(torch.float8_e4m3fn),
        "w.f8e5": torch.randn(31, generator=g).to(torch.float8_e5m2),
        "ids": torch.arange(10, dtype=torch.int64),
        "empty": torch.zeros(0, 3),
    }
    path = tmp_path / "m.safetensors"
    save_file(tensors, str(path))
    return path


FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2)


@pytest.mark.parametrize("target", [torch.float32, torch.float16, torch.bfloat16])
def test_host_load_converts_like_torch(ckpt, target):
    ref = load_file(str(ckpt))
    got = tensorlift.load(ckpt, dtype=target)
    assert sorted(got) == sorted(ref)
    for k, v in ref.items():
        want = v.to(target) if v.dtype in FLOATS else v
        assert got[k].dtype == want.dtype, k
        assert got[k].shape == want.shape, k
        assert torch.equal(got[k].reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)), k


def test_dtype_names_and_errors(ckpt):
    got = tensorlift.load(ckpt, dtype="bf16")
    assert got["w.f32"].dtype == torch.bfloat16
    with pytest.raises(ValueError, match="F8_E4M3"):
        tensorlift.load(ckpt, dtype=torch.float8_e4m3fn)  # not a conversion target
    with pytest.raises(ValueError, match="device"):
        tensorlift.load(ckpt, device="tpu:0")


def test_emulated_device_through_the_core(ckpt):
    loaded = Checkpoint.open(str(ckpt)).load(device="emulated", dtype="F16", staging_bytes=64 << 10,
                                             staging_buffers=2)
    assert loaded.device("w.bf16") == (12, 0)  # kDLExtDev: no framework touches it
    plan = loaded.device_plan()
    assert plan["device_bytes"] > 0 and plan["scratch_bytes"] > 0 and plan["pinned_bytes"] > 0
    files = loaded.files()
    assert files[0]["converted"] == 4 and files[0]["gds"] is False
    with pytest.raises(ValueError, match="host memory"):
        tensorlift._tensors.tensor_from(loaded, "w.bf16", "np")


def test_pinned_staging_is_kept_for_the_next_load_until_released(ckpt):
    tensorlift.release_pinned_staging()
    for _ in range(2):
        loaded = Checkpoint.open(str(ckpt)).load(device="emulated", staging_bytes=64 << 10, staging_buffers=3)
    # Each slot as large as the load's largest read (this file's tensors are one block); the slots
    # the loads read into are kept from the first load for the second: at most the three, not six.
    slot = loaded.device_plan()["pinned_bytes"] // 3
    assert 0 < slot <= (64 + 8) << 10
    released = tensorlift.release_pinned_staging()
    assert released % slot == 0 and 1 <= released // slot <= 3, (released, slot)
    assert tensorlift.release_pinned_staging() == 0


@pytest.mark.skipif(HAVE_GPU, reason="checks the error on a machine without a GPU")
def test_cuda_without_a_gpu_is_a_clear_error(ckpt):
    def fastsafetensors_to_cuda():
        loader = tlf.SafeTensorsFileLoader(tlf.SingleGroup(), "cuda:0")
        loader.add_filenames({0: [str(ckpt)]})
        loader.copy_files_to_device()

    for call in (lambda: tensorlift.load(ckpt, device="cuda:0"),
                 lambda: tensorlift.load(ckpt, device=torch.device("cuda", 0)),
                 fastsafetensors_to_cuda):
        with pytest.raises((RuntimeError, NotImplementedError)) as e:
            call()
        assert "CUDA" in str(e.value) or "cuda" in str(e.value)


@pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
@pytest.mark.parametrize("mode", ["auto", "buffered", "direct"])
def test_cuda_load_equals_reference(ckpt, mode):
    ref = load_file(str(ckpt), device="cuda:0")
    got = tensorlift.load(ckpt, device="cuda:0", mode=mode)
    for k, v in ref.items():
        assert got[k].device == v.device, k
        assert torch.equal(got[k].reshape(-1).view(torch.uint8), v.reshape(-1).view(torch.uint8)), k
    conv = tensorlift.load(ckpt, device="cuda:0", dtype=torch.bfloat16)
    for k, v in ref.items():
        want = v.to(torch.bfloat16) if v.dtype in FLOATS else v
        assert torch.equal(conv[k].reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)), k


@pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
def test_fastsafetensors_on_cuda(ckpt):
    loader = tlf.SafeTensorsFileLoader(tlf.SingleGroup(), "cuda:0")
    loader.add_filenames({0: [str(ckpt)]})
    fb = loader.copy_files_to_device()
    ref = load_file(str(ckpt), device="cuda:0")
    for k, v in ref.items():
        assert torch.equal(fb.get_tensor(k), v), k
    fb.close()
