"""``splitkeeper-tools bench scale``: a small run on the session's Spark checks what the figures mean.

Sizes 20 and 60 files, 2 measured epochs with 1% new data (one new file each), 5 checkpoints
before the restore, 20,000 splits in the memory child: the JSON keys the issue names, each
figure consistent with what the run did (the records of each epoch, files added, a restore
of what was committed). The full sizes are the README's figures, not a test.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from splitkeeper.errors import InvalidParameterError
from splitkeeper_tools.bench.scale import DRIVER_PHASES, file_splits_line, run_scale, write_chart

pytestmark = [pytest.mark.spark]


def test_a_small_scale_run_reports_every_figure_consistently(spark: Any, tmp_path: Path) -> None:
    result = run_scale(
        [20, 60],
        epochs=2,
        checkpoints=5,
        rss_splits=20_000,
        workdir=str(tmp_path),
        spark_factory=lambda: spark,
    )

    for key in (
        "epoch_overhead_ms",
        "restore_s",
        "state_bytes_after_200_checkpoints",
        "driver_rss_mb_1m_splits",
        "growth_epoch_overhead",
    ):
        assert key in result, key
    for size in ("20", "60"):
        epochs = result["per_epoch"][size]
        assert len(epochs) == 2
        assert [e["records"] for e in epochs] == [1, 1]  # 1% of 20 and of 60: one new one-line file
        assert all(e["kind"] == "global" and e["delta_files_added"] > 0 for e in epochs)
        assert all(set(e["phases_ms"]) == set(DRIVER_PHASES) for e in epochs)
        overheads = [e["overhead_ms"] for e in epochs]
        assert min(overheads) <= result["epoch_overhead_ms"][size] <= max(overheads)  # their median
        assert 0 < result["restore_s"][size] < 60
        assert result["state_bytes_after_200_checkpoints"][size] > 0
    assert result["growth_epoch_overhead"] == round(
        result["epoch_overhead_ms"]["60"] / result["epoch_overhead_ms"]["20"], 2
    )
    assert 10 < result["driver_rss_mb_1m_splits"] < 2048
    assert result["goals"] == {"growth_epoch_overhead": result["goals"]["growth_epoch_overhead"]}
    page = Path(write_chart(result, str(tmp_path / "out"))).read_text(encoding="utf-8")
    assert "<svg" in page and "Restore after 5 checkpoints" in page


def test_the_file_splits_row_reports_overhead_restore_and_rss_of_its_own_run(
    spark: Any, tmp_path: Path
) -> None:
    """Part 5 in small: 50 file splits, 4% (two new files) per epoch, on the session's Spark."""
    result = run_scale(
        [],
        epochs=2,
        checkpoints=3,
        rss_splits=20_000,
        workdir=str(tmp_path),
        spark_factory=lambda: spark,
        file_splits=50,
        active_share=0.04,
    )

    part = result["file_splits"]
    assert (part["splits"], part["active_per_epoch"], part["active_share"]) == (50, 2, 0.04)
    assert [e["records"] for e in part["per_epoch"]] == [2, 2] and part["exact"] is True
    assert all(e["kind"] == "global" and set(e["phases_ms"]) == set(DRIVER_PHASES) for e in part["per_epoch"])
    overheads = [e["overhead_ms"] for e in part["per_epoch"]]
    assert min(overheads) <= part["epoch_overhead_ms"] <= max(overheads) and part["epoch_overhead_ms"] > 0
    last = part["per_epoch"][-1]["epoch"]
    assert part["restored_checkpoint"] == last and part["reopen_restored_from"] == last  # what was committed
    assert 0 < part["restore_s"] < 60 and 0 < part["reopen_s"] < 120
    assert 10 < part["driver_rss_mb"] < 8192 and (part["jvm_rss_mb"] is None or part["jvm_rss_mb"] > 10)
    restarted = part["restart"]  # fresh processes: each restored the last checkpoint, its own RSS
    assert [(r["checkpoint"], r["restored_from"]) for r in restarted["runs"]] == [(last, last)] * 2
    assert 0 < restarted["restore_s"] < 60 and 10 < restarted["rss_mb"] < part["driver_rss_mb"]
    assert part["store"] == "local" and part["upload_s"] is None and part["fill_epochs"] == 1
    assert result["epoch_overhead_ms"] == {} and result["growth_epoch_overhead"] is None  # no --sizes
    assert result["goals"] == {}  # the goals are for 100,000 splits with 1,000 active
    page = Path(write_chart(result, str(tmp_path / "out"))).read_text(encoding="utf-8")
    assert "50 file splits, 2 active: plan" in page and "50 file splits (its run&#x27;s state)" in page


