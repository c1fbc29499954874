"""Sample values and a Spark-free driver setup shared by the state tests.

- checkpoints: :func:`snapshot`, :func:`checkpoint` (regional with a ref), :func:`global_`,
  :func:`regional`, :data:`AUDIT`;
- :class:`LocalRegionRunner`: the real region task body (:func:`run_region_task`) run in this
  process, so the real :class:`~splitkeeper.core.driver.EpochDriver` drives epochs against
  the real sink and store without Spark;
- :func:`tree`: every file under a folder with its bytes, to prove that nothing changed;
- :func:`assert_sink_is_input`: a :class:`LocalPipeline`'s sink against its input files, line by line.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from deltalake import DeltaTable

from splitkeeper.app.pipeline import SystemClock
from splitkeeper.core.driver import DriverSettings, EpochDriver
from splitkeeper.core.ports import (
    CrashPoint,
    DriverHooks,
    EpochPlan,
    RegionRun,
    RegionRunner,
    SinkCrashPoint,
)
from splitkeeper.core.source import SourceConnector
from splitkeeper.core.types import (
    AuditRecord,
    BacklogSnapshot,
    CheckpointKind,
    CompletedCheckpoint,
    EnumeratorSnapshot,
    RecoveryDecision,
    RegionOutcome,
    RegionState,
    Split,
)
from splitkeeper.delta.checkpoints import DeltaStateStore
from splitkeeper.sinks.delta.sink import DeltaSink
from splitkeeper.spark.task import run_region_task
from splitkeeper.transforms import identity


def snapshot(checkpoint_id: int = 7) -> EnumeratorSnapshot:
    return EnumeratorSnapshot(
        checkpoint_id=checkpoint_id,
        parallelism=3,
        pool=(Split("t-9", "t", 4, backlog_end=20), Split("t-1", "t", 0)),
        assignments={
            0: (Split("t-3", "t", 11, end=50), Split("t-2", "t", 5)),
            1: (),  # a registered reader that owns nothing
            2: (Split("f-0", "files", 100, end=100),),
        },
        finished=frozenset({"f-old", "t-0"}),
        subscriptions=frozenset({"t", "files", "gone-but-listed"}),
        backlog=BacklogSnapshot(
            boundaries={"t-9": 20, "t-3": 40, "t-dead": 7}, finished=frozenset({"t-3", "x"})
        ),
    )


def checkpoint(checkpoint_id: int = 7, ref: int | None = 6) -> CompletedCheckpoint:
    regions = {
        0: RegionState(0, (Split("t-3", "t", 11, end=50), Split("t-2", "t", 5)), ("e7:n10", "e6:n3")),
        1: RegionState(1, (), ()),
    }
    if ref is not None:
        regions[2] = RegionState(
            2, (Split("f-0", "files", 90, end=100),), ("e6:n1",), ref_checkpoint_id=ref,
            outcome=RegionOutcome.TIMEOUT, ref_depth=1,
        )  # fmt: skip
    else:
        regions[2] = RegionState(2, (Split("f-0", "files", 100, end=100),), ("e7:n0",))
    return CompletedCheckpoint(
        checkpoint_id=checkpoint_id,
        kind=CheckpointKind.REGIONAL if ref is not None else CheckpointKind.GLOBAL,
        parallelism=3,
        regions=regions,
        enumerator=snapshot(checkpoint_id),
        consecutive_regional=1 if ref is not None else 0,
        processing_backlog=True,
    )


AUDIT = (
    AuditRecord("t-1", None, RecoveryDecision.DISCOVERED, None),
    AuditRecord("t-2", 0, RecoveryDecision.ASSIGNED, 7, "least-loaded"),
    AuditRecord("f-0", 2, RecoveryDecision.RETURNED_REGION_FALLBACK, 6, "region 2 timed out"),
)


def global_(checkpoint_id: int, position: int = 0) -> CompletedCheckpoint:
    regions = {
        r: RegionState(r, (Split(f"s{r}", "t", position + checkpoint_id),), (f"op{r}",)) for r in range(2)
    }
    enumerator = EnumeratorSnapshot(checkpoint_id, 2, assignments={r: s.splits for r, s in regions.items()})
    return CompletedCheckpoint(checkpoint_id, CheckpointKind.GLOBAL, 2, regions, enumerator)


def regional(checkpoint_id: int, ref: CompletedCheckpoint, failed: int = 1) -> CompletedCheckpoint:
    fresh = global_(checkpoint_id)
    regions = dict(fresh.regions)
    fallback = ref.regions[failed]
    regions[failed] = dataclasses.replace(
        fallback,
        ref_checkpoint_id=ref.checkpoint_id,
        outcome=RegionOutcome.DECLINE,
        ref_depth=fallback.ref_depth + 1,
    )
    return dataclasses.replace(
        fresh,
        kind=CheckpointKind.REGIONAL,
        regions=regions,
        consecutive_regional=ref.consecutive_regional + 1,
    )


def sink_lines(sink: str) -> dict[str, list[tuple[int, str]]]:
    """Per split, the sink's ``(offset, value)`` records in offset order (read with delta-rs; the raw
    sink's bytes as the UTF-8 text the sample inputs are, strictly decoded)."""
    rows = DeltaTable(sink).to_pyarrow_table(columns=["split_id", "offset", "value"]).to_pylist()
    out: dict[str, list[tuple[int, str]]] = {}
    for row in sorted(rows, key=lambda r: (r["split_id"], r["offset"])):
        value = row["value"]
        text = value.decode("utf-8") if isinstance(value, bytes) else value
        out.setdefault(row["split_id"], []).append((int(row["offset"]), text))
    return out


