"""Does an engine's bf16 CPU path run on this machine? (issue 39)

On some Intel VMs with AMX (Sapphire Rapids: amx_tile, amx_bf16 in /proc/cpuinfo) vLLM 0.32's
bf16 CPU attention dies at the first forward pass: its worker process is killed by SIGILL on a
`tilezero` in the AMX kernel (csrc/cpu/cpu_attn_amx.hpp), whatever the load format; float32 takes
another kernel and runs. The machines this project's CI runs on are drawn from a pool with both
these VMs and AMD Zen 4 ones, so the end-to-end tests (tests/vllm, tests/sglang) and bench/vllm
ask first, once: `probe(command, env)` runs a tiny engine (the command) in bf16 and says whether it
ran, died of an illegal instruction, or failed otherwise (an error: nothing is hidden).

An illegal instruction is seen two ways, whichever process of the engine it hit: the command's own
exit status is -SIGILL, or, for a worker or engine-core process whose parent exits with an error of
its own, the line Python's faulthandler writes before the signal ends it
("Fatal Python error: Illegal instruction"): the probe runs the engine with PYTHONFAULTHANDLER=1,
which every process it starts inherits.

TL_E2E_DTYPE=bfloat16|float32 chooses the dtype instead (the probe is not run, and the line says so).
"""
import dataclasses
import json
import os
import platform
import signal
import subprocess

SIGILL_MARK = "Fatal Python error: Illegal instruction"
DTYPES = ("bfloat16", "float32")
FALLBACK = "float32"
OVERRIDE = "TL_E2E_DTYPE"


class ProbeError(RuntimeError):
    """The probe engine failed for a reason other than an illegal instruction."""


@dataclasses.dataclass
class Verdict:
    engine: str  # "vLLM", "SGLang"
    runs: bool  # bf16 ran (None: not probed, the dtype was chosen by TL_E2E_DTYPE)
    dtype: str  # the dtype the end-to-end runs use
    reason: str
    command: tuple = ()  # the probe engine's command (empty when not probed)
    output: str = ""  # the probe engine's whole output (its result line among it when it ran)

    def result(self, marker='{"tokens"'):
        """The probe engine's last JSON line starting with marker, parsed (it ran)."""
        lines = [x for x in self.output.splitlines() if x.startswith(marker)]
        assert self.runs and lines, self.output[-4000:]
        return json.loads(lines[-1])

    def line(self):
        if self.runs is None:
            said = "not probed"
        else:
            said = "runs" if self.runs else "does not run"
        return f"{self.engine} bf16 on this CPU: {said} ({self.reason}); the end-to-end runs use {self.dtype}"


def cpu_summary():
    """The CPU's model name and whether it has AMX tiles, from /proc/cpuinfo (what decides the
    kernel vLLM picks for bf16)."""
    model, flags = platform.processor() or platform.machine(), []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:  # the first CPU's: its model name comes before its flags
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = value.split()
                    break
    except OSError:
        pass
    amx = sorted(f for f in flags if f.startswith("amx"))
    return f"{model}, " + ("AMX: " + " ".join(amx) if amx else "no AMX")


def forced(engine, environ=None):
    """The Verdict TL_E2E_DTYPE imposes, or None when it is unset. A value other than the two
    dtypes is refused."""
    value = (environ if environ is not None else os.environ).get(OVERRIDE)
    if not value:
        return None
    if value not in DTYPES:
        raise ValueError(f"{OVERRIDE}={value!r}: expected one of {', '.join(DTYPES)}")
    return Verdict(engine, None, value, f"{OVERRIDE}={value} chose the dtype; {cpu_summary()}")


def probe(engine, command, env, timeout=600, marker='{"tokens"'):
    """Runs command (an engine that takes its dtype from TL_DTYPE and prints a line starting with
    marker when it ran) in bf16, with PYTHONFAULTHANDLER=1, in a process group of its own. A Verdict: runs (dtype bfloat16), or does
    not run because a process died with SIGILL (dtype float32). Raises ProbeError for any other
    failure, with the engine's output."""
    env = dict(env, PYTHONFAULTHANDLER="1", TL_DTYPE="bfloat16")
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise ProbeError(f"the {engine} bf16 probe did not finish in {timeout} s:\n{out[-4000:]}") from None
    finally:
        try:  # whatever the engine left behind (a worker whose parent died first)
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    cpu = cpu_summary()
    if proc.returncode == 0 and any(x.startswith(marker) for x in out.splitlines()):
        return Verdict(engine, True, "bfloat16", f"a bf16 engine ran; {cpu}", tuple(command), out)
    if proc.returncode == -signal.SIGILL or SIGILL_MARK in out:
        who = "the engine" if proc.returncode == -signal.SIGILL else "one of its processes"
        where = _first_frame(out)
        return Verdict(engine, False, FALLBACK,
                       f"{who} died with SIGILL, an illegal instruction{where}; {cpu}", tuple(command), out)
    raise ProbeError(f"the {engine} bf16 probe failed (exit {proc.returncode}) without an illegal "
                     f"instruction:\n{out[-4000:]}")


def _first_frame(out):
    """' (faulthandler: "FILE", line N in FUNCTION)': the innermost Python frame faulthandler
    printed after the SIGILL mark (most recent call first); '' when there is none."""
    lines = out.splitlines()
    for i, x in enumerate(lines):
        if SIGILL_MARK in x:
            frames = [y.strip() for y in lines[i + 1:i + 40] if y.strip().startswith("File ")]
            return f" (faulthandler: {frames[0][5:]})" if frames else ""
    return ""


def choose(engine, command, env, timeout=600, marker='{"tokens"'):
    """TL_E2E_DTYPE's choice if set, else probe()'s verdict."""
    return forced(engine, env) or probe(engine, command, env, timeout, marker)
