"""vLLM start-up with each load format, in one run (issue 15): bench/vllm/run.sh.

    .venv/bin/python bench/vllm/vllm_bench.py [--gb 2] [--runs 3] [--formats ...] [--out DIR]

The checkpoint: bench/load/gen_checkpoint.py's Llama-shaped bf16 checkpoint of
at least --gb GB (random bytes, 4 shards, the reference writer's layout) with
a config.json for its shape. Each run is one fresh engine process
(bench/vllm/engine.py, vLLM in-process on the CPU) timed two ways: ready_s,
LLM() constructed (what a server waits for before it serves), and weights_s,
the model loader's load_weights (reading the checkpoint and copying it into
the parameters), timed around every format's loader the same way.

Formats: vLLM's safetensors (its default), runai_streamer, tensorlift (disk),
tensorlift-peer (from a running vLLM instance on this host that loaded with
tensorlift and serves; the seed is started once, outside the timings, and its
memory is the source, so it has no cold state): by default the seed's shared
memory is handed over and mapped as the new instance's parameters (docs/remote.md,
"Same-host handover"); tensorlift-peer-ucx is the same pull with handover off,
the bytes copied over UCX. Each run also reports the host memory it added
(MemTotal - MemAvailable after LLM() minus before, the page cache's growth
excluded): what a second instance of the model costs the host. fastsafetensors and
instanttensor are vLLM formats that load to CUDA only: on a machine without a
GPU they are listed as not runnable.

Cold: every shard fsync'ed and evicted (posix_fadvise DONTNEED) before each
run. Warm: every shard read once before each run. Medians of --runs, the
formats in a seeded shuffled order each round. Every run's greedy tokens must
equal the safetensors format's.

The dtype: before the runs, one bf16 engine start (the safetensors format, not timed) says
whether vLLM's bf16 CPU path runs on this machine (tests/vllm/cpu_probe.py, as the tests ask);
where a process of it dies with SIGILL (vLLM's AMX attention on some Intel VMs, issue 39) every
engine runs in float32 instead. The verdict is printed and kept in the results; TL_E2E_DTYPE
chooses instead.

Writes DIR/vllm.json and DIR/vllm.md (the table docs/inference-servers.md shows).

--reload (issue 54): instead, vLLM's in-place reload, reload_weights, per format (safetensors,
tensorlift; --formats): one engine per format, in a shuffled order, each reloading its own model
directory --runs times cold (evicted before each, residency checked) and --runs times warm
(bench/vllm/engine.py, TL_RELOAD_RUNS). Medians with min-max; the tokens after the reloads must be
the start's. Writes DIR/vllm-reload.json and DIR/vllm-reload.md.
"""
import argparse
import datetime
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench", "load"))
import gen_checkpoint  # noqa: E402
from load_bench import evict, read_through  # noqa: E402
sys.path.insert(0, os.path.join(ROOT, "tests", "vllm"))
import cpu_probe  # noqa: E402

VLLM_PY = os.path.join(ROOT, ".venv-vllm", "bin", "python")
FORMATS = ["safetensors", "runai_streamer", "tensorlift", "tensorlift-peer", "tensorlift-peer-ucx"]
PEER = {"tensorlift-peer": {}, "tensorlift-peer-ucx": {"handover": "off"}}
CUDA_ONLY = {"fastsafetensors": "vLLM's fastsafetensors format loads to cuda:N only",
             "instanttensor": "vLLM's instanttensor format loads to cuda:N only"}
ENV = dict(os.environ, VLLM_TARGET_DEVICE="cpu", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")


def model_dir(gb):
    d = gen_checkpoint.checkpoint_dir(gb, 4)
    meta = json.load(open(os.path.join(d, ".complete")))
    name = meta["shape"]
    _, hidden, inter, vocab, heads, kv = next(s for s in gen_checkpoint.LLAMA_SHAPES if s[0] == name)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
           "intermediate_size": inter, "num_attention_heads": heads, "num_key_value_heads": kv,
           "num_hidden_layers": meta["layers"], "vocab_size": vocab, "max_position_embeddings": 2048,
           "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
           "hidden_act": "silu"}
    path = os.path.join(d, "config.json")
    if not os.path.exists(path) or json.load(open(path)) != cfg:
        with open(path + ".tmp", "w") as f:
            json.dump(cfg, f, indent=1)
        os.replace(path + ".tmp", path)
    return d, meta


