"""What the use cases share: the pipeline's assembly over its lease, the Spark session, the
reports folder, the state store read-only, and the one parse of a checkpoint id.

The services own the pipeline's lease (protocol rule 5.6): a writing use case takes it
(:func:`writer_lease`, before Spark starts), then assembles the pipeline over it and opens it;
read-only ones take none. :func:`leased_pipeline` is the same for callers that drive the pipeline
themselves (the benchmarks, the tests' helpers).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Concatenate, ParamSpec, TypeVar

from splitkeeper import logs
from splitkeeper.app.results import (
    OpenSummary,
)
from splitkeeper.config.settings import PipelineConfig
from splitkeeper.core.assignment import AssignmentStrategy, WeightedStrategy
from splitkeeper.errors import (
    InvalidParameterError,
    StateError,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from splitkeeper.app.pipeline import Pipeline
    from splitkeeper.core.driver import OpenReport
    from splitkeeper.delta.checkpoints import DeltaStateStore
    from splitkeeper.delta.lease import HeldLease

log = logging.getLogger("splitkeeper.app")


REPORTS_ENV = "SPLITKEEPER_REPORTS_DIR"


Progress = Callable[[str], None]


_R = TypeVar("_R")


_P = ParamSpec("_P")


def checkpoint_id_of(value: object, name: str = "checkpoint_id") -> int | None:
    """The checkpoint a person or a DAG Param names for a recovery: ``'latest'`` (or None, or
    ``''``) is None, else a positive integer, given as one or as its digits; InvalidParameterError
    naming ``name`` otherwise. The one parse of a checkpoint id (CLI and Airflow)."""
    if value in (None, "", "latest"):
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if isinstance(value, str) and value.isdigit() and int(value) > 0:
        return int(value)
    raise InvalidParameterError(name, value, "'latest' or a checkpoint id (a positive integer)")


def spark_session() -> SparkSession:
    """The driver's Spark session (``SPLITKEEPER_SPARK_*``), UI off."""
    from splitkeeper.spark.session import SparkSettings, get_spark

    return get_spark(SparkSettings.from_env(ui_enabled=False))


def reports_dir(config: PipelineConfig) -> Path:
    """Where the reports go: ``$SPLITKEEPER_REPORTS_DIR/<name>``, else ``<state>/../reports/<name>``."""
    base = os.environ.get(REPORTS_ENV) or os.path.join(
        os.path.dirname(config.state.path.rstrip("/")), "reports"
    )
    return Path(base) / config.name


def _pipeline(
    config: PipelineConfig,
    lease: HeldLease | None,
    *,
    spark: SparkSession | Callable[[], SparkSession] | None = None,
    faults: Iterable[str] = (),
    progress: Progress | None = None,
    read_only: bool = False,
    metrics: bool = True,
    interrupt: threading.Event | None = None,
) -> Pipeline:
    """The pipeline of ``config`` over ``lease`` (the caller took it with :func:`writer_lease`;
    None for a read-only use), on ``spark`` (default :func:`spark_session`, started only when an
    epoch first has ranges to read: a run with nothing new starts no JVM). Not opened. A read-only
    pipeline (a dry run) runs no region, so it starts no Spark unless given a session."""
    from splitkeeper.app.pipeline import Pipeline
    from splitkeeper.spark.faults import FaultPlan

    return Pipeline(
        config,
        spark if spark is not None or read_only else spark_session,  # started by the first read
        faults=FaultPlan.parse(faults),
        progress=progress,
        read_only=read_only,
        lease=lease,
        # <state>/metrics.prom after each epoch (and OTLP when configured)
        metrics=metrics and not read_only,
        interrupt=interrupt,
    )


@contextlib.contextmanager
def leased_pipeline(
    config: PipelineConfig,
    spark: SparkSession | None = None,
    *,
    faults: Iterable[str] = (),
    progress: Progress | None = None,
    metrics: bool = True,
) -> Iterator[Pipeline]:
    """Take the pipeline's lease (:func:`writer_lease`), then assemble the pipeline over it, for a
    caller that opens and drives it itself; on exit the pipeline is closed, then the lease released.

    LeaseHeldError naming the holder, before anything is assembled or written, while another
    run holds it (protocol rule 5.6).
    """
    with writer_lease(config) as lease:
        pipeline = _pipeline(config, lease, spark=spark, faults=faults, progress=progress, metrics=metrics)
        try:
            yield pipeline
        finally:
            pipeline.close()


@contextlib.contextmanager
def writer_lease(config: PipelineConfig) -> Iterator[HeldLease]:
    """Hold the pipeline's lease for a writing use case (protocol rule 5.6); taken before Spark starts.

    The one place that takes it. First the state's object store is probed (a store that does not
    refuse a second put-if-absent is refused with StoreUnsafeError, nothing written). A second
    writer is refused within a second, with LeaseHeldError naming the holder; a holder whose lease
    generation did not move for its ttl while this writer watched (``lease.wait_s``) is taken over
    (logged), and a run whose lease was taken over stops before its next epoch and before any sink
    commit. Released on exit.
    """
    from splitkeeper.delta.lease import PipelineLease, held
    from splitkeeper.delta.probe import probe_store
    from splitkeeper.delta.tables import StateTables
    from splitkeeper.spark.faults import crash_request

    crash_request()  # a misspelt SPLITKEEPER_CRASH_AT fails before the lease table is written
    probe_store(config.state.path)  # the fences need put-if-absent: checked before the first write
    tables = StateTables(config.state.path)  # only the lease table: the pipeline's claim comes with the run
    lease_of = PipelineLease(tables, config.name)
    with held(lease_of, ttl_s=config.lease.ttl_s, wait_s=config.lease.wait_s) as lease:
        yield lease


def _state_store(config: PipelineConfig) -> DeltaStateStore:
    """The pipeline's state store, read-only (no table is created; the source is not asked)."""
    from splitkeeper.delta.checkpoints import DeltaStateStore

    return DeltaStateStore(config.state.path, config.name, None, read_only=True)


def _open_summary(pipeline: Pipeline, opened: OpenReport) -> OpenSummary:
    return OpenSummary.of(opened, pipeline.loads, pipeline.pool_size)


def _named(
    service: Callable[Concatenate[PipelineConfig, _P], _R],
) -> Callable[Concatenate[PipelineConfig, _P], _R]:
    """Every log record of the service carries the pipeline's name (``logs.bind``)."""

    @functools.wraps(service)
    def wrapper(config: PipelineConfig, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with logs.bind(pipeline=config.name):
            return service(config, *args, **kwargs)

    return wrapper


def _local_state_missing(config: PipelineConfig) -> bool:
    """The state folder is a local path that does not exist (never created, or a typo in state.path)."""
    path = config.state.path
    return "://" not in path and not os.path.isdir(path)


def _no_state_error(config: PipelineConfig, what: str) -> StateError:
    origin = f" in {config.origin}" if config.origin else ""
    return StateError(
        f"pipeline {config.name!r} has no state folder at {config.state.path} (state.path{origin}): {what}. "
        "Check the path for a typo; a pipeline that never ran gets its state from its first "
        "'splitkeeper run'",
        pipeline=config.name,
        path=config.state.path,
    )


def _strategy(config: PipelineConfig) -> str | AssignmentStrategy:
    """The config's strategy as the checks weigh it: ``weighted`` with the configured capacities."""
    if config.strategy == "weighted":
        return WeightedStrategy(capacities=dict(config.weighted.capacities))
    return config.strategy
