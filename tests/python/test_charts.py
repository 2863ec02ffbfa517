"""bench/charts.py: PNG charts from the benchmarks' JSON results.

The inputs are made the way the benchmarks make theirs: raw runs in bench/load/load_bench.py's
layout summarized by its own summarize(), and a GPU run in bench/gpu/gpu_bench.py's layout
summarized by its summarize(), so a change of either layout that the charts do not follow fails
here.
"""
import importlib.util
import json
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

try:
    import matplotlib  # noqa: F401
except ImportError:
    pytest.skip("matplotlib is not installed (bench/charts.py draws with it)", allow_module_level=True)


def _module(name, path):
    sys.path.insert(0, str(path.parent))
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(path.parent))


charts = _module("tl_bench_charts", ROOT / "bench" / "charts.py")
load_bench = _module("load_bench", ROOT / "bench" / "load" / "load_bench.py")
gpu_bench = _module("tl_gpu_bench", ROOT / "bench" / "gpu" / "gpu_bench.py")


def load_result(nbytes, scale=1.0):
    """A load bench result: tensorlift auto, one Python contender and one O_DIRECT limit, cold and
    warm, 3 runs each (the limit cold only), as measure() records them, then summarize()d."""
    limit = load_bench.LIMITS[0][0]
    contenders = [["tensorlift auto", "tl", "auto", ["cold", "warm"]],
                  ["safetensors load_file", "py", "st_load_file", ["cold", "warm"]],
                  [limit, "limit", load_bench.LIMITS[0][1], ["cold"]]]
    times = {("tensorlift auto", "cold"): [1.0, 1.1, 1.2], ("tensorlift auto", "warm"): [0.3, 0.2, 0.4],
             ("safetensors load_file", "cold"): [2.0, 2.5, 2.2], ("safetensors load_file", "warm"): [0.5, 0.6, 0.7],
             (limit, "cold"): [0.9, 0.95, 1.0]}
    raw = []
    for (label, state), ts in times.items():
        runs = []
        for i, t in enumerate(ts):
            t *= scale
            run = {"total_s": t, "load_s": t * 0.8, "peak_rss_bytes": nbytes, "xor": "ab12", "bytes": nbytes,
                   "round": i, "resident_before": [0.0, 0.0] if state == "cold" else [1.0, 1.0]}
            if label == limit:
                run.update(read_s=t * 0.9, tensor_bytes=nbytes)
            if label == "tensorlift auto":
                run["files"] = [{"path": "/x/model-00001.safetensors", "mode": "direct", "engine": "uring",
                                 "reason": "0% in page cache"}]
            runs.append(run)
        raw.append({"contender": label, "state": state, "runs": runs})
    mc = {"fresh_nt_gbps": 8.0, "fresh_1t_gbps": 5.0, "prefaulted_1t_gbps": 10.0, "prefaulted_nt_gbps": 15.0,
          "xxh3_1t_gbps": 20.0, "threads": 2}
    data = {"date": "2026-11-28T10:00:00+00:00", "command": "load_bench.py",
            "machine": {"nproc": 2, "kernel": "6.1", "cpu": "AMD EPYC 7B13 64-Core Processor", "ram_gib": 23.5},
            "page_reporting": True, "settle_s": 3.0,
            "checkpoint": {"dir": "/x", "shards": 4, "tensors": 39, "bytes": nbytes},
            "runs_per_cell": 3, "states": ["cold", "warm"], "contenders": contenders, "raw": raw,
            "memcpy": {"thp": mc, "4k": mc}, "elapsed_s": 60.0}
    report, extra = load_bench.summarize(data)
    return {**data, **extra, "report": report}


def gpu_result(nbytes):
    run = lambda t: {"contender": "tensorlift", "load_s": t, "bytes": nbytes, "tensors": 39, "checksum": "n/a",
                     "peak_rss_bytes": nbytes}
    read = lambda t: {"read_s": t, "bytes_read": nbytes, "tensor_bytes": nbytes, "xor": "ab"}
    data = {"date": "2026-11-28", "device": "emulated", "host": "vm",
            "checkpoint": {"dir": "/x", "shards": 4, "bytes": nbytes}, "runs": 3,
            "loads": {"tensorlift": {"cold": [run(1.0), run(0.9), run(1.1)], "warm": [run(0.3), run(0.2), run(0.4)]}},
            "skipped": {"st_load_file": "needs a GPU"},
            "limits": {"odirect_read": dict(read(0.8), point="8x16"), "odirect_rounds": [read(0.8), read(0.85)],
                       "buffered_read": dict(read(0.15), point="16x16"), "buffered_rounds": [read(0.15)]},
            "kernels": {"ops": {"h2d_pinned": {"gbps_moved": 48.0, "gbps_out": 24.0, "vs_d2d": 1.0}}},
            "gpu": "emulated device (tensorlift's, on the CPU)", "gds": {"works": False, "reason": "no cuFile"}}
    gpu_bench.summarize(data)  # as save() does before it writes results.json
    return data


