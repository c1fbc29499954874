"""A small HTTP fault proxy for tests: forwards every request to one upstream, misbehaving on purpose.

Put in front of the local S3 server (versitygw), it makes the stores the project must refuse or
survive: one that ignores conditional creates (``drop_headers={"if-none-match"}``: the header never
reaches the store, as some S3-compatible gateways do), and, through ``fault``, one that answers a
request with an error status (503 Slow Down), answers late, or resets the connection.

Standard library only (``http.server`` + ``http.client``); one thread per connection. A test tool:
nothing of the product imports it.

    with FaultProxy("http://127.0.0.1:9000", drop_headers={"If-None-Match"}) as proxy:
        os.environ["AWS_ENDPOINT_URL"] = proxy.url  # with credentials=(key, secret): signed again
"""

from __future__ import annotations

import http.client
import re
import socket
import struct
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["Fault", "FaultProxy", "ProxiedRequest"]

#: Headers that belong to one hop (RFC 9110 7.6.1): never forwarded.
_HOP = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade"}


@dataclass(frozen=True, slots=True)
class ProxiedRequest:
    """What the proxy saw: ``headers`` as they reached it (before any was dropped)."""

    method: str
    path: str
    headers: dict[str, str]
    dropped: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Fault:
    """What to do to one request instead of (or before) forwarding it: answer ``status`` (with an S3
    error body), wait ``delay_s`` first, or ``reset`` the connection (RST, no answer)."""

    status: int | None = None
    delay_s: float = 0.0
    reset: bool = False


@dataclass
class FaultProxy:
    """Forward ``127.0.0.1:<port>`` to ``upstream``; :attr:`url` is what clients use (see the module doc)."""

    upstream: str
    drop_headers: Iterable[str] = ()
    #: (access key, secret key) to sign a request again after a signed header was dropped (SigV4:
    #: the store would refuse it otherwise); the region comes from the request's own signature.
    credentials: tuple[str, str] | None = field(default=None, repr=False)
    fault: Callable[[ProxiedRequest], Fault | None] | None = None
    seen: list[ProxiedRequest] = field(default_factory=list)

    def __post_init__(self) -> None:
        parsed = urllib.parse.urlsplit(self.upstream)
        if parsed.scheme != "http" or not parsed.hostname:
            raise ValueError(f"upstream must be http://host:port, not {self.upstream!r}")
        self._target = (parsed.hostname, parsed.port or 80)
        self._drop = {h.lower() for h in self.drop_headers}
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="fault-proxy", daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _record(self, request: ProxiedRequest) -> None:
        with self._lock:
            self.seen.append(request)


def _handler(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
            pass

        def _forward(self) -> None:
            headers = {k: v for k, v in self.headers.items()}
            dropped = tuple(k for k in headers if k.lower() in proxy._drop)
            request = ProxiedRequest(self.command, self.path, headers, dropped)
            proxy._record(request)
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            fault = proxy.fault(request) if proxy.fault is not None else None
            if fault is not None and fault.delay_s:
                time.sleep(fault.delay_s)
            if fault is not None and fault.reset:
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.close_connection = True
                self.connection.close()
                return
            if fault is not None and fault.status is not None:
                self._answer(fault.status, {"Content-Type": "application/xml"}, _s3_error(fault.status))
                return
            sent = {k: v for k, v in headers.items() if k.lower() not in proxy._drop | _HOP}
            if dropped and proxy.credentials is not None:
                sent = _signed_again(self.command, self.path, sent, proxy.credentials)
            upstream = http.client.HTTPConnection(*proxy._target, timeout=60)
            try:
                upstream.request(self.command, self.path, body=body or None, headers=sent)
                response = upstream.getresponse()
                data = response.read()
                self._answer(response.status, dict(response.getheaders()), data)
            finally:
                upstream.close()

        def _answer(self, status: int, headers: dict[str, str], data: bytes) -> None:
            self.send_response(status)
            for key, value in headers.items():
                if key.lower() not in _HOP and key.lower() != "content-length":
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

    return Handler


def _signed_again(
    method: str, target: str, headers: dict[str, str], credentials: tuple[str, str]
) -> dict[str, str]:
    """``headers`` with a SigV4 signature over what is left of the originally signed ones."""
    from splitkeeper.delta.storage import sigv4_authorization as authorization

    lower = {k.lower(): v for k, v in headers.items()}
    old = lower.pop("authorization", "")
    match = re.search(r"Credential=[^/]+/\d{8}/([^/]+)/s3/aws4_request, SignedHeaders=([^,]+)", old)
    if match is None:
        return headers
    region, names = match.group(1), match.group(2).split(";")
    signed = {k: lower[k] for k in names if k in lower}
    path, _, query = target.partition("?")
    lower["authorization"] = authorization(method, path, query, signed, *credentials, region)
    return lower


def _s3_error(status: int) -> bytes:
    code = {503: "SlowDown", 500: "InternalError", 412: "PreconditionFailed"}.get(status, "InjectedFault")
    return (
        f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
        f"<Message>injected by the fault proxy</Message></Error>"
    ).encode()
