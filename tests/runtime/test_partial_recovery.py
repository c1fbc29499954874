"""``recover --mode partial --readers R`` (issue 39 item 4): after the restore, only the named readers
restart, through the enumerator's partial failover (protocol rule 1.3); the result names each
restart and its decisions, the in-run check proves it, and the recovery epoch checkpoints
regionally when a restarted reader fails again. Spark and Delta, a files source."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from splitkeeper.app import services
from splitkeeper.config.settings import config_from_mapping
from splitkeeper.core.types import RecoveryDecision
from splitkeeper.delta.checkpoints import DeltaStateStore
from splitkeeper.errors import InvalidParameterError
from tests.runtime.helpers import (
    assert_sink_equals_source,
    pipeline_mapping,
    write_config,
    write_input,
)

pytestmark = pytest.mark.spark

RULE_1_3 = {
    RecoveryDecision.ADDED_BACK.value,
    RecoveryDecision.IGNORED_ALREADY_PENDING.value,
    RecoveryDecision.RETURNED_PARTIAL_FAILOVER.value,
    RecoveryDecision.IGNORED_STALE_REPORT.value,
    RecoveryDecision.ASSIGNED.value,
    RecoveryDecision.REBALANCED.value,
}


def test_partial_recovery_restarts_only_the_named_readers_and_checkpoints_regionally(
    spark, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_input(tmp_path / "in", files=6, lines=40)
    mapping = pipeline_mapping(tmp_path, "partial", tmp_path / "in", parallelism=3, epoch_records=60)
    config = config_from_mapping(mapping)
    services.run(config, epochs=1)
    store = DeltaStateStore(config.state.path, config.name, None, read_only=True)
    before = store.checkpoint_ids()
    owners = {s.split_id: r for r, st in store.latest_checkpoint().regions.items() for s in st.splits}

    for bad, says in (
        ({"mode": "partial"}, "readers=[] is not allowed: one or more reader ids with mode 'partial'"),
        ({"readers": (7,)}, "readers=[7] is not allowed: reader ids >= 0 < 3"),
        ({"readers": (1,), "mode": "global"}, "none with mode 'global'"),
        ({"readers": (1,), "parallelism": 4}, "'auto' or 'global' when the parallelism changes"),
    ):
        with pytest.raises(InvalidParameterError, match=re.escape(says)):
            services.recover(config, **bad)  # type: ignore[arg-type]
    assert store.checkpoint_ids() == before  # refused before anything was written
    from splitkeeper.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["recover", "--config", str(write_config(tmp_path / "p.yaml", mapping)), "--readers", "x"])
    assert exited.value.code == 2
    assert "--readers='x' is not allowed: reader ids separated by commas" in capsys.readouterr().err

    latest = before[-1]
    result = services.recover(config, readers=(0, 2), faults=[f"fail:2@{latest + 1}"])
    assert [line.split(" (protocol")[0] for line in result.failovers] == [
        f"reader 0 restarted from its state in checkpoint {latest}",
        f"reader 2 restarted from its state in checkpoint {latest}",
    ]
    decided = {(d.split_id, d.reader) for d in result.failover_audit if d.reader is not None}
    assert {d.decision for d in result.failover_audit} <= RULE_1_3
    assert RecoveryDecision.ADDED_BACK.value in {d.decision for d in result.failover_audit}
    assert {r for _sid, r in decided} <= {0, 2}  # reader 1 did not restart: no decision about it
    assert not [sid for sid, r in decided if owners.get(sid) == 1 and r == 1]
    assert result.restart_checks[:2] == (
        f"global restore of checkpoint {latest} (readers 0-2), before epoch {latest + 1}: "
        "rules 6.1, 6.2, 6.3, 6.5, 6.6 passed",
        f"partial failover of checkpoint {latest} (readers 0, 2), before epoch {latest + 1}: "
        "rules 6.1, 6.2, 6.3, 6.5, 6.6 passed",
    )
    assert [e.kind for e in result.epochs] == ["regional"]  # reader 2 failed again: it falls back alone
    assert result.epochs[0].failed_regions == (2,)

    services.run(config)  # to the end
    assert_sink_equals_source(spark, config.sink.path, tmp_path / "in")
