"""Probe the object store before a pipeline writes: does it refuse a second put-if-absent?

Every fence of the project (:mod:`~splitkeeper.delta.fence`: the sink, the state tables, the
lease) rests on one property of the store: of two writers of the same Delta log entry
(``_delta_log/<version>.json``), exactly one succeeds. delta-rs commits on S3 with a
conditional put (``If-None-Match: *``, :mod:`~splitkeeper.delta.storage` rule 3); a store or a
gateway that ignores the header lets both land, the last one wins, and a commit another
writer saw land can vanish without anybody noticing. delta-rs lists the log before it puts,
so only a true race reaches the header: a sequential Delta commit cannot test it.

:func:`probe_store` puts one scratch object (``<location>/_store_probe/<random>``) twice
with ``If-None-Match: *``, signed with the credentials and endpoint delta-rs gets
(:func:`~splitkeeper.delta.storage.storage_options`). The first must land, the second be
refused (412 Precondition Failed, or 409 from a store that reports a concurrent conditional
write). When it lands too (or the store answers 501: the header is not implemented),
:class:`~splitkeeper.errors.StoreUnsafeError` names the store, what it accepted and how to
fix it, before anything of the pipeline is written. The object is deleted afterwards (best
effort). A transient answer (500, 503 SlowDown, a reset connection) is retried with backoff,
:data:`ATTEMPTS` times in all; a first put retried after a lost answer goes to a fresh key (the
lost one may have landed). Another answer (403, ...) or a transient one that persists is a
StateError naming it: nothing is judged from a probe that did not run.

Local file systems pass without a probe (delta-rs commits there with an atomic
rename-if-absent), and so does AWS S3 itself (no custom endpoint: it honours the header
since 2024), as does a custom endpoint without static keys (logged: the probe signs with
``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` only). A passing probe is remembered per
store (endpoint and bucket) for the life of the process; a failing one is not.
"""

from __future__ import annotations

import logging
import os
import threading
import urllib.error
import urllib.parse
import urllib.request
import uuid

from splitkeeper.delta import retries
from splitkeeper.delta.storage import is_local, signed_request, storage_options, table_uri
from splitkeeper.errors import StateError, StoreUnsafeError

__all__ = ["PROBE_FOLDER", "probe_store"]

log = logging.getLogger(__name__)

#: The folder under the probed location that holds the (deleted) scratch objects.
PROBE_FOLDER = "_store_probe"
#: Attempts of one probe request answered by a transient error (:data:`_TRANSIENT`, no answer).
ATTEMPTS = 5
_TRANSIENT = (500, 502, 503, 504)
_NO_ANSWER = -1

_passed: set[tuple[str, str]] = set()
_lock = threading.Lock()


