"""The SGLang tests' verdict on this CPU's bf16 path (cpu_probe), repeated in pytest's summary."""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "vllm"))
import servers  # noqa: E402  (tests/vllm/servers.py)


def pytest_terminal_summary(terminalreporter):
    servers.report_verdict(terminalreporter, "SGLang")
