"""A stand-in for an engine, for tests/vllm/test_cpu_probe.py: what cpu_probe.probe() must tell apart.

    python standin_engine.py MODE [PID_FILE]

MODE:
  ok             prints a tokens line and exits 0 (a bf16 engine that runs)
  worker-sigill  starts a worker process as vLLM does (multiprocessing, spawn) that executes an
                 undefined instruction (ud2 on x86-64, udf on arm64): the kernel kills it with
                 SIGILL; the parent then fails with an error of its own, exit 1, as vLLM's engine
                 does when a worker dies
  sigill         SIGILL to itself, with faulthandler off: only the exit status tells
  error          fails with an ordinary Python error, exit 1
  hang           starts a worker that writes its pid to PID_FILE and sleeps, then waits for it
"""
import ctypes
import faulthandler
import json
import mmap
import multiprocessing
import os
import platform
import signal
import sys
import time

UNDEFINED = {"x86_64": b"\x0f\x0b", "aarch64": b"\x00\x00\x00\x00"}  # ud2; udf #0


def illegal_instruction():
    code = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    code.write(UNDEFINED[platform.machine()])
    ctypes.CFUNCTYPE(None)(ctypes.addressof(ctypes.c_char.from_buffer(code)))()


def sleeper(pid_file):
    with open(pid_file + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(pid_file + ".tmp", pid_file)  # whole when it appears
    time.sleep(600)


def main():
    mode = sys.argv[1]
    if mode == "ok":
        print("INFO a bf16 engine, dtype", os.environ.get("TL_DTYPE"))
        print(json.dumps({"tokens": [[1, 2, 3]], "dtype": os.environ.get("TL_DTYPE")}), flush=True)
    elif mode in ("worker-sigill", "hang"):
        ctx = multiprocessing.get_context("spawn")
        worker = ctx.Process(target=illegal_instruction if mode == "worker-sigill" else sleeper,
                             args=() if mode == "worker-sigill" else (sys.argv[2],))
        worker.start()
        worker.join()
        raise RuntimeError(f"Engine core initialization failed: worker exited with code {worker.exitcode}")
    elif mode == "sigill":
        faulthandler.disable()
        os.kill(os.getpid(), signal.SIGILL)
    elif mode == "error":
        raise ValueError("Expected a cuda device, but got: cpu")
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
