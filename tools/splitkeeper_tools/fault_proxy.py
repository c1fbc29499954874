"""A small HTTP fault proxy for tests: forwards every request to one upstream, misbehaving on purpose.

Put in front of the local S3 server (versitygw), it makes the stores the project must refuse or
survive: one that ignores conditional creates (``drop_headers={"if-none-match"}``: the header never
reaches the store, as some S3-compatible gateways do), and, through ``fault``, one that answers a
request with an error status (503 Slow Down), answers late, or resets the connection: one
request by hand, or (:class:`FaultSchedule`) at a rate per kind drawn from a seed, optionally only
for some methods and paths. :attr:`FaultProxy.injected` counts what it did, by kind
(:data:`FAULT_KINDS`).

Standard library only (``http.server`` + ``http.client``); one thread per connection. A test tool:
nothing of the product imports it.

    with FaultProxy("http://127.0.0.1:9000", drop_headers={"If-None-Match"}) as proxy:
        os.environ["AWS_ENDPOINT_URL"] = proxy.url  # with credentials=(key, secret): signed again
"""

from __future__ import annotations

import http.client
import random
import re
import socket
import struct
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["FAULT_KINDS", "Fault", "FaultProxy", "FaultSchedule", "ProxiedRequest", "is_conditional"]

#: What :attr:`FaultProxy.injected` counts: an error status (503 SlowDown, ...), a delayed answer, a
#: reset connection (no answer at all).
FAULT_KINDS = ("slowdown", "delay", "reset")

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
    error body), wait ``delay_s`` first, or ``reset`` the connection (RST, no answer). With
    ``after``, the reset comes after the request was forwarded and the store answered: the request
    was done (a put landed, or was refused), only its answer is lost."""

    status: int | None = None
    delay_s: float = 0.0
    reset: bool = False
    after: bool = False

    def kinds(self) -> list[str]:
        """What this fault injects, as :data:`FAULT_KINDS` names."""
        return (
            (["delay"] if self.delay_s else [])
            + (["reset"] if self.reset else [])
            + (["slowdown"] if self.status is not None and not self.reset else [])
        )


@dataclass
class FaultSchedule:
    """A seeded fault per request, for :attr:`FaultProxy.fault`: each request that matches
    ``methods`` (none: all) and ``paths`` (a regular expression searched in the request target;
    None: all) draws from ``random.Random(seed)``: a 503 SlowDown with probability ``slowdown``,
    else a reset connection with ``reset``, else an answer ``delay_s`` late with ``delay``.
    The draws are a function of the seed and the order the requests arrive in.

    ``reset_after`` is the share of the resets that come after the request was forwarded (drawn
    from the same seed): done, its answer lost (:attr:`Fault.after`); the others before (not done).
    ``reset_conditional=False`` spares conditional requests (``If-None-Match``, ``If-Match``: a
    Delta commit) the reset, whose lost answer no client may retry blindly (the put may have
    landed); they still meet the 503s (an answer: nothing was done) and the delays. The fence
    re-reads the table after a lost answer (``splitkeeper.delta.fence`` step 5), so a chaos run
    lets them meet resets too."""

    seed: int
    slowdown: float = 0.0
    delay: float = 0.0
    reset: float = 0.0
    delay_s: float = 0.5
    methods: Iterable[str] = ()
    paths: str | None = None
    reset_conditional: bool = True
    reset_after: float = 0.0

    def __post_init__(self) -> None:
        for name in ("slowdown", "delay", "reset", "reset_after"):
            rate = getattr(self, name)
            if not 0 <= rate <= 1:
                raise ValueError(f"{name} must be a rate between 0 and 1, not {rate!r}")
        if self.slowdown + self.delay + self.reset > 1:
            raise ValueError("slowdown + delay + reset must not exceed 1")
        if self.delay_s < 0:
            raise ValueError(f"delay_s must be >= 0, not {self.delay_s!r}")
        self._methods = {m.upper() for m in self.methods}
        self._paths = None if self.paths is None else re.compile(self.paths)
        self._random = random.Random(self.seed)
        self._lock = threading.Lock()

    def __call__(self, request: ProxiedRequest) -> Fault | None:
        if self._methods and request.method.upper() not in self._methods:
            return None
        if self._paths is not None and not self._paths.search(request.path):
            return None
        with self._lock:
            draw = self._random.random()
        if draw < self.slowdown:
            return Fault(status=503)
        if draw < self.slowdown + self.reset:
            if not self.reset_conditional and is_conditional(request):
                return None
            if not self.reset_after:
                return Fault(reset=True)
            with self._lock:
                after = self._random.random() < self.reset_after
            return Fault(reset=True, after=after)
        if draw < self.slowdown + self.reset + self.delay:
            return Fault(delay_s=self.delay_s)
        return None


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
    #: False: only count requests (a long chaos run), do not keep them in :attr:`seen`.
    keep_seen: bool = True
    #: What the proxy injected, by kind (:data:`FAULT_KINDS`); read it with :meth:`counts`.
    injected: Counter[str] = field(default_factory=Counter)
    #: The resets of conditional requests (a Delta commit), by when: :meth:`conditional_resets`.
    conditional: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        parsed = urllib.parse.urlsplit(self.upstream)
        if parsed.scheme != "http" or not parsed.hostname:
            raise ValueError(f"upstream must be http://host:port, not {self.upstream!r}")
        self._target = (parsed.hostname, parsed.port or 80)
        self._drop = {h.lower() for h in self.drop_headers}
        self._lock = threading.Lock()
        self._requests = 0
        self._server = _Server(("127.0.0.1", 0), _handler(self))
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

    def counts(self) -> dict[str, int]:
        """Requests seen and faults injected so far: ``{"requests": n, "slowdown": n, ...}``."""
        with self._lock:
            return {"requests": self._requests, **{k: self.injected[k] for k in FAULT_KINDS}}

    def conditional_resets(self) -> dict[str, int]:
        """Resets of conditional requests (``If-None-Match``, ``If-Match``: a Delta commit's put) so far:
        ``before_forwarding`` (the put never reached the store) and ``after_forwarding`` (the store
        answered, the answer was lost: a put that landed, or that the store refused)."""
        with self._lock:
            return {k: self.conditional[k] for k in ("before_forwarding", "after_forwarding")}

    def _record(self, request: ProxiedRequest) -> None:
        with self._lock:
            self._requests += 1
            if self.keep_seen:
                self.seen.append(request)

    def _count(self, fault: Fault, request: ProxiedRequest) -> None:
        with self._lock:
            self.injected.update(fault.kinds())
            if fault.reset and is_conditional(request):
                self.conditional["after_forwarding" if fault.after else "before_forwarding"] += 1


def is_conditional(request: ProxiedRequest) -> bool:
    """Whether ``request`` is conditional (``If-None-Match`` or ``If-Match``: a Delta commit's put)."""
    return any(k.lower() in ("if-none-match", "if-match") for k in request.headers)


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """Quiet about a client that went away (a SIGKILLed driver, a timeout); loud otherwise."""
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


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
            chunked = "chunked" in self.headers.get("Transfer-Encoding", "").lower()
            body = self._body(chunked)
            fault = proxy.fault(request) if proxy.fault is not None else None
            if fault is not None:
                proxy._count(fault, request)
            if fault is not None and fault.delay_s:
                time.sleep(fault.delay_s)
            if fault is not None and fault.reset and not fault.after:
                self._reset()
                return
            if fault is not None and fault.status is not None:
                self._answer(fault.status, {"Content-Type": "application/xml"}, _s3_error(fault.status))
                return
            sent = {k: v for k, v in headers.items() if k.lower() not in proxy._drop | _HOP}
            if dropped and proxy.credentials is not None:
                sent = _signed_again(self.command, self.path, sent, proxy.credentials)
            sent = {k: v for k, v in sent.items() if k.lower() != "expect"}  # answered here (100)
            if chunked:  # as it came (aws-chunked uploads of the AWS SDKs); the body de-chunked above
                sent["Transfer-Encoding"] = "chunked"
            upstream = http.client.HTTPConnection(*proxy._target, timeout=60)
            try:
                payload = iter([body]) if chunked else (body or None)
                upstream.request(self.command, self.path, payload, sent, encode_chunked=chunked)
                response = upstream.getresponse()
                data = response.read()
                if fault is not None and fault.reset:  # after: the store did it, the answer is lost
                    self._reset()
                    return
                self._answer(response.status, dict(response.getheaders()), data)
            finally:
                upstream.close()

        def _reset(self) -> None:
            """Reset the connection (RST): the client gets no answer."""
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            self.connection.close()

        def _body(self, chunked: bool) -> bytes:
            """The request body: ``Content-Length`` bytes, or the chunks of a chunked one (RFC 9112 7.1)."""
            if not chunked:
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""
            parts: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailer fields
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()  # the CRLF after the chunk

        def _answer(self, status: int, headers: dict[str, str], data: bytes) -> None:
            self.send_response(status)
            length = str(len(data))
            for key, value in headers.items():
                if key.lower() == "content-length" and self.command == "HEAD":
                    length = value  # the size of what a GET would answer: no body here
                elif key.lower() not in _HOP and key.lower() != "content-length":
                    self.send_header(key, value)
            self.send_header("Content-Length", length)
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
