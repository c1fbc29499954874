"""The incident workflow on real parts: ``recover --checkpoint N --rewind`` and ``offsets`` / ``offsets
reset`` on a file pipeline run by Spark, then the next run, then the restart checks and the sink by
content. The commands themselves start no Spark; the SIGKILL tests kill the command (a child process)
at each step and check that the pipeline is either as it was or fully rewound, never between.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from splitkeeper.app import incident, services
from splitkeeper.config.settings import PipelineConfig, config_from_mapping
from splitkeeper.delta.checkpoints import DeltaStateStore
from splitkeeper.errors import CheckpointError, ConcurrentRunError, InvalidParameterError
from splitkeeper.sinks.delta.sink import DeltaSink
from splitkeeper.spark.faults import CRASH_ENV
from tests.state.samples import tree

from .helpers import (
    assert_sink_equals_source,
    pipeline_mapping,
    run_cli,
    run_pipeline,
    sink_rows,
    source_records,
    splitkeeper_subprocess,
    tools_subprocess,
    write_config,
    write_input,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _pipeline(
    tmp_path: Path, name: str, *, epochs: int, spark: Any, lines: int = 40
) -> tuple[PipelineConfig, Path]:
    input_dir = tmp_path / "in"
    write_input(input_dir, files=3, lines=lines)
    mapping = pipeline_mapping(
        tmp_path, name, input_dir, parallelism=2, epoch_records=30, retain_checkpoints=10
    )
    write_config(tmp_path / "pipeline.yaml", mapping)
    config = config_from_mapping(mapping)
    run_pipeline(config, spark, epochs=epochs)
    return config, input_dir


def _store(config: PipelineConfig) -> DeltaStateStore:
    return DeltaStateStore(config.state.path, config.name, None, read_only=True)


def _sink(config: PipelineConfig) -> DeltaSink:
    return DeltaSink(config.sink.path, config.name, read_only=True)


def _positions(config: PipelineConfig, checkpoint: int | None = None) -> dict[str, int | None]:
    from splitkeeper.core.lag import split_places

    store = _store(config)
    cp = store.latest_checkpoint() if checkpoint is None else store.load_checkpoint(checkpoint)
    assert cp is not None
    return {sid: p.position for sid, p in split_places(cp).items()}


def _check(config: PipelineConfig, spark: Any) -> None:
    """The restart checks pass (InvariantViolation naming the splits otherwise), content included."""
    services.validate(config, content=True)


def test_a_dry_run_writes_nothing_then_the_rewind_restores_state_and_sink_and_the_next_run_is_exact(
    spark: Any, tmp_path: Path
) -> None:
    config, input_dir = _pipeline(tmp_path, "rewind", epochs=3, spark=spark)
    store = _store(config)
    assert store.checkpoint_ids() == [1, 2, 3]
    at_one = {(r.split_id, r.offset, r.value) for r in sink_rows(config.sink.path) if r.epoch <= 1}
    before = tree(tmp_path / "state"), tree(tmp_path / "sink")

    code, out, err = run_cli(
        ["recover", "--config", str(tmp_path / "pipeline.yaml"), "--checkpoint", "1", "--rewind"]
    )
    assert code == 0, err
    assert "would rewind from checkpoint 3 to checkpoint 1 (committed as checkpoint 4)" in out
    assert "nothing was written" in out
    assert (tree(tmp_path / "state"), tree(tmp_path / "sink")) == before  # not even a lease commit

    plan = incident.rewind(config, 1, dry_run=True)
    sink_plan = next(t for t in plan.tables if t["table"] == "sink")
    leaving = sum(1 for r in sink_rows(config.sink.path) if r.epoch > 1)
    assert sink_plan["rows_leaving"] == leaving > 0
    # every offset read after checkpoint 1 is undone: the byte spans of the rows that leave
    assert plan.offsets_undone == sum(
        r.next_offset - r.offset for r in sink_rows(config.sink.path) if r.epoch > 1
    )
    assert [t["table"] for t in plan.tables] == ["sink"]  # no dead letters, no change table here

    with pytest.raises(InvalidParameterError, match="reason"):
        incident.rewind(config, 1, yes=True)
    assert (tree(tmp_path / "state"), tree(tmp_path / "sink")) == before

    # maintain compacts the sink and VACUUMs with 0 hours, yet keeps what a rewind to checkpoint 1 needs
    services.maintain(config, history_hours=0)
    done = incident.rewind(config, 1, yes=True, reason="bad transform shipped at 10:00")
    assert done.applied and done.epoch == 4
    assert {(r.split_id, r.offset, r.value) for r in sink_rows(config.sink.path)} == at_one
    assert _positions(config) == _positions(config, 1)
    assert _store(config).checkpoint_ids()[-1] == 4
    assert _sink(config).committed_epoch() == 4
    audit = _store(config).tables.read("audit").to_pylist()
    rewound = [a for a in audit if a["checkpoint_id"] == 4 and a["decision"] == "rewound"]
    assert rewound and all("bad transform shipped at 10:00" in a["detail"] for a in rewound)

    summary = run_pipeline(config, spark)
    assert summary.finished and summary.epochs[0].epoch == 5
    assert_sink_equals_source(spark, config.sink.path, input_dir)
    _check(config, spark)


def test_refused_rewinds_write_nothing_and_the_on_call_commands_answer_without_a_jvm(
    spark: Any, tmp_path: Path
) -> None:
    config, _input = _pipeline(tmp_path, "refused", epochs=3, spark=spark)
    before = tree(tmp_path / "state"), tree(tmp_path / "sink")
    with pytest.raises(CheckpointError, match=r"checkpoint 3 is the latest checkpoint.*restored: \[1, 2\]"):
        incident.rewind(config, 3, yes=True, reason="x")
    with pytest.raises(CheckpointError, match=r"after the latest"):
        incident.rewind(config, 9, yes=True, reason="x")
    with services.writer_lease(config):
        held = tree(tmp_path / "state")
        with pytest.raises(ConcurrentRunError, match=r"holds the pipeline's lease.*restored: \[1, 2\]"):
            incident.rewind(config, 1, yes=True, reason="x")
        with pytest.raises(ConcurrentRunError, match="holds the pipeline's lease"):
            incident.reset_offset(config, sorted(_positions(config))[0], "latest")
        assert tree(tmp_path / "state") == held
    code, _out, err = run_cli(["recover", "--config", str(tmp_path / "pipeline.yaml"), "--checkpoint", "1"])
    assert code != 0 and "--rewind" in err
    assert tree(tmp_path / "sink") == before[1]

    # the on-call commands answer without a JVM: ``bench incident`` runs status, offsets and every dry
    # run as fresh processes with JAVA_HOME pointing nowhere (a JVM start would fail the command)
    state = tree(tmp_path / "state")
    bench = tools_subprocess(
        ["bench", "incident", "--config", str(tmp_path / "pipeline.yaml"), "--repeat", "1", "--json"]
    )
    assert bench.returncode == 0, bench.stderr[-3000:]
    figures = json.loads(bench.stdout)["commands"]
    assert sorted(figures) == sorted(
        ["status", "offsets", "recover --dry-run", "recover --rewind (plan)", "offsets reset --dry-run"]
    )
    assert all(f["median_s"] > 0 for f in figures.values())
    assert (tree(tmp_path / "state"), tree(tmp_path / "sink")) == (state, before[1])  # dry runs write nothing


def test_offsets_lists_every_split_and_resets_forward_and_back_with_exact_accounting(
    spark: Any, tmp_path: Path
) -> None:
    config, input_dir = _pipeline(tmp_path, "offsets", epochs=2, spark=spark)
    path = str(tmp_path / "pipeline.yaml")
    code, out, err = run_cli(["offsets", "--config", path, "--json"])
    assert code == 0, err
    listed = json.loads(out)
    assert listed["checkpoint"] == 2
    live = [s for s in listed["splits"] if s["status"] != "finished"]
    assert live and all(s["lag"] == s["end"] - s["position"] for s in live)
    ahead, back = live[0], live[-1]

    # forward: the offsets skipped never reach the sink, and the checks accept exactly that gap
    lines = source_records(input_dir)[ahead["split_id"]]
    skip_to = next(o for o, _n, _v in lines if o > ahead["position"] + 60)  # two or three lines ahead
    dry = incident.reset_offset(config, ahead["split_id"], f"offset:{skip_to}", dry_run=True)
    assert not dry.applied and dry.change["skipped"] == skip_to - ahead["position"]
    code, out, err = run_cli(
        [
            "offsets",
            "reset",
            "--config",
            path,
            "--split",
            ahead["split_id"],
            "--to",
            f"offset:{skip_to}",
            "--reason",
            "poison",
        ]
    )
    assert code == 0, err
    assert f"position {ahead['position']} set to {skip_to}" in out
    # backward: the split's records from the new offset leave the sink and are read again once
    starts = sorted(r.offset for r in sink_rows(config.sink.path) if r.split_id == back["split_id"])
    back_to = starts[-3]  # three records back: a line start (a file's offsets are bytes)
    with pytest.raises(InvalidParameterError, match="where a line of .* starts"):
        incident.reset_offset(config, back["split_id"], f"offset:{back_to + 1}", dry_run=True)
    again = [r for r in sink_rows(config.sink.path) if r.split_id == back["split_id"] and r.offset >= back_to]
    result = incident.reset_offset(config, back["split_id"], f"offset:{back_to}", reason="reprocess")
    assert result.applied and result.rows_leaving["sink"] == len(again) > 0
    assert not [
        r for r in sink_rows(config.sink.path) if r.split_id == back["split_id"] and r.offset >= back_to
    ]

    run_pipeline(config, spark)
    rows = sink_rows(config.sink.path)
    expected = source_records(input_dir)
    skipped = {
        (ahead["split_id"], o)
        for o, _n, _v in expected[ahead["split_id"]]
        if ahead["position"] <= o < skip_to
    }
    want = {(sid, o, v) for sid, recs in expected.items() for o, _n, v in recs if (sid, o) not in skipped}
    assert sorted((r.split_id, r.offset, r.value) for r in rows) == sorted(want)  # once each, by content
    _check(config, spark)
    page = services.report(config).read_text(encoding="utf-8")  # the report lists what operators did
    assert "Operator actions" in page and "skipped_by_operator" in page and "reset_by_operator" in page
    assert "by " in page and ": poison" in page


@pytest.mark.parametrize(
    "point",
    [
        "after_decision",
        "before_checkpoint_row",
        # no side table here: test_upsert_crash kills a rewind there with keyed, change and dead-letter tables
        pytest.param("before_side_commit", marks=pytest.mark.slow_variant),
        "after_checkpoint_row",
    ],
)
def test_a_rewind_killed_at_each_step_leaves_the_pipeline_as_it_was_or_fully_rewound(
    point: str, spark: Any, tmp_path: Path
) -> None:
    config, input_dir = _pipeline(tmp_path, f"killed-{point}".replace("_", "-"), epochs=3, spark=spark)
    at_three = sorted((r.split_id, r.offset) for r in sink_rows(config.sink.path))
    at_one = sorted((r.split_id, r.offset) for r in sink_rows(config.sink.path) if r.epoch <= 1)
    argv = [
        "recover",
        "--config",
        str(tmp_path / "pipeline.yaml"),
        "--checkpoint",
        "1",
        "--rewind",
        "--yes",
        "--reason",
        "test",
    ]
    crashed = splitkeeper_subprocess(argv, **{CRASH_ENV: f"{point}@4"})
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    sink_now = sorted((r.split_id, r.offset) for r in sink_rows(config.sink.path))
    rewound_sink = _sink(config).committed_epoch() == 4
    assert sink_now == (at_one if rewound_sink else at_three)  # the sink is whole, one way or the other
    # whatever the next command sees is one of the two: status shows the latest it can restore
    again = incident.rewind(config, 1, dry_run=True) if not rewound_sink else None
    if again is not None:
        assert again.from_checkpoint == 3
    summary = run_pipeline(config, spark)
    assert summary.finished
    assert_sink_equals_source(spark, config.sink.path, input_dir)
    audit = _store(config).tables.read("audit").to_pylist()
    assert any(a["decision"] == "rewound" for a in audit) == rewound_sink  # one operator checkpoint, or none
    _check(config, spark)


@pytest.mark.parametrize("point", ["before_checkpoint_row", "after_decision"])
def test_a_backward_offset_reset_killed_mid_way_is_either_not_done_or_done_and_the_sink_stays_exact(
    point: str, spark: Any, tmp_path: Path
) -> None:
    config, input_dir = _pipeline(tmp_path, f"reset-{point}".replace("_", "-"), epochs=2, spark=spark)
    live = [s for s in incident.offsets(config).splits if s.status != "finished"]
    split = live[0].split_id
    starts = sorted(r.offset for r in sink_rows(config.sink.path) if r.split_id == split)
    back_to = starts[-4]
    argv = [
        "offsets",
        "reset",
        "--config",
        str(tmp_path / "pipeline.yaml"),
        "--split",
        split,
        "--to",
        f"offset:{back_to}",
    ]
    crashed = splitkeeper_subprocess(argv, **{CRASH_ENV: f"{point}@3"})
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    deleted = not [r for r in sink_rows(config.sink.path) if r.split_id == split and r.offset >= back_to]
    assert deleted == (_sink(config).committed_epoch() == 3)  # the delete is the sink commit of epoch 3
    run_pipeline(config, spark)  # finishes the reset from its sink commit (or never saw it), then reads on
    assert_sink_equals_source(spark, config.sink.path, input_dir)
    audit = _store(config).tables.read("audit").to_pylist()
    assert any(a["decision"] == "reset_by_operator" for a in audit) == deleted
    _check(config, spark)


def test_a_forward_then_backward_reset_runs_on_and_a_pipeline_wedged_by_an_older_version_is_repaired(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 36, item 14. Back to where a forward reset left the split, the backward reset's delete
    matches no row; its sink commit must record the epoch all the same, or every later open finds the
    checkpoint ahead of the sink (``[STATE_ERROR] ... the sink lost those commits``) while ``status``
    said healthy and ``recover --repair`` found nothing. Then a pipeline wedged so by an older
    splitkeeper (its reset's sink commit stood in for by an ``operator_commit`` that writes nothing):
    status names the problem and exits 1, the repair records the reset, and the run goes on exactly."""
    config, input_dir = _pipeline(tmp_path, "fwd-back", epochs=2, spark=spark)
    path = str(tmp_path / "pipeline.yaml")
    live = [s for s in incident.offsets(config).splits if s.status != "finished"]
    split = live[0]
    lines = source_records(input_dir)[split.split_id]
    ahead = next(o for o, _n, _v in lines if o > split.position)  # the next line start
    assert incident.reset_offset(config, split.split_id, f"offset:{ahead}", reason="skip one").applied
    back = incident.reset_offset(config, split.split_id, f"offset:{split.position}", reason="undo")
    assert back.applied and back.rows_leaving["sink"] == 0
    assert _sink(config).committed_epoch() == back.epoch == 4 == _store(config).checkpoint_ids()[-1]
    assert not services.status(config).problems

    # the same again, with the sink commit of the backward reset missing, as an older version left it
    incident.reset_offset(config, split.split_id, f"offset:{ahead}", reason="skip one")
    with monkeypatch.context() as patched:
        patched.setattr(DeltaSink, "operator_commit", lambda *_a, **_k: None)
        incident.reset_offset(config, split.split_id, f"offset:{split.position}", reason="undo")
    assert _sink(config).committed_epoch() == 5 and _store(config).checkpoint_ids()[-1] == 6
    code, out, err = run_cli(["status", "--config", path])
    assert code == 1, err
    assert "BLOCKED: [STATE_ERROR]" in out and "the sink records epoch 5 as its last commit" in out
    assert "recover --repair" in out
    code, out, err = run_cli(["run", "--config", path])
    assert code == 2 and "the state's latest checkpoint is 6" in err
    code, out, err = run_cli(["recover", "--config", path, "--repair", "--dry-run"])
    assert code == 0 and "checkpoint 6: the offset reset would be recorded in the sink" in out, out + err
    assert _sink(config).committed_epoch() == 5
    code, out, err = run_cli(["recover", "--config", path, "--repair"])
    assert code == 0 and "checkpoint 6: the offset reset was recorded in the sink" in out, out + err
    assert _sink(config).committed_epoch() == 6
    code, out, err = run_cli(["status", "--config", path, "--json"])
    assert code == 0 and json.loads(out)["problems"] == [], out + err

    run_pipeline(config, spark)
    assert_sink_equals_source(spark, config.sink.path, input_dir)  # nothing skipped in the end
    _check(config, spark)