def probe_store(location: str | os.PathLike[str], timeout_s: float = 30.0) -> bool:
    """Refuse (StoreUnsafeError) when the store of ``location`` accepts a second conditional create
    of one key. True when a probe ran and passed; False when none ran (see the module doc)."""
    uri = table_uri(location)
    if is_local(uri):
        return False
    options = storage_options(uri) or {}
    endpoint = options.get("AWS_ENDPOINT_URL", "").rstrip("/")
    bucket, _, prefix = uri[len("s3://") :].partition("/")
    if not endpoint:
        return False
    if not options.get("AWS_ACCESS_KEY_ID") or not options.get("AWS_SECRET_ACCESS_KEY"):
        log.warning("object store %s: no static keys, put-if-absent not probed", endpoint)
        return False
    store = (endpoint, bucket)
    with _lock:
        if store in _passed:
            return False
    put = _Requests(endpoint, bucket, options, timeout_s)
    keys: list[str] = []
    try:
        for attempt in range(ATTEMPTS):  # a fresh key each time: a lost answer may hide a landed put
            keys.append("/".join(p for p in (prefix.strip("/"), PROBE_FOLDER, uuid.uuid4().hex) if p))
            first = put.once("PUT", keys[-1], b"first", {"if-none-match": "*"})
            if first not in _TRANSIENT and first != _NO_ANSWER:
                break
            put.pause(attempt)
        key = keys[-1]
        if first == _NO_ANSWER:
            raise put.unreachable("PUT", key)
        if first // 100 != 2:
            raise put.failed("PUT", key, first, "the probe's first conditional create")
        second = put("PUT", key, b"second", {"if-none-match": "*"})
    finally:
        for scratch in keys:
            try:
                put("DELETE", scratch)
            except Exception as exc:  # noqa: BLE001 - a leftover scratch object harms nothing
                log.warning("could not delete the store probe's object s3://%s/%s: %s", bucket, scratch, exc)
    if second // 100 == 2 or second == 501:
        raise StoreUnsafeError(
            f"the object store at {endpoint} (bucket {bucket!r}, probed under {uri}) "
            f"{'accepted' if second != 501 else 'does not implement (HTTP 501)'} a second conditional "
            f"create of one key (PUT s3://{bucket}/{key} with If-None-Match: *, answered HTTP {second}): "
            "it ignores put-if-absent, so two writers of one Delta commit could both land and a committed "
            "epoch could vanish. Refused before anything of the pipeline was written. Fix: use a store "
            "that honours If-None-Match on PUT (AWS S3, MinIO, Cloudflare R2, versitygw), and make any "
            "gateway or proxy in front of it pass that header through (delta-rs commits with "
            "aws_conditional_put=etag, set by splitkeeper)",
            store=endpoint,
            bucket=bucket,
            location=uri,
            status=second,
            setting="aws_conditional_put",
        )
    if second not in (409, 412):
        raise put.failed("PUT", key, second, "the probe's second conditional create")
    with _lock:
        _passed.add(store)
    log.info("object store %s (bucket %s): a second conditional create is refused (HTTP %s)", *store, second)
    return True


class _Requests:
    """Signed path-style requests to one bucket; each returns the HTTP status."""

    def __init__(self, endpoint: str, bucket: str, options: dict[str, str], timeout_s: float) -> None:
        self.endpoint, self.bucket, self.options, self.timeout_s = endpoint, bucket, options, timeout_s
        self.last_error: OSError | None = None

    def __call__(self, method: str, key: str, data: bytes = b"", extra: dict[str, str] | None = None) -> int:
        """The status, a transient one retried (:data:`ATTEMPTS` in all); StateError without an answer."""
        for attempt in range(ATTEMPTS):
            status = self.once(method, key, data, extra)
            if status not in _TRANSIENT and status != _NO_ANSWER:
                return status
            self.pause(attempt)
        if status == _NO_ANSWER:
            raise self.unreachable(method, key)
        return status

    @staticmethod
    def pause(attempt: int) -> None:
        if attempt + 1 < ATTEMPTS:
            retries.back_off("store_probe", attempt, first_s=0.1, cap_s=2.0)

    def unreachable(self, method: str, key: str) -> StateError:
        return StateError(
            f"the object store at {self.endpoint} could not be probed ({method} "
            f"s3://{self.bucket}/{key}: no answer after {ATTEMPTS} attempts: {self.last_error}); check the "
            "endpoint and that the store runs",
            store=self.endpoint,
        )

    def once(self, method: str, key: str, data: bytes = b"", extra: dict[str, str] | None = None) -> int:
        """One request: its HTTP status, or ``_NO_ANSWER`` (no connection, reset, timeout)."""
        request = signed_request(
            method,
            self.endpoint,
            f"/{self.bucket}/{urllib.parse.quote(key)}",
            self.options["AWS_ACCESS_KEY_ID"],
            self.options["AWS_SECRET_ACCESS_KEY"],
            self.options.get("AWS_REGION") or "us-east-1",
            data,
            extra,
            self.options.get("AWS_SESSION_TOKEN"),
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                response.read()
                return int(response.status)
        except urllib.error.HTTPError as err:
            err.read()
            return int(err.code)
        except OSError as err:
            self.last_error = err
            return _NO_ANSWER

    def failed(self, method: str, key: str, status: int, what: str) -> StateError:
        return StateError(
            f"the object store at {self.endpoint} answered {what} ({method} s3://{self.bucket}/{key}) with "
            f"HTTP {status}: the probe could not run; check the credentials and the bucket's permissions "
            "(the pipeline needs put and delete under its state location)",
            store=self.endpoint,
            status=status,
        )


def _reset_for_tests() -> None:
    with _lock:
        _passed.clear()
