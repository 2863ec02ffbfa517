"""tensorlift's dtype conversions (tensorlift._tensorlift.convert) against torch
on the CPU, bit for bit: raw bits are compared, never values, so NaN payloads,
signed zeros and subnormals all count.

torch's own NaN patterns are not uniform (src/kernels/convert.h lists them);
tensorlift follows its vectorised x86 kernels (AVX2 / AVX-512), which handle
the whole of every tensor here. Two places where torch is not consistent with
itself are checked explicitly below, not masked:
- f32 -> bf16: 0xFFFF for every NaN with AVX2/AVX-512 kernels, 0x7FC0
  (c10::BFloat16) without them (ATEN_CPU_CAPABILITY=default).
- f16 -> f32: the last (count % 8) elements of a tensor go through a scalar
  loop that turns every NaN into 0x7FFFFFFF; the vectorised body keeps the
  payload (made quiet), as tensorlift does everywhere.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from tensorlift import _tensorlift  # noqa: E402

convert = _tensorlift.convert

TORCH = {
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}
BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32}
TORCH_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32}
SIZE = {"F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1}
TARGETS = ["F32", "F16", "BF16"]
VECTORISED = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


def torch_bits(data: bytes, src: str, dst: str) -> np.ndarray:
    """torch's conversion of `data` (raw `src` elements) to `dst`, as raw bits."""
    t = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(TORCH[src])
    out = t.to(TORCH[dst]).contiguous()
    size = SIZE[dst]
    return out.view(TORCH_INT[size]).numpy().view(BITS[size]).copy()


def ours_bits(data: bytes, src: str, dst: str) -> np.ndarray:
    out = convert(data, src, dst)
    assert len(out) == len(data) // SIZE[src] * SIZE[dst]
    return np.frombuffer(out, dtype=BITS[SIZE[dst]])


def assert_same_bits(data: bytes, src: str, dst: str):
    want = torch_bits(data, src, dst)
    got = ours_bits(data, src, dst)
    bad = np.flatnonzero(want != got)
    if bad.size:
        inputs = np.frombuffer(data, dtype=BITS[SIZE[src]])
        examples = ", ".join(
            f"{inputs[i]:#x} -> torch {want[i]:#x}, tensorlift {got[i]:#x}" for i in bad[:8])
        pytest.fail(f"{src} -> {dst}: {bad.size} of {want.size} differ: {examples}")


def all_patterns(src: str) -> bytes:
    n = 1 << (8 * SIZE[src])
    return np.arange(n, dtype=BITS[SIZE[src]]).tobytes()


@pytest.mark.parametrize("dst", TARGETS)
@pytest.mark.parametrize("src", ["BF16", "F16"])
def test_every_16_bit_pattern(src, dst):
    # 65,536 elements: a multiple of every vector width, so torch runs its
    # vectorised loop on all of them (see the module docstring).
    assert_same_bits(all_patterns(src), src, dst)


@pytest.mark.parametrize("dst", TARGETS)
@pytest.mark.parametrize("src", ["F8_E4M3", "F8_E5M2"])
def test_every_fp8_pattern(src, dst):
    assert_same_bits(all_patterns(src), src, dst)


def f32_patterns() -> bytes:
    """Every 16-bit upper half with several low halves, then 1,000,000 random
    patterns (fixed seed)."""
    upper = np.arange(1 << 16, dtype=np.uint32) << 16
    lows = np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF], dtype=np.uint32)
    grid = (upper[:, None] | lows[None, :]).ravel()
    rng = np.random.default_rng(20240601)
    random = rng.integers(0, 1 << 32, size=1_000_000, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([grid, random]).tobytes()


@pytest.mark.parametrize("dst", ["BF16", "F16", "F32"])
def test_f32_patterns(dst):
    if dst == "BF16" and not VECTORISED:
        pytest.skip("torch without AVX2 kernels gives 0x7FC0 for NaN; tensorlift gives 0xFFFF")
    data = f32_patterns()
    assert len(data) % 64 == 0  # No scalar tail in torch (see the docstring).
    assert_same_bits(data, "F32", dst)


def test_known_values():
    f32 = np.array([1.0, -2.5, 65504.0, 65520.0, np.float32(2.0**-24), np.inf, -np.inf],
                   dtype=np.float32)
    assert ours_bits(f32.tobytes(), "F32", "F16").tolist() == [
        0x3C00, 0xC100, 0x7BFF, 0x7C00, 0x0001, 0x7C00, 0xFC00]
    assert ours_bits(f32.tobytes(), "F32", "BF16").tolist() == [
        0x3F80, 0xC020, 0x4780, 0x4780, 0x3380, 0x7F80, 0xFF80]
    nan = np.array([0x7FC00000, 0xFF800001], dtype=np.uint32).tobytes()
    assert ours_bits(nan, "F32", "BF16").tolist() == [0xFFFF, 0xFFFF]
    assert ours_bits(nan, "F32", "F16").tolist() == [0x7E00, 0xFE00]


def test_torch_scalar_tail_nan_differs_for_f16_to_f32():
    """torch's f16 -> f32 gives 0x7FFFFFFF for a NaN in its scalar tail and keeps
    the payload in its vectorised body; tensorlift always keeps the payload.
    This documents the difference (and fails if torch changes)."""
    if not VECTORISED:
        pytest.skip("needs torch's vectorised kernels")
    data = np.array([0x7C01] * 16 + [0x7C01], dtype=np.uint16).tobytes()
    want = torch_bits(data, "F16", "F32")
    got = ours_bits(data, "F16", "F32")
    assert got.tolist() == [0x7FC02000] * 17
    assert want[:16].tolist() == got[:16].tolist()
    assert want[16] == 0x7FFFFFFF  # The scalar tail.


def test_identity_keeps_bits():
    data = np.array([0x7F800001, 0xFFFFFFFF, 0x00000001, 0x80000000], dtype=np.uint32).tobytes()
    assert convert(data, "F32", "F32") == data
    assert convert(b"\x12\x34\x56", "F4", "F4") == b"\x12\x34\x56"
    assert convert(b"", "BF16", "F32") == b""


def test_errors():
    with pytest.raises(ValueError, match="unknown dtype 'F33'"):
        convert(b"\0\0\0\0", "F33", "F16")
    with pytest.raises(ValueError, match="unknown dtype 'bf16'"):
        convert(b"\0\0", "F16", "bf16")
    with pytest.raises(ValueError, match="F32 to F8_E4M3 is not supported"):
        convert(b"\0\0\0\0", "F32", "F8_E4M3")
    with pytest.raises(ValueError, match="F16 to I32 is not supported"):
        convert(b"", "F16", "I32")
    with pytest.raises(ValueError, match="not a whole number of F32 elements"):
        convert(b"\0\0\0", "F32", "F16")
