"""The main job (``bash scripts/run.sh``): the embedded default, end to end, as a user would run it.

1. a fresh workspace: sample files, a pipeline config, an Airflow home on SQLite;
2. the ``splitkeeper_ingest`` DAG runs a few cycles (real DAG runs on local Spark
   and local Delta); new files arrive between cycles; in the second cycle a
   region fails (an injected fault) and the checkpoint completes regionally;
3. the ``splitkeeper_recover`` DAG is triggered by hand with a new parallelism
   (a rescale from a regional checkpoint), printing every recovery decision;
4. a last ingest cycle reads the source to its end (a global checkpoint);
5. the restart checks (Great Expectations) and the run report;
6. the streaming side: the project's own Kafka broker (KRaft, on loopback), two topics
   of 4 partitions with a backlog while more messages keep arriving: change events of orders
   (JSON: created, updated, deleted), a few of them malformed; the same ingest DAG runs a
   Kafka pipeline (P=4) that decodes them into typed columns (``decode: json`` with a declared
   schema, ``errors.tolerance: all``), runs a PySpark transform over each epoch
   (``transform: {kind: spark}``) and upserts them into a keyed Delta table (``sink.mode:
   upsert``, one MERGE per epoch; deletes on ``op = 'd'``) with its change table, until it has
   caught up with what was there when each run began; a region fails in the second run, a
   last run catches up after the producer stops; the change table and the dead-letter table
   are compared with every delivery report (the malformed messages are exactly the dead
   letters), the keyed table with the latest event of every order, the consumer group's lag
   is shown (offsets committed only at checkpoints) and the story ends with how many orders,
   upserts, deletes and dead letters there are;
7. an index page links both reports.

The last line printed is ``report: <path of the index page>``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from splitkeeper import resources


def _checkout() -> Path:
    """The demo runs from a source checkout: its input generator is ``examples/make_files.py``."""
    return resources.require_checkout("the demo (bash scripts/run.sh)")


class _Narrative:
    """Where the demo's story goes: the terminal, while everything else goes to the log file.

    Unless ``--verbose``, file descriptors 1 and 2 are pointed at ``<workspace>/demo.log``
    (so Airflow's task logs, Spark's JVM, the broker and any traceback land there, child
    processes included) and the story is written to a duplicate of the original stdout.
    Each story line is also appended to the log, so the log reads in order.
    """

    def __init__(self) -> None:
        self.out = sys.stdout
        self.log_path: Path | None = None
        self.console: Any = None  # a rich Console while a live display runs (story lines go through it)

    def divert(self, log_path: Path) -> None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        sys.stdout.flush()
        sys.stderr.flush()
        self.out = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        self.log_path = log_path

    def say(self, text: str) -> None:
        line = f"[demo {time.strftime('%H:%M:%S')}] {text}"
        if self.console is not None:  # above the live display
            self.console.print(line, markup=False, highlight=False, soft_wrap=True)
        else:
            print(line, file=self.out, flush=True)
        if self.log_path is not None:
            print(line, flush=True)  # fd 1 is the log now

    def last(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def live(self) -> bool:
        """A live progress display only on a terminal (plain story lines otherwise)."""
        return self.out.isatty() and os.environ.get("TERM") != "dumb"

    @contextlib.contextmanager
    def working(self, what: str) -> Iterator[None]:
        """While a long step runs: on a terminal a rich spinner with the elapsed seconds (the
        story lines print above it); otherwise nothing, the story lines are the progress."""
        if not self.live():
            yield
            return
        from rich.console import Console
        from rich.live import Live
        from rich.spinner import Spinner

        console = Console(file=self.out)
        started = time.monotonic()
        spinner = Spinner("dots", text=what)
        # no stdout/stderr redirection: fds 1 and 2 are the log, and must stay there
        with Live(spinner, console=console, transient=True, redirect_stdout=False, redirect_stderr=False):
            self.console = console
            stop = threading.Event()

            def tick() -> None:
                while not stop.wait(1.0):
                    spinner.update(text=f"{what} ({time.monotonic() - started:.0f}s)")

            ticker = threading.Thread(target=tick, name="demo-progress", daemon=True)
            ticker.start()
            try:
                yield
            finally:
                stop.set()
                ticker.join()
                self.console = None


_STORY = _Narrative()


def _say(text: str) -> None:
    _STORY.say(text)


def _make_files(target: Path, files: int, lines: int, first: int) -> None:
    subprocess.run(
        [
            sys.executable,
            str(_checkout() / "examples" / "make_files.py"),
            str(target),
            "--files",
            str(files),
            "--lines",
            str(lines),
            "--format",
            "jsonl",
            "--first-file",
            str(first),
            "--seed",
            str(first + 7),
        ],
        check=True,
        capture_output=True,
    )


def _config(workspace: Path) -> Path:
    path = workspace / "pipeline.yaml"
    path.write_text(
        """\
