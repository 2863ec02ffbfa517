"""cpu_probe.py against stand-in engines (standin_engine.py): bf16 runs; a worker or the engine
itself killed by SIGILL means float32; any other failure is an error, never a verdict."""
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

import cpu_probe

STANDIN = pathlib.Path(__file__).resolve().parent / "standin_engine.py"
ENV = {k: v for k, v in os.environ.items() if k != cpu_probe.OVERRIDE}


def standin(*args):
    return [sys.executable, str(STANDIN), *args]


def test_an_engine_that_runs_in_bf16_keeps_bf16():
    v = cpu_probe.probe("vLLM", standin("ok"), ENV)
    assert v.runs is True and v.dtype == "bfloat16"
    assert v.result() == {"tokens": [[1, 2, 3]], "dtype": "bfloat16"}  # the probe asked for bf16
    assert v.line().startswith("vLLM bf16 on this CPU: runs (a bf16 engine ran; ")
    assert v.line().endswith("); the end-to-end runs use bfloat16")


def test_a_worker_killed_by_an_illegal_instruction_means_float32():
    v = cpu_probe.probe("vLLM", standin("worker-sigill"), ENV)
    assert v.runs is False and v.dtype == "float32"
    assert cpu_probe.SIGILL_MARK in v.output and "code -4" in v.output  # the worker's own exit status
    assert "one of its processes died with SIGILL, an illegal instruction" in v.reason
    assert "standin_engine.py" in v.reason and "in illegal_instruction" in v.reason  # faulthandler's frame
    assert v.line().startswith("vLLM bf16 on this CPU: does not run (one of its processes died with SIGILL")
    assert v.line().endswith("; the end-to-end runs use float32")


def test_an_engine_killed_by_sigill_is_told_by_its_exit_status_alone():
    v = cpu_probe.probe("SGLang", standin("sigill"), ENV)
    assert cpu_probe.SIGILL_MARK not in v.output
    assert v.runs is False and v.dtype == "float32" and v.reason.startswith("the engine died with SIGILL")


def test_any_other_failure_is_an_error_not_a_verdict():
    with pytest.raises(cpu_probe.ProbeError, match="exit 1.*without an illegal instruction") as e:
        cpu_probe.probe("vLLM", standin("error"), ENV)
    assert "Expected a cuda device, but got: cpu" in str(e.value)


def running(pid):
    """Whether process pid runs: a zombie (killed, its status not yet collected by whoever adopted
    it) does not."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_probe_past_its_time_is_an_error_and_leaves_no_process(tmp_path, monkeypatch):
    pid_file = tmp_path / "worker.pid"

    class WorkerFirst(subprocess.Popen):
        """The probe's wait for the engine starts once the stand-in's worker runs (it wrote its
        pid): on a busy machine, starting the engine and its spawned worker can take longer than
        the probe's 5 s, and the time-out must find the worker there to kill."""

        def communicate(self, input=None, timeout=None):
            if timeout is not None:
                deadline = time.monotonic() + 120
                while not pid_file.exists():
                    assert self.poll() is None, "the stand-in exited before its worker started"
                    assert time.monotonic() < deadline, "the stand-in's worker did not start in 120 s"
                    time.sleep(0.05)
            return super().communicate(input, timeout)

    monkeypatch.setattr(subprocess, "Popen", WorkerFirst)
    with pytest.raises(cpu_probe.ProbeError, match="did not finish in 5 s"):
        cpu_probe.probe("vLLM", standin("hang", str(pid_file)), ENV, timeout=5)
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 60
    while running(pid):  # the worker, in the probe's process group, was killed with it
        assert time.monotonic() < deadline, f"the stand-in's worker {pid} outlived the probe"
        time.sleep(0.05)


def test_TL_E2E_DTYPE_chooses_and_the_probe_is_not_run():
    never = [sys.executable, "-c", "raise SystemExit('the probe ran')"]
    v = cpu_probe.choose("vLLM", never, dict(ENV, TL_E2E_DTYPE="float32"))
    assert v.runs is None and v.dtype == "float32" and v.output == ""
    assert v.line().startswith("vLLM bf16 on this CPU: not probed (TL_E2E_DTYPE=float32 chose the dtype; ")
    with pytest.raises(ValueError, match="TL_E2E_DTYPE='fp16': expected one of bfloat16, float32"):
        cpu_probe.choose("vLLM", never, dict(ENV, TL_E2E_DTYPE="fp16"))
    assert cpu_probe.choose("vLLM", standin("ok"), ENV).runs is True  # unset: probed


def test_the_cpu_summary_names_the_model_and_amx():
    flags = open("/proc/cpuinfo").read().split("flags", 1)[1].split("\n", 1)[0].split()
    summary = cpu_probe.cpu_summary()
    assert ("amx_tile" in summary) == ("amx_tile" in flags), summary
    assert summary.endswith("no AMX") == (not any(f.startswith("amx") for f in flags)), summary


def test_sigill_is_signal_4_here():
    assert signal.SIGILL == 4  # "exits with code -4" in the issue is this signal
