"""``splitkeeper-tools bench scale [--sizes 1000,10000] [--file-splits N] [--json]``: the driver's cost.

The measurements, each on the real parts:

1. **Epoch overhead (files).** For each size N, N small files (one split each, one line)
   are read once (the first epoch reads them all), then for ``--epochs`` epochs 1% new
   data arrives before each epoch: N/100 new one-line files (a file source reads files
   that are complete when they appear, so new data is new files; the split count grows by
   1% per epoch, the finished ones stay in the enumerator). The pipeline runs on local Spark with the
   delta-rs state store and sink, exactly as ``splitkeeper run`` does. Per measured epoch
   the driver's own phases are reported in ms (``plan``, ``decide``, ``sink``, ``state``,
   ``retain``, ``finish``: everything but ``read``, which is the region tasks' Spark
   jobs), and the Delta files the epoch added under the state and sink roots.
   ``epoch_overhead_ms[N]`` is the median over the measured epochs of their sum.
2. **Restore after 200 checkpoints.** :func:`splitkeeper_tools.bench.state.measure_state_store`
   commits ``--checkpoints`` synthetic checkpoints of N splits the way the driver does
   (every 4th regional, retention keeping 3, compaction every 50), then a fresh store
   restores the latest (median of 3). ``restore_s[N]`` and the bytes of the state root
   afterwards, ``state_bytes_after_200_checkpoints[N]``.
3. **Driver memory at 1M splits.** A child process builds the core enumerator with
   1,000,000 splits over 1,000 readers and takes its snapshot (what a checkpoint does);
   ``driver_rss_mb_1m_splits`` is its peak RSS (``ru_maxrss``).

4. **Epoch overhead (Kafka).** For each of ``--kafka-partitions`` (100 and 1,000), one
   topic of that many partitions on the project's broker (started here, or
   ``--bootstrap-servers``): one message per partition is read by the first epoch, then
   before each measured epoch 1% of the partitions (at least one, a different set each
   time) get one new message. Same phases and files as part 1 (``kafka_epoch_overhead_ms``,
   ``kafka_epoch_phases_ms``, ``kafka_delta_files_per_epoch``), and every epoch must commit
   exactly the messages produced before it (``kafka_exact``). ``kafka_first_epoch_s``: the
   pipeline's open and its first epoch, which reads one message of every partition (issue
   26's goal: <= 3 s at 1,000 partitions; ``kafka_first_epoch_read_s`` its read phase,
   ``kafka_first_epoch_region_task_s`` the slowest region task's own time in it).

5. **Many file splits, few active (``--file-splits N --active-share S``).** Part 1 at one large
   size on the same real runtime (local Spark, the delta-rs state store and sink, the core's
   driver: what ``splitkeeper run`` does; a simulator would leave out the delta-rs commits and the
   file listing, which are most of the driver's time per epoch): N one-line files read by the first
   epoch, then ``--epochs`` epochs each after ``round(N * S)`` new files. Reported under
   ``file_splits``: ``epoch_overhead_ms`` (median driver time per epoch without ``read``) and its
   phases; ``restore_s``, a fresh read-only store restoring the latest checkpoint of that state
   (median of 3, what a restarted driver does before discovery); ``reopen_s``, the pipeline's whole
   open again (lease, restore, discovery of every file; no Spark); ``driver_rss_mb``, the peak RSS
   of this (the driver's) process, ``jvm_rss_mb`` the JVM's. Goals (issue 26) at 100,000 splits
   with 1,000 active: overhead <= 600 ms, restore <= 10 s, driver RSS <= 2 GB. The new files are
   named on from the first ones (a drop with growing names); ``--discovery`` and
   ``--recheck-finished-every`` set the source's keys, ``epoch_overhead_ms_max`` is the slowest
   measured epoch (one that rechecks the finished files, when one is measured). An epoch reads at
   most :data:`FILL_EPOCH_FILES` files (1,000,000 are read by five). ``restart``: a restarted driver,
   each in a fresh process (restore, reopen, its own peak RSS). ``--store s3`` puts the files, the
   state and the sink on a versitygw started here, the files uploaded in parallel (``upload_s``);
   ``--tables local`` keeps the state and the sink on local disk (the files alone on the store).
   ``--store s3 --discovery notifications``: versitygw publishes its bucket events to a new topic
   (``EVENT_PARTITIONS`` partitions) of the broker (``--bootstrap-servers``, or the project's own
   started here), the source reads them (``source.notifications``), and each upload waits until
   the topic holds an event per object uploaded (an event may land after its PUT answered): the
   new data of an epoch has arrived when its events have.

``growth_epoch_overhead`` is the ratio of the largest size's overhead to the smallest's
(files; ``kafka_growth_epoch_overhead`` the same for partitions).
Goals (issue): overhead at 10,000 splits with 100 active <= 300 ms, growth <= 3, restore at
10,000 splits <= 5 s, RSS at 1M splits <= 2 GB; the JSON says which hold (``goals``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from splitkeeper.errors import InvalidParameterError

if TYPE_CHECKING:
    from splitkeeper.config.settings import PipelineConfig

DRIVER_PHASES = ("plan", "decide", "sink", "state", "retain", "finish")
CHART_FILE = "scale.html"
GOALS = {
    "epoch_overhead_ms_at_10000": 300.0,
    "growth_epoch_overhead": 3.0,
    "restore_s_at_10000": 5.0,
    "driver_rss_mb_1m_splits": 2048.0,
    "kafka_first_epoch_s_at_1000": 3.0,
    "file_splits_epoch_overhead_ms_at_100000": 600.0,
    "file_splits_restore_s_at_100000": 10.0,
    "file_splits_driver_rss_mb_at_100000": 2048.0,
}


def say(line: str) -> None:
    print(f"[bench scale] {line}", file=sys.stderr, flush=True)


def _delta_files(root: Path) -> int:
    """Files under ``root`` (data files and log entries of every Delta table there)."""
    return sum(len(files) for _dir, _dirs, files in os.walk(root)) if root.exists() else 0


def _dir_bytes(root: Path) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _dirs, files in os.walk(root) for f in files)


def _file_name(i: int, folder_files: int = 0) -> str:
    """The name of part 5's file ``i``: ``f00000000.txt``..., or with ``folder_files`` N, in folders
    of N names that sort in the files' order (``d000000/f00000000.txt``...), as dated drops are."""
    name = f"f{i:08d}.txt"
    return f"d{i // folder_files:06d}/{name}" if folder_files else name


