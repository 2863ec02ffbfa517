"""The installed wheel's smoke suite (tests/wheel/run.sh runs it in fresh environments).

Run from a scratch folder with the environment's own python, PATH holding only that
environment's bin/: no compiler, no source tree on sys.path. Checks what a user does
first: the `tensorlift` command (and `python -m tensorlift`) at the package's version;
verify, inspect and load --checksum on a checkpoint written here; tensorlift.load with
numpy, and with torch where torch is installed, or else its one clear error; safe_open;
the vLLM plugin's entry point; `tensorlift doctor`.

    python smoke.py --torch yes|no [--no-libcurl]
"""
import argparse
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

checks = []


def check(name, ok, detail=""):
    checks.append((name, bool(ok)))
    print(f"{'ok  ' if ok else 'FAIL'} {name}" + (f": {detail}" if detail and not ok else ""), flush=True)


def run(*args):
    return subprocess.run(list(args), capture_output=True, text=True, timeout=120)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--torch", choices=["yes", "no"], required=True)
    ap.add_argument("--no-libcurl", action="store_true", help="libcurl is hidden: S3 must say so")
    ap.add_argument("--no-mpi", action="store_true", help="MPI is hidden: doctor must say what to install")
    args = ap.parse_args()

    import tensorlift
    from tensorlift.numpy import save_file

    # Where things come from.
    here = os.path.realpath(sys.prefix)
    pkg = os.path.realpath(tensorlift.__file__)
    check("tensorlift is the installed wheel's", pkg.startswith(here + os.sep), pkg)
    src = [p for p in sys.path if os.path.exists(os.path.join(p, "python", "tensorlift", "__init__.py"))]
    check("no source tree on sys.path", not src, str(src))
    compilers = {c: shutil.which(c) for c in ("cc", "gcc", "g++", "c++", "clang", "cmake", "nvcc")}
    check("no compiler on PATH", not any(compilers.values()), str(compilers))

    # The command, and python -m tensorlift, at the package's version.
    cli = shutil.which("tensorlift")
    check("tensorlift is on PATH", cli and os.path.realpath(cli).startswith(here + os.sep), str(cli))
    want = f"tensorlift {tensorlift.__version__}"
    v = run("tensorlift", "--version")
    check("tensorlift --version", v.returncode == 0 and v.stdout.strip() == want, v.stdout + v.stderr)
    m = run(sys.executable, "-m", "tensorlift", "--version")
    check("python -m tensorlift --version", m.returncode == 0 and m.stdout.strip() == want, m.stdout + m.stderr)

    tmp = tempfile.mkdtemp(prefix="tl-smoke-")
    path = os.path.join(tmp, "model.safetensors")
    tensors = {
        "embed.weight": np.arange(4096, dtype=np.float32).reshape(64, 64) / 7,
        "layer.0.bias": np.linspace(-1, 1, 33).astype(np.float16),
        "layer.0.ids": np.arange(-5, 5, dtype=np.int64),
        "mask": np.array([1, 0, 1, 1], dtype=np.uint8),
        "empty": np.zeros((0, 3), dtype=np.float32),
    }
    save_file(tensors, path, metadata={"format": "np", "by": "smoke"})

    r = run("tensorlift", "verify", path)
    check("tensorlift verify", r.returncode == 0, r.stdout + r.stderr)
    r = run("tensorlift", "inspect", path)
    check("tensorlift inspect", r.returncode == 0 and all(n in r.stdout for n in tensors), r.stdout + r.stderr)
    r = run("tensorlift", "load", path, "--checksum")
    check("tensorlift load --checksum", r.returncode == 0 and all(n in r.stdout + r.stderr for n in tensors if
                                                                   tensors[n].size), r.stdout + r.stderr)
    bad = os.path.join(tmp, "bad.safetensors")
    with open(bad, "wb") as f:
        f.write(b"\xff" * 16)
    r = run("tensorlift", "verify", bad)
    check("tensorlift verify refuses a broken file", r.returncode != 0 and "HeaderTooLarge" in r.stdout + r.stderr,
          r.stdout + r.stderr)

    got = tensorlift.load(path, framework="numpy")
    check("tensorlift.load(framework='numpy')",
          sorted(got) == sorted(tensors) and all(np.array_equal(got[k], tensors[k]) and got[k].dtype == tensors[k].dtype
                                                 for k in tensors))
    if args.torch == "yes":
        import torch
        pt = tensorlift.load(path)
        check("tensorlift.load() gives torch tensors",
              all(isinstance(pt[k], torch.Tensor) and np.array_equal(pt[k].numpy(), tensors[k]) for k in tensors))
    else:
        try:
            tensorlift.load(path)
            check("tensorlift.load() without torch raises", False, "it returned")
        except ModuleNotFoundError as e:
            msg = str(e)
            check("tensorlift.load() without torch: one clear error",
                  'framework="numpy"' in msg and "pip install tensorlift[torch]" in msg, msg)

    with tensorlift.safe_open(path, framework="np") as f:
        same = sorted(f.keys()) == sorted(tensors) and all(np.array_equal(f.get_tensor(k), tensors[k]) for k in tensors)
        check("safe_open", same and f.metadata() == {"format": "np", "by": "smoke"})

    eps = [e for e in importlib.metadata.entry_points(group="vllm.general_plugins") if e.name == "tensorlift"]
    check("vLLM plugin entry point discovered", len(eps) == 1 and callable(eps[0].load()), str(eps))

    d = run("tensorlift", "doctor")
    check("tensorlift doctor", d.returncode == 0 and "S3 client" in d.stdout, d.stdout + d.stderr)
    if args.no_libcurl:
        line = next((ln for ln in d.stdout.splitlines() if ln.startswith("S3 client")), "")
        check("doctor says libcurl is missing and what to install",
              "not usable here" in line and "tensorlift[s3]" in line, line)
        s3 = run("tensorlift", "inspect", "s3://bucket/model.safetensors")
        check("an s3:// path says libcurl is missing", s3.returncode != 0 and "libcurl" in s3.stderr,
              s3.stdout + s3.stderr)
    if args.no_mpi:
        line = next((ln for ln in d.stdout.splitlines() if ln.startswith("MPI:")), "")
        check("doctor says MPI is missing and what to install", "MPI not found" in line and "install" in line, line)
    else:
        line = next((ln for ln in d.stdout.splitlines() if ln.startswith("MPI:")), "")
        check("doctor finds MPI", line.startswith("MPI: built, "), line)
    print(d.stdout, end="")

    shutil.rmtree(tmp)
    failed = [n for n, ok in checks if not ok]
    print(f"smoke: {len(checks) - len(failed)} of {len(checks)} checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
