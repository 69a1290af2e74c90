"""An S3-compatible server on loopback for tests: moto in server mode, in a process of
its own (in a thread it would share the driver's interpreter lock).

``S3Server`` starts it, sets the ``AWS_*`` environment that delta-rs, pyarrow and
Spark's Python workers (started from this process) read, and makes buckets."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid

from helpers import free_port

ENV_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "AWS_DEFAULT_REGION",
            "AWS_ENDPOINT_URL", "AWS_ALLOW_HTTP", "AWS_EC2_METADATA_DISABLED")


class S3Server:
    def __init__(self) -> None:
        self.endpoint = ""
        self._proc: subprocess.Popen[bytes] | None = None
        self._saved: dict[str, str | None] = {}

    def __enter__(self) -> S3Server:
        port = free_port()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    self._stop()
                    raise RuntimeError("the moto S3 server did not start") from None
                time.sleep(0.1)
        self.endpoint = f"http://127.0.0.1:{port}"
        env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1",
               "AWS_ENDPOINT_URL": self.endpoint, "AWS_ALLOW_HTTP": "true",
               "AWS_EC2_METADATA_DISABLED": "true"}
        for key in ENV_KEYS:
            self._saved[key] = os.environ.get(key)
        os.environ.update(env)
        return self

    def __exit__(self, *exc: object) -> None:
        for key, value in self._saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._stop()

    def _stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=30)

    def client(self):  # noqa: ANN201 - boto3's client type
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint)

    def new_bucket(self) -> str:
        name = f"sf-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        found: list[str] = []
        for page in self.client().get_paginator("list_objects_v2").paginate(
                Bucket=bucket, Prefix=prefix):
            found += [o["Key"] for o in page.get("Contents", [])]
        return found



_METHODS = (b"GET ", b"PUT ", b"POST ", b"HEAD ", b"DELETE ")


class FlakyProxy:
    """A TCP proxy on loopback in front of an S3 server (``upstream``, ``host:port``)
    that fails chosen requests as a request that timed out does: ``fail_after(n)``
    cuts the connection carrying the ``n``-th request from now (both sides closed,
    no reply), once. ``dropped`` counts the requests cut."""

    def __init__(self, upstream: str) -> None:
        import threading

        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.endpoint = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.dropped = 0
        self._countdown: int | None = None
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def fail_after(self, n: int | None) -> None:
        with self._lock:
            self._countdown = n

    def _cut(self, data: bytes) -> bool:
        if not data.startswith(_METHODS):
            return False
        with self._lock:
            if self._countdown is None:
                return False
            self._countdown -= 1
            if self._countdown > 0:
                return False
            self._countdown = None
            self.dropped += 1
            return True

    def _accept(self) -> None:
        import threading

        while not self._closed:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.upstream, timeout=60)
            except OSError:
                client.close()
                continue
            threading.Thread(target=self._pump, args=(client, upstream, True),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False),
                             daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, requests: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data or (requests and self._cut(data)):
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        self._closed = True
        self.sock.close()