def _write_files(folder: Path, count: int, folder_files: int = 0) -> None:
    """``count`` one-line files :func:`_file_name` in ``folder`` (one ``open``/``write``/``close``
    each: 1,000,000 take about a minute on local disk)."""
    folder.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    for i in range(count):
        path = folder / _file_name(i, folder_files)
        if folder_files and i % folder_files == 0:
            path.parent.mkdir(exist_ok=True)
        fd = os.open(path, flags, 0o644)
        try:
            os.write(fd, f"file {i} line 0\n".encode())
        finally:
            os.close(fd)


#: Part 5's epochs read at most this many files each (``backlog.*_epoch_records``): 100,000 files are
#: read by one first epoch, 1,000,000 by five (as a team's backlog of drops would be).
FILL_EPOCH_FILES = 200_000


class Drops:
    """Where part 5's files, state and sink are: a local folder, or (``store``, a started
    :class:`~splitkeeper_tools.chaos.store.ChaosStore`) versitygw, the files uploaded to its bucket
    in parallel (``pyarrow.fs.copy_files`` from a local folder, pyarrow's I/O threads) and the
    pipeline reaching it through the ``AWS_*`` environment (no fault proxy)."""

    def __init__(
        self,
        root: Path,
        store: Any | None = None,
        events: Mapping[str, str] | None = None,
        tables: str = "store",
    ) -> None:
        self.root = root
        self.store = store
        self.tables = tables  # "store": the state and sink on the store too; "local": on local disk
        # --discovery notifications: source.notifications
        self.events = events
        self.event_offsets: dict[int, int] = {}  # the event topic read so far, per partition

    def loc(self, name: str) -> str:
        """The location of ``name`` (``in``, ``state``, ``sink``) as the pipeline is given it."""
        if self.store is None or (self.tables == "local" and name != "in"):
            return str(self.root / name)
        return str(self.store.location(f"{self.root.name}/{name}"))

    def local(self, name: str) -> Path:
        """The folder whose files are ``name``'s (on the store: versitygw's posix backend)."""
        if self.store is None or (self.tables == "local" and name != "in"):
            return self.root / name
        from splitkeeper_tools.chaos.store import BUCKET

        return self.store.workdir / "s3" / BUCKET / self.store.prefix / self.root.name / name

    def put(self, files: Sequence[tuple[str, str]], batch: str) -> None:
        """Files ``(name, text)`` into ``in``: locally each written under a hidden name and renamed
        (complete when it appears); on the store uploaded together (an object appears complete)."""
        if self.store is None:
            folder = self.root / "in"
            for name, text in files:
                final = folder / name
                final.parent.mkdir(parents=True, exist_ok=True)
                tmp = final.parent / f".{batch}-{final.name}"
                tmp.write_text(text, encoding="utf-8")
                tmp.rename(final)
            return
        folder = self.root / "upload" / batch
        folder.mkdir(parents=True)
        for name, text in files:
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(text, encoding="utf-8")
        self.upload(folder)

    def upload(self, folder: Path) -> float:
        """Every file of ``folder`` to the store's ``in`` (the same names); the seconds it took."""
        import pyarrow as pa
        import pyarrow.fs as pafs

        from splitkeeper.delta.storage import filesystem

        fs, inner = filesystem(self.loc("in"))
        started = time.perf_counter()
        threads = pa.io_thread_count()
        pa.set_io_thread_count(32)
        try:
            pafs.copy_files(
                str(folder),
                inner,
                source_filesystem=pafs.LocalFileSystem(),
                destination_filesystem=fs,
                use_threads=True,
            )
        finally:
            pa.set_io_thread_count(threads)
        if self.events is not None:
            uploaded = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
            self._await_events(inner.split("/", 1)[1] + "/", uploaded)
        return time.perf_counter() - started

    def _await_events(self, prefix: str, keys: set[str], timeout_s: float = 300.0) -> None:
        """Wait until the event topic holds an event for each object just uploaded (``keys``, their
        object keys after ``prefix``; an event may reach the topic after its PUT has answered): the
        new data has arrived when its events have. Only the events of these keys count: a count of
        the topic's events is satisfied by any other event."""
        from splitkeeper.sources.files.notify import EventFeed, parse_events

        assert self.events is not None
        feed = EventFeed(self.events["bootstrap_servers"], self.events["topic"])
        pending = set(keys)
        deadline = time.monotonic() + timeout_s
        try:
            while pending:
                marks = feed.partitions()
                ends = {p: high for p, (_low, high) in marks.items()}
                start = {p: self.event_offsets.get(p, low) for p, (low, _high) in marks.items()}
                for _partition, _offset, value in feed.read(start, ends):
                    try:
                        events = parse_events(value)
                    except Exception:  # noqa: BLE001 - not an object event: not one of ours
                        continue
                    for event in events:
                        for key in event.keys:  # as spelled and URL-decoded, as discovery reads it
                            if key.startswith(prefix):
                                pending.discard(key[len(prefix) :])
                self.event_offsets.update(ends)
                if pending and time.monotonic() > deadline:
                    raise RuntimeError(
                        f"bench scale: no bucket event on {self.events['topic']} after {timeout_s:g} s for "
                        f"{len(pending)} of the {len(keys)} objects uploaded (e.g. {sorted(pending)[:3]})"
                    )
                if pending:
                    time.sleep(0.05)
        finally:
            feed.close()