def engine(model, fmt, extra=None, hold=False, log=None):
    cmd = [VLLM_PY, os.path.join(HERE, "engine.py"), model, fmt, json.dumps(extra or {})]
    env = dict(ENV, TL_HOLD="1") if hold else ENV
    if hold:
        return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=1800)
    lines = [x for x in p.stdout.splitlines() if x.startswith('{"format"')]
    if p.returncode != 0 or not lines:
        tail = [x for x in p.stdout.splitlines() if "Error" in x][-1:] or p.stdout.splitlines()[-1:]
        return {"error": tail}
    return json.loads(lines[-1])


class PeerSeed:
    def __init__(self, model, out_dir):
        self.ready = os.path.join(out_dir, "seed.url")
        if os.path.exists(self.ready):
            os.unlink(self.ready)
        self.log = open(os.path.join(out_dir, "seed.log"), "w+")
        self.proc = engine(model, "tensorlift", {"serve": {"ready_file": self.ready}}, hold=True, log=self.log)
        deadline = time.monotonic() + 1200
        while not os.path.exists(self.ready):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the seed did not come up: " + open(self.log.name).read()[-3000:])
            time.sleep(0.5)
        self.url = open(self.ready).read().strip()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=120)
        self.log.close()


def measure(args):
    d, meta = model_dir(args.gb)
    shards = gen_checkpoint.shard_paths(d)
    data = {"date": datetime.date.today().isoformat(), "host": platform.node(), "cpus": os.cpu_count(),
            "checkpoint": {"dir": d, "bytes": meta["bytes"], "shape": meta["shape"], "layers": meta["layers"],
                           "shards": len(shards)}, "runs": args.runs, "results": {}, "not_run": dict(CUDA_ONLY)}
    verdict = cpu_probe.choose("vLLM", [VLLM_PY, os.path.join(HERE, "engine.py"), d, "safetensors"], ENV,
                               timeout=1800, marker='{"format"')
    print(f"vllm bench: {verdict.line()}", flush=True)
    ENV["TL_DTYPE"] = data["dtype"] = verdict.dtype
    data["bf16_probe"] = verdict.line()
    formats = args.formats.split(",")
    seed = None
    if any(f in PEER for f in formats):
        print("vllm bench: starting the seed (a vLLM instance serving its weights)", flush=True)
        seed = PeerSeed(d, args.out)
        data["seed_url"] = seed.url
    rng = random.Random(15)
    try:
        for state in ("cold", "warm"):
            for r in range(args.runs):
                order = [f for f in formats if not (f in PEER and state == "cold")]
                rng.shuffle(order)
                for fmt in order:
                    if state == "cold":
                        evict(shards)
                    else:
                        read_through(shards)
                    if fmt in PEER:
                        res = engine(d, "tensorlift", dict({"peer": seed.url, "fallback": False}, **PEER[fmt]))
                    else:
                        res = engine(d, fmt)
                    data["results"].setdefault(fmt, {}).setdefault(state, []).append(res)
                    shown = (f"ready {res['ready_s']:.2f} s, weights {res['weights_s']:.2f} s"
                             if "ready_s" in res else f"failed: {res['error']}")
                    print(f"vllm bench: {state} {r + 1}/{args.runs} {fmt}: {shown}", flush=True)
    finally:
        if seed is not None:
            seed.stop()
    return data


