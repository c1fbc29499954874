"""Shared test fixtures: one Spark session, one Kafka broker, a scratch folder per test.

- ``spark`` (session scope): the one SparkSession of the test run, built by
  :func:`splitkeeper.spark.session.get_spark` (``local[2]``, UI off, 2 shuffle
  partitions, Delta on). The JVM starts once, on first use, and stops at the end.
- ``kafka_broker`` (session scope): one local KRaft broker for the whole run.
- ``versitygw`` (session scope): the object store's binary (``.tools/versitygw/bin/versitygw``),
  built by ``bash scripts/setup.sh versitygw`` when missing; a failed build fails the test that
  needs it (never a skip: a real-S3 test does not depend on another test having built it first).
- ``iceberg_rest``: Iceberg's REST catalog test server of the test (``iceberg_rest_jars``, session
  scope, fetches its jars with ``bash scripts/setup.sh iceberg-rest`` when missing).
- ``s3_store``: a versitygw of the test's own, the ``AWS_*`` environment pointing at it.
- ``gcs_store`` / ``azure_store``: fake-gcs-server / Azurite (one of each per session, started on
  first use; bucket ``drops``, :mod:`splitkeeper_tools.emulators`) with a prefix of the test's own,
  ``STORAGE_EMULATOR_HOST`` / ``AZURE_STORAGE_USE_EMULATOR`` and ``AZURITE_BLOB_STORAGE_URL``
  pointing at it; ``fake_gcs`` and ``azurite`` (session scope) build them with ``bash
  scripts/setup.sh fake-gcs`` / ``azurite`` when missing (never a skip).
- ``s3_events``: the same, publishing its bucket events (``--event-kafka-url``,
  ``--event-kafka-topic``) to a topic of its own (2 partitions) on ``kafka_broker``.
- ``scratch``: a :class:`ScratchDirs` over ``tmp_path``, for Delta tables and state.

A test using ``spark`` or ``kafka_broker`` is marked ``spark`` / ``kafka``
automatically (so ``-m "not spark"`` deselects it). A test marked ``spark`` gets the
shared session started even if it does not name the fixture. Mark ``kafka`` a test
that starts its own broker too (it needs the Kafka jars).

A test marked ``slow_variant`` (a bigger or longer duplicate of a default test, for a
benchmark or a release bar) is deselected, not skipped, unless the run asks for it with
``--run-slow-variants`` or ``SPLITKEEPER_SLOW_VARIANTS=1``; a ``-m`` of the user cannot
bring it back by accident, nor drop the default tests.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

    from splitkeeper_tools.chaos.store import ChaosStore
    from splitkeeper_tools.emulators import Azurite, FakeGcs
    from splitkeeper_tools.iceberg_rest import IcebergRestCatalog
    from splitkeeper_tools.kafka_broker import KafkaBroker

_FIXTURE_MARKS = {"spark": "spark", "kafka_broker": "kafka"}
SLOW_VARIANTS_OPTION = "--run-slow-variants"
SLOW_VARIANTS_ENV = "SPLITKEEPER_SLOW_VARIANTS"


@dataclass(frozen=True)
class ScratchDirs:
    """A per-test folder (under pytest's ``tmp_path``) with named sub-folders."""

    root: Path

    def path(self, *parts: str) -> Path:
        """``root/parts...``, created as a folder."""
        folder = self.root.joinpath(*parts)
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def table(self, name: str) -> str:
        """Location for a Delta table called ``name`` (not created: Delta creates it)."""
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
            raise ValueError(f"table name {name!r}: use letters, digits, '_', '.', '-'")
        return str(self.path("tables") / name)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        SLOW_VARIANTS_OPTION,
        action="store_true",
        default=False,
        help=f"also run the tests marked slow_variant (deselected by default; or {SLOW_VARIANTS_ENV}=1)",
    )


def run_slow_variants(config: pytest.Config) -> bool:
    """Whether this run includes the ``slow_variant`` tests (the option, or the variable set to 1)."""
    return bool(config.getoption(SLOW_VARIANTS_OPTION)) or os.environ.get(SLOW_VARIANTS_ENV, "") == "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        for fixture, mark in _FIXTURE_MARKS.items():
            if fixture in fixtures and item.get_closest_marker(mark) is None:
                item.add_marker(getattr(pytest.mark, mark))
    if not run_slow_variants(config):
        deselected = [item for item in items if item.get_closest_marker("slow_variant") is not None]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = [item for item in items if item.get_closest_marker("slow_variant") is None]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = "no tests were collected: a run that tests nothing is a failure (check paths, -k, -m)"
        if reporter is not None:
            reporter.write_line(f"ERROR: {message}", red=True, bold=True)


