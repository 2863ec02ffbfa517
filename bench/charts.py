"""Charts of the benchmarks' JSON results, as PNG files (matplotlib, Agg backend).

    .venv/bin/python bench/charts.py --out bench/out/charts bench/out/load.json [more JSON...]

Reads results of the load benchmark (bench/load/load_bench.py: bench/out/load.json), of the
GPU benchmark (bench/gpu/gpu_bench.py: DIR/results.json) and of the fan-out benchmark
(bench/remote/fanout_bench.py: bench/out/fanout.json, drawn as the curve of T(N)/T1 per mode,
fanout.png); any other file is skipped with a one-line message. Per result: the load time of
every contender, cold and warm (and half cached where measured) side by side, the median with
the min-max of the runs as error bars, and the machine's limit in that state as a dashed line
(its min-max as a band where it has one). When
results for more than one checkpoint size are given: load time by size, per state and
contender (load-by-size.png, gpu-by-size.png). Prints the path of every chart it writes; exits
1 when it drew none.
"""
import argparse
import json
import os
import re
import statistics
import sys

STATE_COLORS = {"cold": "tab:blue", "warm": "tab:orange", "half": "tab:green"}
STATE_NAMES = {"cold": "cold", "warm": "warm", "half": "half cached"}
DPI = 100


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


# The results, read into one shape: {"kind", "title", "tag", "bytes", "states",
# "bars": [(contender, state, median_s, min_s, max_s)], "limits": {state: (label, median_s, min_s, max_s)},
# "note"}. ------------------------------------------------------------------------------

def _spread(median, runs):
    runs = [r for r in runs if r is not None]
    return (median, min(runs), max(runs)) if runs else (median, median, median)


def read_load(data):
    """The load benchmark's summarized rows (load_bench.py: main() writes them beside the raw runs)."""
    ckpt = data["checkpoint"]
    states = list(data.get("states") or [])
    bars, limits = [], {}
    rows = data["rows"]
    by = {(r["contender"], r["state"]): r for r in rows}
    for r in rows:
        name = r["contender"]
        if name.startswith("limit:") or name.startswith("device only"):
            continue  # the limits are drawn as lines; the device alone is no loader's limit
        bars.append((name, r["state"]) + _spread(r["median_s"], r.get("runs_s") or []))
    for state in states:
        auto = by.get(("tensorlift auto", state))
        if not auto or auto.get("x_limit") is None:
            continue
        limit_s = auto["x_limit"] * auto["median_s"]  # x_limit = the limit's time / this time
        # The limit's own row (the fastest O_DIRECT variant cold, memcpy + hash warm), for its spread.
        own = [r for r in rows if r["state"] == state and r["contender"].startswith("limit:")
               and abs(r["median_s"] - limit_s) <= 1e-9 * max(1.0, limit_s)]
        what = {"cold": "O_DIRECT read + hash", "warm": "memcpy into fresh memory + hash"}.get(state, "limit")
        limits[state] = (f"{STATE_NAMES.get(state, state)} limit: {what}",) + _spread(
            limit_s, own[0].get("runs_s") or [] if own else [])
    m = data.get("machine", {})
    cpu = re.sub(r"\s+\d+-Core Processor$", "", m.get("cpu", "?"))
    gb = ckpt["bytes"] / 1e9
    title = (f"Load benchmark: {gb:.2f} GB Llama-shaped bf16 checkpoint, {ckpt.get('shards', '?')} shards, "
             f"into host memory\n{m.get('nproc', '?')} CPUs ({cpu}), {str(data.get('date', '?'))[:10]}; "
             f"median of {data.get('runs_per_cell', '?')} runs, bars min-max")
    return {"kind": "load", "title": title, "tag": f"load-{gb:.2f}gb", "bytes": ckpt["bytes"], "states": states,
            "bars": bars, "limits": limits,
            "xlabel": "seconds: first loader call to every tensor's bytes hashed (XXH3) once"}


