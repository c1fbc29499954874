"""``splitkeeper-tools bench assign`` runs the real enumerator path; checked on counts, not timing."""

from __future__ import annotations

import json

import pytest

from splitkeeper_tools.bench.assign import bench_assign
from splitkeeper_tools.cli import main


def test_bench_assign_json_reports_figures_and_moves_only_the_failed_readers_splits(capsys):
    code = main(["bench", "assign", "--json", "--splits", "3000", "--readers", "30"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0
    for key in ("full_assignment_s", "failover_s", "failover_moved", "failed_reader_splits", "discovery_s"):
        assert key in result
    assert result["splits"] == 3000 and result["readers"] == 30
    assert result["unassigned_after_full"] == 0
    assert (result["load_min"], result["load_max"]) == (100, 100)
    assert result["failed_reader_splits"] == 100
    assert result["failover_moved"] == result["failed_reader_splits"]
    assert result["failover_moved_from_other_readers"] == 0
    assert result["restart_moved"] == 0  # a restarted reader gets its own splits back (sticky)
    assert result["final_load_spread"] <= 1


@pytest.mark.parametrize("strategy", ["round-robin", "least-loaded", "weighted", "legacy-hash"])
def test_bench_assign_runs_every_strategy_with_uneven_counts(strategy):
    result = bench_assign(1001, 7, strategy)
    assert result["unassigned_after_full"] == 0
    assert result["failover_moved"] == result["failed_reader_splits"] > 0
    assert result["failover_moved_from_other_readers"] == 0
    if strategy == "legacy-hash":
        # the fixed hash owner is gone: its splits wait in the pool (the legacy limitation)
        assert result["unassigned_after_failover"] == result["failed_reader_splits"]
    else:
        assert result["unassigned_after_failover"] == 0
        assert result["final_load_spread"] <= 1


def test_bench_assign_table_output_names_targets(capsys):
    assert main(["bench", "assign", "--splits", "500", "--readers", "5"]) == 0
    out = capsys.readouterr().out
    assert "full assignment" in out and "target < 1.0 s" in out and "reader lost" in out


def test_bench_bad_arguments_are_clear_errors(capsys):
    assert main(["bench", "assign", "--splits", "10", "--readers", "1"]) == 2
    assert "readers=1 is not allowed: an integer >= 2" in capsys.readouterr().err
    assert main(["bench", "ingestion"]) == 2
    assert "benchmark='ingestion' is not allowed: one of assign" in capsys.readouterr().err
    assert main(["bench", "assign", "--strategy", "fast", "--splits", "10", "--readers", "2"]) == 2
    assert "strategy='fast' is not allowed" in capsys.readouterr().err
