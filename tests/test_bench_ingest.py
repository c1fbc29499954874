"""``splitkeeper-tools bench ingest``: the tiny end-to-end run (Spark) and the pure helpers around it.

No timing assertions: the figures depend on the machine's load. The end-to-end test
checks that both sides ingested exactly the input, that the JSON carries the agreed
keys, and that the ratio is the one computed from the printed rates.
"""

from __future__ import annotations

import importlib.machinery
import json
import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from splitkeeper.errors import InvalidParameterError
from splitkeeper_tools import cli
from splitkeeper_tools.bench import ingest
from splitkeeper_tools.bench.ingest import IngestSettings, average_phases, restore_verdict
from splitkeeper_tools.bench.ingest_common import (
    CDC_SCHEMA,
    JSON_SCHEMA,
    expected_cdc_rows,
    typed_rows,
    write_cdc_files,
)

REQUIRED_KEYS = {
    "ours_records_per_s",
    "baseline_records_per_s",
    "ratio",
    "records",
    "ours_s",
    "baseline_s",
    "state_commit_ms_avg",
    "restore_s_after_10",
    "restore_s_after_200",
    "load_avg",
}


@pytest.mark.spark
@pytest.mark.slow
def test_tiny_ingest_run_holds_exactly_the_input_in_both_sinks_and_reports_the_ratio_of_printed_rates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "charts"
    code = cli.main(
        [
            "bench",
            "ingest",
            "--source",
            "files",
            "--files",
            "2",
            "--lines",
            "500",
            "--repeat",
            "1",
            "--restore-checkpoints",
            "10",
            "--restore-repeat",
            "1",
            "--out",
            str(out),
            "--work-dir",
            str(tmp_path / "work"),
            "--limit",
            "--json",
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    lines = [line for line in captured.out.splitlines() if line.strip()]
    assert len(lines) == 1, "exactly one JSON object on stdout"
    result = json.loads(lines[0])
    # --limit: plain Arrow read and wrote every line once, in warm workers, one per core; ours /
    # limit is the ratio of the printed median seconds
    assert result["runs"][0]["limit_rows"] == 1000 and result["limit_warm"] is True
    assert result["limit_processes"] == min(os.cpu_count() or 1, 2)  # 2 files: at most 2 shares
    assert result["ours_over_limit"] == pytest.approx(result["ours_s"] / result["limit_s"], abs=5.1e-4)
    assert result["runs"][0]["order"] == ["ours", "baseline", "limit"]

    assert set(result) >= REQUIRED_KEYS
    assert result["records"] == 1000
    assert result["ours_sink_records"] == 1000
    assert result["baseline_sink_records"] == 1000
    assert result["ours_duplicates"] == 0
    assert result["exact"] is True
    assert result["content_equal"] is True
    assert result["runs"][0]["ours_finished"] is True
    # a Spark job per epoch, none to set up, counted after the run from the jobs' submission times
    assert [e["jobs"] for e in result["runs"][0]["ours_epochs"]] == [1, 1]
    assert result["runs"][0]["ours_setup_jobs"] == 0 and result["runs"][0]["ours_jobs"] == 2
    # each epoch's acknowledged region tasks' own times, from the driver's epoch reports: every
    # region of every epoch ran and acknowledged (no faults), and reading took time
    tasks, epochs = result["runs"][0]["ours_region_task_s"], result["runs"][0]["ours_epochs"]
    assert len(tasks) == result["parallelism"] * len(epochs) > 0
    assert min(tasks) >= 0 and sum(tasks) > 0
    # the ratio is ours / baseline of the printed rates (rounded to 4 places), and the rates are
    # records / printed seconds (rounded to 0.1 records/s)
    assert result["ratio"] == pytest.approx(
        result["ours_records_per_s"] / result["baseline_records_per_s"], abs=5.1e-5
    )
    assert result["ours_records_per_s"] == pytest.approx(result["records"] / result["ours_s"], abs=0.051)
    assert result["baseline_records_per_s"] == pytest.approx(
        result["records"] / result["baseline_s"], abs=0.051
    )
    # our epochs' phases, the state commit and the restore after 10 checkpoints were measured
    assert {"plan", "read", "sink", "state", "retain"} <= set(result["ours_phases_avg_s"])
    assert result["state_commit_ms_avg"] > 0
    assert result["restore_s_after_10"] is not None and result["restore_s_after_10"] > 0
    assert result["restore_s_after_200"] is None  # only 10 checkpoints were committed
    assert [x["checkpoints"] for x in result["restore_samples"]] == [10]  # --restore-repeat 1
    assert set(result["load_avg"]) >= {"start", "ours", "baseline", "restore", "end"}
    # progress on stderr, the chart in --out with the throughput bars and the phase breakdown
    assert "[bench ingest] rep 1/1 ours" in captured.err
    html = (out / ingest.CHART_FILE).read_text(encoding="utf-8")
    assert html.count("<svg") >= 3
    assert 'id="ingest-throughput"' in html and 'id="ingest-phases"' in html
    assert "Arrow limit" in html
    assert result["chart"] == str(out / ingest.CHART_FILE)


def test_kafka_source_is_refused_as_not_available_while_its_module_is_missing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(ingest, "KAFKA_MODULE", "splitkeeper_tools.bench._no_such_kafka_bench")
    code = cli.main(["bench", "ingest", "--source", "kafka", "--json"])
    err = capsys.readouterr().err
    assert code == 2
    assert "not available yet" in err and "source='kafka'" in err


def test_kafka_source_runs_the_kafka_module_once_it_exists(monkeypatch: pytest.MonkeyPatch) -> None:
    name = "splitkeeper_tools.bench._fake_ingest_kafka"
    fake = types.ModuleType(name)
    fake.__spec__ = importlib.machinery.ModuleSpec(name, None)
    seen: list[str] = []

    def configure(parser: object) -> None:
        parser.add_argument("--source")  # type: ignore[attr-defined]
        parser.add_argument("--topic")  # type: ignore[attr-defined]

    def run(args: object) -> int:
        seen.append(args.topic)  # type: ignore[attr-defined]
        return 7

    fake.configure = configure  # type: ignore[attr-defined]
    fake.run = run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, name, fake)
    monkeypatch.setattr(ingest, "KAFKA_MODULE", name)
    assert cli.main(["bench", "ingest", "--source=kafka", "--topic", "orders"]) == 7
    assert seen == ["orders"]
    assert ingest.module_for_source(["--source", "files"]) == "splitkeeper_tools.bench.ingest"


def test_an_unknown_source_is_refused_naming_what_is_allowed(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "ingest", "--source", "s3"]) == 2
    assert "source='s3' is not allowed: files" in capsys.readouterr().err


