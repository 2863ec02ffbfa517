"""Shared fixtures for the tests against the reference safetensors package.

TENSORLIFT_BUILD names the build directory (default /work/main/build). It must
hold the CLI (tensorlift) and the test tools tl_make_corpus and tl_rewrite; a
missing tool is an error, not a skip: these tests are how tensorlift is held
to the reference.
"""

import atexit
import collections
import functools
import os
import pathlib
import shutil
import subprocess
import tempfile

import pytest

BUILD = pathlib.Path(os.environ.get("TENSORLIFT_BUILD", "/work/main/build"))

Case = collections.namedtuple("Case", "name expected reference known_bug path")


def tool(name):
    """The path of an executable in the build directory; fails if missing."""
    path = BUILD / name
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise RuntimeError(
            f"{path} is missing: build it (cmake --build {BUILD}) or point "
            f"TENSORLIFT_BUILD at a build directory that has it"
        )
    return path


@functools.lru_cache(maxsize=None)
def corpus():
    """Writes the corpus once per session; returns (directory, [Case])."""
    directory = pathlib.Path(tempfile.mkdtemp(prefix="tl_corpus_"))
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    subprocess.run([str(tool("tl_make_corpus")), str(directory)], check=True,
                   capture_output=True)
    known_bugs = {}
    for line in (directory / "known_bugs.tsv").read_text().splitlines():
        name, note = line.split("\t", 1)
        known_bugs[name] = note
    cases = []
    for line in (directory / "manifest.tsv").read_text().splitlines():
        name, expected, reference = line.split("\t")
        cases.append(Case(name, expected, reference, known_bugs.get(name),
                          directory / f"{name}.safetensors"))
    if not cases:
        raise RuntimeError(f"tl_make_corpus wrote an empty manifest in {directory}")
    return directory, cases


def pytest_generate_tests(metafunc):
    # A test taking `case` runs once per corpus case, named after it (unless it
    # parametrizes `case` itself); one taking `valid_case` once per case that
    # both readers accept.
    own = {name.strip() for m in metafunc.definition.iter_markers("parametrize")
           for name in (m.args[0].split(",") if isinstance(m.args[0], str) else m.args[0])}
    if "case" in metafunc.fixturenames and "case" not in own:
        _, cases = corpus()
        metafunc.parametrize("case", cases, ids=[c.name for c in cases])
    if "valid_case" in metafunc.fixturenames:
        _, cases = corpus()
        valid = [c for c in cases if c.expected == "ok" and c.reference == "ok"]
        metafunc.parametrize("valid_case", valid, ids=[c.name for c in valid])


@pytest.fixture(scope="session")
def cli():
    return tool("tensorlift")


@pytest.fixture(scope="session")
def rewrite():
    return tool("tl_rewrite")


@pytest.fixture(scope="session")
def corpus_cases():
    return corpus()[1]


def save_sharded(directory, shards):
    """Writes `shards` (a list of {name: torch tensor}) into `directory` as
    model-0000k-of-0000n.safetensors files with a model.safetensors.index.json, as
    transformers' save_pretrained shards a checkpoint; returns the directory."""
    import json
    from safetensors.torch import save_file
    directory = pathlib.Path(directory)
    weight_map = {}
    for k, tensors in enumerate(shards):
        name = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(tensors, str(directory / name))
        weight_map.update({n: name for n in tensors})
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}))
    return directory
