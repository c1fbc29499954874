"""The store probe at open (splitkeeper.delta.probe) and the fault proxy (splitkeeper_tools.fault_proxy).

No Spark, no object-store binary: a small S3 stand-in in this module honours ``If-None-Match``
and checks every request's SigV4 signature, as the real store does (the real one, versitygw,
is built only for the cluster: tests/cluster/test_cluster_up.py probes it, directly and through
the same proxy). The proxy drops ``If-None-Match`` the way some S3 gateways do, signing the
request again, so only the header's meaning is lost.
"""

from __future__ import annotations

import http.client
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from splitkeeper.delta import probe
from splitkeeper.delta.probe import PROBE_FOLDER, probe_store
from splitkeeper.delta.storage import sigv4_authorization
from splitkeeper.errors import StateError, StoreUnsafeError
from splitkeeper_tools.fault_proxy import FAULT_KINDS, Fault, FaultProxy, FaultSchedule, ProxiedRequest

ACCESS, SECRET = "probe-access", "probe-secret-0123456789"


class FakeS3:
    """Objects in a dict; PUT honours ``If-None-Match: *`` (412); every request's signature is checked."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        store = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

            def _answer(self, status: int, body: bytes = b"") -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _handle(self) -> None:
                headers = {k.lower(): v for k, v in self.headers.items()}
                store.requests.append((self.command, self.path, headers))
                body = self.rfile.read(int(headers.get("content-length") or 0))
                if not store.signed_right(self.command, self.path, headers):
                    return self._answer(403, b"<Error><Code>SignatureDoesNotMatch</Code></Error>")
                key = urllib.parse.unquote(self.path)
                if self.command == "PUT":
                    if headers.get("if-none-match") == "*" and key in store.objects:
                        return self._answer(412, b"<Error><Code>PreconditionFailed</Code></Error>")
                    store.objects[key] = body
                    return self._answer(200)
                if self.command == "DELETE":
                    store.objects.pop(key, None)
                    return self._answer(204)
                return self._answer(405)

            do_PUT = do_DELETE = do_GET = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    @staticmethod
    def signed_right(method: str, target: str, headers: dict[str, str]) -> bool:
        given = headers.get("authorization", "")
        try:
            names = given.split("SignedHeaders=")[1].split(",")[0].split(";")
            region = given.split("Credential=")[1].split("/")[2]
        except IndexError:
            return False
        path, _, query = target.partition("?")
        signed = {n: headers.get(n, "") for n in names}
        return sigv4_authorization(method, path, query, signed, ACCESS, SECRET, region) == given


@pytest.fixture
def store(monkeypatch) -> Iterator[FakeS3]:
    fake = FakeS3()
    monkeypatch.setenv("AWS_ENDPOINT_URL", fake.url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    probe._reset_for_tests()
    yield fake
    probe._reset_for_tests()
    fake.server.shutdown()


def _puts(fake: FakeS3) -> list[str]:
    return [path for method, path, _ in fake.requests if method == "PUT"]


def test_a_local_state_location_passes_without_a_probe(tmp_path: Path) -> None:
    assert probe_store(tmp_path / "state") is False
    assert not (tmp_path / "state").exists()


def test_a_store_that_refuses_the_second_conditional_put_passes_once_per_process(store: FakeS3) -> None:
    assert probe_store("s3://bucket/pipelines/orders/state") is True
    puts = _puts(store)
    assert len(puts) == 2 and puts[0] == puts[1]
    assert puts[0].startswith(f"/bucket/pipelines/orders/state/{PROBE_FOLDER}/")
    assert all(h.get("if-none-match") == "*" for m, _, h in store.requests if m == "PUT")
    assert store.objects == {}  # the scratch object is deleted
    assert probe_store("s3a://bucket/another/state") is False  # the same store: remembered
    assert len(store.requests) == 3


def test_a_store_that_ignores_if_none_match_is_refused_naming_the_store_and_the_fix(
    store: FakeS3, monkeypatch
) -> None:
    with FaultProxy(store.url, drop_headers={"If-None-Match"}, credentials=(ACCESS, SECRET)) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        with pytest.raises(StoreUnsafeError) as err:
            probe_store("s3://bucket/state")
        assert [r.dropped for r in proxy.seen if r.method == "PUT"] == [("If-None-Match",)] * 2
    text = str(err.value)
    assert text.startswith("[STORE_UNSAFE] the object store at " + proxy.url + " (bucket 'bucket'")
    assert "accepted a second conditional create of one key" in text and "answered HTTP 200" in text
    assert "If-None-Match" in text and "aws_conditional_put" in text and "Fix:" in text
    assert "Refused before anything of the pipeline was written" in text
    assert isinstance(err.value, StateError) and err.value.params["setting"] == "aws_conditional_put"
    assert store.objects == {}  # both puts landed (the proxy re-signed them), then the delete
    assert len(_puts(store)) == 2
    # not remembered: once the gateway is fixed, the next open probes again and passes
    monkeypatch.setenv("AWS_ENDPOINT_URL", store.url)
    assert probe_store("s3://bucket/state") is True


def test_a_probe_that_cannot_run_says_so_and_judges_nothing(store: FakeS3, monkeypatch) -> None:
    def forbidden(request: ProxiedRequest) -> Fault | None:
        return Fault(status=403) if request.method == "PUT" else None

    with FaultProxy(store.url, fault=forbidden) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        with pytest.raises(StateError, match="HTTP 403: the probe could not run") as err:
            probe_store("s3://bucket/state")
    assert not isinstance(err.value, StoreUnsafeError)


def test_the_proxy_injects_503_a_delay_and_a_connection_reset_on_schedule(store: FakeS3) -> None:
    def schedule(request: ProxiedRequest) -> Fault | None:
        key = request.path.rsplit("/", 1)[-1]
        faults = {"slow": Fault(status=503), "late": Fault(delay_s=0.2), "cut": Fault(reset=True)}
        return {**faults, "done": Fault(reset=True, after=True)}.get(key)  # done: forwarded, answer lost

    with FaultProxy(store.url, fault=schedule) as proxy:
        host, port = proxy.url.removeprefix("http://").split(":")

        def put(key: str) -> tuple[int, bytes]:
            connection = http.client.HTTPConnection(host, int(port), timeout=10)
            try:
                connection.request("PUT", f"/bucket/{key}", body=b"x", headers={"Authorization": "none"})
                response = connection.getresponse()
                return response.status, response.read()
            finally:
                connection.close()

        status, body = put("slow")
        assert status == 503 and b"<Code>SlowDown</Code>" in body
        assert put("late")[0] == 403  # forwarded after the delay: the store checked (and refused) it
        with pytest.raises((ConnectionResetError, http.client.RemoteDisconnected)):
            put("cut")
        with pytest.raises((ConnectionResetError, http.client.RemoteDisconnected)):
            put("done")
        assert proxy.counts()["reset"] == 2
    # the delayed one and the one reset after forwarding reached the store; the other reset did not
    assert [p for _, p, _ in store.requests] == ["/bucket/late", "/bucket/done"]


def test_a_run_on_a_store_that_ignores_if_none_match_is_refused_before_it_writes(
    store: FakeS3, monkeypatch, tmp_path: Path
) -> None:
    """``splitkeeper run`` probes the state's store before its lease: [STORE_UNSAFE], exit 2, the
    store holds nothing (no lease, no table), Spark never started."""
    import contextlib
    import io

    import yaml

    from splitkeeper.cli import main

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("one\ntwo\n")
    config = tmp_path / "p.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "name": "orders",
                "parallelism": 1,
                "source": {"kind": "files", "path": str(tmp_path / "in"), "format": "lines"},
                "state": {"path": "s3://bucket/orders/state"},
                "sink": {"path": "s3://bucket/orders/sink"},
                "staging": {"path": str(tmp_path / "staging")},
            }
        )
    )
    with FaultProxy(store.url, drop_headers={"If-None-Match"}, credentials=(ACCESS, SECRET)) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["run", "--config", str(config)])
    assert code == 2, err.getvalue()
    assert "[STORE_UNSAFE]" in err.getvalue() and "s3://bucket/orders/state" in err.getvalue()
    assert store.objects == {}
    assert {p.rsplit("/", 1)[0] for p in _puts(store)} == {f"/bucket/orders/state/{PROBE_FOLDER}"}


def test_the_probe_retries_a_503_and_a_reset_then_passes_on_a_fresh_key(store: FakeS3, monkeypatch) -> None:
    faults = iter([Fault(status=503), Fault(reset=True)])

    def first_two_puts(request: ProxiedRequest) -> Fault | None:
        return next(faults, None) if request.method == "PUT" else None

    with FaultProxy(store.url, fault=first_two_puts) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        assert probe_store("s3://bucket/state") is True
        assert proxy.counts() == {"requests": 7, "slowdown": 1, "delay": 0, "reset": 1}  # 4 PUTs, 3 DELETEs
    puts = [r.path for r in proxy.seen if r.method == "PUT"]
    assert len(set(puts[:3])) == 3 and puts[3] == puts[2]  # a fresh key after each lost answer
    assert _puts(store) == puts[2:]  # the faulted ones never reached the store
    assert store.objects == {}


def test_the_fault_schedule_is_drawn_from_its_seed_scoped_and_counted(store: FakeS3) -> None:
    def requests(n: int, method: str = "PUT", path: str = "/b/t/_delta_log/0.json") -> list[ProxiedRequest]:
        return [ProxiedRequest(method, path, {}) for _ in range(n)]

    def kinds(schedule: FaultSchedule, batch: list[ProxiedRequest]) -> list[tuple[str, ...]]:
        return [tuple(f.kinds()) if (f := schedule(r)) else () for r in batch]

    rates = {"slowdown": 0.2, "reset": 0.1, "delay": 0.1, "delay_s": 0.05}
    one = kinds(FaultSchedule(seed=5, **rates), requests(400))
    assert one == kinds(FaultSchedule(seed=5, **rates), requests(400))
    assert one != kinds(FaultSchedule(seed=6, **rates), requests(400))
    share = {k: sum(1 for f in one if f == (k,)) / 400 for k in FAULT_KINDS}
    assert 0.13 < share["slowdown"] < 0.27 and 0.05 < share["reset"] < 0.15 and 0.05 < share["delay"] < 0.15
    scoped = FaultSchedule(seed=5, slowdown=1.0, methods=["put"], paths=r"/_delta_log/")
    assert kinds(scoped, requests(3)) == [("slowdown",)] * 3
    assert kinds(scoped, requests(3, "GET") + requests(3, "PUT", "/b/t/part-0.parquet")) == [()] * 6
    for bad in ({"slowdown": 1.5}, {"reset": -0.1}, {"slowdown": 0.6, "reset": 0.6}, {"delay_s": -1.0}):
        with pytest.raises(ValueError, match="must"):
            FaultSchedule(seed=1, **bad)  # type: ignore[arg-type]

    # through the proxy: every request draws, the counts are what the clients met
    with FaultProxy(store.url, fault=FaultSchedule(seed=2, **rates), keep_seen=False) as proxy:
        host, port = proxy.url.removeprefix("http://").split(":")
        met = {"slowdown": 0, "reset": 0, "answered": 0}
        for i in range(60):
            connection = http.client.HTTPConnection(host, int(port), timeout=10)
            try:
                connection.request("DELETE", f"/bucket/k{i}", headers={"Authorization": "none"})
                response = connection.getresponse()
                response.read()
                met["slowdown" if response.status == 503 else "answered"] += 1
            except (ConnectionResetError, http.client.RemoteDisconnected):
                met["reset"] += 1
            finally:
                connection.close()
        counts = proxy.counts()
    assert proxy.seen == [] and counts["requests"] == 60
    assert (counts["slowdown"], counts["reset"]) == (met["slowdown"], met["reset"])
    assert counts["slowdown"] > 0 and counts["reset"] > 0 and counts["delay"] > 0
    assert len(store.requests) == met["answered"]  # the delayed ones reached the store, late
