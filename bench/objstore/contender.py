"""One timed load from S3 by one contender, in this (fresh) process.

    python bench/objstore/contender.py tl URL
    python bench/objstore/contender.py tl-device URL         (onto the emulated device, its copies discarded)
    python bench/objstore/contender.py runai URL             (RUNAI_STREAMER_CONCURRENCY from the env)
    python bench/objstore/contender.py boto3 URL TMPDIR
    python bench/objstore/contender.py limit PLAN.json THREADS
    python bench/objstore/contender.py verify URL SHARD...   (not timed: tensorlift vs local files)
    python bench/objstore/contender.py imports               (the baseline: imports only, for peak RSS)
    python bench/objstore/contender.py disk DIR              (tensorlift.load of the local copy)
    python bench/objstore/contender.py peer URL DIR [HANDOVER]
                                      (tensorlift.remote.load_from_peer, DIR's key; HANDOVER: auto
                                       by default, off: over UCX even from a seed on this host)
    python bench/objstore/contender.py stripe DIR|- URL|- PEER|- KEYDIR [DEVICE]
                                      (tensorlift.remote.load_striped over the given sources, with
                                       its defaults; the peers' key is KEYDIR's, as tensorlift serve's)

URL is s3://bucket/prefix; the endpoint and the credentials come from the
environment (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_REGION), as every contender reads them. Imports come first and are not
timed; the clock runs from just before the first call of the loader to the
moment every tensor is in hand (and kept alive). Nothing else is done with the
tensors: their count and bytes are summed from the shapes (no data touched).
Prints one JSON object: seconds, bytes, tensors (and what the contender adds).

tl: tensorlift.load(URL) with its defaults, nothing else.
tl-device: the same checkpoint onto the emulated device (Checkpoint.open(URL).load(device=
  "emulated:0"), the defaults otherwise) with TENSORLIFT_EMULATED_DISCARD_COPIES=1 from the bench:
  the device's memory is never touched, so the child's peak RSS is host memory alone (the staged
  pipeline's pinned slots, or a whole host copy if the load built one); rss_before_bytes: VmRSS just
  before the load, so that the load's own peak is the peak less it.
runai: runai-model-streamer's S3 backend as vLLM drives it: list_safetensors(URL)
  then SafetensorsStreamer.stream_files(files) and every tensor of get_tensors()
  (owned=True, the default: the tensors stay valid).
boto3: every object under the prefix downloaded to TMPDIR with boto3's
  download_file (its default TransferConfig: 8 MiB parts, 10 threads per file),
  then safetensors.torch.load_file of each shard.
limit: the tensors' bytes (PLAN.json: bucket, [key, offset, length] of
  each 16 MiB range) fetched by THREADS threads, each with its own kept-alive
  http.client connection, SigV4-signed by botocore, read with readinto straight
  into one numpy buffer allocated before the clock (not touched: its pages are
  faulted in by the reads, as a loader's are). Nothing else.
"""

import json
import os
import sys
import time


def nbytes(t):
    return t.numel() * t.element_size()


def run_tl(url):
    import torch  # noqa: F401
    import tensorlift

    t0 = time.perf_counter()
    tensors = tensorlift.load(url)
    t1 = time.perf_counter()
    return {"seconds": t1 - t0, "tensors": len(tensors), "bytes": sum(nbytes(t) for t in tensors.values())}


def run_tl_device(url):
    import tensorlift  # noqa: F401
    from tensorlift._tensorlift import Checkpoint

    before = rss_now()
    t0 = time.perf_counter()
    loaded = Checkpoint.open(url).load(device="emulated:0")
    t1 = time.perf_counter()
    return {"seconds": t1 - t0, "tensors": len(loaded.names()), "bytes": loaded.total_bytes,
            "rss_before_bytes": before,
            "discard_copies": os.environ.get("TENSORLIFT_EMULATED_DISCARD_COPIES")}


