"""The fatal-signal report (include/tensorlift/crash.h) where users meet it: a Python process
that imported tensorlift and faults in native code (with Python's faulthandler on and off), the
switch that turns it off, and a `tensorlift serve` seed killed with SIGSEGV, whose report names
the UCX build it had loaded."""
import os
import re
import signal
import subprocess
import sys
import time

import pytest

import tensorlift

CRASH = "import tensorlift._tensorlift as t; t._crash_for_test({kind!r})"


def crash(kind, *python_args, env=None):
    e = dict(os.environ)
    e.pop("TENSORLIFT_CRASH_HANDLER", None)
    e.update(env or {})
    return subprocess.run([sys.executable, *python_args, "-c", CRASH.format(kind=kind)],
                          capture_output=True, text=True, timeout=120, env=e)


def test_a_native_fault_reports_the_signal_the_version_and_the_native_stack():
    r = crash("segv")
    assert r.returncode == -signal.SIGSEGV, r.stderr
    assert re.search(r"\*\*\* tensorlift: fatal signal 11 \(SIGSEGV\) at address 0x0, in pid \d+\n", r.stderr), r.stderr
    assert f"*** tensorlift {tensorlift.__version__}\n" in r.stderr
    report = r.stderr.split("*** native stack", 1)[1]
    # Frames in the extension, then in Python's interpreter; then the end line.
    assert re.search(r"_tensorlift[^\n]*\(\+0x[0-9a-f]+\)\[0x[0-9a-f]+\]", report), report
    assert "libpython" in report or "python" in report
    assert "*** end of tensorlift's report" in report
    assert "Fatal Python error" not in r.stderr  # faulthandler is off here


def test_with_faulthandler_the_python_stack_follows_the_report():
    r = crash("segv", "-X", "faulthandler")
    assert r.returncode == -signal.SIGSEGV, r.stderr
    ours = r.stderr.index("*** tensorlift: fatal signal 11 (SIGSEGV)")
    end = r.stderr.index("*** end of tensorlift's report")
    python = r.stderr.index("Fatal Python error: Segmentation fault")
    assert ours < end < python, r.stderr
    assert 'File "<string>", line 1' in r.stderr[python:]


def test_abort_is_reported_as_sent_to_the_process():
    r = crash("abort")
    assert r.returncode == -signal.SIGABRT, r.stderr
    assert re.search(r"fatal signal 6 \(SIGABRT\), sent by pid \d+, in pid \d+", r.stderr), r.stderr


def test_tensorlift_crash_handler_0_turns_it_off():
    r = crash("segv", env={"TENSORLIFT_CRASH_HANDLER": "0"})
    assert r.returncode == -signal.SIGSEGV
    assert "tensorlift: fatal signal" not in r.stderr, r.stderr
    p = subprocess.run([sys.executable, "-c", "import tensorlift._tensorlift as t; print(t.crash_handler_installed())"],
                       capture_output=True, text=True, env={**os.environ, "TENSORLIFT_CRASH_HANDLER": "0"})
    assert p.stdout.strip() == "False", p.stderr
    assert tensorlift._tensorlift.crash_handler_installed()  # this process: on


def test_a_seed_killed_with_sigsegv_names_the_ucx_it_had_loaded(cli, tmp_path):
    from safetensors.numpy import save_file
    import numpy as np
    ckpt = tmp_path / "model.safetensors"
    save_file({"w": np.arange(4096, dtype=np.float32)}, str(ckpt))
    doctor = subprocess.run([str(cli), "doctor"], capture_output=True, text=True, timeout=120)
    assert "crash report: on" in doctor.stdout, doctor.stdout
    ucx = re.search(r"^UCX \(peer loading\): built, ([0-9.]+) \((.+)\)$", doctor.stdout, re.M)
    ready = tmp_path / "url"
    env = {k: v for k, v in os.environ.items() if k != "TENSORLIFT_CRASH_HANDLER"}
    proc = subprocess.Popen([str(cli), "serve", str(ckpt), "--model", "tiny", "--revision", "r1",
                             "--ready-file", str(ready)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "serve did not become ready"
            time.sleep(0.05)
        proc.send_signal(signal.SIGSEGV)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGSEGV, err
    # Sent by this test; or by the seed itself when UCX's own handler (UCX_HANDLE_ERRORS, installed
    # when UCX is loaded, after tensorlift's) printed its backtrace first and raised it again.
    sent = re.search(rf"fatal signal 11 \(SIGSEGV\), sent by pid (\d+), in pid {proc.pid}\n", err)
    assert sent and int(sent.group(1)) in (os.getpid(), proc.pid), err
    assert "*** native stack" in err and "*** end of tensorlift's report" in err
    if ucx:  # The seed's data plane loaded UCX: the report names that build.
        assert f"*** UCX: {ucx.group(1)} (" in err, err
