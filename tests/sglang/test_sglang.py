"""SGLang with --load-format tensorlift, end to end on the CPU (sglang 0.5.23 in .venv-vllm).

Run by `make test` with .venv-vllm's Python (scripts/test.sh), after the vLLM
tests. Each engine runs in its own process (tests/sglang/run_sglang.py, or
SGLang's OpenAI server); the loader runs in SGLang's scheduler process, which
finds the plugin through tensorlift's installed `sglang.srt.plugins` entry
point: nothing here registers it by hand. Models are the small random-weight
checkpoints of tests/vllm/make_model.py. Every engine runs in the dtype chosen once per session
(the sglang_dtype fixture, tests/vllm/cpu_probe.py): bf16 where a bf16 engine runs on this CPU,
float32 where one dies with SIGILL; the verdict is printed as one line.
"""
import json
import os
import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "vllm"))
import servers  # noqa: E402  (tests/vllm/servers.py: what both servers' tests share)

ENV = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"), HF_HUB_OFFLINE="1",
           TOKENIZERS_PARALLELISM="false")


STATE = {}  # "dtype": what every engine here runs in (the sglang_dtype fixture sets it first)


def make_model(arch, out):
    return servers.make_model(arch, out, ENV)


def engine_env(**extra):
    """The environment of one engine: ENV, this session's dtype (TL_DTYPE, read by run_sglang.py)
    and extra."""
    return dict(ENV, TL_DTYPE=STATE.get("dtype", ""), **extra)


def engine_command(model, load_format, extra=None):
    return [sys.executable, str(HERE / "run_sglang.py"), str(model), load_format] + (
        [json.dumps(extra)] if extra is not None else [])


def run_engine(model, load_format, extra=None, expect_ok=True):
    return servers.run_engine(engine_command(model, load_format, extra), engine_env(), expect_ok)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return make_model("llama", tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="module", autouse=True)
def sglang_dtype(llama, request):
    """The dtype of every engine here: the verdict of a bf16 engine (the safetensors format) on
    this CPU, once per session."""
    verdict = servers.e2e_verdict(request.config, "SGLang", engine_command(llama, "safetensors"), engine_env())
    STATE["dtype"] = verdict.dtype
    yield verdict
    STATE.clear()


@pytest.fixture(scope="module")
def llama_fresh(llama, sglang_dtype):
    """A fresh engine on llama with SGLang's own format: {"tokens", "logprobs", ...}."""
    if sglang_dtype.runs and sglang_dtype.command[2] == str(llama):
        return sglang_dtype.result()  # the probe was this very run, in this dtype
    return run_engine(llama, "safetensors")


@pytest.fixture(scope="module")
def llama_reference(llama_fresh):
    return llama_fresh["tokens"]