def rss_now():
    """This process's resident bytes now (VmRSS), just before the loader is called."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return None


def run_runai(url):
    import torch  # noqa: F401
    from runai_model_streamer import SafetensorsStreamer
    from runai_model_streamer.safetensors_streamer.safetensors_streamer import list_safetensors

    keep = []
    t0 = time.perf_counter()
    files = sorted(list_safetensors(url))
    with SafetensorsStreamer() as s:
        s.stream_files(files)
        for _, t in s.get_tensors():
            keep.append(t)
    t1 = time.perf_counter()
    return {"seconds": t1 - t0, "tensors": len(keep), "bytes": sum(nbytes(t) for t in keep), "files": len(files),
            "concurrency_env": os.environ.get("RUNAI_STREAMER_CONCURRENCY")}


def run_boto3(url, tmpdir):
    import torch  # noqa: F401
    import boto3
    import botocore.config
    from safetensors.torch import load_file

    bucket, _, prefix = url[len("s3://"):].partition("/")
    prefix = prefix.rstrip("/") + "/"
    t0 = time.perf_counter()
    s3 = boto3.client("s3", config=botocore.config.Config(s3={"addressing_style": "path"}))
    keys = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys += [o["Key"] for o in page.get("Contents", [])]
    local = []
    for key in keys:
        dst = os.path.join(tmpdir, key[len(prefix):])
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        s3.download_file(bucket, key, dst)
        local.append(dst)
    t_dl = time.perf_counter()
    tensors = {}
    for path in sorted(p for p in local if p.endswith(".safetensors")):
        tensors.update(load_file(path))
    t1 = time.perf_counter()
    return {"seconds": t1 - t0, "download_s": t_dl - t0, "load_file_s": t1 - t_dl, "objects": len(keys),
            "tensors": len(tensors), "bytes": sum(nbytes(t) for t in tensors.values())}


def run_limit(plan_path, threads):
    import http.client
    import itertools
    import threading
    import urllib.parse

    import numpy as np
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    with open(plan_path) as f:
        plan = json.load(f)
    endpoint_url = os.environ["AWS_ENDPOINT_URL"].rstrip("/")
    endpoint = urllib.parse.urlsplit(endpoint_url)
    creds = Credentials(os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"])
    region = os.environ.get("AWS_REGION", "us-east-1")
    jobs = []  # (key, offset in the object, length, offset in the buffer)
    pos = 0
    for key, off, n in plan["ranges"]:
        jobs.append((key, off, n, pos))
        pos += n
    buf = np.empty(pos, dtype=np.uint8)  # Allocated, not touched.
    mv = memoryview(buf)
    counter = itertools.count()
    errors = []

    def worker():
        conn = http.client.HTTPConnection(endpoint.hostname, endpoint.port, timeout=120)
        try:
            while not errors:
                i = next(counter)  # Atomic under the GIL.
                if i >= len(jobs):
                    return
                key, off, n, dst = jobs[i]
                path = "/" + plan["bucket"] + "/" + urllib.parse.quote(key)
                req = AWSRequest(method="GET", url=endpoint_url + path,
                                 headers={"Range": f"bytes={off}-{off + n - 1}"})
                S3SigV4Auth(creds, "s3", region).add_auth(req)
                conn.request("GET", path, headers=dict(req.headers.items()))
                resp = conn.getresponse()
                # 206, or 200 with the range's Content-Range (what rclone serve s3 answers).
                crange = resp.getheader("Content-Range", "")
                if resp.status not in (200, 206) or not crange.startswith(f"bytes {off}-{off + n - 1}/") \
                        or resp.getheader("Content-Length") != str(n):
                    errors.append(f"{key} bytes {off}-{off + n - 1}: HTTP {resp.status}, Content-Range "
                                  f"{crange!r}, Content-Length {resp.getheader('Content-Length')!r}")
                    return
                got = 0
                while got < n:
                    k = resp.readinto(mv[dst + got:dst + n])
                    if not k:
                        break
                    got += k
                if got != n:
                    errors.append(f"{key} bytes {off}-{off + n - 1}: short body ({got} of {n})")
                    return
        except Exception as e:  # noqa: BLE001  (reported, not hidden)
            errors.append(f"{type(e).__name__}: {e}")
        finally:
            conn.close()

    t0 = time.perf_counter()
    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    t1 = time.perf_counter()
    if errors:
        raise RuntimeError("; ".join(errors[:3]))
    return {"seconds": t1 - t0, "bytes": pos, "requests": len(jobs), "threads": threads,
            "tensors": plan["tensors"]}


def run_verify(url, shards):
    """tensorlift.load(url) against safetensors' load_file of the local shards:
    every tensor's name, dtype, shape and XXH3-64 of its bytes."""
    import torch
    import tensorlift
    import xxhash
    from safetensors.torch import load_file

    def digest(tensors):
        out = {}
        for name, t in tensors.items():
            raw = t.contiguous().reshape(-1).view(torch.uint8).numpy()
            out[name] = [str(t.dtype), list(t.shape), xxhash.xxh3_64_hexdigest(raw)]
        return out

    t0 = time.perf_counter()
    remote = tensorlift.load(url)
    remote_s = time.perf_counter() - t0
    got = digest(remote)
    del remote
    want = {}
    for path in shards:
        want.update(digest(load_file(path)))
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    differ = sorted(n for n in set(want) & set(got) if want[n] != got[n])
    return {"ok": not (missing or extra or differ), "tensors": len(want), "tensors_tensorlift": len(got),
            "missing": missing[:10], "extra": extra[:10],
            "differ": [[n, want[n], got[n]] for n in differ[:10]], "n_differ": len(differ),
            "tensorlift_load_s": remote_s,
            "dtypes": sorted({v[0] for v in want.values()})}


