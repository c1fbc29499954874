"""``splitkeeper-tools bench ingest --source kafka``: a tiny end-to-end run (own broker, Spark) and bad input.

No timing assertions beyond what the stall itself guarantees (the baseline's micro-batch
waits for the sleeping record): the figures depend on the machine's load. The end-to-end
test checks that both sides ingested exactly the produced messages, that the JSON carries
the agreed keys, that the ratio is the one of the printed rates, and that the stall was
injected on both sides.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from splitkeeper.errors import InvalidParameterError
from splitkeeper_tools import cli
from splitkeeper_tools.bench import ingest_kafka
from splitkeeper_tools.bench.ingest_common import JSON_SCHEMA
from splitkeeper_tools.bench.ingest_kafka import KafkaIngestSettings, latest_of, stall_filter

REQUIRED_KEYS = {
    "ours_records_per_s",
    "baseline_records_per_s",
    "ratio",
    "stalled_ours_s",
    "stalled_baseline_s",
    "load_avg",
    "messages",
    "ours_s",
    "baseline_s",
    "ours_phases_avg_s",
    "exact",
}
MESSAGES = 3000
STALL_S = 12.0


@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.slow
def test_tiny_kafka_ingest_holds_exactly_the_produced_messages_in_both_sinks_and_reports_the_stall(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "charts"
    code = cli.main(
        [
            "bench", "ingest", "--source", "kafka", "--messages", str(MESSAGES), "--repeat", "1",
            "--stall-messages", "800", "--stall-s", str(STALL_S), "--region-timeout-s", "5",
            "--out", str(out), "--work-dir", str(tmp_path / "work"), "--limit", "--json",
        ]
    )  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err[-5000:]
    lines = [line for line in captured.out.splitlines() if line.strip()]
    assert len(lines) == 1, "exactly one JSON object on stdout"
    result = json.loads(lines[0])

    assert set(result) >= REQUIRED_KEYS
    assert (result["source"], result["messages"], result["partitions"], result["parallelism"]) == (
        "kafka",
        MESSAGES,
        8,
        4,
    )
    assert result["ours_sink_records"] == result["baseline_sink_records"] == MESSAGES
    assert result["ours_duplicates"] == 0 and result["baseline_duplicates"] == 0
    assert result["exact"] is True and result["content_equal"] is True and result["passed"] is True
    assert result["ratio"] == pytest.approx(
        result["ours_records_per_s"] / result["baseline_records_per_s"], abs=5.1e-5
    )
    assert result["ours_records_per_s"] == pytest.approx(MESSAGES / result["ours_s"], abs=0.051)
    assert {"plan", "read", "sink", "state"} <= set(result["ours_phases_avg_s"])
    # --limit: plain confluent-kafka + Arrow, one process per region, wrote every produced message
    # once with its bytes (read back and compared with the producer's delivery reports), and
    # ours / limit is the ratio of the printed median seconds
    limit_run = result["runs"][0]
    assert limit_run["order"] == ["ours", "baseline", "limit"]
    assert limit_run["limit_rows"] == MESSAGES and limit_run["limit_content_equal"] is True
    assert result["limit_warm"] is True and result["limit_s"] > 0
    assert result["limit_processes"] == min(
        os.cpu_count() or 1, result["partitions"]
    )  # one warm worker per core
    assert result["limit_records_per_s"] == pytest.approx(MESSAGES / result["limit_s"], abs=0.051)
    assert result["ours_over_limit"] == pytest.approx(result["ours_s"] / result["limit_s"], abs=5.1e-4)
    assert "Arrow limit (median)" not in captured.out  # --json: the table is not printed
    assert set(result["load_avg"]) >= {"start", "ours", "baseline", "stall_ours", "stall_baseline", "end"}

    stall = result["stall"]
    assert stall["ours_injected"] is True and stall["baseline_injected"] is True
    assert stall["ours_exact"] is True and stall["baseline_exact"] is True
    # epoch 1 completes (a region can only fall back to a completed checkpoint); in epoch 2
    # region 0 times out and the epoch completes regionally
    first, second = stall["ours_epochs"][:2]
    assert (first["epoch"], first["kind"]) == (1, "global")
    assert (second["epoch"], second["kind"], second["outcomes"]["0"]) == (2, "regional", "timeout")
    assert len(stall["stalled_region_partitions"]) == 2
    assert stall["stalled_partition"] in stall["stalled_region_partitions"]
    # the baseline's second micro-batch commits nothing before its sleeping record is processed
    assert result["stalled_baseline_s"] >= STALL_S
    assert result["stalled_ours_s"] is not None and stall["ours_all_s"] >= result["stalled_ours_s"]

    assert "[bench ingest kafka] rep 1/1 ours" in captured.err
    html = (out / ingest_kafka.CHART_FILE).read_text(encoding="utf-8")
    assert 'id="ingest-kafka-throughput"' in html and 'id="ingest-kafka-stall"' in html
    assert "Arrow limit" in html  # the third bar
    assert result["chart"] == str(out / ingest_kafka.CHART_FILE)


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--messages", "0"], "messages=0"),
        (["--partitions", "-1"], "partitions=-1"),
        (["--stall-s", "5", "--region-timeout-s", "10"], "stall_s=5.0"),
        (["--bootstrap-servers", "no port"], "--bootstrap-servers='no port'"),
        (["--limit", "--decode", "json"], "limit=True"),
    ],
)
def test_bad_input_exits_2_naming_the_value_before_starting_anything(
    argv: list[str], named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    work = tmp_path / "work"
    assert cli.main(["bench", "ingest", "--source", "kafka", "--work-dir", str(work), *argv]) == 2
    assert named in capsys.readouterr().err
    assert not work.exists()  # no broker folder, no sink: refused before anything started


def test_settings_size_the_baseline_batches_like_our_epochs() -> None:
    default = KafkaIngestSettings()
    assert (default.messages, default.partitions, default.parallelism) == (400_000, 8, 4)
    assert default.records_per_epoch == 200_000
    # Spark rounds each partition's share of the limit down: one record per partition on top keeps
    # the baseline at as many micro-batches (Delta commits) as we make epochs
    assert default.max_offsets_per_trigger == 200_008
    assert KafkaIngestSettings(epoch_records=50_000, partitions=3).max_offsets_per_trigger == 50_003
    assert KafkaIngestSettings(stall_messages=0, stall_s=1, region_timeout_s=10).stall_messages == 0
    with pytest.raises(InvalidParameterError) as err:
        KafkaIngestSettings(epoch_records=True)  # type: ignore[arg-type]
    assert err.value.name == "epoch_records"


def test_latency_of_a_set_of_partitions_is_its_last_commit_and_unknown_if_one_never_was() -> None:
    done = {"t-0": 3.0, "t-1": 7.5, "t-2": 4.0}
    assert latest_of(done, ["t-0", "t-2"]) == 4.0
    assert latest_of(done, ["t-0", "t-1", "t-2"]) == 7.5
    assert latest_of(done, ["t-0", "t-3"]) is None
    assert latest_of(done, []) is None


def test_stall_filter_sleeps_on_one_row_only_and_refuses_quotes() -> None:
    predicate = stall_filter("orders-3", 0, 1.5)
    assert "split_id = 'orders-3' AND offset = 0" in predicate
    assert "CAST(1500 AS BIGINT)" in predicate and predicate.endswith("ELSE true END")
    with pytest.raises(InvalidParameterError):
        stall_filter("o'rders-3", 0, 1.0)


@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.slow
@pytest.mark.slow_variant  # the typed files benchmark's tiny run stays in the suite
def test_tiny_typed_kafka_ingest_decodes_the_same_rows_on_both_sides_with_decode_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # (no "json" in the test's name: see tests/test_bench_ingest.py's typed test)
    out = tmp_path / "charts"
    code = cli.main(
        [
            "bench", "ingest", "--source", "kafka", "--decode", "json", "--messages", "1200", "--repeat", "1",
            "--stall-messages", "0", "--out", str(out), "--work-dir", str(tmp_path / "work"), "--json",
        ]
    )  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err[-5000:]
    result = json.loads(captured.out.strip().splitlines()[-1])
    assert (result["decode"], result["schema"]) == ("json", JSON_SCHEMA)
    assert result["ours_sink_records"] == result["baseline_sink_records"] == 1200
    assert result["ours_duplicates"] == 0 and result["baseline_duplicates"] == 0
    assert result["exact"] is True and result["content_equal"] is True  # the same typed rows
    assert result["stall"] is None and result["passed"] is True
    assert result["chart"] == str(out / "ingest_kafka_json.html")


def test_json_values_are_the_files_benchmarks_records_numbered_by_sequence() -> None:
    value_of = ingest_kafka.json_values(100, seed=1)
    first, second = (json.loads(value_of(seq, "t", 0, "ff")) for seq in (0, 1))
    assert set(first) == {"id", "user", "amount", "ts", "note"}
    assert (first["id"], second["id"]) == (0, 1)
    assert 50 <= len(value_of(2, "t", 0, "ff")) <= 150  # about --value-bytes long


def test_the_kafka_limit_check_refuses_a_missing_a_changed_or_a_repeated_message(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from splitkeeper_tools.bench.limit import check_kafka_limit

    delivered = {("t", 0, 0): b"a", ("t", 0, 1): b"b\xff", ("t", 1, 0): b"c"}

    def written(rows: list[tuple[str, int, int, bytes]]) -> bool:
        out = tmp_path / f"out{len(list(tmp_path.iterdir()))}"
        out.mkdir()
        split_ids, topics, partitions, offsets, values = (list(c) for c in zip(*rows, strict=True))
        table = pa.table(
            {
                "split_id": split_ids,
                "offset": pa.array(offsets, pa.int64()),
                "value": pa.array(values, pa.binary()),
                "topic": topics,
                "partition": pa.array(partitions, pa.int32()),
            }
        )
        pq.write_table(table, out / "part-0.parquet")
        return check_kafka_limit(str(out), delivered)

    good = [("t-0", "t", 0, 0, b"a"), ("t-0", "t", 0, 1, b"b\xff"), ("t-1", "t", 1, 0, b"c")]
    assert written(good)
    assert not written(good[:2])  # one missing
    assert not written([*good[:2], ("t-1", "t", 1, 0, b"C")])  # one byte changed
    assert not written([good[0], good[0], good[2]])  # one twice, one missing
    assert not written([*good[:2], ("t-0", "t", 1, 0, b"c")])  # the wrong split id
