"""One SGLang engine for tests/sglang/test_sglang.py (SGLang spawns its scheduler, hence a main guard).

    python run_sglang.py MODEL_DIR LOAD_FORMAT [EXTRA_CONFIG_JSON]

Starts sglang.Engine(model_path=MODEL_DIR, load_format=LOAD_FORMAT) on the
CPU (torch_native attention, no tokenizer), generates greedy tokens for fixed
prompts (token ids) and prints one JSON line: {"tokens": [[...], ...],
"ready_s": ...}. Exits non-zero if the engine cannot start (the error is in
the output). With TL_HOLD=1 it then stays up until its standard input closes
(a seed serving its weights). The loader runs in SGLang's scheduler process,
which finds the plugin through tensorlift's sglang.srt.plugins entry point. TL_DTYPE is the
model's dtype (bfloat16 when unset; the tests' is cpu_probe's choice). The JSON line also has
"logprobs": each generated position's top 5 as [token, logprob] pairs (floats exact in JSON).

TL_RELOAD='[PATH, ...]': after generating, updates the weights in place once per entry
(`engine.update_weights_from_disk(PATH, load_format="tensorlift")`) and generates again after
each; "reloads" in the JSON line has, per entry, {"path", "ok", "error" (SGLang's message when it
failed), "seconds", "tokens", "logprobs"}.
"""
import json
import os
import sys
import time

PROMPTS = [[1, 2, 3, 4], [7, 100, 42, 5, 9, 300]]


def main():
    import sglang
    model, load_format = sys.argv[1], sys.argv[2]
    extra = sys.argv[3] if len(sys.argv) > 3 else None
    t0 = time.perf_counter()
    engine = sglang.Engine(model_path=model, load_format=load_format, model_loader_extra_config=extra or "{}",
                           device="cpu", attention_backend="torch_native", skip_tokenizer_init=True,
                           dtype=os.environ.get("TL_DTYPE") or "bfloat16", mem_fraction_static=0.1, context_length=128,
                           disable_cuda_graph=True, log_level="info")
    ready = time.perf_counter() - t0
    def generate():
        outs = engine.generate(input_ids=PROMPTS, sampling_params={"max_new_tokens": 8, "temperature": 0},
                               return_logprob=True, top_logprobs_num=5)
        return {"tokens": [o["output_ids"] for o in outs],
                "logprobs": [[sorted([t, lp] for lp, t, _ in pos) for pos in o["meta_info"]["output_top_logprobs"]]
                             for o in outs]}

    try:
        result = dict(generate(), ready_s=ready)
        if os.environ.get("TL_RELOAD"):
            result["reloads"] = []
            for path in json.loads(os.environ["TL_RELOAD"]):
                t = time.perf_counter()
                ok, message, _ = engine.update_weights_from_disk(path, load_format="tensorlift")
                step = {"path": path, "ok": ok, "error": "" if ok else message, "seconds": time.perf_counter() - t}
                step.update(generate())
                result["reloads"].append(step)
        print(json.dumps(result), flush=True)
        if os.environ.get("TL_HOLD") == "1":
            sys.stdin.read()  # until the test closes our stdin
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()