def measure_epochs(
    spark: Any,
    root: Path,
    size: int,
    epochs: int,
    active_share: float = 0.01,
    parallelism: int = 4,
    source_options: Mapping[str, Any] | None = None,
    store: Any | None = None,
    tables: str = "store",
    folder_files: int = 0,
) -> dict[str, Any]:
    """Part 1 for one size: driver phases (ms) and Delta files added per measured epoch.
    ``source_options``: more keys of the files source (``discovery``, ``recheck_finished_every``);
    ``store``: a started ChaosStore that holds the files, the state and the sink (``tables`` "local":
    the files only, :class:`Drops`); ``folder_files``: the files in folders of that many
    (:func:`_file_name`)."""
    from splitkeeper.config.settings import config_from_mapping

    drops = Drops(root, store, (source_options or {}).get("notifications"), tables)
    started = time.perf_counter()
    _write_files(root / ("upload/initial" if store is not None else "in"), size, folder_files)
    written_s = time.perf_counter() - started
    upload_s = drops.upload(root / "upload" / "initial") if store is not None else None
    say(
        f"{size:,} files written in {written_s:.1f}s"
        + ("" if upload_s is None else f", uploaded to versitygw in {upload_s:.1f}s")
    )
    config = config_from_mapping(_mapping(drops, size, parallelism, source_options))
    active = max(1, round(size * active_share))

    def new_data(epoch: int) -> int:  # 1% new data: files are immutable once they appear, so new files
        drops.put(  # named on from the first ones, as drops with growing names are
            [
                (_file_name(size + epoch * active + i, folder_files), f"epoch {epoch} file {i}\n")
                for i in range(active)
            ],
            f"e{epoch}",
        )
        return active

    measured = _measure(
        config, spark, root, f"{size:,} splits", size, active, epochs, new_data, counted=drops.local
    )
    return {**measured, "write_files_s": round(written_s, 1), "upload_s": upload_s and round(upload_s, 1)}


def _mapping(
    drops: Drops, size: int, parallelism: int, source_options: Mapping[str, Any] | None
) -> dict[str, Any]:
    """Part 1's and 5's pipeline config (as a mapping) over ``drops``."""
    per_epoch = min(size * 2, FILL_EPOCH_FILES)
    return {
        "name": f"scale-{size}",
        "parallelism": parallelism,
        "source": {"kind": "files", "path": drops.loc("in"), "format": "lines", **(source_options or {})},
        "checkpoint": {"retain_checkpoints": 3, "region_timeout_s": 600},
        "backlog": {"backlog_epoch_records": per_epoch, "normal_epoch_records": per_epoch},
        "state": {"path": drops.loc("state")},
        "sink": {"path": drops.loc("sink")},
    }


def _measure(
    config: PipelineConfig,
    spark: Any,
    root: Path,
    label: str,
    size: int,
    active: int,
    epochs: int,
    new_data: Callable[[int], int],
    counted: Callable[[str], Path] | None = None,
) -> dict[str, Any]:
    """Open the pipeline of ``config`` (holding its lease, as a run does), run its first epoch (reads
    everything there; as many epochs as it takes when an epoch reads less than ``size`` records),
    then ``epochs`` epochs each after ``new_data(epoch)`` (returns the records it added): driver
    phases and Delta files (those in the folders ``counted("state")`` and ``counted("sink")``)."""
    from splitkeeper.app.services import leased_pipeline

    folder = counted or (lambda name: root / name)
    measured: list[dict[str, Any]] = []
    with leased_pipeline(config, spark, metrics=False) as pipeline:
        started = time.perf_counter()
        pipeline.open()
        first = pipeline.run_epoch()  # reads everything there is (or its backlog share of it)
        read = first.committed_records
        fill_epochs = 1
        while read < size and first.committed_records:
            first = pipeline.run_epoch()
            read += first.committed_records
            fill_epochs += 1
        first_s = time.perf_counter() - started
        say(
            f"{label}: first epoch{'s' if fill_epochs > 1 else ''} ({fill_epochs}) {first.kind.value}, "
            f"{read:,} records in {first_s:.1f}s (RSS peak {_peak_rss_mb()} MB)"
        )
        for epoch in range(epochs):
            added = new_data(epoch)
            before = _delta_files(folder("state")) + _delta_files(folder("sink"))
            report = pipeline.run_epoch()
            after = _delta_files(folder("state")) + _delta_files(folder("sink"))
            phases_ms = {p: round(report.phases.get(p, 0.0) * 1000, 1) for p in DRIVER_PHASES}
            measured.append(
                {
                    "epoch": report.epoch,
                    "kind": report.kind.value,
                    "records": report.committed_records,
                    "records_added": added,
                    "phases_ms": phases_ms,
                    "overhead_ms": round(sum(phases_ms.values()), 1),
                    "read_ms": round(report.phases.get("read", 0.0) * 1000, 1),
                    "delta_files_added": after - before,
                }
            )
            by_phase = ", ".join(f"{k} {v:.0f}" for k, v in phases_ms.items())
            say(
                f"{label}, epoch {report.epoch}: {report.committed_records} records, driver "
                f"{measured[-1]['overhead_ms']:.0f} ms ({by_phase}), "
                f"read {measured[-1]['read_ms']:.0f} ms, {after - before} Delta files"
            )
    return {
        "splits": size,
        "active_per_epoch": active,
        "first_epoch_s": round(first_s, 2),  # open (restore, discovery) and the epoch reading everything
        "fill_epochs": fill_epochs,  # epochs that read the first ``size`` records
        "driver_rss_mb_after_fill": _peak_rss_mb(),
        "first_epoch_read_s": round(first.phases.get("read", 0.0), 2),
        # the slowest region task's own time (reading and staging): the rest of read is Spark's
        "first_epoch_region_task_s": round(max(first.region_task_s.values(), default=0.0), 2),
        "epochs": measured,
        "overhead_ms_median": statistics.median(e["overhead_ms"] for e in measured),
        "phases_ms_median": {
            p: statistics.median(e["phases_ms"][p] for e in measured) for p in DRIVER_PHASES
        },
        "delta_files_per_epoch_median": statistics.median(e["delta_files_added"] for e in measured),
        "exact": all(e["records"] == e["records_added"] for e in measured),
    }


def _peak_rss_mb(pid: int | None = None) -> float | None:
    """Peak RSS (MB, ``VmHWM``) of process ``pid`` (default: this one); None when unreadable."""
    try:
        status = Path(f"/proc/{pid or 'self'}/status").read_text(encoding="utf-8")
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return None