def run_disk(path):
    import torch  # noqa: F401
    import tensorlift

    t0 = time.perf_counter()
    tensors = tensorlift.load(path)
    t1 = time.perf_counter()
    return {"seconds": t1 - t0, "tensors": len(tensors), "bytes": sum(nbytes(t) for t in tensors.values())}


def run_peer(url, path, handover="auto"):
    import torch  # noqa: F401
    from tensorlift import remote

    key = remote.key_for(path)  # as `tensorlift serve DIR` keys it (not timed: headers only)
    t0 = time.perf_counter()
    tensors = remote.load_from_peer(url, model=key["model"], revision=key["revision"], handover=handover)
    t1 = time.perf_counter()
    rep = remote.last_report()
    return {"seconds": t1 - t0, "tensors": len(tensors), "bytes": sum(nbytes(t) for t in tensors.values()),
            "source": rep["source"]}


def run_stripe(path, url, peer, keydir, device="cpu"):
    import torch  # noqa: F401
    from tensorlift import remote

    path, url, peer = (None if a == "-" else a for a in (path, url, peer))
    key = remote.key_for(keydir)  # not timed: headers only
    t0 = time.perf_counter()
    if device == "cpu":
        tensors = remote.load_striped(path, url, peers=[peer] if peer else None, model=key["model"],
                                      revision=key["revision"])
        count, total = len(tensors), sum(nbytes(t) for t in tensors.values())
        rep = remote.last_report()
    else:  # The emulated device has no framework tensors: the loaded checkpoint itself.
        from tensorlift import _tensorlift as _tl
        loaded, rep = _tl.load_striped(path=path or "", object_url=url or "", peers=[peer] if peer else [],
                                       key={"model": key["model"], "revision": key["revision"]}, device=device)
        count, total = len(loaded.names()), loaded.total_bytes
    t1 = time.perf_counter()
    return {"seconds": t1 - t0, "tensors": count, "bytes": total,
            "sources": [{k: s[k] for k in ("name", "bytes", "ranges", "seconds", "failure")}
                        for s in rep["sources"]],
            "checked": rep["checked"], "refetched": rep["refetched"], "note": rep["note"]}


def run_imports():
    """Python with torch and every contender's library imported, nothing loaded: the peak RSS
    that every Python contender pays before its first byte."""
    import torch  # noqa: F401
    import boto3  # noqa: F401
    import numpy  # noqa: F401
    import runai_model_streamer  # noqa: F401
    import safetensors.torch  # noqa: F401
    import tensorlift  # noqa: F401

    return {"seconds": 0.0, "tensors": 0, "bytes": 0}


def main():
    kind = sys.argv[1]
    if kind == "imports":
        res = run_imports()
    elif kind == "tl":
        res = run_tl(sys.argv[2])
    elif kind == "tl-device":
        res = run_tl_device(sys.argv[2])
    elif kind == "runai":
        res = run_runai(sys.argv[2])
    elif kind == "boto3":
        res = run_boto3(sys.argv[2], sys.argv[3])
    elif kind == "limit":
        res = run_limit(sys.argv[2], int(sys.argv[3]))
    elif kind == "disk":
        res = run_disk(sys.argv[2])
    elif kind == "peer":
        res = run_peer(*sys.argv[2:5])
    elif kind == "stripe":
        res = run_stripe(*sys.argv[2:7])
    elif kind == "verify":
        res = run_verify(sys.argv[2], sys.argv[3:])
    else:
        sys.exit(f"contender: unknown kind {kind!r}")
    print(json.dumps({"contender": kind, **res}), flush=True)


if __name__ == "__main__":
    main()