@pytest.fixture(autouse=True)
def _shared_spark_first(request: pytest.FixtureRequest) -> None:
    """A test marked ``spark`` gets the shared session started before its body runs,
    so a ``get_spark()`` inside the code under test returns it instead of building a
    differently configured one."""
    if request.node.get_closest_marker("spark") is not None:
        request.getfixturevalue("spark")


@pytest.fixture
def scratch(tmp_path: Path) -> ScratchDirs:
    return ScratchDirs(tmp_path)


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    from splitkeeper.spark.session import SparkSettings, get_spark

    settings = SparkSettings(
        master="local[2]",
        app_name="splitkeeper-tests",
        ui_enabled=False,
        shuffle_partitions=2,
        warehouse_dir=str(tmp_path_factory.mktemp("spark-warehouse")),
    )
    session = get_spark(settings)
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def _setup_step(step: str, found: Callable[[], object], what: str) -> None:
    """Run ``bash scripts/setup.sh <step>`` unless ``found()`` already is truthy; fail the test
    (never a skip) when it fails or leaves ``found()`` falsy. A fresh machine (CI) gets the
    tool the test needs on demand, offline first (setup.sh's stamps and a warm ~/.m2)."""
    import subprocess

    if found():
        return
    repo = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        ["bash", str(repo / "scripts" / "setup.sh"), step],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if done.returncode != 0 or not found():
        pytest.fail(
            f"{what}: bash scripts/setup.sh {step} "
            f"exited {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def versitygw() -> Path:
    """The versitygw binary, built now when it is not (``bash scripts/setup.sh versitygw``)."""
    from splitkeeper_tools.chaos.store import versitygw_binary

    _setup_step("versitygw", versitygw_binary, "the real-S3 tests need versitygw and building it failed")
    found = versitygw_binary()
    assert found is not None
    return found


@pytest.fixture(scope="session")
def iceberg_rest_jars() -> str:
    """The classpath of Iceberg's REST catalog test server, fetched now when it is not (``bash
    scripts/setup.sh iceberg-rest``: Maven, jvm/iceberg-rest.xml -> .jars/iceberg-rest/)."""
    from splitkeeper.errors import EnvironmentNotReadyError
    from splitkeeper_tools.iceberg_rest import classpath

    def found() -> str | None:
        try:
            return classpath()
        except EnvironmentNotReadyError:
            return None

    _setup_step(
        "iceberg-rest",
        found,
        "the REST catalog tests need Iceberg's REST catalog server and fetching its jars failed",
    )
    return classpath()


@pytest.fixture
def iceberg_rest(tmp_path: Path, iceberg_rest_jars: str) -> Iterator[IcebergRestCatalog]:
    """Iceberg's REST catalog test server of this test, on a free port, its SQLite catalog and
    local warehouse under ``tmp_path/rest-catalog``; ready (``GET /v1/config`` answered), stopped
    at the end. ``iceberg_rest.uri`` is what ``sink.catalog.uri`` names."""
    from splitkeeper_tools.iceberg_rest import IcebergRestCatalog

    with IcebergRestCatalog(tmp_path / "rest-catalog") as server:
        yield server


@pytest.fixture(params=["embedded", "rest"])
def iceberg_catalog(request: pytest.FixtureRequest) -> dict[str, str] | None:
    """``sink.catalog`` of an Iceberg test, which runs once per catalog: None (the embedded SQL
    catalog on SQLite) and ``{name: rest, type: rest, uri: ...}`` (``iceberg_rest``, Iceberg's
    REST catalog test server of the test)."""
    if request.param == "embedded":
        return None
    server: IcebergRestCatalog = request.getfixturevalue("iceberg_rest")
    return {"name": "rest", **server.catalog_properties()}


@pytest.fixture
def s3_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, versitygw: Path) -> Iterator[ChaosStore]:
    """A versitygw of this test (under ``tmp_path/store``; ``versitygw`` builds the binary when it
    is missing: never a skip), with the ``AWS_*`` environment pointing at the store itself (no
    faults); ``s3_store.location(name)`` is an ``s3://`` location in its bucket."""
    from splitkeeper_tools.chaos.store import ChaosStore

    with _serving(
        ChaosStore(tmp_path / "store", seed=1, fault_rate=0.0, prefix="test"), monkeypatch
    ) as store:
        yield store


