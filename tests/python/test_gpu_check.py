"""make gpu-check (scripts/gpu_check.sh): the dry run without a GPU, its completeness
check, and the whole sequence (setup, test, bench) against the emulated device."""
import json
import os
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
# What the completeness check looks at (relative to the checkout).
CHECKED = ["scripts/gpu_check.sh", "scripts/gpu_bundle.sh", "scripts/gpu_lease.sh", "bench/gpu/gpu_bench.py",
           "bench/gpu/contender.py", "tests/device/kernels_bench.cc", "bench/load/gen_checkpoint.py", "docs/gpu.md",
           "tests/CMakeLists.txt", "bench/remote/gpu_handover_bench.py", "bench/sparse/offload_bench.py"]


def has_gpu():
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    p = subprocess.run([smi, "-L"], capture_output=True, text=True)
    return any(line.startswith("GPU ") for line in p.stdout.splitlines())


def run(env_extra=None, cwd=ROOT, script=SCRIPT, timeout=900):
    env = dict(os.environ)
    env.pop("GPU_CHECK_EMULATED", None)
    env.update(env_extra or {})
    return subprocess.run(["bash", str(script)], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.skipif(has_gpu(), reason="this machine has a GPU: gpu-check would run for real")
def test_without_a_gpu_it_says_so_in_one_line_and_exits_0():
    p = run()
    assert p.returncode == 0, p.stderr
    lines = p.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu-check: no GPU here ("), p.stdout
    assert "checked its 10 files" in lines[0]


@pytest.mark.skipif(has_gpu(), reason="this machine has a GPU: gpu-check would run for real")
@pytest.mark.parametrize("missing", ["bench/gpu/contender.py", "scripts/gpu_bundle.sh", "scripts/gpu_lease.sh",
                                     "docs/gpu.md"])
def test_the_dry_run_fails_when_a_file_is_missing(tmp_path, missing):
    for rel in CHECKED:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    (tmp_path / missing).unlink()
    p = run(cwd=tmp_path, script=tmp_path / "scripts" / "gpu_check.sh")
    assert p.returncode != 0
    assert f"{missing} is missing" in p.stderr


@pytest.mark.skipif(has_gpu(), reason="this machine has a GPU: gpu-check would run for real")
def test_the_dry_run_fails_when_a_script_does_not_parse(tmp_path):
    for rel in CHECKED:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    (tmp_path / "bench/gpu/gpu_bench.py").write_text("def broken(:\n")
    p = run(cwd=tmp_path, script=tmp_path / "scripts" / "gpu_check.sh")
    assert p.returncode != 0 and "gpu_bench.py does not parse" in p.stderr


def test_an_unknown_step_is_refused():
    p = run({"STEP": "benchmark"})
    assert p.returncode == 2 and "unknown STEP 'benchmark'" in p.stderr


def test_the_whole_sequence_on_the_emulated_device(tmp_path):
    out = tmp_path / "gpu"
    p = run({"GPU_CHECK_EMULATED": "1", "OUT": str(out)})
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-3000:])
    # The steps ran, in order, and the table was printed at the end.
    for step in ("setup", "test", "bench"):
        assert f"gpu-check [emulated] {step}" in p.stdout
    assert "| tensorlift |" in p.stdout and "| kernel | GB/s moved" in p.stdout
    # Tests: ctest and pytest ran and passed.
    suites = [json.loads(line) for line in (out / "tests.jsonl").read_text().splitlines()]
    by_name = {s["suite"]: s for s in suites}
    assert by_name["ctest"]["rc"] == 0 and by_name["ctest"]["passed"] > 50
    assert by_name["pytest"]["rc"] == 0 and by_name["pytest"]["passed"] > 0
    # Bench: tensorlift loaded the checkpoint cold and warm on the emulated device;
    # the others say why they did not run; the kernels and limits were measured.
    res = json.loads((out / "results.json").read_text())
    ckpt = res["checkpoint"]["bytes"]
    for state in ("cold", "warm"):
        runs = res["loads"]["tensorlift"][state]
        assert runs and all(r["load_s"] > 0 and 0 < r["bytes"] <= ckpt for r in runs), runs
    assert set(res["skipped"]) >= {"st_load_file", "fastsafetensors_gds", "instanttensor", "runai"}
    ops = res["kernels"]["ops"]
    assert set(ops) == {"h2d_pinned", "d2d", "realign", "convert_bf16_f16", "convert_bf16_f32", "sparse_decode_50",
                        "d2d_dense_of_sparse"}
    assert all(o["gbps_moved"] > 0 for o in ops.values())
    assert res["limits"]["odirect_read"]["read_s"] > 0
    # The peer pull, device memory to device memory between two processes: every run
    # landed straight in the device's memory with the disk load's bytes.
    peer = res["peer_pull"]
    assert peer["device"] == "emulated:0" and len(peer["runs"]) == res["runs"], peer
    assert all(r["same_bytes"] and r["landing"] == "device" and r["pull_s"] > 0 for r in peer["runs"]), peer
    md = (out / "results.md").read_text()
    assert md.startswith("GPU benchmark, ") and "Peer pull, emulated:0 to emulated:0" in md


def test_a_failing_test_makes_it_exit_non_zero(tmp_path):
    # The test step again, with a pytest that fails (a missing test path):
    # the step records it and the command exits 1.
    out = tmp_path / "gpu"
    setup = run({"GPU_CHECK_EMULATED": "1", "OUT": str(out), "STEP": "setup"})
    assert setup.returncode == 0, setup.stderr[-2000:]
    p = run({"GPU_CHECK_EMULATED": "1", "OUT": str(out), "STEP": "test",
             "GPU_CHECK_PYTESTS": "tests/python/no_such_test_file.py"})
    assert p.returncode == 1, (p.stdout[-2000:], p.stderr[-2000:])
    assert "tests failed" in p.stderr