def _jvm_pid(spark: Any) -> int | None:
    """The pid of the session's JVM when this process launched it (local mode), else None."""
    try:
        proc = spark.sparkContext._gateway.proc
    except AttributeError:
        return None
    return None if proc is None else int(proc.pid)


_RESTART_CHILD = """
import json, sys, time
from pathlib import Path
from splitkeeper.app.services import leased_pipeline
from splitkeeper.config.settings import config_from_mapping
from splitkeeper.delta.checkpoints import DeltaStateStore
from splitkeeper_tools.bench.scale import _peak_rss_mb
mapping = json.loads(sys.argv[1])
started = time.perf_counter()
latest = DeltaStateStore(mapping["state"]["path"], mapping["name"], None, read_only=True).latest_checkpoint()
restore_s = time.perf_counter() - started
restore_rss = _peak_rss_mb()
started = time.perf_counter()
with leased_pipeline(config_from_mapping(mapping), None, metrics=False) as pipeline:
    opened = pipeline.open()
reopen_s = time.perf_counter() - started
print(json.dumps({"restore_s": round(restore_s, 3), "restore_rss_mb": restore_rss,
                  "reopen_s": round(reopen_s, 2), "rss_mb": _peak_rss_mb(),
                  "checkpoint": None if latest is None else latest.checkpoint_id,
                  "restored_from": opened.restored_from}))
"""


def measure_restart(mapping: Mapping[str, Any], repeats: int = 2) -> dict[str, Any]:
    """A restarted driver, each in a fresh process (the first run's process not involved): its
    restore of the latest checkpoint (a read-only store), then the pipeline's whole open (lease,
    restore, discovery of every file; no Spark), and its peak RSS; the median of ``repeats``."""
    runs = []
    for _ in range(repeats):
        done = subprocess.run(
            [sys.executable, "-c", _RESTART_CHILD, json.dumps(mapping)],
            capture_output=True,
            text=True,
            check=False,
            timeout=1800,
        )
        if done.returncode != 0:
            raise RuntimeError(f"the restarted driver failed: {done.stderr[-3000:]}")
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
        say(f"restarted driver: {runs[-1]}")
    return {
        key: statistics.median(r[key] for r in runs)
        for key in ("restore_s", "restore_rss_mb", "reopen_s", "rss_mb")
    } | {"runs": runs}


def measure_file_splits(
    spark: Any,
    root: Path,
    splits: int,
    epochs: int,
    active_share: float,
    restore_repeats: int = 3,
    source_options: Mapping[str, Any] | None = None,
    store: Any | None = None,
    tables: str = "store",
    folder_files: int = 0,
) -> dict[str, Any]:
    """Part 5: part 1 at ``splits`` files with ``active_share`` new per epoch, then restore, reopen,
    RSS (in this process, and in fresh processes: :func:`measure_restart`)."""
    from splitkeeper.app.services import leased_pipeline
    from splitkeeper.config.settings import config_from_mapping
    from splitkeeper.delta.checkpoints import DeltaStateStore

    measured = measure_epochs(
        spark,
        root,
        splits,
        epochs,
        active_share,
        source_options=source_options,
        store=store,
        tables=tables,
        folder_files=folder_files,
    )
    drops = Drops(root, store, tables=tables)
    restores = []
    restored_id = None
    for _ in range(restore_repeats):
        started = time.perf_counter()
        state = DeltaStateStore(drops.loc("state"), f"scale-{splits}", None, read_only=True)
        latest = state.latest_checkpoint()
        restores.append(time.perf_counter() - started)
        restored_id = None if latest is None else latest.checkpoint_id
    mapping = _mapping(drops, splits, 4, source_options)
    started = time.perf_counter()
    with leased_pipeline(config_from_mapping(mapping), spark, metrics=False) as pipeline:
        opened = pipeline.open()
    reopen_s = time.perf_counter() - started
    result = {
        **measured,
        "active_share": active_share,
        "restore_s": round(statistics.median(restores), 3),
        "restored_checkpoint": restored_id,
        "reopen_s": round(reopen_s, 2),
        "reopen_restored_from": opened.restored_from,
        "driver_rss_mb": _peak_rss_mb(),
        "jvm_rss_mb": _peak_rss_mb(_jvm_pid(spark)),
        "restart": measure_restart(mapping),
    }
    say(
        f"{splits:,} file splits, {measured['active_per_epoch']:,} active: overhead "
        f"{measured['overhead_ms_median']:.0f} ms, restore {result['restore_s']:.2f} s, reopen "
        f"{reopen_s:.1f} s, driver RSS {result['driver_rss_mb']} MB, JVM {result['jvm_rss_mb']} MB; "
        f"restarted: {result['restart']}"
    )
    return result


def measure_kafka_epochs(
    spark: Any,
    root: Path,
    bootstrap: str,
    partitions: int,
    epochs: int,
    active_share: float = 0.01,
    metadata_interval_s: float | None = None,
) -> dict[str, Any]:
    """Part 4 for one partition count: a fresh topic; driver phases per epoch with ``active_share``
    of the partitions receiving a message before each (``metadata_interval_s``: the source's
    ``metadata_interval_s``; None: its default)."""
    from confluent_kafka import Producer

    from splitkeeper.config.settings import config_from_mapping
    from splitkeeper_tools.kafka_testbed import QUIET_CLIENT_LOG, create_topics

    topic = f"scale-{partitions}-{os.getpid()}-{int(time.time())}"
    started = time.perf_counter()
    create_topics(bootstrap, {topic: partitions}, timeout_s=300)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "logger": QUIET_CLIENT_LOG})

    def produce(targets: Sequence[int], tag: str) -> int:
        for p in targets:
            producer.produce(topic, value=f"{tag} partition {p}".encode(), partition=p)
        if producer.flush(120):
            raise RuntimeError(f"bench scale: messages to {topic} undelivered after 120 s")
        return len(targets)

    produce(range(partitions), "initial")
    say(f"{partitions:,} partitions: topic created and filled in {time.perf_counter() - started:.1f}s")
    active = max(1, round(partitions * active_share))
    config = config_from_mapping(
        {
            "name": f"scale-kafka-{partitions}",
            "parallelism": 4,
            "source": {
                "kind": "kafka",
                "bootstrap_servers": bootstrap,
                "topics": [topic],
                "starting": "earliest",
                **({} if metadata_interval_s is None else {"metadata_interval_s": metadata_interval_s}),
            },
            "checkpoint": {"retain_checkpoints": 3, "region_timeout_s": 600},
            "backlog": {"backlog_epoch_records": partitions * 4, "normal_epoch_records": partitions * 4},
            "state": {"path": str(root / "state")},
            "sink": {"path": str(root / "sink")},
        }
    )

    def new_data(epoch: int) -> int:  # a different 1% of the partitions each epoch
        first = (epoch * active) % partitions
        return produce([(first + i) % partitions for i in range(active)], f"epoch {epoch}")

    return _measure(config, spark, root, f"{partitions:,} partitions", partitions, active, epochs, new_data)