def file_lines(folder: Path) -> dict[str, list[tuple[int, str]]]:
    """Per input file (its name), ``(byte offset, line)`` read from disk: the oracle."""
    out: dict[str, list[tuple[int, str]]] = {}
    for path in sorted(folder.iterdir()):
        pos, records = 0, []
        for raw in path.read_bytes().splitlines(keepends=True):
            records.append((pos, raw.rstrip(b"\n").decode("utf-8")))
            pos += len(raw)
        out[path.name] = records
    return out


def assert_sink_is_input(pipeline: LocalPipeline) -> None:
    got = sink_lines(pipeline.sink_path)
    want = file_lines(pipeline.root / "in")
    assert {Path(k).name: v for k, v in got.items()} == want, "the sink differs from the input, line by line"
    assert len(got) == len(want)


def tree(root: str | Path) -> dict[str, bytes]:
    """Every file under ``root`` (relative path -> bytes) and every folder (``path/`` -> b""); empty
    when ``root`` does not exist."""
    found: dict[str, bytes] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs:
            found[os.path.relpath(os.path.join(folder, name), root) + "/"] = b""
        for name in files:
            path = os.path.join(folder, name)
            found[os.path.relpath(path, root)] = Path(path).read_bytes()
    return found


# --------------------------------------------------------------------------- a driver without Spark


class LocalRegionRunner(RegionRunner):
    """Runs each region's task body in this process (every region acknowledges)."""

    def __init__(self, connector: SourceConnector, staging_path: str) -> None:
        self.connector = connector
        self.staging_path = staging_path

    def run(self, epoch: int, plan: EpochPlan, timeout_s: float) -> Mapping[int, RegionRun]:
        reader = self.connector.reader()
        out: dict[int, RegionRun] = {}
        for region, ranges in plan.items():
            result = run_region_task(list(ranges), reader, identity, self.staging_path, epoch, region)
            out[region] = RegionRun(
                region_id=region,
                outcome=RegionOutcome.ACK,
                positions=dict(result.positions),
                records=result.records,
                backlog_finished=tuple(result.backlog_finished),
                output=result.staged_path,
            )
        return out


class Crash(Exception):
    """Raised by :class:`CrashAt` at its crash point: the driver 'dies' there."""


class CrashAt(DriverHooks):
    def __init__(self, point: CrashPoint, epoch: int) -> None:
        self.point, self.epoch = point, epoch

    def crash_point(self, point: CrashPoint, epoch: int) -> None:
        if (point, epoch) == (self.point, self.epoch):
            raise Crash(f"{point.value}@{epoch}")


@dataclasses.dataclass
class LocalPipeline:
    """A files pipeline under ``root`` run by the real driver, store and sink, without Spark."""

    root: Path
    name: str = "orders"
    parallelism: int = 2
    retain: int = 3

    @property
    def state(self) -> str:
        return str(self.root / "state")

    @property
    def sink_path(self) -> str:
        return str(self.root / "sink")

    @property
    def staging(self) -> str:
        return str(self.root / "state" / "_staging")

    def write_input(self, files: int = 2, lines: int = 30) -> None:
        folder = self.root / "in"
        folder.mkdir(parents=True, exist_ok=True)
        for f in range(files):
            (folder / f"part-{f}.txt").write_text("".join(f"line {f}-{i}\n" for i in range(lines)))

    def run(self, epochs: int | None = None, hooks: DriverHooks | None = None) -> EpochDriver:
        """A new driver, opened (recovering as a restart does) and run for ``epochs`` (None: to the end)."""
        driver = self.driver(hooks)
        driver.open()
        driver.run(epochs)
        return driver

    def driver(
        self,
        hooks: DriverHooks | None = None,
        *,
        read_only: bool = False,
        sink_point: Callable[[SinkCrashPoint, int], None] | None = None,
    ) -> EpochDriver:
        """A new driver; ``sink_point`` is called at the sink's own crash points (a pause, a crash)."""
        from splitkeeper.core.backlog import BacklogConfig
        from splitkeeper.sources.files.source import FileSource

        source = FileSource(self.root / "in")
        store = DeltaStateStore(self.state, self.name, source.fingerprint(), read_only=read_only)
        sink = DeltaSink(
            self.sink_path, self.name, staging_path=self.staging, read_only=read_only, crash_point=sink_point
        )
        settings = DriverSettings(
            pipeline=self.name,
            parallelism=self.parallelism,
            retain_checkpoints=self.retain,
            backlog=BacklogConfig(backlog_epoch_records=20, normal_epoch_records=20),
        )
        return EpochDriver(
            settings, source, LocalRegionRunner(source, self.staging), sink, store, SystemClock(), hooks
        )
