"""``splitkeeper run --continuous`` on a real broker: two checkpoint intervals, and a stop that is global.

A backlog of 3,000 messages, then a trickle while the pipeline runs as its own process.
Epochs start ``backlog_interval_s`` apart while the backlog lasts and ``normal_interval_s``
apart afterwards (protocol rule 4.4); SIGTERM (what an Airflow task's cancel sends) ends the
run on a final checkpoint that is global, with exit code 0 (protocol rule 2.6); ``splitkeeper stop``
sends it to the run holding the pipeline's lease on this host.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from splitkeeper_tools.kafka_broker import KafkaBroker

from .helpers import CLI, sink_rows, write_config
from .test_kafka_source import create_topic, produce, unique

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.slow]

BACKLOG_S, NORMAL_S = 8.0, 4.0


def test_a_continuous_run_follows_both_intervals_and_splitkeeper_stop_ends_it_on_a_global_checkpoint(
    spark: Any, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    topic = create_topic(bootstrap, 2, name=unique("continuous"))
    produce(bootstrap, topic, {p: [f"{p}-{i}" for i in range(1500)] for p in (0, 1)})  # the backlog
    config = write_config(
        tmp_path / "pipeline.yaml",
        {
            "name": unique("cont"),
            "parallelism": 2,
            "source": {"kind": "kafka", "bootstrap_servers": bootstrap, "topics": [topic]},
            "backlog": {
                "backlog_epoch_records": 1000,
                "normal_epoch_records": 1000,
                "backlog_interval_s": BACKLOG_S,
                "normal_interval_s": NORMAL_S,
            },
            "checkpoint": {"region_timeout_s": 60},
            "state": {"path": str(tmp_path / "state")},
            "sink": {"path": str(tmp_path / "sink")},
        },
    )
    proc = subprocess.Popen(
        [str(CLI), "run", "--config", str(config), "--continuous", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    stop_trickle = threading.Event()

    def trickle() -> None:
        i = 0
        while not stop_trickle.is_set():
            produce(bootstrap, topic, {0: [f"t{i}"], 1: [f"t{i}"]})
            i += 1
            time.sleep(0.5)

    producer = threading.Thread(target=trickle, daemon=True)
    producer.start()
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            switched = [i for i, line in enumerate(lines) if "switched to the normal interval" in line]
            if switched and sum(1 for line in lines[switched[0] :] if line.startswith("epoch ")) >= 4:
                break
            time.sleep(0.5)
        assert proc.poll() is None, "".join(lines[-30:])
        stopped = subprocess.run(  # what an operator runs: records the request, SIGTERMs a local holder
            [str(CLI), "stop", "--config", str(config), "--json"], capture_output=True, text=True, timeout=120
        )
        assert stopped.returncode == 0, stopped.stderr
        assert json.loads(stopped.stdout)["signalled_pid"] == proc.pid
        out, _err = proc.communicate(timeout=180)
    finally:
        stop_trickle.set()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, "".join(lines[-30:])
    result = json.loads(out.strip().splitlines()[-1])
    epochs = result["epoch_lines"]
    regular = [e for e in epochs if not e["final"]]
    backlog = [e["started_at"] for e in regular if e["processing_backlog"]]
    normal = [e["started_at"] for e in regular if not e["processing_backlog"]]
    assert len(backlog) >= 3 and len(normal) >= 4, epochs
    backlog_gaps = [b - a for a, b in zip(backlog, backlog[1:], strict=False)]
    normal_gaps = [b - a for a, b in zip(normal, normal[1:], strict=False)]
    for gaps, interval in ((backlog_gaps, BACKLOG_S), (normal_gaps, NORMAL_S)):
        assert min(gaps) >= interval - 0.05, (gaps, interval)  # never early
        assert statistics.median(gaps) <= interval + 1.5, (gaps, interval)  # and on time, with a tolerance
    assert result["interval_switches"] and "normal interval (4s)" in result["interval_switches"][0]
    assert result["stopped"] is True
    assert epochs[-1]["final"] and epochs[-1]["kind"] == "global"
    # status shows the switch from the checkpoint rows: the first checkpoint taken in normal mode
    shown = subprocess.run(
        [str(CLI), "status", "--config", str(config), "--json"], capture_output=True, text=True, timeout=120
    )
    assert shown.returncode == 0, shown.stderr
    after = int(re.search(r"after checkpoint (\d+)", result["interval_switches"][0]).group(1))  # type: ignore[union-attr]
    assert json.loads(shown.stdout)["interval_switches"][0] == [after, "normal"]

    rows = sink_rows(tmp_path / "sink")
    by_split: dict[str, list[int]] = {}
    for row in rows:
        by_split.setdefault(row.split_id, []).append(row.offset)
    for split_id, offsets in by_split.items():  # each record once, from 0, no gap
        assert sorted(offsets) == list(range(len(offsets))), split_id
    assert sum(len(v) for v in by_split.values()) >= 3000
