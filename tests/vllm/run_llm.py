"""One vLLM engine for tests/vllm/test_vllm.py (vLLM spawns workers, hence a script with a main guard).

    python run_llm.py MODEL_DIR LOAD_FORMAT [EXTRA_CONFIG_JSON]

Starts LLM(model=MODEL_DIR, load_format=LOAD_FORMAT) on the CPU without a
tokenizer, generates greedy tokens for fixed prompts (token ids) and prints
one JSON line: {"tokens": [[...], ...], "ready_s": ...}. Exits non-zero if
the engine cannot start (the error is in the output). With TL_HOLD=1 it then
stays up until its standard input closes (a seed serving its weights). With
TL_INPROC=1 vLLM runs in this one process (no engine-core or worker
processes): the same loader and load, a start several times faster. TL_TP=N
runs it with tensor_parallel_size N (a worker process per rank). A lying seed:
TENSORLIFT_PEER_FAULTS=corrupt:NAME@0 in its environment (src/remote/peer_faults.h). TL_DTYPE is the model's dtype (bfloat16 when unset; the tests' is cpu_probe's
choice). The JSON line also has "logprobs": each generated position's top 5 as [token, logprob]
pairs (floats exact in JSON).

TL_RELOAD='[PATH or null, ...]': after generating, reloads the weights in place once per entry
(`llm.collective_rpc("reload_weights", kwargs={"weights_path": PATH})`; null: without a path, the
engine's own model again) and generates again after each; "reloads" in the JSON line has, per
entry, {"path", "ok", "error" (the error's text when it failed), "seconds", "tokens", "logprobs"}.
"""
import json
import os
import sys
import time

PROMPTS = [[1, 2, 3, 4], [7, 100, 42, 5, 9, 300]]


def main():
    inproc = os.environ.get("TL_INPROC") == "1"
    if inproc:  # vLLM in this one process: the same load, a much faster start
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams
    model, load_format = sys.argv[1], sys.argv[2]
    extra = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
    tp = int(os.environ.get("TL_TP", "1"))
    t0 = time.perf_counter()
    llm = LLM(tensor_parallel_size=tp, model=model, load_format=load_format, model_loader_extra_config=extra, skip_tokenizer_init=True,
              dtype=os.environ.get("TL_DTYPE") or "bfloat16", enforce_eager=True, gpu_memory_utilization=0.1, max_model_len=128,
              **({"distributed_executor_backend": "uni"} if inproc else {}))
    ready = time.perf_counter() - t0
    params = SamplingParams(max_tokens=8, temperature=0, logprobs=5)

    def generate():
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
        return {"tokens": [list(o.outputs[0].token_ids) for o in outs],
                "logprobs": [[sorted([t, lp.logprob] for t, lp in pos.items()) for pos in o.outputs[0].logprobs]
                             for o in outs]}

    result = dict(generate(), ready_s=ready)
    if os.environ.get("TL_RELOAD"):
        result["reloads"] = []
        for path in json.loads(os.environ["TL_RELOAD"]):
            step = {"path": path, "ok": True, "error": ""}
            t = time.perf_counter()
            try:
                llm.collective_rpc("reload_weights", kwargs={"weights_path": path} if path else {})
            except Exception as e:  # the engine's answer: the test checks it, and that the engine still serves
                step.update(ok=False, error=str(e))
            step["seconds"] = time.perf_counter() - t
            step.update(generate())
            result["reloads"].append(step)
    print(json.dumps(result), flush=True)
    if os.environ.get("TL_HOLD") == "1":
        sys.stdin.read()  # until the test closes our stdin


if __name__ == "__main__":
    main()
