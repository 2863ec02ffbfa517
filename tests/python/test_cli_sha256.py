"""`tensorlift verify --sha256 SOURCE`: every shard's SHA-256 against a
sha256sum file, a JSON map, the Hub API's "siblings" list, or (hub) the blob
names of a Hugging Face cache snapshot, checked here with hashlib."""
import hashlib
import json
import os
import subprocess

import numpy as np
from safetensors.numpy import save_file


def run(cli, *args):
    r = subprocess.run([str(cli), *map(str, args)], capture_output=True, text=True, timeout=120)
    assert r.returncode >= 0, f"{args} died of signal {-r.returncode}: {r.stderr}"
    return r


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def write_checkpoint(directory):
    """Two shards (one over the 8 MiB read buffer) and their index; the shards' paths."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(5)
    shards = {
        "model-00001-of-00002.safetensors": {"a": rng.standard_normal((1100, 1024), dtype=np.float32)},
        "model-00002-of-00002.safetensors": {"b": rng.standard_normal((16, 32), dtype=np.float32)},
    }
    weight_map = {}
    for name, tensors in shards.items():
        save_file(tensors, str(directory / name))
        weight_map.update({t: name for t in tensors})
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}))
    return [directory / n for n in shards]


def flip_last_byte(path):
    """One byte of tensor data changed: the header stays valid."""
    with open(path, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        b = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([b[0] ^ 0x40]))


def test_sha256sum_file(cli, tmp_path):
    shards = write_checkpoint(tmp_path / "ckpt")
    sums = tmp_path / "SHA256SUMS"
    # One with sha256sum's binary marker, one under a relative path.
    sums.write_text(f"{sha256(shards[0])} *{shards[0].name}\n"
                    f"{sha256(shards[1])}  ckpt/{shards[1].name}\n")
    r = run(cli, "verify", "--sha256", sums, tmp_path / "ckpt")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SHA-256 of 2 files checked" in r.stdout
    # A single file, and sha256sum's own output.
    out = subprocess.run(["sha256sum", shards[1].name], cwd=shards[1].parent, check=True,
                         capture_output=True, text=True).stdout
    sums.write_text(out)
    r = run(cli, "verify", "--sha256", sums, shards[1])
    assert r.returncode == 0 and "SHA-256 of 1 file checked" in r.stdout, r.stdout + r.stderr


def test_json_map_and_hub_siblings(cli, tmp_path):
    shards = write_checkpoint(tmp_path / "ckpt")
    plain = tmp_path / "digests.json"
    plain.write_text(json.dumps({p.name: sha256(p) for p in shards}))
    api = tmp_path / "api.json"
    api.write_text(json.dumps({"id": "org/name", "siblings": [
        {"rfilename": "config.json"},
        *[{"rfilename": p.name, "lfs": {"sha256": sha256(p), "size": p.stat().st_size}}
          for p in shards]]}))
    for source in (plain, api):
        r = run(cli, "verify", "--sha256", source, tmp_path / "ckpt")
        assert r.returncode == 0, r.stdout + r.stderr
        assert "SHA-256 of 2 files checked" in r.stdout
        # Through the index file too.
        r = run(cli, "verify", "--sha256", source, tmp_path / "ckpt" / "model.safetensors.index.json")
        assert r.returncode == 0 and "SHA-256 of 2 files checked" in r.stdout, r.stdout + r.stderr


def test_corrupt_shard_fails_naming_it(cli, tmp_path):
    shards = write_checkpoint(tmp_path / "ckpt")
    expected = {p.name: sha256(p) for p in shards}
    source = tmp_path / "digests.json"
    source.write_text(json.dumps(expected))
    flip_last_byte(shards[0])
    # The header is still valid: only the digest can tell.
    assert run(cli, "verify", tmp_path / "ckpt").returncode == 0
    r = run(cli, "verify", "--sha256", source, tmp_path / "ckpt")
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 1, lines
    assert str(shards[0]) in lines[0]
    assert expected[shards[0].name] in lines[0] and sha256(shards[0]) in lines[0]
    assert "does not match" in lines[0]


def test_missing_entry_fails_naming_the_file(cli, tmp_path):
    shards = write_checkpoint(tmp_path / "ckpt")
    sums = tmp_path / "SHA256SUMS"
    sums.write_text(f"{sha256(shards[0])}  {shards[0].name}\n")
    r = run(cli, "verify", "--sha256", sums, tmp_path / "ckpt")
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"no SHA-256 known for {shards[1]}" in r.stdout
    assert "OK" not in r.stdout
    # A source that is not a digest list at all.
    sums.write_text("not a digest\n")
    r = run(cli, "verify", "--sha256", sums, tmp_path / "ckpt")
    assert r.returncode == 1 and str(sums) in r.stdout, r.stdout + r.stderr


def hub_cache(tmp_path):
    """A Hugging Face cache layout: blobs named by SHA-256 (LFS) or git SHA-1,
    and a snapshot of relative symlinks to them; the snapshot's directory."""
    work = tmp_path / "work"
    shards = write_checkpoint(work)
    repo = tmp_path / "hub" / "models--org--name"
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    for p in shards:
        digest = sha256(p)
        os.rename(p, repo / "blobs" / digest)
        os.symlink(f"../../blobs/{digest}", snapshot / p.name)
    index = work / "model.safetensors.index.json"
    git_sha1 = hashlib.sha1(index.read_bytes()).hexdigest()  # Not git's exactly; a 40-hex name.
    os.rename(index, repo / "blobs" / git_sha1)
    os.symlink(f"../../blobs/{git_sha1}", snapshot / index.name)
    return snapshot


def test_hub_cache(cli, tmp_path):
    snapshot = hub_cache(tmp_path)
    r = run(cli, "verify", "--sha256", "hub", snapshot)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SHA-256 of 2 files checked" in r.stdout
    one = snapshot / "model-00002-of-00002.safetensors"
    r = run(cli, "verify", "--sha256", "hub", one)
    assert r.returncode == 0 and "SHA-256 of 1 file checked" in r.stdout, r.stdout + r.stderr

    # A corrupt blob: the name it was stored under no longer matches.
    blob = snapshot / os.readlink(one)
    flip_last_byte(blob)
    r = run(cli, "verify", "--sha256", "hub", snapshot)
    assert r.returncode == 1 and str(one) in r.stdout and "does not match" in r.stdout, r.stdout


def test_hub_needs_symlinks(cli, tmp_path):
    snapshot = hub_cache(tmp_path)
    # A copied shard (not a symlink into blobs/) has no known digest.
    copy = snapshot / "model-00001-of-00002.safetensors"
    data = copy.read_bytes()
    copy.unlink()
    copy.write_bytes(data)
    r = run(cli, "verify", "--sha256", "hub", snapshot)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"no SHA-256 known for {copy}" in r.stdout
