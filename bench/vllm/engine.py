"""One vLLM engine start for bench/vllm/vllm_bench.py, in its own process (.venv-vllm's Python).

    python engine.py MODEL_DIR LOAD_FORMAT [EXTRA_CONFIG_JSON]

Runs vLLM in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, the "uni"
executor), so that the same timer wraps every format's load: each model
loader class's load_weights (reading the checkpoint and copying it into the
model's parameters) is timed here, whatever the format logs. Prints one JSON
line: ready_s (LLM() constructed: config, model init, weights, warm-up, KV
cache), weights_s, the first greedy tokens (to check every format gave the
same model), peak RSS, and host_added_bytes: the host memory in use
(MemTotal - MemAvailable) after LLM() minus before, less the page cache's
growth (reclaimable), so that memory shared with another process counts once. With TL_HOLD=1 it stays up until stdin closes (a seed). TL_DTYPE is the
model's dtype (bfloat16 when unset; vllm_bench.py sets the probe's choice).

TL_RELOAD_RUNS=N (issue 54): after the start, reloads the weights in place from the model's own
directory (`collective_rpc("reload_weights", kwargs={"weights_path": MODEL_DIR})`, as an RL
loop does with each new checkpoint) N times cold (every shard fsync'ed and evicted before each,
its residency checked) and N times warm (every shard read once before each), and adds
"reloads": {"cold": [seconds, ...], "warm": [...], "resident": {"cold": [...], "warm": [...]}}
(each reload's wall time around collective_rpc, and the shards' smallest resident fraction just
before it) to the JSON line, with the greedy tokens after the last reload (they must be the
start's).
"""
import json
import os
import resource
import sys
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def host_used():
    m = {}
    for line in open("/proc/meminfo"):
        k, v = line.split(":")
        m[k] = int(v.split()[0]) * 1024
    return m["MemTotal"] - m["MemAvailable"], m["Cached"] - m.get("Shmem", 0)


def main():
    model, load_format = sys.argv[1], sys.argv[2]
    extra = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
    from vllm import LLM, SamplingParams
    from vllm.plugins import load_general_plugins
    load_general_plugins()  # registers --load-format tensorlift (the installed entry point)
    import vllm.model_executor.model_loader as ml

    timings = []

    def timed(cls):
        original = cls.load_weights

        def load_weights(self, model, model_config):
            t0 = time.perf_counter()
            try:
                return original(self, model, model_config)
            finally:
                timings.append(time.perf_counter() - t0)
        cls.load_weights = load_weights

    for cls in set(ml._LOAD_FORMAT_TO_MODEL_LOADER.values()):
        if "load_weights" in cls.__dict__:
            timed(cls)
    used0, cache0 = host_used()
    t0 = time.perf_counter()
    llm = LLM(model=model, load_format=load_format, model_loader_extra_config=extra, skip_tokenizer_init=True,
              dtype=os.environ.get("TL_DTYPE") or "bfloat16", enforce_eager=True, max_model_len=128,
              distributed_executor_backend="uni",
              # On the CPU this is the share of host memory for weights + KV cache: room for
              # a 2 GB model beside a seed holding two copies of its own.
              gpu_memory_utilization=float(os.environ.get("TL_BENCH_MEMORY_SHARE", "0.35")))
    ready = time.perf_counter() - t0
    used1, cache1 = host_used()
    out = llm.generate([{"prompt_token_ids": [1, 2, 3, 4]}], SamplingParams(max_tokens=4, temperature=0))
    result = {"format": load_format, "extra": extra, "ready_s": ready,
              "weights_s": sum(timings) if timings else None,
              "tokens": list(out[0].outputs[0].token_ids),
              "host_added_bytes": (used1 - used0) - max(0, cache1 - cache0),
              "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    if os.environ.get("TL_RELOAD_RUNS"):
        result["reloads"] = reloads(llm, model, int(os.environ["TL_RELOAD_RUNS"]))
        out = llm.generate([{"prompt_token_ids": [1, 2, 3, 4]}], SamplingParams(max_tokens=4, temperature=0))
        result["tokens_after_reload"] = list(out[0].outputs[0].token_ids)
    print(json.dumps(result), flush=True)
    if os.environ.get("TL_HOLD") == "1":
        sys.stdin.read()


def reloads(llm, model, runs):
    """runs cold and runs warm reloads of the model's own directory, each timed around
    collective_rpc (see the module docstring)."""
    import glob
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "load"))
    from load_bench import evict, read_through, resident_fraction
    shards = sorted(glob.glob(os.path.join(model, "*.safetensors")))
    out = {"cold": [], "warm": [], "resident": {"cold": [], "warm": []}}
    for state in ("cold", "warm"):
        for _ in range(runs):
            if state == "cold":
                evict(shards)
            else:
                read_through(shards)
            out["resident"][state].append(min(resident_fraction(f) for f in shards))
            t0 = time.perf_counter()
            llm.collective_rpc("reload_weights", kwargs={"weights_path": model})
            out[state].append(time.perf_counter() - t0)
    return out


if __name__ == "__main__":
    main()