def measure_restore(root: Path, size: int, checkpoints: int) -> dict[str, Any]:
    """Part 2 for one size: restore after ``checkpoints`` checkpoints, and the state's bytes."""
    from splitkeeper_tools.bench.state import measure_state_store

    started = time.perf_counter()
    figures = measure_state_store(
        root, checkpoints=checkpoints, marks=(checkpoints,), splits=size, parallelism=4, restore_repeats=3
    )
    say(
        f"{size:,} splits: {checkpoints} checkpoints committed in {time.perf_counter() - started:.0f}s; "
        f"restore {figures.restore_ms[checkpoints]} ms (open {figures.open_ms[checkpoints]} ms)"
    )
    return {
        "restore_s": round((figures.restore_ms[checkpoints] + figures.open_ms[checkpoints]) / 1000, 3),
        "state_bytes": _dir_bytes(root),
        "commit_ms_median": statistics.median(figures.total_commit_ms),
    }


_RSS_CHILD = """
import resource, sys
from splitkeeper_tools.bench.assign import make_splits
from splitkeeper.core.enumerator import RecordingEnumeratorContext, enumerator_for
from splitkeeper.core.source import ReassignableStaticSplitSource
n, readers = int(sys.argv[1]), int(sys.argv[2])
context = RecordingEnumeratorContext(readers)
enumerator = enumerator_for(ReassignableStaticSplitSource("bench", make_splits(n)), context, "least-loaded")
enumerator.start()
for r in range(readers):
    context.register_reader(r)
    enumerator.add_reader(r)
snapshot = enumerator.snapshot(1)
assert sum(len(v) for v in snapshot.assignments.values()) + len(snapshot.pool) == n
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
"""