def measure_reload(args):
    d, meta = model_dir(args.gb)
    data = {"kind": "reload", "date": datetime.date.today().isoformat(), "host": platform.node(),
            "cpus": os.cpu_count(), "checkpoint": {"dir": d, "bytes": meta["bytes"], "shape": meta["shape"],
                                                  "layers": meta["layers"],
                                                  "shards": len(gen_checkpoint.shard_paths(d))},
            "runs": args.runs, "results": {}}
    verdict = cpu_probe.choose("vLLM", [VLLM_PY, os.path.join(HERE, "engine.py"), d, "safetensors"], ENV,
                               timeout=1800, marker='{"format"')
    print(f"vllm bench: {verdict.line()}", flush=True)
    ENV["TL_DTYPE"] = data["dtype"] = verdict.dtype
    data["bf16_probe"] = verdict.line()
    data["vllm"] = subprocess.run([VLLM_PY, "-c", "import vllm; print(vllm.__version__)"], capture_output=True,
                                  text=True, env=ENV).stdout.strip().splitlines()[-1:]
    formats = args.formats.split(",")
    random.Random(54).shuffle(formats)
    for fmt in formats:
        ENV["TL_RELOAD_RUNS"] = str(args.runs)
        try:
            res = engine(d, fmt)
        finally:
            del ENV["TL_RELOAD_RUNS"]
        data["results"][fmt] = res
        if "reloads" in res:
            r = res["reloads"]
            print(f"vllm bench: reload {fmt}: cold {[round(x, 2) for x in r['cold']]} s, "
                  f"warm {[round(x, 2) for x in r['warm']]} s", flush=True)
        else:
            print(f"vllm bench: reload {fmt}: failed: {res.get('error')}", flush=True)
    return data


def summarize_reload(data):
    gb = data["checkpoint"]["bytes"] / 1e9
    vllm = data.get("vllm") or [""]
    lines = [f"vLLM {vllm[0] if isinstance(vllm, list) else vllm} on the CPU, {data['date']}: reload_weights "
             f"(collective_rpc, weights_path = the model's own directory), {data['checkpoint']['shape']} shapes, "
             f"{data['checkpoint']['layers']} layers, {gb:.2f} GB bf16 in {data['checkpoint']['shards']} shards; "
             f"the engines in {data.get('dtype', 'bfloat16')}; medians of {data['runs']} reloads (min-max) in one "
             f"engine per format; {data['cpus']} CPUs", "",
             "| format | cold: reload s | warm: reload s | cold GB/s | warm GB/s "
             "| vs safetensors (cold / warm) | shards resident before (cold / warm) | tokens after = before |",
             "|---|---|---|---|---|---|---|---|"]
    base = {}
    st = data["results"].get("safetensors", {}).get("reloads")
    if st:
        base = {s: statistics.median(st[s]) for s in ("cold", "warm")}
    for fmt, res in data["results"].items():
        r = res.get("reloads")
        if not r:
            lines.append(f"| {fmt} | failed: {res.get('error')} |||||||")
            continue
        cells, rates, ratio, resident = [], [], [], []
        for s in ("cold", "warm"):
            m = statistics.median(r[s])
            cells.append(f"{m:.2f} ({min(r[s]):.2f}-{max(r[s]):.2f})")
            rates.append(f"{gb / m:.2f}")
            ratio.append(f"{m / base[s]:.2f}x" if base.get(s) else "–")
            resident.append(f"{max(r['resident'][s]):.2f}" if s == "cold" else f"{min(r['resident'][s]):.2f}")
        same = "yes" if res.get("tokens_after_reload") == res.get("tokens") else "NO"
        lines.append(f"| {fmt} | " + " | ".join(cells) + " | " + " | ".join(rates) + f" | {' / '.join(ratio)} | "
                     f"{' / '.join(resident)} | {same} |")
    return "\n".join(lines) + "\n"


def med(runs, key):
    xs = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(xs) if xs else None