def test_the_plugin_is_installed_and_adds_the_format():
    import importlib.metadata as md
    eps = [e for e in md.entry_points(group="sglang.srt.plugins") if e.name == "tensorlift"]
    assert eps and eps[0].value == "tensorlift.integrations.sglang:register"
    code = ("from sglang.srt.plugins import load_plugins; load_plugins();"
            "from sglang.srt.arg_groups.choices import LOAD_FORMAT_CHOICES;"
            "from sglang.srt.configs.load_config import LoadConfig;"
            "from sglang.srt.model_loader.loader import get_model_loader;"
            "assert 'tensorlift' in LOAD_FORMAT_CHOICES;"
            "print(type(get_model_loader(LoadConfig(load_format='tensorlift'))).__name__);"
            "print(LoadConfig(load_format='safetensors').load_format)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    # Ours becomes the loader; every other format is SGLang's as before.
    assert p.stdout.strip().splitlines()[-2:] == ["TensorliftSGLangLoader", "LoadFormat.SAFETENSORS"], p.stdout


@pytest.fixture(scope="module")
def reload_dirs(llama, tmp_path_factory):
    """(new weights for llama, {kind: (a directory an update must refuse, the file to blame)}): the
    bad ones are copies of llama with one fault each (tests/vllm/servers.py)."""
    root = tmp_path_factory.mktemp("reload")
    return servers.new_weights(llama, root / "new"), servers.bad_copies(llama, root)


@pytest.fixture(scope="module")
def updated(llama, reload_dirs):
    """An engine on llama with load_format tensorlift that then updates its weights in place
    (`Engine.update_weights_from_disk(PATH, load_format="tensorlift")`): new weights, the three bad
    directories, llama's again. Its result (run_sglang.py's JSON line)."""
    new, bad = reload_dirs
    env = engine_env(TL_RELOAD=json.dumps([str(new)] + [str(bad[k][0]) for k in bad] + [str(llama)]))
    return servers.run_engine(engine_command(llama, "tensorlift"), env)


def test_llama_greedy_tokens_equal_the_safetensors_format(llama, llama_reference, updated):
    assert len(list(llama.glob("*.safetensors"))) >= 2  # sharded, with an index
    assert updated["tokens"] == llama_reference
    assert "tensorlift: loading weights took" in updated["output"]


def test_update_weights_from_disk_with_the_tensorlift_format(llama_fresh, reload_dirs, updated):
    """Issue 54: the same engine takes new weights; each bad directory is refused with tensorlift's
    one error naming the file (SGLang: "Failed to get weights iterator", nothing written) and the
    new weights keep serving (tokens and top-5 logprobs unchanged); llama's weights again by path
    give, to the last bit of the logprobs, what a fresh engine on llama gives (SGLang's own format:
    the dtype probe's run)."""
    new, bad = reload_dirs
    ref = llama_fresh
    steps = updated["reloads"]
    assert steps[0]["ok"] and steps[0]["tokens"] != ref["tokens"], steps[0]
    for kind, step in zip(bad, steps[1:4]):
        where, name = bad[kind]
        assert not step["ok"], (kind, step)
        assert "Failed to get weights iterator" in step["error"] and "was refused before any weight was written" \
            in step["error"] and name in step["error"], (kind, step["error"][-2000:])
        assert (step["tokens"], step["logprobs"]) == (steps[0]["tokens"], steps[0]["logprobs"]), kind
    assert steps[4]["ok"], steps[4]
    assert (steps[4]["tokens"], steps[4]["logprobs"]) == (ref["tokens"], ref["logprobs"])


def test_a_striped_load_reads_from_the_files_and_a_peer_at_once(llama, llama_reference):
    """The stripe option: every piece from the local files and a peer serving them at once."""
    from tensorlift import remote
    with remote.serve(llama, chunk_bytes=256 << 10) as server:
        url = server.url
        got = run_engine(llama, "tensorlift", {"stripe": {"peer": url, "page_cache": False}})
    assert got["tokens"] == llama_reference
    assert "tensorlift: weights striped over 2 sources: " in got["output"], got["output"][-3000:]
    assert f"{url} " in got["output"]


bucket = pytest.fixture(scope="module", name="bucket")(servers.llama_bucket)


def test_a_model_in_a_bucket_loads_with_the_tensorlift_format(bucket, llama_reference, tmp_path):
    """model_path s3://bucket/model with load_format tensorlift: SGLang pulls the config (its
    runai-model-streamer step), its load format stays tensorlift (not runai_streamer), and
    tensorlift streams the weights from the bucket; the same greedy tokens as a local load."""
    env = engine_env(**servers.s3_env(bucket), SGLANG_CACHE_DIR=str(tmp_path / "cache"))
    got = servers.run_engine(engine_command("s3://models/llama/", "tensorlift"), env)
    assert got["tokens"] == llama_reference
    assert "tensorlift: weights from s3://models/llama/" in got["output"], got["output"][-3000:]
    assert "tensorlift: loading weights took" in got["output"]


def test_qwen2_with_tied_embeddings_and_options(tmp_path):
    model = make_model("qwen2", tmp_path / "qwen2")
    ref = run_engine(model, "safetensors")["tokens"]
    assert run_engine(model, "tensorlift", {"mode": "buffered", "threads": 2})["tokens"] == ref


def test_a_corrupt_shard_stops_start_up_with_the_one_line_error(llama, tmp_path):
    shard = servers.corrupt_copy(llama, tmp_path / "bad")
    servers.assert_format_error(run_engine(shard.parent, "tensorlift", expect_ok=False), shard)


def test_an_unknown_option_is_refused(llama):
    err = run_engine(llama, "tensorlift", {"mode": "direct", "bogus": 1}, expect_ok=False)
    assert "unknown option(s) ['bogus']" in err, err[-3000:]


def test_the_openai_server_serves_with_the_tensorlift_format(llama, llama_reference, reload_dirs, updated, tmp_path):
    """The server's own argument parser takes --load-format tensorlift (the plugin added the
    choice), and its POST /update_weights_from_disk with "load_format": "tensorlift" updates the
    weights in place (issue 54): the new weights' tokens are the Engine's after the same update; a
    truncated shard is refused (400, naming the file) and the new weights keep serving."""
    new, bad = reload_dirs
    port = servers.free_port()
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(llama), "--load-format", "tensorlift",
           "--host", "127.0.0.1", "--port", str(port), "--device", "cpu", "--attention-backend", "torch_native",
           "--skip-tokenizer-init", "--dtype", STATE["dtype"], "--mem-fraction-static", "0.1",
           "--context-length", "128", "--disable-cuda-graph"]
    log = open(tmp_path / "server.log", "w+")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=ENV, start_new_session=True)
    try:
        servers.wait_healthy(proc, f"http://127.0.0.1:{port}/health", log.name)
        def generate():
            return servers.post_json(f"http://127.0.0.1:{port}/generate",
                                     {"input_ids": [1, 2, 3, 4],
                                      "sampling_params": {"max_new_tokens": 8, "temperature": 0}})["output_ids"]

        def update(path):
            return servers.post_json(f"http://127.0.0.1:{port}/update_weights_from_disk",
                                     {"model_path": str(path), "load_format": "tensorlift"}, status=True)

        assert generate() == llama_reference[0]
        assert "tensorlift: loading weights took" in open(log.name).read()
        code, answer = update(new)
        assert code == 200 and answer["success"], answer
        assert generate() == updated["reloads"][0]["tokens"][0]
        where, name = bad["truncated"]
        code, answer = update(where)
        assert code == 400 and not answer["success"] and name in answer["message"], answer
        assert "was refused before any weight was written" in answer["message"], answer
        assert generate() == updated["reloads"][0]["tokens"][0]
    finally:
        servers.stop_group(proc)
        log.close()


def test_a_new_instance_pulls_its_weights_from_a_running_one(llama, llama_reference, tmp_path):
    """The seed registers in etcd; a new instance finds it there ({"registry": URL}) and, handover
    off, pulls its parameters over UCX, relaying them while they arrive (on by default with a
    registry). The same-host handover: tests/vllm's case (the same loader code)."""
    with servers.etcd(tmp_path) as etcd, servers.Seed(lambda opts: engine_command(llama, "tensorlift", opts),
                                                      engine_env(), tmp_path, serve={"registry": etcd}) as seed:
        assert seed.tokens == llama_reference
        # No fallback: the weights can only come from the seed.
        got = run_engine(llama, "tensorlift", {"registry": etcd, "fallback": False, "handover": "off"})
        assert got["tokens"] == llama_reference
        line = servers.weights_line(got["output"])
        assert f"weights from {seed.url}" in line and "handed over" not in line, line
        assert "; relayed at http://127.0.0.1:" in line, line