def measure_rss(splits: int = 1_000_000, readers: int = 1_000) -> float:
    """Part 3: peak RSS (MB) of a process holding ``splits`` splits in the core enumerator."""
    done = subprocess.run(
        [sys.executable, "-c", _RSS_CHILD, str(splits), str(readers)],
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the 1M-split enumerator process failed: {done.stderr[-2000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def run_scale(
    sizes: Sequence[int],
    *,
    epochs: int = 5,
    checkpoints: int = 200,
    rss_splits: int = 1_000_000,
    workdir: str | None = None,
    spark_factory: Callable[[], Any] | None = None,
    kafka_partitions: Sequence[int] = (),
    bootstrap_servers: str | None = None,
    file_splits: int = 0,
    active_share: float = 0.01,
    source_options: Mapping[str, Any] | None = None,
    store: str = "local",
    kafka_metadata_interval_s: float | None = None,
    tables: str = "store",
    folder_files: int = 0,
) -> dict[str, Any]:
    """Every part (Kafka only with ``kafka_partitions``, part 5 only with ``file_splits``; parts 1 and
    2 only with ``sizes``); the JSON-able result. ``store`` ``s3``: part 5's files, state and sink on
    a versitygw started here (``local``: a local folder; ``tables`` ``local``: the state and sink on
    local disk); ``source_options`` ``discovery: notifications`` (with ``s3``): its bucket events to a
    topic of the broker at ``bootstrap_servers`` (none: the project's own started here)."""
    base = Path(workdir or tempfile.mkdtemp(prefix="splitkeeper-scale-"))
    load_start = [round(x, 2) for x in os.getloadavg()]
    object_store = None
    events_broker = None
    notified = (source_options or {}).get("discovery") == "notifications"
    if notified and not (store == "s3" and file_splits):
        raise InvalidParameterError(
            "--discovery", "notifications", "with --store s3 and --file-splits N (the events are a bucket's)"
        )
    if store == "s3" and file_splits:  # started before Spark: its Python workers get the AWS_* environment
        from splitkeeper_tools.chaos.store import ChaosStore

        options: tuple[str, ...] = ()
        if notified:  # versitygw publishes its bucket events to a topic of the project's broker
            events_broker, notifications = _event_topic(base, bootstrap_servers)
            source_options = {**(source_options or {}), "notifications": notifications}
            options = ("--event-kafka-url", notifications["bootstrap_servers"])
            options += ("--event-kafka-topic", notifications["topic"])
        object_store = ChaosStore(base / "store", seed=1, fault_rate=0.0, prefix="scale", options=options)
    try:
        if object_store is not None:
            object_store.start()
            os.environ.update(object_store.store_env())  # the store itself, not the fault proxy
        if spark_factory is None:
            from splitkeeper.spark.session import SparkSettings, get_spark

            spark = get_spark(SparkSettings.from_env(ui_enabled=False))
        else:
            spark = spark_factory()
        epochs_by_size = {}
        restore_by_size = {}
        for size in sizes:
            say(f"{size:,} splits: epochs (load {os.getloadavg()[0]:.1f})")
            epochs_by_size[size] = measure_epochs(spark, base / f"files-{size}", size, epochs)
            say(f"{size:,} splits: restore after {checkpoints} checkpoints")
            restore_by_size[size] = measure_restore(base / f"state-{size}", size, checkpoints)
        kafka_by_size: dict[int, dict[str, Any]] = {}
        if kafka_partitions:
            from splitkeeper_tools.kafka_testbed import BrokerHandle

            broker = BrokerHandle(base / "broker", bootstrap_servers)
            bootstrap = broker.start()
            try:
                for partitions in kafka_partitions:
                    say(f"{partitions:,} partitions: epochs (load {os.getloadavg()[0]:.1f})")
                    kafka_by_size[partitions] = measure_kafka_epochs(
                        spark,
                        base / f"kafka-{partitions}",
                        bootstrap,
                        partitions,
                        epochs,
                        active_share,
                        kafka_metadata_interval_s,
                    )
            finally:
                broker.stop()
        files_part: dict[str, Any] | None = None
        if file_splits:
            say(
                f"{file_splits:,} file splits, {active_share:.2%} active per epoch "
                f"(load {os.getloadavg()[0]:.1f})"
            )
            files_part = measure_file_splits(
                spark,
                base / f"file-splits-{file_splits}",
                file_splits,
                epochs,
                active_share,
                source_options=source_options,
                store=object_store,
                tables=tables,
                folder_files=folder_files,
            )
        say(f"driver memory with {rss_splits:,} splits")
        rss = measure_rss(rss_splits)
        overhead = {str(s): epochs_by_size[s]["overhead_ms_median"] for s in sizes}
        growth = None
        if sizes:
            small, large = min(sizes), max(sizes)
            if overhead[str(small)] > 0 and large != small:
                growth = round(overhead[str(large)] / overhead[str(small)], 2)
        result: dict[str, Any] = {
            "sizes": list(sizes),
            "epochs_measured": epochs,
            "epoch_overhead_ms": overhead,
            "epoch_phases_ms": {str(s): epochs_by_size[s]["phases_ms_median"] for s in sizes},
            "delta_files_per_epoch": {
                str(s): epochs_by_size[s]["delta_files_per_epoch_median"] for s in sizes
            },
            "restore_s": {str(s): restore_by_size[s]["restore_s"] for s in sizes},
            "state_bytes_after_200_checkpoints": {str(s): restore_by_size[s]["state_bytes"] for s in sizes},
            "state_commit_ms": {str(s): restore_by_size[s]["commit_ms_median"] for s in sizes},
            "checkpoints_for_restore": checkpoints,
            "driver_rss_mb_1m_splits": rss,
            "rss_splits": rss_splits,
            "growth_epoch_overhead": growth,
            "per_epoch": {str(s): epochs_by_size[s]["epochs"] for s in sizes},
            "load": {"start": load_start, "end": [round(x, 2) for x in os.getloadavg()]},
        }
        if files_part is not None:
            result["file_splits"] = {
                "splits": files_part["splits"],
                "active_per_epoch": files_part["active_per_epoch"],
                "active_share": files_part["active_share"],
                "epoch_overhead_ms": files_part["overhead_ms_median"],
                # the slowest measured epoch: one that rechecks finished files (source.recheck_finished_every)
                "epoch_overhead_ms_max": max(e["overhead_ms"] for e in files_part["epochs"]),
                "source_options": dict(source_options or {}),
                "folder_files": folder_files,
                "store": store,
                "tables": tables if store == "s3" else "local",
                "write_files_s": files_part["write_files_s"],
                "upload_s": files_part["upload_s"],
                "fill_epochs": files_part["fill_epochs"],
                "driver_rss_mb_after_fill": files_part["driver_rss_mb_after_fill"],
                "restart": files_part["restart"],
                "epoch_phases_ms": files_part["phases_ms_median"],
                "delta_files_per_epoch": files_part["delta_files_per_epoch_median"],
                "first_epoch_s": files_part["first_epoch_s"],
                "restore_s": files_part["restore_s"],
                "restored_checkpoint": files_part["restored_checkpoint"],
                "reopen_s": files_part["reopen_s"],
                "reopen_restored_from": files_part["reopen_restored_from"],
                "driver_rss_mb": files_part["driver_rss_mb"],
                "jvm_rss_mb": files_part["jvm_rss_mb"],
                "exact": files_part["exact"],
                "per_epoch": files_part["epochs"],
                "runtime": "local Spark, delta-rs state store and sink, the core's driver (as in a run)",
            }
        if kafka_by_size:
            k_small, k_large = min(kafka_by_size), max(kafka_by_size)
            k_overhead = {str(s): kafka_by_size[s]["overhead_ms_median"] for s in kafka_by_size}
            result.update(
                {
                    "kafka_partitions": sorted(kafka_by_size),
                    "kafka_active_share": active_share,
                    "kafka_metadata_interval_s": kafka_metadata_interval_s,
                    "kafka_epoch_overhead_ms": k_overhead,
                    "kafka_epoch_phases_ms": {
                        str(s): v["phases_ms_median"] for s, v in kafka_by_size.items()
                    },
                    "kafka_delta_files_per_epoch": {
                        str(s): v["delta_files_per_epoch_median"] for s, v in kafka_by_size.items()
                    },
                    "kafka_growth_epoch_overhead": (
                        round(k_overhead[str(k_large)] / k_overhead[str(k_small)], 2)
                        if k_overhead[str(k_small)] > 0 and k_large != k_small
                        else None
                    ),
                    "kafka_exact": all(v["exact"] for v in kafka_by_size.values()),
                    "kafka_first_epoch_s": {str(s): v["first_epoch_s"] for s, v in kafka_by_size.items()},
                    "kafka_first_epoch_read_s": {
                        str(s): v["first_epoch_read_s"] for s, v in kafka_by_size.items()
                    },
                    "kafka_first_epoch_region_task_s": {
                        str(s): v["first_epoch_region_task_s"] for s, v in kafka_by_size.items()
                    },
                    "kafka_per_epoch": {str(s): v["epochs"] for s, v in kafka_by_size.items()},
                }
            )
        result["goals"] = _goals(result)
        return result
    finally:
        if object_store is not None:
            object_store.stop()
        if events_broker is not None:
            events_broker.stop()


#: Partitions of part 5's event topic (``--discovery notifications``).
EVENT_PARTITIONS = 2


def _event_topic(base: Path, bootstrap_servers: str | None) -> tuple[Any, dict[str, str]]:
    """The broker (the project's own started here, or ``bootstrap_servers``) and a new topic of it for
    the store's bucket events: the handle, and ``source.notifications``."""
    from splitkeeper_tools.kafka_testbed import BrokerHandle, create_topics

    broker = BrokerHandle(base / "events-broker", bootstrap_servers)
    servers = broker.start()
    topic = f"scale-events-{os.getpid()}-{int(time.time())}"
    try:
        create_topics(servers, {topic: EVENT_PARTITIONS}, timeout_s=120)
    except BaseException:
        broker.stop()
        raise
    say(f"bucket events to topic {topic} ({EVENT_PARTITIONS} partitions) at {servers}")
    return broker, {"bootstrap_servers": servers, "topic": topic}


def _goals(result: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "10000" in result["epoch_overhead_ms"]:
        out["epoch_overhead_ms_at_10000"] = {
            "value": result["epoch_overhead_ms"]["10000"],
            "goal": GOALS["epoch_overhead_ms_at_10000"],
            "met": result["epoch_overhead_ms"]["10000"] <= GOALS["epoch_overhead_ms_at_10000"],
        }
    if "10000" in result["restore_s"]:
        out["restore_s_at_10000"] = {
            "value": result["restore_s"]["10000"],
            "goal": GOALS["restore_s_at_10000"],
            "met": result["restore_s"]["10000"] <= GOALS["restore_s_at_10000"],
        }
    if result["growth_epoch_overhead"] is not None:
        out["growth_epoch_overhead"] = {
            "value": result["growth_epoch_overhead"],
            "goal": GOALS["growth_epoch_overhead"],
            "met": result["growth_epoch_overhead"] <= GOALS["growth_epoch_overhead"],
        }
    first = result.get("kafka_first_epoch_s", {})
    if "1000" in first:
        out["kafka_first_epoch_s_at_1000"] = {
            "value": first["1000"],
            "goal": GOALS["kafka_first_epoch_s_at_1000"],
            "met": first["1000"] <= GOALS["kafka_first_epoch_s_at_1000"],
        }
    part = result.get("file_splits")
    if part is not None and part["splits"] == 100_000 and part["active_per_epoch"] == 1_000:
        for name, key in (
            ("epoch_overhead_ms", "file_splits_epoch_overhead_ms_at_100000"),
            ("restore_s", "file_splits_restore_s_at_100000"),
            ("driver_rss_mb", "file_splits_driver_rss_mb_at_100000"),
        ):
            value = part[name]
            out[key] = {"value": value, "goal": GOALS[key], "met": value is not None and value <= GOALS[key]}
    if result["rss_splits"] == 1_000_000:
        out["driver_rss_mb_1m_splits"] = {
            "value": result["driver_rss_mb_1m_splits"],
            "goal": GOALS["driver_rss_mb_1m_splits"],
            "met": result["driver_rss_mb_1m_splits"] <= GOALS["driver_rss_mb_1m_splits"],
        }
    return out


def write_chart(result: dict[str, Any], out_dir: str) -> str:
    """``<out_dir>/scale.html``: driver overhead per phase and size, restore per size."""
    from html import escape

    from splitkeeper.report import charts
    from splitkeeper_tools.bench.ingest import write_page

    phase_rows = [
        (f"{int(s):,} splits: {phase}", float(ms))
        for s, phases in result["epoch_phases_ms"].items()
        for phase, ms in phases.items()
    ] + [
        (f"{int(s):,} partitions: {phase}", float(ms))
        for s, phases in result.get("kafka_epoch_phases_ms", {}).items()
        for phase, ms in phases.items()
    ]
    part = result.get("file_splits")
    if part is not None:
        phase_rows += [
            (f"{part['splits']:,} file splits, {part['active_per_epoch']:,} active: {phase}", float(ms))
            for phase, ms in part["epoch_phases_ms"].items()
        ]
    phases = charts.hbar_chart(
        "scale-phases",
        "Driver ms per epoch, by phase and size (median)",
        "EpochReport.phases without 'read', median over the measured epochs",
        phase_rows,
        x_label="ms per epoch",
        y_label="phase",
        color=charts.GREEN,
    )
    restore = charts.hbar_chart(
        "scale-restore",
        f"Restore after {result['checkpoints_for_restore']} checkpoints (s)",
        "open a fresh store and restore the latest checkpoint, median of 3",
        [(f"{int(s):,} splits", float(v)) for s, v in result["restore_s"].items()]
        + (
            [] if part is None else [(f"{part['splits']:,} file splits (its run's state)", part["restore_s"])]
        ),
        x_label="seconds",
        y_label="size",
        color=charts.VERMILLION,
    )
    goals = "".join(
        f"<tr><td>{escape(k)}</td><td>{v['value']}</td><td>{v['goal']}</td>"
        f"<td>{'yes' if v['met'] else 'no'}</td></tr>"
        for k, v in result["goals"].items()
    )
    body = f"""<h1>splitkeeper-tools bench scale</h1>
<p>Load at start {result["load"]["start"]}, at end {result["load"]["end"]}. Driver RSS with
{result["rss_splits"]:,} splits: {result["driver_rss_mb_1m_splits"]:.0f} MB.</p>
<table><tr><th>figure</th><th>value</th><th>goal</th><th>met</th></tr>{goals}</table>
<div>{phases}{restore}</div>
"""
    return write_page(out_dir, CHART_FILE, "splitkeeper-tools bench scale", body)


def file_splits_line(result: Mapping[str, Any]) -> str:
    """Part 5's line of the command's output: the median driver overhead per epoch, with the load."""
    part = result["file_splits"]
    where = part["store"] + (f" (tables {part['tables']})" if part["store"] == "s3" else "")
    return (
        f"{part['splits']:>7,} file splits, {part['active_per_epoch']:,} active per epoch: "
        f"epoch overhead {part['epoch_overhead_ms']:.0f} ms "
        f"(median; max {part['epoch_overhead_ms_max']:.0f}), "
        f"restore {part['restore_s']:.2f} s (reopen with discovery {part['reopen_s']:.1f} s), "
        f"driver RSS {part['driver_rss_mb']} MB (JVM {part['jvm_rss_mb']} MB); "
        f"discovery {part['source_options'].get('discovery', 'full')}, store {where}, "
        f"load {result['load']['start']} -> {result['load']['end']}"
    )


def _sizes(
    text: str, option: str = "--sizes", allowed: str = "comma-separated split counts >= 10, e.g. 1000,10000"
) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        sizes = []
    if not sizes or any(s < 10 for s in sizes):
        raise InvalidParameterError(option, text, allowed)
    return sorted(set(sizes))


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sizes", default="1000,10000", help="split counts (files), comma-separated; 'none' skips parts 1-2"
    )
    parser.add_argument("--epochs", type=int, default=5, help="measured epochs per size (after the first)")
    parser.add_argument("--checkpoints", type=int, default=200, help="checkpoints before the restore")
    parser.add_argument("--rss-splits", type=int, default=1_000_000, help="splits in the memory measurement")
    parser.add_argument(
        "--kafka-partitions",
        default="100,1000",
        help="partition counts of the Kafka part, comma-separated; 'none' skips it",
    )
    parser.add_argument(
        "--bootstrap-servers", default=None, help="an existing broker (default: start the project's own)"
    )
    parser.add_argument(
        "--file-splits",
        type=int,
        default=0,
        help="part 5: this many file splits (e.g. 100000), --active-share of them new per epoch (0: skip)",
    )
    parser.add_argument(
        "--active-share",
        type=float,
        default=0.01,
        help="parts 4 and 5: the share of partitions with a new message / of new file splits per epoch",
    )
    parser.add_argument(
        "--kafka-metadata-interval-s",
        type=float,
        default=None,
        help="part 4: the Kafka source's source.metadata_interval_s (default: the source's own default)",
    )
    parser.add_argument(
        "--discovery",
        choices=("full", "incremental", "notifications"),
        default=None,
        help="part 5: the files source's source.discovery (default: the source's own default); "
        "notifications needs --store s3: versitygw publishes its bucket events to a topic of the broker "
        "(--bootstrap-servers, or the project's own started here)",
    )
    parser.add_argument(
        "--recheck-finished-every",
        type=int,
        default=None,
        help="part 5: source.recheck_finished_every, epochs (default: the source's own default)",
    )
    parser.add_argument(
        "--store",
        choices=("local", "s3"),
        default="local",
        help="part 5: the files, state and sink on local disk, or on a versitygw started here (s3)",
    )
    parser.add_argument(
        "--tables",
        choices=("store", "local"),
        default="store",
        help="part 5 with --store s3: the state and sink tables on the store too (store), or on local disk",
    )
    parser.add_argument(
        "--folder-files",
        type=int,
        default=0,
        help="part 5: the files in folders of this many names, in the files' order, as dated drops are "
        "(0: one flat folder)",
    )
    parser.add_argument("--workdir", default=None, help="where the files and tables go (default: a temp dir)")
    parser.add_argument("--out", default="var/bench", help="where the HTML chart goes")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON line")


def run(args: argparse.Namespace) -> int:
    sizes = [] if args.sizes.strip().lower() in ("none", "0", "") else _sizes(args.sizes)
    if args.file_splits and args.file_splits < 10:
        raise InvalidParameterError("--file-splits", args.file_splits, "a split count >= 10, or 0 to skip")
    if args.folder_files < 0:
        raise InvalidParameterError(
            "--folder-files", args.folder_files, "an integer >= 0 (0: one flat folder)"
        )
    if not 0 < args.active_share <= 1:
        raise InvalidParameterError("--active-share", args.active_share, "a share in (0, 1], e.g. 0.01")
    for name in ("epochs", "checkpoints", "rss_splits"):
        value = getattr(args, name)
        if value < 1:
            raise InvalidParameterError(f"--{name.replace('_', '-')}", value, "an integer >= 1")
    kafka = (
        []
        if args.kafka_partitions.strip().lower() in ("none", "0", "")
        else _sizes(
            args.kafka_partitions, "--kafka-partitions", "partition counts >= 10, e.g. 100,1000 (or none)"
        )
    )
    result = run_scale(
        sizes,
        epochs=args.epochs,
        checkpoints=args.checkpoints,
        rss_splits=args.rss_splits,
        workdir=args.workdir,
        kafka_partitions=kafka,
        bootstrap_servers=args.bootstrap_servers,
        file_splits=args.file_splits,
        active_share=args.active_share,
        store=args.store,
        kafka_metadata_interval_s=args.kafka_metadata_interval_s,
        tables=args.tables,
        folder_files=args.folder_files,
        source_options={
            key: value
            for key, value in (
                ("discovery", args.discovery),
                ("recheck_finished_every", args.recheck_finished_every),
            )
            if value is not None
        },
    )
    result["chart"] = write_chart(result, args.out)
    if args.json:
        print(json.dumps(result))
    else:
        for s in sizes:
            print(
                f"{s:>7,} splits: epoch overhead {result['epoch_overhead_ms'][str(s)]:.0f} ms, "
                f"restore after {args.checkpoints} checkpoints {result['restore_s'][str(s)]:.2f} s, "
                f"state {result['state_bytes_after_200_checkpoints'][str(s)] / 1e6:.1f} MB"
            )
        print(f"growth of the epoch overhead: {result['growth_epoch_overhead']}")
        for s in kafka:
            print(
                f"{s:>7,} partitions: epoch overhead {result['kafka_epoch_overhead_ms'][str(s)]:.0f} ms, "
                f"first epoch {result['kafka_first_epoch_s'][str(s)]:.1f} s "
                f"(read {result['kafka_first_epoch_read_s'][str(s)]:.1f} s, slowest region task "
                f"{result['kafka_first_epoch_region_task_s'][str(s)]:.1f} s), exact {result['kafka_exact']}"
            )
        if "file_splits" in result:
            print(file_splits_line(result))
        print(f"driver RSS with {args.rss_splits:,} splits: {result['driver_rss_mb_1m_splits']:.0f} MB")
        print(f"chart: {result['chart']}")
    return 0