def test_settings_size_the_baseline_batches_like_our_epochs_and_pick_restore_marks() -> None:
    default = IngestSettings()
    assert default.records == 800_000
    assert default.records_per_epoch == 400_000
    assert default.max_files_per_trigger == 4
    assert default.restore_marks == (10, 200)
    small = IngestSettings(files=2, lines=500, epoch_records=300, restore_checkpoints=5)
    assert small.max_files_per_trigger == 1  # never below one whole file
    assert small.restore_marks == (5,)
    assert IngestSettings(restore_checkpoints=0).restore_marks == ()


@pytest.mark.parametrize(
    ("field", "value"), [("files", 0), ("lines", -1), ("repeat", 0), ("epoch_records", 0), ("files", True)]
)
def test_settings_reject_values_outside_their_range_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(InvalidParameterError) as err:
        IngestSettings(**{field: value})  # type: ignore[arg-type]
    assert err.value.name == field


def test_restore_verdict_says_about_equal_within_the_factor_and_not_equal_beyond_it() -> None:
    assert restore_verdict({10: 1.0, 200: 1.2}).startswith("about equal: 1.00 s after 10 vs 1.20 s after 200")
    assert restore_verdict({10: 1.0, 200: 2.0}).startswith("NOT equal")
    assert "grows with history" in restore_verdict({10: 1.0, 200: 2.0})
    assert restore_verdict({10: 3.0, 200: 1.0}).startswith("NOT equal")
    assert "one checkpoint count only" in restore_verdict({10: 1.0})


def test_average_phases_keeps_the_runner_order_and_counts_missing_phases_as_zero() -> None:
    avg = average_phases([{"plan": 1.0, "read": 3.0, "state": 2.0}, {"read": 1.0, "plan": 3.0}])
    assert list(avg) == ["plan", "read", "state"]
    assert avg == {"plan": 2.0, "read": 2.0, "state": 1.0}
    assert average_phases([]) == {}


def _tiny_files_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], out: Path, *options: str
) -> dict[str, Any]:
    """``bench ingest --source files <options>`` on 2 files of 300 lines, one repetition, no restore:
    asserts it exits 0 and returns its JSON result."""
    code = cli.main(
        [
            "bench", "ingest", "--source", "files", *options, "--files", "2", "--lines", "300",
            "--repeat", "1", "--skip-restore", "--out", str(out), "--work-dir", str(tmp_path / "work"),
            "--json",
        ]
    )  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err[-5000:]
    result: dict[str, Any] = json.loads(captured.out.strip().splitlines()[-1])
    return result