def read_gpu(data):
    """The GPU benchmark's results.json (gpu_bench.py: measure() and save())."""
    ckpt = data["checkpoint"]["bytes"]
    bars, states = [], []
    # tensorlift first, the others in the bench's order.
    for c, per_state in sorted(data["loads"].items(), key=lambda kv: kv[0] != "tensorlift"):
        for state, runs in per_state.items():
            ok = [r["load_s"] for r in runs if "load_s" in r]
            if not ok:
                continue
            if state not in states:
                states.append(state)
            bars.append((c, state) + _spread(statistics.median(ok), ok))
    states.sort(key=lambda s: list(STATE_COLORS).index(s) if s in STATE_COLORS else 99)
    limits = {}
    summary = data.get("summary") or {}
    ops = ((data.get("kernels") or {}).get("ops") or {}) if isinstance(data.get("kernels"), dict) else {}
    h2d = summary.get("h2d_gbps") or ops.get("h2d_pinned", {}).get("gbps_out") or \
        (data.get("h2d_torch") or {}).get("gbps")  # (torch's copy where the kernels bench did not run)
    for state, key, what in (("cold", "odirect", "O_DIRECT read"), ("warm", "buffered", "page cache read")):
        rounds = [r for r in data.get("limits", {}).get(f"{key}_rounds", []) if r and r.get("read_s")]
        best = data.get("limits", {}).get(f"{key}_read", {})
        rounds = rounds or ([best] if best.get("read_s") else [])
        rates = sorted(r["bytes_read"] / r["read_s"] / 1e9 for r in rounds)
        if not rates and not h2d:
            continue
        # The limit is min(pinned H2D, the read), in GB/s, turned into seconds for the checkpoint.
        read = statistics.median(rates) if rates else None
        if read is not None and (not h2d or read <= h2d):
            limits[state] = (f"{state} limit: {what} (below pinned H2D)", ckpt / read / 1e9,
                             ckpt / rates[-1] / 1e9, ckpt / rates[0] / 1e9)
        else:
            limits[state] = (f"{state} limit: pinned H2D", ckpt / h2d / 1e9, ckpt / h2d / 1e9, ckpt / h2d / 1e9)
    gb = ckpt / 1e9
    runs = data.get("runs", "?")
    device = data.get("device", "?")
    gpu = data.get("gpu", "?")
    title = (f"GPU benchmark, {gpu if device == 'emulated' else f'{device}: {gpu}'}: {gb:.2f} GB in "
             f"{data['checkpoint'].get('shards', '?')} shards\n{data.get('date', '?')}, host {data.get('host', '?')}; "
             f"median of {runs} runs, bars min-max")
    notes = [f"{c}: not run ({why})" for c, why in (data.get("skipped") or {}).items()]
    if "tensorlift_scheduling" in data["loads"]:
        notes.insert(0, "tensorlift_scheduling: a diagnostic, not a load (the emulated device's copies take their "
                        "time but move no bytes)")
    note = "\n".join(notes)
    return {"kind": "gpu", "title": title, "tag": f"gpu-{data.get('device', 'x')}-{gb:.2f}gb".replace(":", ""),
            "bytes": ckpt, "states": states, "bars": bars, "limits": limits, "note": note,
            "xlabel": "seconds: first loader call to every tensor in device memory"}


def read_fanout(data):
    """The fan-out benchmark: per mode, N -> (median, min, max) of the time until all receivers
    are done, over T1."""
    t1 = data["t1"]["median"]
    curves = {}
    for row in data["rows"]:
        a = row["all_done_s"]
        curves.setdefault(row["mode"], []).append((row["n"], a["median"] / t1, a["min"] / t1, a["max"] / t1))
    title = (f"{data['bytes'] / 2**20:.0f} MiB to N receivers at once, every link {data['cap_mbit']:g} Mbit/s "
             f"(T1 = {t1:.2f} s; {data['runs']} runs a point)")
    return {"kind": "fanout", "title": title, "tag": "fanout", "bytes": data["bytes"], "curves": curves,
            "bars": [1], "commit": data.get("commit", "")}