def write(path, obj):
    path.write_text(json.dumps(obj))
    return str(path)


def test_charts_from_load_and_gpu_results(tmp_path, capsys):
    inputs = [write(tmp_path / "load1.json", load_result(1_000_000_000)),
              write(tmp_path / "load2.json", load_result(2_000_000_000, scale=2.0)),
              write(tmp_path / "gpu.json", gpu_result(2_000_000_000)),
              write(tmp_path / "other.json", {"something": "else"}),
              str(tmp_path / "missing.json")]
    out = tmp_path / "charts"
    assert charts.main(["--out", str(out), *inputs]) == 0
    printed = capsys.readouterr().out
    want = {"load-1.00gb.png", "load-2.00gb.png", "load-by-size.png", "gpu-emulated-2.00gb.png"}
    assert {p.name for p in out.iterdir()} == want
    for name in want:
        blob = (out / name).read_bytes()
        assert blob.startswith(PNG_MAGIC) and len(blob) > 5000, name
        assert f"wrote {out / name}" in printed
    # One line for each input it could not draw.
    skipped = [line for line in printed.splitlines() if line.startswith("charts: skipping")]
    assert len(skipped) == 2 and "other.json" in skipped[0] and "missing.json" in skipped[1]


def test_what_the_charts_draw(tmp_path):
    res, why = charts.read_result(write(tmp_path / "load.json", load_result(1_000_000_000)))
    assert why is None
    bars = {(c, s): (m, lo, hi) for c, s, m, lo, hi in res["bars"]}
    # Medians with their min-max; the limits are lines, not bars.
    assert bars[("tensorlift auto", "cold")] == pytest.approx((1.1, 1.0, 1.2))
    assert bars[("safetensors load_file", "warm")] == pytest.approx((0.6, 0.5, 0.7))
    assert not any(c.startswith("limit") for c, _ in bars)
    # Cold: the O_DIRECT limit's median and spread; warm: memcpy into fresh memory + hash.
    assert res["limits"]["cold"][1:] == pytest.approx((0.95, 0.9, 1.0))
    assert res["limits"]["warm"][1] == pytest.approx(1 / 8.0 + 1 / 20.0)

    g, why = charts.read_result(write(tmp_path / "gpu.json", gpu_result(2_000_000_000)))
    assert why is None
    gbars = {(c, s): (m, lo, hi) for c, s, m, lo, hi in g["bars"]}
    assert gbars[("tensorlift", "cold")] == pytest.approx((1.0, 0.9, 1.1))
    # Cold limit: the median of the O_DIRECT rounds (below the 24 GB/s H2D), in seconds.
    assert g["limits"]["cold"][1] == pytest.approx(2.0 / (2.0 / 0.8 + 2.0 / 0.85) * 2, rel=1e-6)
    assert "st_load_file: not run" in g["note"]


def test_nothing_to_draw_fails(tmp_path, capsys):
    assert charts.main(["--out", str(tmp_path / "c"), write(tmp_path / "x.json", [1, 2])]) == 1
    assert "skipping" in capsys.readouterr().out


def test_the_fan_out_curve(tmp_path):
    """bench/remote/fanout_bench.py's result (its JSON's layout): T(N)/T1 per mode, a PNG."""
    def row(n, mode, times):
        spread = {"median": sorted(times)[1], "min": min(times), "max": max(times), "runs": times}
        return {"n": n, "mode": mode, "all_done_s": spread, "median_receiver_s": spread,
                "root_upload_x": {"median": 1.0, "min": 1.0, "max": 1.0, "runs": [1.0] * 3}, "sources_last_run": []}
    data = {"machine": {"cpu": "x", "nproc": 2}, "bytes": 128 << 20, "cap_mbit": 200, "runs": 3, "commit": "abc",
            "t1": {"median": 5.0, "min": 4.9, "max": 5.1, "runs": [4.9, 5.0, 5.1]},
            "rows": [row(2, "relay", [6.0, 6.5, 7.0]), row(8, "relay", [8.0, 8.5, 9.0]),
                     row(2, "star", [10.0, 10.0, 10.5]), row(8, "star", [40.0, 40.0, 41.0])]}
    res, why = charts.read_result(write(tmp_path / "fanout.json", data))
    assert why is None
    assert res["curves"]["relay"] == [(2, pytest.approx(1.3), pytest.approx(1.2), pytest.approx(1.4)),
                                      (8, pytest.approx(1.7), pytest.approx(1.6), pytest.approx(1.8))]
    assert res["curves"]["star"][1][1] == pytest.approx(8.0)
    out = tmp_path / "charts"
    assert charts.main(["--out", str(out), str(tmp_path / "fanout.json")]) == 0
    blob = (out / "fanout.png").read_bytes()
    assert blob.startswith(PNG_MAGIC) and len(blob) > 5000