@pytest.mark.spark
@pytest.mark.slow
def test_tiny_typed_ingest_decodes_the_same_rows_on_both_sides_with_decode_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # (the test's name has no "json": delta.tables._is_log_error takes any DeltaError whose text holds
    # "json", e.g. a missing table under a tmp_path named after the test, for a damaged log)
    out = tmp_path / "charts"
    result = _tiny_files_run(tmp_path, capsys, out, "--decode", "json")
    assert (result["decode"], result["schema"]) == ("json", JSON_SCHEMA)
    assert result["ours_sink_records"] == result["baseline_sink_records"] == 600
    assert result["exact"] is True and result["content_equal"] is True  # the same typed rows
    assert result["ratio"] == pytest.approx(
        result["ours_records_per_s"] / result["baseline_records_per_s"], abs=5.1e-5
    )
    html = (out / "ingest_json.html").read_text(encoding="utf-8")
    assert "--decode json" in html and 'id="ingest-throughput"' in html
    assert result["chart"] == str(out / "ingest_json.html")


def test_jobs_are_counted_per_span_of_submission_times_and_unknown_stays_unknown() -> None:
    submitted = {7: 100.0, 8: 100.5, 9: 101.0, 10: 102.25}  # job id -> submitted (s)
    marks = [100.5, 101.0, 102.0]  # open ended, then each epoch
    assert ingest.jobs_in(submitted, None, marks[0]) == 1  # setup: before open ended
    assert [ingest.jobs_in(submitted, a, b) for a, b in zip(marks, marks[1:], strict=False)] == [1, 1]
    assert ingest.jobs_in(submitted, None, marks[-1]) == 3 and ingest.jobs_in(submitted, None, None) == 4
    assert ingest.jobs_in(None, None, marks[0]) is None
    assert ingest.job_submissions(object(), 1, 3) is None  # no status store reachable: no figure
    assert ingest.job_submissions(object(), None, 3) is None


def test_typed_rows_compare_every_row_by_its_typed_columns_in_any_order() -> None:
    import pyarrow as pa

    rows = {"id": [2, 1], "user": ["u2", "u1"], "amount": [2.5, 1.25], "ts": [20, 10], "note": ["b", "a"]}
    spark_like = pa.table(rows)  # int64, string, double: what Spark's from_json writes
    ours = pa.table({**{k: v[::-1] for k, v in rows.items()}, "_rescued": [None, None]}).cast(
        pa.schema(
            [
                ("id", pa.int64()),
                ("user", pa.large_string()),
                ("amount", pa.float64()),
                ("ts", pa.int64()),
                ("note", pa.large_string()),
                ("_rescued", pa.string()),
            ]
        )
    )
    assert typed_rows(ours).equals(typed_rows(spark_like))
    changed = pa.table({**rows, "amount": [2.5, 1.2500001]})
    assert not typed_rows(changed).equals(typed_rows(spark_like))
    doubled = pa.concat_tables([spark_like, spark_like.slice(0, 1)])
    assert not typed_rows(doubled).equals(typed_rows(spark_like))


@pytest.mark.spark
@pytest.mark.slow
def test_tiny_ingest_with_long_lived_readers_runs_every_epoch_in_one_spark_job_and_holds_the_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = _tiny_files_run(tmp_path, capsys, tmp_path / "charts", "--readers", "long_lived")
    assert result["readers"] == "long_lived"
    assert result["ours_sink_records"] == result["baseline_sink_records"] == 600
    assert result["exact"] is True and result["content_equal"] is True
    run = result["runs"][0]
    assert len(run["ours_epochs"]) == 2 and run["ours_finished"] is True
    assert run["ours_jobs"] == 1  # the readers' one job served both epochs (per_epoch: one each)
    # counted after the run by submission time: the pool's job started in the first epoch
    assert [e["jobs"] for e in run["ours_epochs"]] == [1, 0] and run["ours_setup_jobs"] == 0
    assert len(run["ours_region_task_s"]) == result["parallelism"] * 2