def chart_fanout(res, path):
    """T(N)/T1 against N, a line per mode with min-max error bars; the ideal (1) dashed."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    names = {"relay": "relaying (default)", "star": "--no-relay (star)", "seed": "--no-relay --seed",
             "kill": "relaying, a relay killed half way (the others)"}
    top = 1.0
    for mode, pts in sorted(res["curves"].items()):
        pts = sorted(pts)
        xs = [p[0] for p in pts]
        ys = [p[1] for p in pts]
        err = [[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]]
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=names.get(mode, mode))
        top = max(top, max(p[3] for p in pts))
    ax.axhline(1.0, color="gray", linestyle="--", linewidth=1, label="one pull's time (the bound)")
    ax.set_xlabel("receivers started together (N)")
    ax.set_ylabel("time until all are done / T1")
    ax.set_ylim(0, top * 1.1)
    ax.set_title(res["title"], fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def read_result(path):
    """(result, None) or (None, why it cannot be drawn)."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        return None, f"{type(e).__name__}: {e}"
    if not isinstance(data, dict):
        return None, "not a JSON object"
    try:
        if "t1" in data and "rows" in data and all("mode" in r for r in data["rows"]):
            return read_fanout(data), None
        if "rows" in data and "checkpoint" in data and "raw" in data:
            return read_load(data), None
        if "loads" in data and "limits" in data and "checkpoint" in data:
            return read_gpu(data), None
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
        return None, f"unexpected layout ({type(e).__name__}: {e})"
    return None, "not a load (bench/load), GPU (bench/gpu) or fan-out (bench/remote/fanout_bench.py) result"


# The charts. -----------------------------------------------------------------------------

