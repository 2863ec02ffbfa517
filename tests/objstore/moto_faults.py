"""A real S3 server (moto's, in this process) that injects faults into ranged GETs.

    .venv-s3/bin/python tests/objstore/moto_faults.py --port P --plan PLAN \
        --root-objects DIR [--stats FILE] [--slow-seconds S] [--trickle-rate B]

Starts moto's S3 server (werkzeug, threaded) on 127.0.0.1:P (0: a free port),
creates a bucket for every top-level folder of DIR and uploads every file
under it (key = the path under the folder), with boto3 against itself, then
arms PLAN and prints "READY <port>" on stdout (nothing else is printed there;
moto's and werkzeug's logs go to stderr).

The plan applies to ranged object GETs only (moto's S3Response.get_object
with a Range header), in the order they arrive: a comma-separated sequence
of KIND:COUNT steps; once it is used up every ranged GET is served normally.

    none         no faults
    ok:N         N ranged GETs served normally (e.g. to let a header probe by)
    503:N        503 SlowDown, with S3's XML error body
    500:N        500 InternalError, with S3's XML error body
    short:N      the right status and headers (Content-Length of the whole
                 range), half the body, then the connection is closed (FIN)
    reset:N      the right status and headers, a quarter of the body, then the
                 connection is reset (RST: SO_LINGER 0, closed without shutdown)
    slow:N       the first 1000 bytes of the body, a stall of --slow-seconds,
                 then the rest (slow enough for a low-speed limit of 1 KiB/s)
    trickle:N    a slowloris body: the right status and headers, then the body at
                 --trickle-rate bytes/s (2048), a tenth of that every 100 ms
    slowheaders:N  a slowloris head: the status line and headers a byte every
                 100 ms, for at most --slow-seconds, then a reset

Stats ("name value" lines: ranged_gets, served, faults, and one count per
kind) are rewritten atomically to --stats FILE after each ranged GET's fault
decision, and are also served at GET /__faults__/stats.
"""

import argparse
import os
import socket
import struct
import sys
import threading
import time
import uuid

import boto3
from botocore.config import Config
from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from moto.s3.responses import S3Response
from werkzeug.serving import ThreadedWSGIServer

KINDS = ("ok", "503", "500", "short", "reset", "slow", "trickle", "slowheaders")
ERRORS = {
    "503": ("503 Service Unavailable", "SlowDown", "Please reduce your request rate."),
    "500": ("500 Internal Server Error", "InternalError",
            "We encountered an internal error. Please try again."),
}
FAULT_KEY = "tensorlift.fault"


def parse_plan(text):
    steps = []
    text = text.strip()
    if text in ("", "none"):
        return steps
    for part in text.split(","):
        kind, _, count = part.strip().partition(":")
        if kind not in KINDS or not count.isdigit():
            raise SystemExit(f"moto_faults: bad plan step {part!r} (KIND:COUNT, KIND in {KINDS})")
        steps.append([kind, int(count)])
    return steps


class Faults:
    """The plan and the counts, shared by the request threads."""

    def __init__(self, stats_path, slow_seconds, trickle_rate=2048):
        self.lock = threading.Lock()
        self.trickle_rate = trickle_rate
        self.steps = []
        self.armed = False
        self.stats_path = stats_path
        self.slow_seconds = slow_seconds
        self.counts = {"ranged_gets": 0, "served": 0, "faults": 0}
        for kind in KINDS[1:]:
            self.counts["fault_" + kind] = 0

    def arm(self, steps):
        with self.lock:
            self.steps = steps
            self.armed = True
            self._write()

    def next(self):
        """The fault for the next ranged GET ("ok" for none)."""
        with self.lock:
            if not self.armed:
                return "ok"
            kind = "ok"
            while self.steps and self.steps[0][1] == 0:
                self.steps.pop(0)
            if self.steps:
                kind = self.steps[0][0]
                self.steps[0][1] -= 1
            self.counts["ranged_gets"] += 1
            if kind == "ok":
                self.counts["served"] += 1
            else:
                self.counts["faults"] += 1
                self.counts["fault_" + kind] += 1
            self._write()
            return kind

    def text(self):
        with self.lock:
            return "".join(f"{k} {v}\n" for k, v in self.counts.items())

    def _write(self):
        if not self.stats_path:
            return
        tmp = self.stats_path + ".tmp"
        with open(tmp, "w") as f:
            f.write("".join(f"{k} {v}\n" for k, v in self.counts.items()))
        os.replace(tmp, self.stats_path)


FAULTS = None
RESET = set()  # id() of sockets to close with an RST.
RESET_LOCK = threading.Lock()

_get_object = S3Response.get_object