# The demo pipeline: JSON-lines files ingested by 3 independent regions into a Delta table.
name: demo-orders
parallelism: 3
regions: per_reader
strategy: least-loaded
source:
  kind: files
  path: incoming
  format: jsonl
  split_bytes: 262144
checkpoint:
  max_consecutive_failures: 2
  max_failure_ratio: 0.5
  region_timeout_s: 60
backlog:
  backlog_epoch_records: 6000
  normal_epoch_records: 6000
state:
  path: state
sink:
  path: sink
decode:
  kind: text
transform: splitkeeper.transforms:enrich_json
""",
        encoding="utf-8",
    )
    return path


STREAM_TOPICS = {"orders-stream": 4, "payments-stream": 4}
STREAM_GROUP = "splitkeeper-demo-stream"
#: The streaming side's records: change events (JSON objects of this declared schema, Spark DDL) of
#: orders keyed by ``id``: ``op`` c (created), u (updated) or d (deleted).
STREAM_SCHEMA = "id BIGINT, op STRING, seq BIGINT, stream STRING, amount DOUBLE, note STRING"
STREAM_COLUMNS = ("id", "op", "seq", "stream", "amount", "note")
#: The Spark transform of the stream (a PySpark DataFrame function, run once per epoch).
STREAM_TRANSFORM = "splitkeeper.transforms:amount_cents"
MALFORMED_MESSAGES = 5  # in the backlog; cut short, they are not JSON
KEYS_PER_PARTITION = 25  # each order lives in one partition, as a Kafka partitioner keeps a key
DELETE_SHARE = 0.04  # of the events after an order exists


def _stream_values(backlog: int) -> Any:
    """The producer's values: change events of orders as JSON (each order's events in one partition,
    created first, then updated or deleted; a deleted order may be created again);
    :data:`MALFORMED_MESSAGES` of the first ``backlog`` messages are cut short (not JSON: dead
    letters). Called in the producer's order, so the events of a key are in order."""
    import json
    import random

    step = backlog // MALFORMED_MESSAGES
    malformed = {step // 2 + i * step for i in range(MALFORMED_MESSAGES)}
    live: set[int] = set()
    rng = random.Random(5)

    def value_of(seq: int, topic: str, partition: int, payload: str) -> bytes:
        base = (list(STREAM_TOPICS).index(topic) * 10 + partition) * 1000
        key = base + rng.randrange(KEYS_PER_PARTITION)
        if key not in live:
            op = "c"
        elif rng.random() < DELETE_SHARE:
            op = "d"
        else:
            op = "u"
        record = {
            "id": key,
            "op": op,
            "seq": seq,
            "stream": topic,
            "amount": (seq % 1000) / 10,
            "note": payload,
        }
        text = json.dumps(record)
        if seq in malformed:
            return text[: len(text) // 2].encode()
        if op == "d":
            live.discard(key)
        else:
            live.add(key)
        return text.encode()

    return value_of


def _stream_config(workspace: Path, bootstrap: str) -> Path:
    path = workspace / "stream.yaml"
    path.write_text(
        f"""\
# The demo's streaming side: change events of orders on two Kafka topics (8 partitions) read by
# 4 independent regions; JSON values decoded into typed columns, a PySpark transform per epoch,
# and a keyed Delta table (the latest row per order, deletes applied) with its change table.
name: demo-stream
parallelism: 4
regions: per_reader
strategy: least-loaded
source:
  kind: kafka
  bootstrap_servers: "{bootstrap}"
  topics: [{", ".join(STREAM_TOPICS)}]
  starting: earliest
  group_id: {STREAM_GROUP}       # offsets committed to Kafka only when a checkpoint completes
  on_offset_out_of_range: fail
checkpoint:
  max_consecutive_failures: 2
  max_failure_ratio: 0.5
  region_timeout_s: 60
backlog:
  backlog_epoch_records: 8000      # larger epochs while catching up with the backlog
  normal_epoch_records: 4000
state:
  path: stream/state
sink:
  path: stream/orders              # the keyed table: one row per live order
  mode: upsert                     # one Delta MERGE per epoch, under the same fence as an append
  key: [id]
  delete_when: "op = 'd'"
  changes_path: stream/changes     # every event once: the accounting of the upserts
decode:
  kind: json
  schema: "{STREAM_SCHEMA}"
transform:
  kind: spark                      # fn(DataFrame) -> DataFrame over each epoch's records
  function: {STREAM_TRANSFORM}
errors:
  tolerance: all                   # a bad record goes to the dead-letter table, not the region down
  dead_letter:
    path: stream/dead_letters
  max_bad_ratio: 0.2               # above this share of a region's records in an epoch, it fails
""",
        encoding="utf-8",
    )
    return path


def _prepare_airflow(workspace: Path) -> None:
    home = workspace / "airflow"
    os.environ["AIRFLOW_HOME"] = str(home)
    os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
    os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(resources.dags_dir())
    airflow = Path(sys.executable).with_name("airflow")
    done = subprocess.run([str(airflow), "db", "migrate"], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"airflow db migrate failed:\n{done.stderr[-3000:]}")
    from splitkeeper.airflow.wiring import share_in_process_execution_api

    share_in_process_execution_api()  # dag.test() builds an API server per task otherwise: seconds each


def _dag(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, resources.dags_dir() / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dag


def _run_dag(name: str, conf: dict, config: str | None = None) -> None:
    """Run one DAG (dag.test: a real DAG run on SQLite) and tell what it did: its checkpoints,
    recovery decisions and the restart checks' verdict."""
    from splitkeeper.airflow import tasks

    path = config or os.environ["SPLITKEEPER_PIPELINE_CONFIG"]
    before = tasks.next_epoch(path)
    _say(f"DAG run {name} {conf}")
    started = time.monotonic()
    with _STORY.working(f"DAG run {name}: running its tasks"):
        run = _dag(name).test(run_conf=conf)
    if run.state != "success":
        where = f"; the task logs are in {_STORY.log_path}" if _STORY.log_path else ""
        raise SystemExit(f"{name} ended {run.state}{where}")
    for line in _story_of(path, before):
        _say(f"  {line}")
    _say(f"DAG run {name}: success in {time.monotonic() - started:.0f}s; restart checks passed")


def _decisions_of(config: str, epoch: int, show: int = 3) -> list[str]:
    """A few of the per-split recovery decisions checkpoint ``epoch`` committed (the audit trail)."""
    from splitkeeper.config.settings import load_config
    from splitkeeper.delta.checkpoints import DeltaStateStore

    loaded = load_config(config)
    store = DeltaStateStore(loaded.state.path, loaded.name, None, read_only=True)
    rows = [r for r in store.tables.read("audit").to_pylist() if r["checkpoint_id"] == epoch]
    rows = [r for r in rows if r["decision"] not in ("assigned", "discovered")] or rows
    lines = [
        f"split {r['split_id']}: {r['decision']}"
        + ("" if r["reader_id"] is None else f" (reader {r['reader_id']})")
        + (f" {r['detail']}" if r["detail"] else "")
        for r in rows[:show]
    ]
    if len(rows) > show:
        lines.append(
            f"... {len(rows) - show} more decisions in the audit trail (splitkeeper status, the report)"
        )
    return lines


def _rewind_story(config: str) -> None:
    """The incident workflow: a rewind to the first retained checkpoint, planned then applied."""
    from splitkeeper.app import incident
    from splitkeeper.config.settings import load_config

    loaded = load_config(config)
    target = _first_checkpoint(loaded)
    plan = incident.rewind(loaded, target, dry_run=True)
    sink = next((t for t in plan.tables if t["table"] == "sink"), None)
    _say(
        f"a bad transform shipped? rewind plan to checkpoint {target}: {len(plan.changes)} splits go back, "
        f"{plan.offsets_undone:,} offsets read again"
        + ("" if sink is None else f", {sink['rows_leaving']:,} sink rows leave")
        + " (dry run: nothing written)"
    )
    _run_dag(
        "splitkeeper_recover",
        {"rewind": True, "checkpoint_id": str(target), "confirm": True, "reason": "demo: replay after a fix"},
    )
    _say(f"  rewound: state and sink are checkpoint {target}'s again; the next run reads on from there")


def _first_checkpoint(config: Any) -> int:
    from splitkeeper.delta.checkpoints import DeltaStateStore

    ids = DeltaStateStore(config.state.path, config.name, None, read_only=True).checkpoint_ids()
    return ids[0] if ids else 1


def _story_of(config: str, first: int) -> list[str]:
    """One line per checkpoint attempt from ``first`` on (kind, failed regions, reason)."""
    from splitkeeper.app import services
    from splitkeeper.config.settings import load_config

    status = services.status(load_config(config), last=1000)
    lines = []
    for t in status.timeline:
        if t.id < first:
            continue
        failed = f", failed regions {list(t.failed_regions)}" if t.failed_regions else ""
        reason = f" ({t.reason})" if t.reason else ""
        lines.append(f"checkpoint {t.id} {t.kind}{failed}{reason}")
    latest = status.latest_checkpoint
    if not lines:
        return ["no new checkpoint: nothing new to read (the source is at its end)"]
    if latest is not None:
        lines.append(
            f"latest checkpoint {latest.id} at parallelism {latest.parallelism}, loads {latest.loads}"
        )
    return lines


def _stream(workspace: Path, messages: int) -> tuple[str, str]:
    """The streaming side (step 6); returns the report's path and a one-line outcome."""
    from splitkeeper.airflow import tasks
    from splitkeeper_tools.kafka_testbed import BrokerHandle, NumberedProducer, create_topics

    broker = BrokerHandle(workspace / "stream", None)
    _say("starting the project's Kafka broker (KRaft, loopback)")
    bootstrap = broker.start()
    try:
        create_topics(bootstrap, STREAM_TOPICS)
        config = _stream_config(workspace, bootstrap)
        os.environ["SPLITKEEPER_PIPELINE_CONFIG"] = str(config)
        partitions = [(t, p) for t, n in STREAM_TOPICS.items() for p in range(n)]
        backlog = messages * 3 // 5
        producer = NumberedProducer(
            bootstrap,
            partitions,
            seed=11,
            weights=[4, 3, 2, 1, 3, 3, 2, 2],
            value_of=_stream_values(backlog),
        )
        producer.produce(backlog)
        _say(
            f"Kafka {bootstrap}: {backlog:,} change events of orders (JSON) waiting in {len(partitions)} "
            f"partitions, {MALFORMED_MESSAGES} of them malformed"
        )
        _say(f"{messages - backlog:,} more arrive while the pipeline runs")
        arriving = producer.in_background(messages - backlog, chunks=10, pause_s=3.0)
        _run_dag("splitkeeper_ingest", {"epochs": 20})
        next_epoch = tasks.next_epoch(str(config))
        _say(f"injecting a failure of region 2 at epoch {next_epoch}")
        _run_dag("splitkeeper_ingest", {"epochs": 20, "faults": [f"fail:2@{next_epoch}"]})
        arriving.join()
        if getattr(arriving, "errors", None):
            raise SystemExit(f"the demo producer failed: {arriving.errors[0]}")  # type: ignore[attr-defined]
        _say("the producer stopped: a last run catches up")
        _run_dag("splitkeeper_ingest", {"epochs": 20})
        line, dead_line = _check_stream(workspace / "stream", producer.delivered, bootstrap)
        _say(line)
        _say(dead_line)
        report = tasks.report(str(config), title="splitkeeper demo: Kafka with regional checkpoints")
        _say(f"stream report: {report}")
        return report, line
    finally:
        broker.stop()


def _decoded(value: str) -> dict[str, Any] | None:
    """A delivered value's record (JSON), None when it is malformed."""
    import json

    try:
        record = json.loads(value)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def _check_stream(
    folder: Path, delivered: dict[tuple[str, int, int], str], bootstrap: str
) -> tuple[str, str]:
    """The change table's typed rows and the dead letters against every delivery report (every
    message in exactly one of them: the well-formed ones decoded, with the transform's
    ``amount_cents``; the malformed ones byte for byte), the keyed table against the fold of the
    delivery reports (per order its last event, absent when that deletes it), and the consumer
    group's lag per partition. Returns the outcome line and the dead letters' line."""
    from collections import Counter

    from deltalake import DeltaTable

    from splitkeeper.sinks.delta.read import read_sink
    from splitkeeper.sources.kafka.source import KafkaSource, split_id_of
    from splitkeeper_tools.kafka_testbed import end_offsets, value_bytes

    columns = ["split_id", "offset", *STREAM_COLUMNS, "amount_cents"]
    rows = read_sink(folder / "changes", columns).to_pylist()
    dead_path = folder / "dead_letters"
    dead_table = DeltaTable(str(dead_path)).to_pyarrow_table(
        columns=["split_id", "offset", "value", "stage", "error_class", "error_message"]
    )
    dead = dead_table.to_pylist()
    keys = Counter((r["split_id"], int(r["offset"])) for r in rows + dead)
    expected = {(split_id_of(t, p), o): v for (t, p, o), v in delivered.items()}
    got = {(r["split_id"], int(r["offset"])): {c: r[c] for c in STREAM_COLUMNS} for r in rows}
    got_dead = {(r["split_id"], int(r["offset"])): r["value"] for r in dead}
    lost = sum(1 for k in expected if k not in got and k not in got_dead)
    duplicated = sum(n - 1 for n in keys.values() if n > 1)
    wrong = sum(1 for k, v in got.items() if _decoded(expected.get(k, "")) != v)
    wrong += sum(1 for r in rows if r["amount_cents"] != round(r["amount"] * 100))
    wrong += sum(
        1
        for k, v in got_dead.items()
        if k not in expected or _decoded(expected[k]) is not None or value_bytes(expected[k]) != v
    )
    # the fold of the delivery reports: per order the event with the highest offset (one partition each)
    last: dict[int, tuple[int, dict[str, Any]]] = {}
    ops: Counter[str] = Counter()
    for (_topic, _partition, position), value in delivered.items():
        record = _decoded(value)
        if record is None:
            continue
        ops[record["op"]] += 1
        if record["id"] not in last or last[record["id"]][0] < position:
            last[record["id"]] = (position, record)
    orders = {k: r for k, (_o, r) in last.items() if r["op"] != "d"}
    table = {r["id"]: {c: r[c] for c in STREAM_COLUMNS} for r in read_sink(folder / "orders").to_pylist()}
    keyed_wrong = sorted(k for k in set(orders) | set(table) if orders.get(k) != table.get(k))
    ends = end_offsets(delivered)
    source = KafkaSource(bootstrap, topics=list(STREAM_TOPICS), group_id=STREAM_GROUP)
    try:
        committed = source.committed_positions()
    finally:
        source.close()
    lag_total = 0
    for sid in sorted(ends):
        at = committed.get(sid)
        offset = "-" if at is None else at.position
        tag = "-" if at is None else at.checkpoint_id
        lag = ends[sid] - (0 if at is None else at.position)
        lag_total += lag
        _say(
            f"  group {STREAM_GROUP} {sid:<18} committed {offset:>6} end {ends[sid]:>6} lag {lag} ckpt {tag}"
        )
    if lost or duplicated or wrong or lag_total or keyed_wrong:
        raise SystemExit(
            f"streaming side check failed: {lost} lost, {duplicated} duplicated, {wrong} unexpected "
            f"values, consumer group lag {lag_total}, keyed table wrong for orders {keyed_wrong[:10]}"
        )
    line = (
        f"stream: {len(expected):,} change events produced, {len(got):,} decoded into typed columns "
        f"({STREAM_SCHEMA}) and transformed on Spark ({STREAM_TRANSFORM}), {len(dead)} dead letters, "
        f"0 lost, 0 duplicated; consumer group lag 0 on {len(ends)} partitions"
    )
    keyed_line = (
        f"keyed table {folder / 'orders'}: {len(table):,} orders from {ops['c'] + ops['u']:,} upserts "
        f"({ops['c']:,} creates, {ops['u']:,} updates) and {ops['d']:,} deletes, one MERGE per epoch; it "
        f"equals the latest event of every order (deletes applied), and the change table "
        f"{folder / 'changes'} holds every event once"
    )
    _say(keyed_line)
    first = min(dead, key=lambda r: (r["split_id"], r["offset"]), default=None)
    example = (
        ""
        if first is None
        else f"; e.g. {first['split_id']} offset {first['offset']}, stage {first['stage']}: "
        f"{first['error_class']}: {first['error_message'][:100]}"
    )
    dead_line = (
        f"dead letters: {len(dead)} malformed messages (errors.tolerance all) are in the Delta table "
        f"{dead_path}, with their raw bytes{example}"
    )
    return line, dead_line


def _index(folder: Path, files_report: str, stream_report: str, stream_line: str) -> Path:
    """A small page that links the two reports."""
    import html

    def link(path: str) -> str:
        return html.escape(os.path.relpath(path, folder))

    folder.mkdir(parents=True, exist_ok=True)
    target = folder / "index.html"
    target.write_text(
        f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>splitkeeper demo</title>
<style>body{{font-family:system-ui,sans-serif;max-width:52rem;margin:2rem auto;line-height:1.5}}</style>
</head><body>
<h1>splitkeeper demo</h1>
<ul>
<li><a href="{link(files_report)}">Files: ingest, region failure, recovery and rescale</a>:
the <code>splitkeeper_ingest</code> and <code>splitkeeper_recover</code> DAGs on local files.</li>
<li><a href="{link(stream_report)}">Kafka: regional checkpoints on two topics</a>:
{html.escape(stream_line)}.</li>
</ul>
</body></html>
""",
        encoding="utf-8",
    )
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="splitkeeper-demo", description=__doc__.splitlines()[0])
    parser.add_argument("--workspace", default=None, help="demo workspace, recreated (default: var/demo/)")
    parser.add_argument("--lines", type=int, default=3000, help="lines per input file")
    parser.add_argument(
        "--messages", type=int, default=20000, help="Kafka messages of the streaming side (>= 100)"
    )
    parser.add_argument(
        "--verbose", action="store_true", help="print everything (Airflow, Spark) instead of the story"
    )
    args = parser.parse_args(argv)
    if args.messages < 100:
        parser.error(f"--messages {args.messages}: at least 100 (the streaming side needs data to read)")

    workspace = Path(args.workspace).resolve() if args.workspace else _checkout() / "var" / "demo"
    shutil.rmtree(workspace, ignore_errors=True)
    (workspace / "incoming").mkdir(parents=True)
    if not args.verbose:
        _STORY.divert(workspace / "demo.log")
        _say(
            f"the story only; Airflow, Spark and check details go to {workspace / 'demo.log'} (or --verbose)"
        )
    config = _config(workspace)
    os.environ["SPLITKEEPER_PIPELINE_CONFIG"] = str(config)
    os.environ["SPLITKEEPER_REPORTS_DIR"] = str(workspace / "reports")
    _say(f"workspace {workspace}")
    _make_files(workspace / "incoming", files=4, lines=args.lines, first=0)
    _prepare_airflow(workspace)

    from splitkeeper.airflow import tasks

    _run_dag("splitkeeper_ingest", {"epochs": 2})
    _make_files(workspace / "incoming", files=2, lines=args.lines, first=4)  # a new file drop
    next_epoch = tasks.next_epoch(str(config))
    _say(f"injecting a failure of region 1 at epoch {next_epoch}")
    _run_dag("splitkeeper_ingest", {"epochs": 1, "faults": [f"fail:1@{next_epoch}"]})
    recovered = tasks.next_epoch(str(config))
    _run_dag("splitkeeper_recover", {"checkpoint_id": "latest", "mode": "global", "parallelism": 4})
    for line in _decisions_of(str(config), recovered):
        _say(f"  {line}")
    _rewind_story(str(config))
    _run_dag("splitkeeper_ingest", {"epochs": 50})
    files_report = tasks.report(
        str(config), title="splitkeeper demo: ingest, region failure, recovery and rescale"
    )
    _say(f"files report: {files_report}")
    stream_report, stream_line = _stream(workspace, args.messages)
    path = _index(workspace / "reports", files_report, stream_report, stream_line)
    # py4j logs "Closing down clientserver connection" at interpreter exit (through Airflow's
    # log handler, on stdout): keep it quiet so that the report line stays the last one.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    _STORY.last(f"report: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