def test_the_bench_contenders_agree_on_the_bytes(tmp_path):
    # Every contender of bench/gpu/contender.py whose library is installed here,
    # on the host ("cpu"): the code the GPU bench runs, less the device.
    import sys
    from safetensors.torch import save_file
    import torch
    g = torch.Generator().manual_seed(3)
    files = []
    for i in range(2):
        path = tmp_path / f"model-{i}.safetensors"
        save_file({f"l{i}.w": torch.randn(64, 48, generator=g).to(torch.bfloat16),
                   f"l{i}.b": torch.randn(48, generator=g), f"l{i}.e": torch.zeros(0, 3)}, str(path))
        files.append(str(path))
    sums = {}
    for name in ("tensorlift", "tensorlift_pinned", "st_load_file", "fastsafetensors_nogds", "runai"):
        p = subprocess.run([sys.executable, str(ROOT / "bench/gpu/contender.py"), name, "cpu", *files],
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, (name, p.stderr[-2000:])
        res = json.loads(p.stdout.strip().splitlines()[-1])
        assert res["tensors"] == 6 and res["bytes"] == 2 * (64 * 48 * 2 + 48 * 4) and res["load_s"] > 0, res
        sums[name] = res["checksum"]
    assert len(set(sums.values())) == 1, sums


@pytest.mark.skipif(not list((ROOT / "dist").glob("tensorlift-*.whl")),
                    reason="no wheel in dist/ (make wheel; make test makes it before these tests)")
def test_the_wheel_step_on_the_emulated_device(tmp_path):
    # STEP=wheel, a lease's first step: dist/'s wheel installed beside the Python with no
    # build, then the device tests and the load benchmark with it.
    out = tmp_path / "gpu"
    p = run({"GPU_CHECK_EMULATED": "1", "OUT": str(out), "STEP": "wheel"})
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-3000:])
    site = ROOT / "build-fromwheel" / "site"
    assert f"from the wheel ({site}/tensorlift/__init__.py)" in p.stdout, p.stdout[-3000:]
    suites = [json.loads(line) for line in (out / "tests.jsonl").read_text().splitlines()]
    assert [s["suite"] for s in suites] == ["pytest-wheel"] and suites[0]["rc"] == 0 and suites[0]["passed"] > 0
    res = json.loads((out / "results.json").read_text())
    for state in ("cold", "warm"):
        runs = res["loads"]["tensorlift"][state]
        assert runs and all(r["load_s"] > 0 for r in runs), runs
    # --parts loads: no kernels, no peer pull.
    assert res["kernels"] is None and "peer_pull" not in res
    assert res["limits"]["odirect_read"]["read_s"] > 0


def test_the_disturbance_step_on_the_cpu(tmp_path):
    # STEP=disturbance: the seed's workload alone and during pulls, each rate limit measured.
    out = tmp_path / "gpu"
    setup = run({"GPU_CHECK_EMULATED": "1", "OUT": str(out), "STEP": "setup"})
    assert setup.returncode == 0, setup.stderr[-2000:]
    p = run({"GPU_CHECK_EMULATED": "1", "OUT": str(out), "STEP": "disturbance"})
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-3000:])
    res = json.loads((out / "seed-disturbance.json").read_text())
    assert set(res["by_rate_limit"]) == {"0", "2e+09"}, res
    for r in res["by_rate_limit"].values():
        assert r["served_from"] == "host" and len(r["runs"]) == 1, r
        run0 = r["runs"][0]
        # The rates' values depend on the machine's load: the bench's to measure, not to assert.
        # Each window lasts until at least one iteration and one pull ran, however late: never 0.
        assert run0["alone_per_s"] > 0 and run0["during_per_s"] > 0 and run0["pulls"] >= 1, run0
    assert "| rate limit | served from |" in p.stdout


def test_the_offload_step_on_the_emulated_device(tmp_path):
    # STEP=offload: the sparse part of the GPU bench, then the offload bench's tensorlift rows
    # (accelerate's need a CUDA device), each streamed row within its budget, the same tokens.
    out = tmp_path / "gpu"
    setup = run({"GPU_CHECK_EMULATED": "1", "OUT": str(out), "STEP": "setup"})
    assert setup.returncode == 0, setup.stderr[-2000:]
    p = run({"GPU_CHECK_EMULATED": "1", "OUT": str(out), "STEP": "offload"})
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-3000:])
    sparse = json.loads((out / "sparse" / "results.json").read_text())["sparse"]
    for kind in ("sparse", "dense"):
        for state in ("cold", "warm"):
            runs = sparse["loads"][kind][state]
            assert runs and all(r["load_s"] > 0 for r in runs), (kind, state, runs)
    res = json.loads((out / "offload.json").read_text())
    assert res["complete"] and res["tensorlift_tokens_identical"], res.get("errors")
    assert set(res["rows"]) == {"tl-dense-cold", "tl-dense-warm", "tl-sparse-cold", "tl-sparse-warm"}
    for name, row in res["rows"].items():
        assert row["tokens_per_s"] > 0 and row["device_bytes_within_budget"], (name, row)
        run0 = row["median_run"]
        cached = run0["cached_bytes_before"]
        assert cached <= 0.05 * run0["checkpoint_bytes"] if run0["state"] == "cold" else cached > 0, (name, run0)
    assert "skipped" in res["accelerate"]
    assert "| tl-sparse-cold | cold |" in (out / "offload.md").read_text()