@pytest.fixture(scope="session")
def fake_gcs() -> Path:
    """The fake-gcs-server binary, built now when it is not (``bash scripts/setup.sh fake-gcs``)."""
    from splitkeeper_tools.emulators import fake_gcs_binary

    _setup_step("fake-gcs", fake_gcs_binary, "the gs:// tests need fake-gcs-server and building it failed")
    found = fake_gcs_binary()
    assert found is not None
    return found


@pytest.fixture(scope="session")
def azurite() -> Path:
    """Azurite's Blob service script, installed now when it is not (``bash scripts/setup.sh azurite``)."""
    from splitkeeper_tools.emulators import azurite_script

    _setup_step("azurite", azurite_script, "the abfss:// tests need Azurite and installing it failed")
    found = azurite_script()
    assert found is not None
    return found


@pytest.fixture(scope="session")
def _gcs_server(tmp_path_factory: pytest.TempPathFactory, fake_gcs: Path) -> Iterator[FakeGcs]:
    from splitkeeper_tools.emulators import FakeGcs

    with FakeGcs(tmp_path_factory.mktemp("gcs")) as server:
        yield server


@pytest.fixture(scope="session")
def _azurite_server(tmp_path_factory: pytest.TempPathFactory, azurite: Path) -> Iterator[Azurite]:
    from splitkeeper_tools.emulators import Azurite

    with Azurite(tmp_path_factory.mktemp("azure")) as server:  # node starts in about a second: once
        yield server


def _emulated(server: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """``server`` with a prefix of this test's own, its environment set."""
    import uuid

    server.prefix = "t-" + uuid.uuid4().hex[:12]
    for key, value in server.env().items():
        monkeypatch.setenv(key, value)
    return server


@pytest.fixture
def gcs_store(monkeypatch: pytest.MonkeyPatch, _gcs_server: FakeGcs) -> FakeGcs:
    """fake-gcs-server (one per session, its data under pytest's temporary folder) with a prefix of
    this test's own, ``STORAGE_EMULATOR_HOST`` pointing at it; ``gcs_store.location(name)`` is a
    ``gs://`` location under that prefix in its bucket."""
    return _emulated(_gcs_server, monkeypatch)  # type: ignore[no-any-return]


@pytest.fixture
def azure_store(monkeypatch: pytest.MonkeyPatch, _azurite_server: Azurite) -> Azurite:
    """Azurite's Blob service (one per session) with a prefix of this test's own,
    ``AZURE_STORAGE_USE_EMULATOR`` and ``AZURITE_BLOB_STORAGE_URL`` pointing at it;
    ``azure_store.location(name)`` is an ``abfss://`` location under that prefix in its container."""
    return _emulated(_azurite_server, monkeypatch)  # type: ignore[no-any-return]


@contextlib.contextmanager
def _serving(store: ChaosStore, monkeypatch: pytest.MonkeyPatch) -> Iterator[ChaosStore]:
    """``store`` started without faults, the ``AWS_*`` environment pointing at it; stopped at the end."""
    store.start()
    try:
        assert store.proxy is not None
        store.proxy.fault = None
        for key, value in store.store_env().items():
            monkeypatch.setenv(key, value)
        yield store
    finally:
        store.stop()


@dataclass
class S3Events:
    """``s3_events``: the store (a ChaosStore without faults) and the Kafka topic of its bucket events."""

    store: Any
    bootstrap_servers: str
    topic: str


@pytest.fixture
def s3_events(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, versitygw: Path, kafka_broker: KafkaBroker
) -> Iterator[S3Events]:
    """A versitygw of this test that publishes an S3 event notification per object written or removed
    to a new topic (2 partitions) of the project's broker, the ``AWS_*`` environment pointing at it."""
    import uuid

    from confluent_kafka.admin import AdminClient, NewTopic

    from splitkeeper_tools.chaos.store import ChaosStore

    topic = "bucket-events-" + uuid.uuid4().hex[:8]
    servers = kafka_broker.bootstrap_servers
    admin = AdminClient({"bootstrap.servers": servers})
    for future in admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)]).values():
        future.result(timeout=30)
    options = ("--event-kafka-url", servers, "--event-kafka-topic", topic)
    store = ChaosStore(tmp_path / "store", seed=1, fault_rate=0.0, prefix="test", options=options)
    with _serving(store, monkeypatch):
        yield S3Events(store, servers, topic)


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    from splitkeeper_tools.kafka_broker import KafkaBroker

    broker = KafkaBroker(tmp_path_factory.mktemp("kafka"))
    broker.start(timeout_s=120)
    try:
        yield broker
    finally:
        broker.stop()
