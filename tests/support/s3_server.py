"""A real S3 endpoint for tests and benchmarks: moto's server on loopback, and a
fault-injecting HTTP proxy in front of it.

``S3Server`` starts ``moto.server.ThreadedMotoServer`` on 127.0.0.1 at a free
port and creates one bucket. ``FaultProxy`` forwards every request to it and,
for a chosen fraction of requests, answers 503, resets the connection, or
delays; it can also add a fixed latency to every request (a stand-in for an
object store's first-byte latency) and counts the requests it saw.
Nothing listens on or connects to any address but 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import datetime
import http.client
import json
import logging
import random
import socket
import struct
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["FaultProxy", "S3Server", "retry_options"]

ACCESS = {"access_key_id": "testing", "secret_access_key": "testing", "region": "us-east-1"}


def retry_options(*, retries: int = 3, timeout: float = 2.0, budget: float = 10.0
                  ) -> dict[str, Any]:
    """obstore client and retry options for tests: short backoff, short timeouts."""
    return {
        "retry_config": {
            "max_retries": retries,
            "backoff": {"init_backoff": datetime.timedelta(milliseconds=5),
                        "max_backoff": datetime.timedelta(milliseconds=50), "base": 2},
            "retry_timeout": datetime.timedelta(seconds=budget),
        },
        "client_options": {"allow_http": True, "timeout": f"{timeout}s",
                           "connect_timeout": "1s"},
    }


@dataclass
class S3Server:
    """moto's S3 server on 127.0.0.1 with one bucket."""

    bucket: str = "zerobatch-test"
    endpoint: str = ""
    _server: Any = None
    _counter: int = 0

    def start(self) -> S3Server:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        request = urllib.request.Request(f"{self.endpoint}/{self.bucket}", method="PUT")
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def storage_options(self, endpoint: str | None = None, **retry: Any) -> dict[str, Any]:
        """``storage_options`` that reach this server (or a proxy at ``endpoint``)."""
        return {"config": {**ACCESS, "endpoint": endpoint or self.endpoint},
                **retry_options(**retry)}

    def env(self, endpoint: str | None = None) -> dict[str, str]:
        """The environment variables that reach this server, as the AWS tools read them."""
        return {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint or self.endpoint,
                "AWS_ALLOW_HTTP": "true"}

    def url(self, name: str = "data") -> str:
        """A fresh prefix URL in the bucket (``s3://bucket/name-N``), unique per call."""
        self._counter += 1
        return f"s3://{self.bucket}/{name}-{self._counter}"


@dataclass
class _Faults:
    rate: float = 0.0
    kinds: tuple[str, ...] = ("503", "reset", "delay")
    delay: float = 0.05
    latency: float = 0.0
    bandwidth: float = 0.0  # bytes/s per response body; 0: no cap
    rng: random.Random = field(default_factory=lambda: random.Random(0))


class FaultProxy:
    """An HTTP proxy on 127.0.0.1 in front of ``target`` that injects faults.

    ``with proxy.faults(rate=0.2, kinds=("503", "reset", "delay")):`` makes that
    fraction of requests fail (seeded, so a run is repeatable); ``latency``
    seconds are added to every request. ``requests`` lists (method, path,
    Range header) of every request forwarded (``GET /__requests__`` answers it
    as JSON); ``reset_counts()`` clears it.
    """

    def __init__(self, target: str) -> None:
        self.target = target.removeprefix("http://")
        self.state = _Faults()
        self.requests: list[tuple[str, str, str | None]] = []
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                if self.path == "/__requests__":  # the log, for a benchmark in another process
                    with proxy.lock:
                        payload = json.dumps(proxy.requests).encode()
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                fault = proxy._draw()
                if proxy.state.latency:
                    time.sleep(proxy.state.latency)
                if fault == "reset":
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                               struct.pack("ii", 1, 0))
                    self.close_connection = True
                    return
                if fault == "503":
                    payload = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown'
                               b"</Code><Message>injected</Message></Error>")
                    self.send_response(503)
                    self.send_header("Content-Length", str(len(payload)))
                    self.send_header("Content-Type", "application/xml")
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                if fault == "delay":
                    time.sleep(proxy.state.delay)
                with proxy.lock:
                    proxy.requests.append((self.command, self.path, self.headers.get("Range")))
                connection = http.client.HTTPConnection(proxy.target, timeout=30)
                try:
                    headers = {k: v for k, v in self.headers.items()
                               if k.lower() not in ("connection", "keep-alive")}
                    connection.request(self.command, self.path, body=body, headers=headers)
                    response = connection.getresponse()
                    payload = response.read()
                except OSError:  # the server dropped us: a retryable answer
                    self.send_error(502)
                    return
                finally:
                    connection.close()
                self.send_response(response.status, response.reason)
                for key, value in response.getheaders():
                    if key.lower() not in ("connection", "keep-alive", "transfer-encoding",
                                           "content-length", "server", "date"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if self.command != "HEAD":
                    if proxy.state.bandwidth:
                        time.sleep(len(payload) / proxy.state.bandwidth)
                    self.wfile.write(payload)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        class Server(ThreadingHTTPServer):
            request_queue_size = 256  # many clients connect at once; the default is 5

            def handle_error(self, request: Any, client_address: Any) -> None:
                return  # clients that time out and hang up are part of the test

        self._server = Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def _draw(self) -> str | None:
        with self.lock:
            state = self.state
            if state.rate <= 0 or state.rng.random() >= state.rate:
                return None
            return state.rng.choice(state.kinds)

    @contextlib.contextmanager
    def faults(self, rate: float, *, kinds: tuple[str, ...] = ("503", "reset", "delay"),
               delay: float = 0.05, latency: float = 0.0, bandwidth: float = 0.0,
               seed: int = 0) -> Iterator[None]:
        """Inject faults into ``rate`` of the requests inside the block; add
        ``latency`` seconds to every request and cap each response body at
        ``bandwidth`` bytes/s (0: no cap)."""
        with self.lock:
            self.state = _Faults(rate, kinds, delay, latency, bandwidth, random.Random(seed))
        try:
            yield
        finally:
            with self.lock:
                self.state = _Faults()

    def reset_counts(self) -> None:
        with self.lock:
            self.requests.clear()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
