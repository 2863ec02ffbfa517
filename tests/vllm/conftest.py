"""The vLLM tests' verdict on this CPU's bf16 path (cpu_probe), repeated in pytest's summary."""
import servers


def pytest_terminal_summary(terminalreporter):
    servers.report_verdict(terminalreporter, "vLLM")