def chart_result(res, path):
    """Horizontal bars: one group per contender, one bar per state; the limits as dashed lines.
    The axis ends at 1.6x the slowest median: a run far slower than its cell's median (a noisy
    disk) has its error bar cut there, its maximum written beside it."""
    plt = _plt()
    contenders = []
    for c, *_ in res["bars"]:
        if c not in contenders:
            contenders.append(c)
    states = [s for s in res["states"] if any(b[1] == s for b in res["bars"])]
    n = max(1, len(states))
    height = 0.8 / n
    fig, ax = plt.subplots(figsize=(9, 2.4 + 0.3 * n * len(contenders)), layout="constrained")
    bars = {(b[0], b[1]): b[2:] for b in res["bars"]}
    medians = [b[2] for b in res["bars"]] + [lim[1] for s, lim in res["limits"].items() if s in states]
    xmax = 1.6 * max(medians) if medians and max(medians) > 0 else 1.0
    for k, state in enumerate(states):
        ys, med, lo, hi, top = [], [], [], [], []
        for i, c in enumerate(contenders):
            if (c, state) in bars:
                m, mn, mx = bars[(c, state)]
                ys.append(i + (k - (n - 1) / 2) * height)
                med.append(m)
                lo.append(m - mn)
                hi.append(min(mx, xmax) - m)
                top.append(mx)
        color = STATE_COLORS.get(state, None)
        ax.barh(ys, med, height=height * 0.9, xerr=[lo, hi], color=color, ecolor="0.25", capsize=2,
                label=f"{STATE_NAMES.get(state, state)} (median, min-max)")
        for y, m, h, mx in zip(ys, med, hi, top):
            text = f"{m:.2f} s, {res['bytes'] / m / 1e9:.1f} GB/s"
            if m + h >= xmax * 0.72:  # no room right of the bar: inside the axis' right end
                text += f" (max {mx:.2f} s)" if mx > xmax else ""
                ax.text(xmax * 0.995, y, text, va="center", ha="right", fontsize=7,
                        bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1})
            else:
                ax.text(m + h, y, "  " + text, va="center", fontsize=7)
    for state in states:
        if state not in res["limits"]:
            continue
        label, m, mn, mx = res["limits"][state]
        spread = f" ({mn:.2f}-{mx:.2f})" if mx > mn else ""
        ax.axvline(m, color=STATE_COLORS.get(state, "k"), linestyle="--", linewidth=1.3,
                   label=f"{label}: {m:.2f} s{spread}, {res['bytes'] / m / 1e9:.1f} GB/s")
    ax.set_yticks(range(len(contenders)))
    ax.set_yticklabels(contenders, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, xmax)
    xlabel = f"load time, s ({res['xlabel']}); shorter is faster"
    if res.get("note"):
        xlabel += "\n" + res["note"]
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_title(res["title"], fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    fig.legend(fontsize=7, loc="outside lower center", ncol=2, frameon=False)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def chart_by_size(results, path, kind):
    """Load time against checkpoint size, one panel per state, one line per contender."""
    plt = _plt()
    results = sorted(results, key=lambda r: r["bytes"])
    states = []
    for r in results:
        states += [s for s in r["states"] if s not in states]
    fig, axes = plt.subplots(1, len(states), figsize=(5 * len(states), 4.2), squeeze=False)
    contenders = []
    for r in results:
        for b in r["bars"]:
            if b[0] not in contenders:
                contenders.append(b[0])
    cmap = plt.get_cmap("tab10" if len(contenders) <= 10 else "tab20")
    for ax, state in zip(axes[0], states):
        for j, c in enumerate(contenders):
            pts = [(r["bytes"] / 1e9,) + b[2:] for r in results for b in r["bars"] if b[0] == c and b[1] == state]
            if not pts:
                continue
            x = [p[0] for p in pts]
            m = [p[1] for p in pts]
            ax.errorbar(x, m, yerr=[[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]], marker="o",
                        markersize=4, capsize=2, linewidth=1.2, color=cmap(j % cmap.N), label=c)
        lim = [(r["bytes"] / 1e9, r["limits"][state][1]) for r in results if state in r["limits"]]
        if lim:
            ax.plot([p[0] for p in lim], [p[1] for p in lim], "k--", linewidth=1.3, marker="x",
                    label=f"{state} limit")
        ax.set_title(STATE_NAMES.get(state, state), fontsize=9)
        ax.set_xlabel("checkpoint size, GB", fontsize=8)
        ax.set_ylabel("load time, s (median, min-max)", fontsize=8)
        ax.set_ylim(bottom=0)
        ax.set_xlim(left=0)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6)
    what = "Load benchmark, into host memory" if kind == "load" else "GPU benchmark"
    first = results[0]["title"].split("\n")[1].split(";")[0]
    fig.suptitle(f"{what}: load time by checkpoint size ({first})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "out", "charts"),
                    help="directory for the PNG files (default bench/out/charts)")
    ap.add_argument("json", nargs="+", help="results: bench/out/load.json, a GPU run's results.json, ...")
    args = ap.parse_args(argv)
    try:
        _plt()
    except ImportError as e:
        print(f"charts: matplotlib is not installed ({e}); no charts", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    results = []
    for path in args.json:
        res, why = read_result(path)
        if res is None:
            print(f"charts: skipping {path}: {why}")
            continue
        if not res["bars"]:
            print(f"charts: skipping {path}: no completed run in it")
            continue
        results.append(res)
    written = []
    used = set()
    for res in results:
        name = res["tag"]
        k = 2
        while name in used:
            name = f"{res['tag']}-{k}"
            k += 1
        used.add(name)
        out = os.path.join(args.out, name + ".png")
        (chart_fanout if res["kind"] == "fanout" else chart_result)(res, out)
        written.append(out)
    for kind in ("load", "gpu"):
        group = [r for r in results if r["kind"] == kind]
        if len({r["bytes"] for r in group}) > 1:
            out = os.path.join(args.out, f"{kind}-by-size.png")
            chart_by_size(group, out, kind)
            written.append(out)
    for out in written:
        print(f"charts: wrote {out}")
    return 0 if written else 1


if __name__ == "__main__":
    sys.exit(main())
