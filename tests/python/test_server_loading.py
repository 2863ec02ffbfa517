"""What vLLM's and SGLang's `tensorlift` load formats share and which needs neither server
(tensorlift.integrations.loading): option checking, the read-ahead pieces, and the weights
they yield. The formats inside a real vLLM and SGLang are tested by tests/vllm and
tests/sglang (make test, .venv-vllm)."""
import pytest
import torch
from safetensors.torch import load_file, save_file

from tensorlift._tensorlift import ucx_version
from tensorlift.integrations import loading as tlv
from tensorlift.integrations import vllm as tl_vllm

# Serving and pulling need the UCX data plane; a build without it (the GPU check's bundle) skips
# these, as ctest skips its UCX tests.
needs_ucx = pytest.mark.skipif(ucx_version() is None, reason="tensorlift was built without UCX (Debian libucx-dev)")


def test_the_vllm_module_imports_without_vllm_and_shares_the_options():
    assert tl_vllm.parse_options is tlv.parse_options and tl_vllm.iterate_weights is tlv.iterate_weights


def test_options_are_checked():
    assert tlv.parse_options(None) == {}
    assert tlv.parse_options({"mode": "direct", "threads": 4, "filter": "^a", "progress": False})["threads"] == 4
    for bad, msg in [({"bogus": 1}, "unknown option(s) ['bogus']"), ({"mode": "fast"}, "mode must be one of"),
                     ({"threads": 0}, "threads must be a positive integer"), ({"threads": True}, "threads"),
                     ({"filter": "("}, "is not a regex"), ({"progress": "yes"}, "progress must be"),
                     ([1], "must be a JSON object"),
                     ({"filter": "^a", "peer": "http://127.0.0.1:1"}, "give filter or peer/registry, not both"),
                     ({"stripe": {}}, "stripe must be an object with keys from"),
                     ({"stripe": {"peers": "x"}}, "stripe must be an object with keys from"),
                     ({"stripe": {"peer": [1]}}, "stripe.peer must be a URL"),
                     ({"stripe": {"bucket": "/tmp/x"}}, "stripe.bucket must be an s3:// or gs:// URL"),
                     ({"stripe": {"peer": "http://h:1"}, "mode": "direct"}, "leave mode at auto"),
                     ({"stripe": {"peer": "http://h:1"}, "registry": "http://e:2379"}, "give one of them"),
                     ({"peer": "http://h:1", "handover": "on"}, "handover must be one of auto, off, verify"),
                     ({"handover": "off"}, "handover applies to a peer load or serve")]:
        with pytest.raises(ValueError, match=msg.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
            tlv.parse_options(bad)


@pytest.fixture
def shards(tmp_path):
    g = torch.Generator().manual_seed(5)
    paths = []
    for k in range(2):
        p = tmp_path / f"model-0000{k + 1}-of-00002.safetensors"
        save_file({f"layers.{k}.w{i}": torch.randn(64, 32, generator=g).to(torch.bfloat16) for i in range(6)}
                  | {f"layers.{k}.norm": torch.ones(32)}, str(p))
        paths.append(str(p))
    return paths


def test_pieces_follow_file_order_and_size(shards):
    from tensorlift._tensorlift import Checkpoint
    w = 64 * 32 * 2
    pieces = tlv.plan_groups(shards, None, group_bytes=2 * w)
    for f in shards:
        in_file = [g for p, g in pieces if p == f]
        # File order (the writer puts the small F32 norm first), cut once a piece reaches 2 w's bytes.
        order = [t[0] for t in Checkpoint.open(f).shard_tensors(0)]
        assert [n for g in in_file for n in g] == order
        assert [len(g) for g in in_file] == [3, 2, 2]
    assert [p for p, _ in pieces] == [shards[0]] * 3 + [shards[1]] * 3
    only = tlv.plan_groups(shards, r"\.w[01]$", group_bytes=1 << 30)
    assert [sorted(g) for _, g in only] == [["layers.0.w0", "layers.0.w1"], ["layers.1.w0", "layers.1.w1"]]


def test_the_weights_are_the_reference_tensors(shards, monkeypatch):
    monkeypatch.setattr(tlv, "GROUP_BYTES", 3 * 64 * 32 * 2)  # several pieces per file
    assert len(tlv.plan_groups(shards, None)) == 4  # not 2: the patched size counts
    ref = {n: t for f in shards for n, t in load_file(f).items()}
    got = dict(tlv.iterate_weights(shards, "cpu", {"mode": "buffered", "threads": 2}))
    assert got.keys() == ref.keys()
    for n, t in ref.items():
        assert got[n].dtype == t.dtype and torch.equal(got[n], t), n


def test_a_bad_file_raises_the_format_error(shards, tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(open(shards[0], "rb").read()[:-10])
    import tensorlift
    with pytest.raises(tensorlift.FormatError, match="bad.safetensors"):
        list(tlv.iterate_weights([shards[1], str(bad)], "cpu", {}))


def test_a_model_split_over_ranks_reads_views_on_the_cpu(shards, monkeypatch):
    """Tensor or pipeline parallel ranks get views of the files (each touches only its slices, the
    device reads each byte once); one rank reads as asked; a mode the user chose is kept."""
    assert tlv.read_plan("cuda:1", {}, 1) == ("cuda:1", "auto")
    assert tlv.read_plan("cuda:1", {}, 2) == ("cpu", "mmap")
    assert tlv.read_plan("cuda:1", {"mode": "direct"}, 4) == ("cuda:1", "direct")
    assert tlv.read_plan("cpu", {"mode": "buffered"}, 1) == ("cpu", "buffered")
    import tensorlift._stream as st
    seen = []
    real = st.stream

    def recording(*args, **kwargs):
        seen.append((kwargs["device"], kwargs["mode"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(st, "stream", recording)
    ref = {n: t for f in shards for n, t in load_file(f).items()}
    got = dict(tlv.iterate_weights(shards, "cpu", {}, ranks=2))
    assert seen == [("cpu", "mmap")]
    assert got.keys() == ref.keys() and all(torch.equal(got[n], t) for n, t in ref.items())


# R-Fork in the server formats: a loaded model serves its parameters, a new one pulls them
# into its own (serve_parameters / pull_parameters), here with plain torch modules.

class Tiny(torch.nn.Module):
    def __init__(self, rows=8, seed=None):
        super().__init__()
        self.embed = torch.nn.Parameter(torch.zeros(rows, 16, dtype=torch.bfloat16), requires_grad=False)
        self.proj = torch.nn.Linear(16, 4, bias=True)
        self.proj.requires_grad_(False)
        self.head = self.embed  # tied: one parameter under two names, served once
        if seed is not None:
            g = torch.Generator().manual_seed(seed)
            with torch.no_grad():
                for p in self.parameters():
                    p.copy_(torch.randn(p.shape, generator=g).to(p.dtype))


def _key(model_dir, tp_size=1, options=None):
    return tlv.parameter_key(str(model_dir), dict({"model": "tiny", "revision": "r1"}, **(options or {})),
                             "test-1.0", torch.bfloat16, None, tp_size)


def _seed(model, key, tp_size=1, tp_rank=0, handover="auto", **serve):
    logs = []
    tlv.serve_parameters(model, {"serve": serve, "handover": handover}, key, tp_size, tp_rank, lambda u: [u],
                         lambda fmt, *a: logs.append(fmt % a))
    server = tlv.SERVERS.pop()
    return server, logs


def _pull(model, key, options, tp_size=1, tp_rank=0, model_dir="/nonexistent"):
    logs = []
    got = tlv.pull_parameters(model, str(model_dir), options, key, tp_size, tp_rank,
                              lambda fmt, *a: logs.append(fmt % a))
    return got, logs


def test_the_parameter_key_names_the_server_and_the_layout(shards, tmp_path):
    key = _key(tmp_path, 2)
    assert key == {"model": "tiny", "revision": "r1+test-1.0-parameters-tp2", "dtype": "bfloat16",
                   "quantization": "none"}
    # Without model and revision: the checkpoint directory's default key, extended.
    import os
    default = tlv.parameter_key(os.path.dirname(shards[0]), {}, "test-1.0", torch.float16, "fp8", 1)
    assert default["revision"].endswith("+test-1.0-parameters-tp1") and default["quantization"] == "fp8"
    with pytest.raises(ValueError, match="needs model and revision"):
        tlv.parameter_key(str(tmp_path / "missing"), {}, "test-1.0", torch.bfloat16, None, 1)


@needs_ucx
def test_a_new_model_pulls_the_parameters_into_its_own(tmp_path):
    seed_model, key = Tiny(seed=1), _key(tmp_path)
    server, logs = _seed(seed_model, key, ready_file=str(tmp_path / "url"))
    try:
        assert (tmp_path / "url").read_text() == server.url + "\n" and "serving the weights from shared memory at" in logs[0]
        new = Tiny()
        got, logs = _pull(new, key, {"peer": [server.url], "fallback": False})
        assert got and f"weights from {server.url}" in logs[-1] and "handed over" in logs[-1], logs
        for (name, p), (_, q) in zip(new.named_parameters(), seed_model.named_parameters()):
            assert torch.equal(p, q), name
        assert new.head is new.embed  # still tied
        # Over UCX when handover is off (the bytes travel; the server counts them).
        over_ucx = Tiny()
        got, logs = _pull(over_ucx, key, {"peer": [server.url], "fallback": False, "handover": "off"})
        assert got and "handed over" not in logs[-1], logs
        for (name, p), (_, q) in zip(over_ucx.named_parameters(), seed_model.named_parameters()):
            assert torch.equal(p, q), name
        assert server.served_bytes > 0
    finally:
        server.close()


def _memfd_of(t):
    """The name of the shared-memory file whose mapping holds t's bytes, else None."""
    addr = t.data_ptr()
    for line in open("/proc/self/maps"):
        fields = line.split(maxsplit=5)
        lo, hi = (int(x, 16) for x in fields[0].split("-"))
        if lo <= addr < hi:
            name = fields[5].strip() if len(fields) > 5 else ""
            return name if name.startswith("/memfd:") else None
    return None


@needs_ucx
def test_same_host_instances_keep_one_copy_and_their_writes_stay_their_own(tmp_path):
    """Same-host handover in the server formats: the seed's parameters move into sealed shared
    memory (its model keeps a copy-on-write mapping of it), a new instance's parameters are the
    same memory mapped; a write on either side changes that side's page only."""
    seed_model, key = Tiny(seed=5), _key(tmp_path)
    want = {n: p.clone() for n, p in seed_model.named_parameters()}
    server, logs = _seed(seed_model, key)
    try:
        assert seed_model.head is seed_model.embed
        for name, p in seed_model.named_parameters():
            assert _memfd_of(p) == "/memfd:tensorlift:tiny (deleted)", name
            assert torch.equal(p, want[name]), name
        new = Tiny()
        got, logs = _pull(new, key, {"peer": [server.url], "fallback": False})
        assert got and "handed over" in logs[-1], logs
        for name, p in new.named_parameters():
            assert _memfd_of(p) == "/memfd:tensorlift:tiny (deleted)", name
        with torch.no_grad():
            seed_model.embed.add_(1)  # post-processing in place, on the seed's side
            new.proj.weight.mul_(2)  # and on the new instance's
        assert torch.equal(new.embed, want["embed"])
        assert torch.equal(seed_model.proj.weight, want["proj.weight"])
        # What a third instance gets is still the weights as served.
        third = Tiny()
        assert _pull(third, key, {"peer": [server.url], "fallback": False, "handover": "verify"})[0]
        for name, p in third.named_parameters():
            assert torch.equal(p, want[name]), name
    finally:
        server.close()
    # The seed's server is gone; both models still hold their (mapped) parameters.
    assert torch.equal(new.embed, want["embed"]) and torch.equal(seed_model.embed, want["embed"] + 1)


@needs_ucx
def test_a_model_of_other_shapes_is_left_untouched_and_falls_back(tmp_path):
    seed_model, key = Tiny(seed=1), _key(tmp_path)
    server, _ = _seed(seed_model, key)
    try:
        other = Tiny(rows=6)
        before = {n: p.clone() for n, p in other.named_parameters()}
        got, logs = _pull(other, key, {"peer": [server.url]}, model_dir=tmp_path)  # fallback: its own files
        assert got is False and "weights from disk:" in logs[-1] and "parameter 'embed'" in logs[-1], logs
        for n, p in other.named_parameters():
            assert torch.equal(p, before[n]), n
        with pytest.raises(RuntimeError, match="parameter 'embed': the peer has torch.bfloat16 \\[8, 16\\]"):
            _pull(other, key, {"peer": [server.url], "fallback": False}, model_dir=tmp_path)
    finally:
        server.close()


@needs_ucx
def test_another_layout_or_a_dead_peer_gives_the_files_or_a_clear_error(tmp_path):
    server, _ = _seed(Tiny(seed=1), _key(tmp_path, tp_size=1))
    url = server.url
    try:
        got, logs = _pull(Tiny(), _key(tmp_path, tp_size=2), {"peer": [url]}, model_dir=tmp_path)
        assert got is False and "incompatible: revision" in logs[-1], logs
    finally:
        server.close()
    got, logs = _pull(Tiny(), _key(tmp_path), {"peer": [url], "timeout": 2}, model_dir=tmp_path)
    assert got is False and "weights from disk:" in logs[-1] and url in logs[-1]
    with pytest.raises(RuntimeError, match="no peer worked"):
        _pull(Tiny(), _key(tmp_path), {"peer": [url], "timeout": 2, "fallback": False}, model_dir=tmp_path)


@needs_ucx
def test_ranks_pull_from_the_same_rank_of_the_seed(tmp_path):
    """Two seed ranks serve different parameters under one key; each new rank gets its own."""
    key = _key(tmp_path, 2)
    seeds = [Tiny(seed=10 + r) for r in range(2)]
    servers = [_seed(m, key, tp_size=2, tp_rank=r)[0] for r, m in enumerate(seeds)]
    try:
        urls = [s.url for s in servers]
        for r in range(2):
            new = Tiny()
            got, logs = _pull(new, key, {"peer": urls, "fallback": False}, tp_size=2, tp_rank=r)
            assert got, logs
            for (name, p), (_, q) in zip(new.named_parameters(), seeds[r].named_parameters()):
                assert torch.equal(p, q), (r, name)
    finally:
        for s in servers:
            s.close()


@needs_ucx
@pytest.mark.parametrize("handover", ["auto", "off"])
def test_a_model_that_pulled_serves_the_buffers_it_pulled(tmp_path, handover):
    """Off: the pulled buffers are served where they are. Auto: the seed hands over its memory and
    the middle instance, serving in turn, shares what it maps into shared memory of its own."""
    key = _key(tmp_path)
    first, _ = _seed(Tiny(seed=3), key, handover=handover)
    try:
        middle = Tiny()
        assert _pull(middle, key, {"peer": [first.url], "fallback": False, "handover": handover})[0]
        ptrs = {n: p.data_ptr() for n, p in middle.named_parameters()} if handover == "off" else None
        second, _ = _seed(middle, key, handover=handover)
        try:
            # Served where they are: the parameters still have the pulled buffers.
            assert ptrs is None or ptrs == {n: p.data_ptr() for n, p in middle.named_parameters()}
            last = Tiny()
            assert _pull(last, key, {"peer": [second.url], "fallback": False, "handover": handover})[0]
            for (name, p), (_, q) in zip(last.named_parameters(), middle.named_parameters()):
                assert torch.equal(p, q), name
        finally:
            second.close()
    finally:
        first.close()


@needs_ucx
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (make gpu-check runs it)")
def test_gpu_parameters_are_served_from_and_pulled_into_gpu_memory(tmp_path):
    import os
    key = _key(tmp_path)
    seed_model = Tiny(seed=5).cuda()
    server, logs = _seed(seed_model, key)
    try:
        if os.environ.get("TENSORLIFT_UCX_LIB"):  # a UCX with CUDA (make gpu-check's bundle)
            assert "from the GPU's memory" in logs[-1], logs
        elif "from the GPU's memory" not in logs[-1]:  # Debian's UCX: host copies, and why
            assert "serving host copies" in logs[0] and "TENSORLIFT_UCX_LIB" in logs[0], logs
        new = Tiny().cuda()
        got, logs = _pull(new, key, {"peer": [server.url], "fallback": False})
        assert got, logs
        for (name, p), (_, q) in zip(new.named_parameters(), seed_model.named_parameters()):
            assert p.device == q.device and torch.equal(p, q), name
        assert new.head is new.embed
    finally:
        server.close()


@needs_ucx
def test_striped_pieces_come_from_the_files_and_a_peer_serving_them(shards, tmp_path):
    """The `stripe` option's reader: each piece from the local files and a peer serving the same
    files (`tensorlift serve DIR`'s key) at once, byte-exact, with each source's bytes logged."""
    from tensorlift import remote
    model_dir = str(tmp_path)
    want = {}
    for f in shards:
        want.update(load_file(f))
    lines = []
    with remote.serve(model_dir, chunk_bytes=4096) as server:
        url = server.url
        # A live peer's time-out: generous, so that a busy machine never drops it (the log line
        # names both sources).
        options = tlv.parse_options({"stripe": {"peer": url, "timeout": 60, "page_cache": False}})
        got = dict(tlv.iterate_striped(shards, model_dir, "cpu", options, lambda *a: lines.append(a[0] % a[1:])))
    assert sorted(got) == sorted(want) and all(torch.equal(got[n], want[n]) for n in want)
    assert len(lines) == 1 and lines[0].startswith("tensorlift: weights striped over 2 sources: "), lines
    assert f"{url} " in lines[0] and "disk " in lines[0]


def test_a_bucket_model_refuses_a_local_read_mode():
    """iterate_bucket (vLLM's and SGLang's s3:// models): mode is for local files, refused before
    any request (the loads themselves: tests/vllm, tests/sglang against rclone)."""
    logged = []
    with pytest.raises(ValueError, match="mode applies to local files; s3://models/llama/ is in object storage"):
        next(tlv.iterate_bucket("s3://models/llama/", "cpu", {"mode": "direct"}, lambda *a: logged.append(a)))
    with pytest.raises(ValueError, match="threads apply to local files .pread threads.; s3://models/llama/ is in"):
        next(tlv.iterate_bucket("s3://models/llama/", "cpu", {"threads": 4}, lambda *a: logged.append(a)))
    assert not logged


# --- a reload's checks (issue 54): every new file whole, its tensors the engine's -----------------

class _Config:
    """A server's model config: the fields that name its weights."""

    def __init__(self, model):
        self.model, self.revision = model, None


def _checkpoint(root, name, seed, shapes=None, index=True):
    """A two-shard checkpoint directory like `shards`, with an index unless index=False."""
    import json
    d = root / name
    d.mkdir()
    g = torch.Generator().manual_seed(seed)
    weight_map = {}
    for k in range(2):
        f = f"model-0000{k + 1}-of-00002.safetensors"
        tensors = {f"layers.{k}.w{i}": torch.randn(*(shapes or {}).get(f"layers.{k}.w{i}", (64, 32)), generator=g)
                   for i in range(3)}
        save_file(tensors, str(d / f))
        weight_map.update({n: f for n in tensors})
    if index:
        (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return d


def _files(d):
    return sorted(str(p) for p in d.glob("*.safetensors"))


def _reload(config, where, options=None):
    """check_reload as a server's loader calls it, the restore recorded."""
    restored = []

    def restore(fields):
        restored.append(fields)
        for k, v in fields.items():
            setattr(config, k, v)
    config.model = str(where)  # the server points its config at the new path first
    sources, shapes = tlv.check_reload(config, str(where), lambda: [("", _files(where))], options or {}, restore)
    return sources, shapes, restored


def test_a_reload_takes_a_checkpoint_of_the_same_tensors_even_in_another_dtype(tmp_path):
    old = _checkpoint(tmp_path, "old", 1)
    config = _Config(str(old))
    tlv.remember_loaded(config, {"model": str(old)}, tlv.checkpoint_shapes(_files(old)))
    new = _checkpoint(tmp_path, "new", 2)
    sources, shapes, restored = _reload(config, new)
    assert sources == [("", _files(new))] and not restored
    assert shapes == {n: (str(new / f"model-0000{int(n[7]) + 1}-of-00002.safetensors"), (64, 32))
                      for n in tlv.loaded(config)["shapes"]}
    half = tmp_path / "half"  # the same names and shapes in bf16: the weight loaders convert
    half.mkdir()
    for f in _files(new):
        save_file({n: t.to(torch.bfloat16) for n, t in load_file(f).items()}, str(half / f.split("/")[-1]))
    _reload(config, half)
    assert tlv.loaded(_Config(str(old))) is None  # what a config loaded is its own


@pytest.mark.parametrize("fault", ["missing", "truncated", "other shapes", "extra", "lacking", "no directory",
                                   "empty"])
def test_a_bad_reload_is_refused_naming_the_file_and_the_config_is_put_back(tmp_path, fault):
    import os
    old = _checkpoint(tmp_path, "old", 1)
    config = _Config(str(old))
    tlv.remember_loaded(config, {"model": str(old), "revision": "r1"}, tlv.checkpoint_shapes(_files(old)))
    new = _checkpoint(tmp_path, "new", 2, shapes={"layers.1.w2": (65, 32)} if fault == "other shapes" else None,
                      index=fault not in ("extra", "lacking"))
    second = str(new / "model-00002-of-00002.safetensors")
    if fault == "missing":
        os.unlink(second)
        want = "model-00002-of-00002.safetensors"
    elif fault == "truncated":
        data = open(second, "rb").read()
        open(second, "wb").write(data[:-4])
        want = f"{second}: MetadataIncompleteBuffer"
    elif fault == "other shapes":
        want = f"{second}: tensor 'layers.1.w2' has shape [65, 32], the engine's [64, 32]"
    elif fault == "extra":
        save_file({"lm_head.weight": torch.zeros(4, 4)}, str(new / "model-00003-of-00003.safetensors"))
        want = "model-00003-of-00003.safetensors: tensor 'lm_head.weight' is not one of the engine's"
    elif fault == "lacking":  # no index: a shard left out is seen by its tensors
        os.unlink(second)
        want = f"{new}: 3 of the engine's tensors are in none of its files"
    elif fault == "no directory":
        new = tmp_path / "nowhere"
        want = f"{new}: no such directory"
    else:
        new = tmp_path / "empty"
        new.mkdir()
        want = "6 of the engine's tensors are in none of its files"
    with pytest.raises(ValueError) as err:
        _reload(config, new)
    msg = str(err.value)
    assert msg.startswith(f"tensorlift load format: reloading the weights from {new} was refused before any "
                          "weight was written; the engine keeps serving the weights it had: "), msg
    assert want in msg, msg
    assert (config.model, config.revision) == (str(old), "r1")  # named the weights it still has
    assert tlv.loaded(config)["source"] == {"model": str(old), "revision": "r1"}


def test_a_reload_with_a_filter_checks_the_matching_tensors_only(tmp_path):
    old = _checkpoint(tmp_path, "old", 1)
    config = _Config(str(old))
    opts = {"filter": r"\.w0$"}
    tlv.remember_loaded(config, {"model": str(old)}, tlv.checkpoint_shapes(_files(old), None, opts["filter"]))
    new = _checkpoint(tmp_path, "new", 2, shapes={"layers.0.w1": (8, 8)})  # not read: no matter
    _, shapes, _ = _reload(config, new, opts)
    assert sorted(shapes) == ["layers.0.w0", "layers.1.w0"]