def summarize(data):
    gb = data["checkpoint"]["bytes"] / 1e9
    ref_tokens = next((r["tokens"] for s in data["results"].get("safetensors", {}).values() for r in s
                       if "tokens" in r), None)
    base = {s: med(data["results"].get("safetensors", {}).get(s, []), "weights_s") for s in ("cold", "warm")}
    lines = [f"vLLM {data.get('vllm', '')} on the CPU, {data['date']}: {data['checkpoint']['shape']} shapes, "
             f"{data['checkpoint']['layers']} layers, {gb:.2f} GB bf16 in {data['checkpoint']['shards']} shards; "
             f"the engines in {data.get('dtype', 'bfloat16')}; medians of {data['runs']} runs; {data['cpus']} CPUs",
             *([f"({data['bf16_probe']})"] if "bf16_probe" in data else []), "",
             "| format | cold: weights s | cold: ready s | warm: weights s | warm: ready s | weights vs safetensors (cold / warm) | peak RSS GiB | host memory added (x weights) |",
             "|---|---|---|---|---|---|---|---|"]
    for fmt, states in data["results"].items():
        cells, ratio, rss, notes, added = [], [], [], [], []
        for s in ("cold", "warm"):
            runs = states.get(s, [])
            w, rd = med(runs, "weights_s"), med(runs, "ready_s")
            cells += [f"{w:.2f}" if w else "–", f"{rd:.2f}" if rd else "–"]
            ratio.append(f"{w / base[s]:.2f}x" if w and base.get(s) else "–")
            rss += [r["peak_rss_bytes"] for r in runs if "peak_rss_bytes" in r]
            if s == "warm":
                added += [r["host_added_bytes"] for r in runs if r.get("host_added_bytes") is not None]
            if any("error" in r for r in runs):
                notes.append(f"{s} failed: {next(r['error'] for r in runs if 'error' in r)}")
            if ref_tokens and any(r.get("tokens") not in (None, ref_tokens) for r in runs):
                notes.append(f"{s}: DIFFERENT TOKENS")
        note = f" ({'; '.join(notes)})" if notes else ""
        label = fmt + ({"tensorlift-peer": " (a running vLLM on this host, handed over; no cold state)",
                        "tensorlift-peer-ucx": " (the same seed, handover off: over UCX)"}.get(fmt, ""))
        lines.append(f"| {label}{note} | " + " | ".join(cells) + f" | {' / '.join(ratio)} | "
                     + (f"{max(rss) / 2**30:.2f} |" if rss else "– |")
                     + (f" {statistics.median(added) / data['checkpoint']['bytes']:.2f}x |" if added else " – |"))
    for fmt, why in data["not_run"].items():
        lines.append(f"| {fmt} | not run: {why} |||||||")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gb", type=float, default=2.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "out"))
    ap.add_argument("--report", metavar="JSON", help="print the table of a saved run and exit")
    ap.add_argument("--reload", action="store_true", help="time reload_weights instead of the start (issue 54)")
    args = ap.parse_args()
    if args.report:
        data = json.load(open(args.report))
        print((summarize_reload if data.get("kind") == "reload" else summarize)(data), end="")
        return
    os.makedirs(args.out, exist_ok=True)
    if args.reload:
        if args.formats == ",".join(FORMATS):
            args.formats = "safetensors,tensorlift"
        data = measure_reload(args)
        write(args.out, "vllm-reload", data, summarize_reload(data))
        return
    data = measure(args)
    data["vllm"] = subprocess.run([VLLM_PY, "-c", "import vllm; print(vllm.__version__)"], capture_output=True,
                                  text=True, env=ENV).stdout.strip().splitlines()[-1:]
    data["vllm"] = data["vllm"][0] if data["vllm"] else ""
    write(args.out, "vllm", data, summarize(data))


def write(out, name, data, md):
    """out/NAME.json (the runs) and out/NAME.md (the table), and the table on stdout."""
    with open(os.path.join(out, f"{name}.json"), "w") as f:
        json.dump(data, f, indent=1)
    with open(os.path.join(out, f"{name}.md"), "w") as f:
        f.write(md)
    print(md, end="")

if __name__ == "__main__":
    main()
