"""A record no transform can read, with ``checkpoint.on_split_failure: quarantine`` (protocol rule 1.8).

Three files of JSON lines (read as lines); one holds a line that is not JSON, so the
``enrich_json`` transform raises on it in the region task (a real failure on an
executor, not an injected one). After two failed epochs in a row the split is parked:
the other files are read to their end with global checkpoints, the restart checks pass
with the split quarantined, ``status`` names it. The operator then deploys a transform
that copes and runs ``recover --release``: the split is read from where its records
end, and the sink holds every line exactly once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.report.page import parse

from .helpers import pipeline_mapping, run_cli, sink_rows, source_records, write_config

pytestmark = [pytest.mark.spark]

BAD_LINE = 12


def _write_files(input_dir: Path) -> None:
    input_dir.mkdir(parents=True)
    for f in range(3):
        lines = [json.dumps({"user": f"u{f}-{i}", "amount": i}) for i in range(20)]
        if f == 1:
            lines[BAD_LINE] = "{not json: a producer bug"
        (input_dir / f"orders-{f}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


def _rows(html: str, table_id: str) -> list[list[str]]:
    return parse(html).rows(table_id)


def test_a_split_with_an_unreadable_record_is_quarantined_and_released_after_a_fix(
    spark: Any, tmp_path: Path
) -> None:
    input_dir = tmp_path / "in"
    _write_files(input_dir)
    mapping = pipeline_mapping(tmp_path, "orders", input_dir, parallelism=2, epoch_records=24)
    mapping["transform"] = "splitkeeper.transforms:enrich_json"
    mapping["decode"] = {"kind": "text"}
    mapping["checkpoint"].update(on_split_failure="quarantine", quarantine_after=2)
    config = write_config(tmp_path / "orders.yaml", mapping)

    code, out, err = run_cli(["run", "--config", str(config), "--epochs", "8", "--json"])
    assert code == 0, err
    assert json.loads(out)["quarantined"] == ["orders-1.jsonl"]  # the run ends: all else is read
    assert "split orders-1.jsonl quarantined: reads failed 2 epochs in a row" in err

    code, out, err = run_cli(["status", "--config", str(config), "--json"])
    assert code == 0, err
    latest = json.loads(out)["latest_checkpoint"]
    assert latest["kind"] == "global"
    (parked,) = latest["quarantined"].items()
    bad_offset = source_records(input_dir)["orders-1.jsonl"][BAD_LINE][0]
    assert parked[0] == "orders-1.jsonl" and parked[1] <= bad_offset

    rows = sink_rows(tmp_path / "sink")
    per_split = {
        sid: sorted(r.offset for r in rows if r.split_id == sid) for sid in {r.split_id for r in rows}
    }
    want = {sid: [o for o, _n, _v in recs] for sid, recs in source_records(input_dir).items()}
    assert per_split["orders-0.jsonl"] == want["orders-0.jsonl"]  # the others read to their end
    assert per_split["orders-2.jsonl"] == want["orders-2.jsonl"]
    assert all(o < parked[1] for o in per_split.get("orders-1.jsonl", []))  # nothing past where it parked

    code, out, err = run_cli(
        ["validate", "--config", str(config)]
    )  # quarantined: neither lost nor duplicated
    assert code == 0, out + err

    code, out, err = run_cli(["report", "--config", str(config)])  # the report names it, with its error
    assert code == 0, err
    page = Path(out.strip().splitlines()[-1].removeprefix("report: ")).read_text(encoding="utf-8")
    parked_rows = _rows(page, "table-parked")
    assert len(parked_rows) == 1 and parked_rows[0][0] == "orders-1.jsonl", parked_rows
    assert "reads failed 2 epochs in a row" in parked_rows[0][3]
    assert parked_rows[0][4] == str(parked[1]) and parked_rows[0][5] == "-"  # parked where status says
    # why its region declined, from the checkpoints' failures: the class, the split and the bad line's offset
    causes = {(r[4], r[5], r[6]) for r in _rows(page, "table-failures")}
    assert ("SplitReadError", "orders-1.jsonl", str(bad_offset)) in causes, causes

    mapping["transform"] = "splitkeeper.transforms:identity"  # the fix: a transform that copes
    write_config(config, mapping)
    code, out, err = run_cli(
        ["recover", "--config", str(config), "--release", "orders-1.jsonl", "--epochs", "3"]
    )
    assert code == 0, err
    assert "released from quarantine: orders-1.jsonl" in out
    code, out, err = run_cli(["status", "--config", str(config), "--json"])
    assert json.loads(out)["latest_checkpoint"]["quarantined"] == {}

    rows = sink_rows(tmp_path / "sink")
    got = sorted((r.split_id, r.offset) for r in rows)
    assert got == sorted((sid, o) for sid, offsets in want.items() for o in offsets)  # each line exactly once
    bad = [r.value for r in rows if r.split_id == "orders-1.jsonl" and r.offset == bad_offset]
    assert bad == [b"{not json: a producer bug"]
    code, out, err = run_cli(["validate", "--config", str(config)])
    assert code == 0, out + err
    code, out, err = run_cli(["report", "--config", str(config)])
    assert code == 0, err
    page = Path(out.strip().splitlines()[-1].removeprefix("report: ")).read_text(encoding="utf-8")
    (released,) = _rows(page, "table-parked")
    assert released[0] == "orders-1.jsonl" and released[4] == "-" and released[5] != "-"  # released at

    code, out, err = run_cli(["recover", "--config", str(config), "--release", "orders-1.jsonl"])
    assert code == 2 and "a quarantined split (quarantined now: none)" in err


def test_a_run_that_ends_with_every_split_quarantined_fails_and_status_says_blocked(
    spark: Any, tmp_path: Path
) -> None:
    """Issue 36: with its only split quarantined the run exited 0 saying "caught up" while it read
    nothing. Now the run ends with ``[ALL_QUARANTINED]`` (exit 2: a failed Airflow task), what it
    committed kept, and ``status`` says BLOCKED (exit 1) until the split is released."""
    input_dir = tmp_path / "in"
    input_dir.mkdir()
    lines = [json.dumps({"user": f"u{i}", "amount": i}) for i in range(6)]
    lines[3] = "{not json: a producer bug"
    (input_dir / "only.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    mapping = pipeline_mapping(tmp_path, "parked", input_dir, parallelism=1, epoch_records=2)
    mapping["transform"] = "splitkeeper.transforms:enrich_json"
    mapping["decode"] = {"kind": "text"}
    mapping["checkpoint"].update(on_split_failure="quarantine", quarantine_after=2)
    config = write_config(tmp_path / "parked.yaml", mapping)

    code, out, err = run_cli(["run", "--config", str(config), "--epochs", "8"])
    assert code == 2 and out == "", out
    assert "[ALL_QUARANTINED] pipeline 'parked': every split is quarantined (only.jsonl)" in err
    assert "caught up" not in err
    committed = sorted(r.offset for r in sink_rows(tmp_path / "sink"))
    assert committed == [o for o, _n, _v in source_records(input_dir)["only.jsonl"][:2]]  # kept

    code, out, err = run_cli(["status", "--config", str(config)])
    assert code == 1, err
    assert "BLOCKED: every split is quarantined (1)" in out and "recover --release" in out