def faulty_get_object(self):
    """moto's get_object, with the plan applied to ranged GETs."""
    if not self.headers.get("Range") and not self.headers.get("range"):
        return _get_object(self)
    kind = FAULTS.next()
    if kind in ERRORS:
        status, code, message = ERRORS[kind]
        body = ('<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>%s</Code>'
                "<Message>%s</Message><RequestId>%s</RequestId></Error>"
                % (code, message, uuid.uuid4().hex))
        return int(status[:3]), {"Content-Type": "application/xml"}, body
    if kind != "ok":
        self.request.environ[FAULT_KEY] = kind  # For FaultMiddleware, once moto cut the range.
    return _get_object(self)


class FaultMiddleware:
    """Cuts, resets or stalls the bodies of the responses get_object marked."""

    def __init__(self, app):
        self.app = app

    def __call__(self, environ, start_response):
        if environ.get("PATH_INFO") == "/__faults__/stats":
            body = FAULTS.text().encode()
            start_response("200 OK", [("Content-Type", "text/plain"),
                                      ("Content-Length", str(len(body)))])
            return [body]
        result = self.app(environ, start_response)  # Flask runs the view now.
        kind = environ.get(FAULT_KEY)
        if kind is None:
            return result
        return self._faulty(result, kind, environ)

    @staticmethod
    def _faulty(result, kind, environ):
        try:
            body = b"".join(result)
        finally:
            if hasattr(result, "close"):
                result.close()
        if kind == "short":
            yield body[: len(body) // 2]  # Then werkzeug closes the connection (FIN).
        elif kind == "reset":
            yield body[: len(body) // 4]
            sock = environ.get("werkzeug.socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                with RESET_LOCK:
                    RESET.add(id(sock))
        elif kind == "slow":  # Under 1 KiB/s over curl's 5 s window: its low-speed limit.
            cut = min(1000, len(body) // 2)
            yield body[:cut]
            time.sleep(FAULTS.slow_seconds)
            yield body[cut:]
        elif kind == "trickle":  # werkzeug writes each piece as it is yielded.
            piece = max(1, FAULTS.trickle_rate // 10)
            for at in range(0, len(body), piece):
                yield body[at:at + piece]
                time.sleep(0.1)
        elif kind == "slowheaders":  # Before werkzeug writes its own head: a byte at a time.
            sock = environ.get("werkzeug.socket")
            head = (b"HTTP/1.1 206 Partial Content\r\nContent-Type: binary/octet-stream\r\n"
                    b"x-amz-request-id: " + b"0" * 4096 + b"\r\n")
            deadline = time.monotonic() + FAULTS.slow_seconds
            try:
                for b in head:
                    if time.monotonic() > deadline:
                        break
                    sock.sendall(bytes([b]))
                    time.sleep(0.1)
            except OSError:
                pass  # The client gave up.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            with RESET_LOCK:
                RESET.add(id(sock))
            raise ConnectionResetError("slowheaders: done")  # werkzeug drops the response.
        else:
            yield body


class FaultServer(ThreadedWSGIServer):
    def shutdown_request(self, request):
        with RESET_LOCK:
            reset = id(request) in RESET
            RESET.discard(id(request))
        if reset:  # close() with SO_LINGER 0 and no shutdown(): an RST, not a FIN.
            self.close_request(request)
        else:
            super().shutdown_request(request)


def upload(endpoint, root):
    s3 = boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1",
        aws_access_key_id="TLTESTACCESSKEY01", aws_secret_access_key="tl-test-secret-key-0123456789",
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))
    for bucket in sorted(os.listdir(root)):
        folder = os.path.join(root, bucket)
        if not os.path.isdir(folder):
            continue
        s3.create_bucket(Bucket=bucket)
        for dirpath, _, files in os.walk(folder):
            for name in sorted(files):
                path = os.path.join(dirpath, name)
                key = os.path.relpath(path, folder).replace(os.sep, "/")
                with open(path, "rb") as f:
                    s3.put_object(Bucket=bucket, Key=key, Body=f)


def main():
    global FAULTS
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--plan", default="none")
    p.add_argument("--root-objects", required=True)
    p.add_argument("--stats", default="")
    p.add_argument("--slow-seconds", type=float, default=5.0)
    p.add_argument("--trickle-rate", type=int, default=2048)
    args = p.parse_args()
    steps = parse_plan(args.plan)
    FAULTS = Faults(args.stats, args.slow_seconds, args.trickle_rate)
    S3Response.get_object = faulty_get_object

    # What moto.server.ThreadedMotoServer runs, built here in the main thread
    # (a port in use ends the process instead of a thread) with the fault
    # middleware and the RST-capable server.
    app = FaultMiddleware(DomainDispatcherApplication(create_backend_app))
    server = FaultServer("127.0.0.1", args.port, app, MotoRequestHandler)
    if server.socket.fileno() < 0:
        raise SystemExit(f"moto_faults: cannot listen on 127.0.0.1:{args.port}")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    upload(f"http://127.0.0.1:{port}", args.root_objects)
    FAULTS.arm(steps)
    sys.stdout.write(f"READY {port}\n")
    sys.stdout.flush()
    threading.Event().wait()  # Until killed.


if __name__ == "__main__":
    main()