def test_readers_default_to_the_pipeline_default_and_reach_our_pipeline_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from splitkeeper.config.models import Readers

    assert IngestSettings().readers == "per_epoch"
    settings = IngestSettings(readers="long_lived")
    config = ingest._ours_config(settings, str(tmp_path / "input"), str(tmp_path / "run"))
    assert config.readers is Readers.LONG_LIVED
    with pytest.raises(InvalidParameterError) as err:
        IngestSettings(readers="pooled")
    assert err.value.name == "readers" and "per_epoch or long_lived" in str(err.value)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["bench", "ingest", "--source", "files", "--readers", "pooled"])
    assert exit_.value.code == 2
    assert "invalid choice: 'pooled'" in capsys.readouterr().err
    assert "readers long_lived" in ingest.decode_text({"decode": "raw", "readers": "long_lived"})
    assert "readers" not in ingest.decode_text({"decode": "raw", "readers": "per_epoch"})


def test_decode_is_raw_or_json_and_json_figures_get_their_own_chart_page(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(InvalidParameterError) as err:
        IngestSettings(decode="csv")
    assert err.value.name == "decode"
    assert IngestSettings().decode == "raw"
    assert ingest.chart_file("ingest.html", {"decode": "raw"}) == "ingest.html"
    assert ingest.chart_file("ingest_kafka.html", {"decode": "json"}) == "ingest_kafka_json.html"
    with pytest.raises(SystemExit) as exit_:
        cli.main(["bench", "ingest", "--source", "files", "--decode", "xml"])
    assert exit_.value.code == 2
    assert "invalid choice: 'xml'" in capsys.readouterr().err


@pytest.mark.spark
@pytest.mark.slow
def test_tiny_upsert_ingest_merges_the_same_keyed_rows_on_both_sides_as_the_generator_expects(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "charts"
    result = _tiny_files_run(tmp_path, capsys, out, "--sink", "upsert")
    assert (result["sink"], result["schema"]) == ("upsert", CDC_SCHEMA)
    # our change table holds all 600 records once; both keyed tables hold the generator's live keys
    assert result["ours_sink_records"] == 600 and result["ours_duplicates"] == 0
    assert 0 < result["baseline_sink_records"] < 600
    assert result["exact"] is True and result["content_equal"] is True
    assert result["chart"] == str(out / "ingest_upsert.html")


def test_cdc_files_mix_inserts_updates_and_deletes_and_their_expected_table_is_the_fold_of_the_lines(
    tmp_path: Path,
) -> None:
    counts, expected = write_cdc_files(str(tmp_path), files=3, lines=2000, line_bytes=80, seed=3)
    assert counts == {"cdc-00000.jsonl": 2000, "cdc-00001.jsonl": 2000, "cdc-00002.jsonl": 2000}
    records = [
        json.loads(line)
        for name in sorted(counts)
        for line in (tmp_path / name).read_text(encoding="utf-8").splitlines()
    ]
    ops = [r["op"] for r in records]
    assert 0.17 < ops.count("u") / len(ops) < 0.23 and 0.01 < ops.count("d") / len(ops) < 0.03
    folded: dict[int, dict[str, object]] = {}
    files_of: dict[int, set[int]] = {}
    for i, r in enumerate(records):
        files_of.setdefault(r["id"], set()).add(i // 2000)
        if r["op"] == "d":
            assert r["id"] in folded  # only a live key is deleted
            del folded[r["id"]]
        else:
            assert (r["op"] == "c") == (r["id"] not in folded)
            folded[r["id"]] = r
    assert all(len(f) == 1 for f in files_of.values())  # a key's changes are in one file
    assert folded == expected
    assert expected_cdc_rows(expected).num_rows == len(expected)
    assert [r["ts"] for r in records] == sorted(r["ts"] for r in records)


def test_the_arrow_limit_writes_every_line_byte_for_byte_with_its_first_byte_as_offset(
    tmp_path: Path,
) -> None:
    import pyarrow.parquet as pq

    from splitkeeper_tools.bench.limit import read_and_write

    lines = [b'{"id": 1, "note": "caf\xc3\xa9"}', b"\xff\xfe not utf-8", b'a,b;"c"\tq']
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "f.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    (tmp_path / "out").mkdir()
    assert read_and_write([str(tmp_path / "in" / "f.jsonl")], str(tmp_path / "out")) == {"f.jsonl": 3}
    table = pq.read_table(tmp_path / "out" / "f.jsonl.parquet")
    assert table.column("value").to_pylist() == lines
    starts = [0, len(lines[0]) + 1, len(lines[0]) + len(lines[1]) + 2]
    assert table.column("offset").to_pylist() == starts
    assert set(table.column("split_id").to_pylist()) == {"f.jsonl"}