@pytest.mark.slow
def test_the_file_splits_row_on_the_object_store_reads_its_uploaded_files_exactly(tmp_path: Path) -> None:
    """Part 5 with ``--store s3``: the files uploaded to a versitygw started by the run (in folders of
    8, listed incrementally), the state and sink there too. Its own process, as the command is run:
    Spark's workers get the ``AWS_*`` environment only from a session started after the store (this
    process may hold one already)."""
    from splitkeeper_tools.chaos.store import versitygw_binary

    assert versitygw_binary() is not None, "bash scripts/setup.sh versitygw"
    argv = [sys.executable, "-m", "splitkeeper_tools", "bench", "scale", "--sizes", "none"]
    argv += ["--kafka-partitions", "none", "--file-splits", "20", "--active-share", "0.1", "--epochs", "1"]
    argv += ["--checkpoints", "3", "--rss-splits", "1000", "--store", "s3", "--json"]
    argv += ["--folder-files", "8", "--discovery", "incremental"]  # folders, listed from the cursor
    argv += ["--workdir", str(tmp_path / "work"), "--out", str(tmp_path / "out")]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=1500)
    assert done.returncode == 0, done.stderr[-3000:]
    part = json.loads(done.stdout.strip().splitlines()[-1])["file_splits"]
    assert part["store"] == "s3" and part["upload_s"] > 0 and part["exact"] is True
    assert part["folder_files"] == 8 and part["source_options"] == {"discovery": "incremental"}
    assert [e["records"] for e in part["per_epoch"]] == [2]
    last = part["per_epoch"][-1]["epoch"]
    assert part["restored_checkpoint"] == last and part["restart"]["runs"][0]["restored_from"] == last
    assert part["per_epoch"][0]["delta_files_added"] > 0  # counted in the store's own folder


@pytest.mark.kafka
def test_the_file_splits_row_in_notification_mode_reads_the_new_objects_from_their_events_exactly(
    kafka_broker: Any, versitygw: Path, tmp_path: Path
) -> None:
    """Part 5 with ``--store s3 --discovery notifications``: versitygw started by the run publishes its
    bucket events to a topic of the session's broker; every measured epoch commits exactly the new
    objects, found through their events (no listing but the first). Its own process, as above."""
    argv = [sys.executable, "-m", "splitkeeper_tools", "bench", "scale", "--sizes", "none"]
    argv += ["--kafka-partitions", "none", "--file-splits", "20", "--active-share", "0.1", "--epochs", "2"]
    argv += ["--checkpoints", "3", "--rss-splits", "1000", "--store", "s3", "--tables", "local"]
    argv += ["--discovery", "notifications", "--bootstrap-servers", kafka_broker.bootstrap_servers]
    argv += ["--workdir", str(tmp_path / "work"), "--out", str(tmp_path / "out"), "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=1500)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    part = result["file_splits"]
    assert (part["store"], part["tables"], part["source_options"]["discovery"]) == (
        "s3",
        "local",
        "notifications",
    )
    assert [e["records"] for e in part["per_epoch"]] == [2, 2] and part["exact"] is True
    overheads = [e["overhead_ms"] for e in part["per_epoch"]]
    assert min(overheads) <= part["epoch_overhead_ms"] <= max(overheads) and part["epoch_overhead_ms"] > 0
    assert (tmp_path / "work" / "file-splits-20" / "state").is_dir()  # --tables local: on local disk
    line = file_splits_line(result)  # what the command prints without --json
    assert line.startswith("     20 file splits, 2 active per epoch: epoch overhead ")
    assert f"discovery notifications, store s3 (tables local), load {result['load']['start']}" in line


def test_notification_mode_needs_the_object_store_and_says_so() -> None:
    with pytest.raises(InvalidParameterError) as err:
        run_scale([], file_splits=20, store="local", source_options={"discovery": "notifications"})
    assert "--discovery" in str(err.value) and "--store s3" in str(err.value)


def test_bad_sizes_are_refused_naming_the_option() -> None:
    from splitkeeper_tools.bench.scale import _sizes

    with pytest.raises(InvalidParameterError) as err:
        _sizes("1000,abc")
    assert "--sizes" in str(err.value) and "comma-separated" in str(err.value)


@pytest.mark.kafka
def test_the_kafka_part_reads_its_share_of_the_partitions_per_epoch_exactly(
    spark: Any, kafka_broker: Any, tmp_path: Path
) -> None:
    result = run_scale(
        [20],
        epochs=2,
        checkpoints=3,
        rss_splits=20_000,
        workdir=str(tmp_path),
        spark_factory=lambda: spark,
        kafka_partitions=[10, 100],
        bootstrap_servers=kafka_broker.bootstrap_servers,
        active_share=0.05,
        kafka_metadata_interval_s=60,
    )

    assert result["kafka_partitions"] == [10, 100]
    assert (result["kafka_active_share"], result["kafka_metadata_interval_s"]) == (0.05, 60)
    for partitions, moved in (("10", 1), ("100", 5)):
        epochs = result["kafka_per_epoch"][partitions]
        assert [e["records"] for e in epochs] == [moved, moved]  # 5%: a message to each of that many
        assert all(e["kind"] == "global" and e["delta_files_added"] > 0 for e in epochs)
        assert set(result["kafka_epoch_phases_ms"][partitions]) == set(DRIVER_PHASES)
        assert result["kafka_epoch_overhead_ms"][partitions] > 0
    assert result["kafka_exact"] is True
    assert 0 < result["kafka_first_epoch_read_s"]["100"] <= result["kafka_first_epoch_s"]["100"]
    assert 0 < result["kafka_first_epoch_region_task_s"]["100"] <= result["kafka_first_epoch_read_s"]["100"]
    assert result["kafka_growth_epoch_overhead"] == round(
        result["kafka_epoch_overhead_ms"]["100"] / result["kafka_epoch_overhead_ms"]["10"], 2
    )
    page = Path(write_chart(result, str(tmp_path / "out"))).read_text(encoding="utf-8")
    assert "100 partitions: plan" in page


def test_bad_kafka_partitions_are_refused_naming_the_option() -> None:
    from splitkeeper_tools.bench.scale import _sizes

    with pytest.raises(InvalidParameterError) as err:
        _sizes("100,x", "--kafka-partitions", "partition counts >= 10")
    assert "--kafka-partitions" in str(err.value)
