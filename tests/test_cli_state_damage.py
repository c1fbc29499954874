"""Damaged state through the CLI: ``status``, ``validate``, ``recover --dry-run`` and ``run`` all
end with one ``[STATE_ERROR]`` line naming the table and the file (exit 2, no traceback), and the
repair the error advises (``recover --repair``) works through the CLI, after which ``run``
finishes the input exactly once, checked line by line.

The state is real: written by the real driver, store and sink (the state tests' LocalPipeline,
no Spark), then read by the CLI with the shared Spark session (one per module).
"""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Any

import pytest

from tests.runtime.helpers import run_cli, write_config
from tests.state.samples import LocalPipeline, assert_sink_is_input, file_lines, sink_lines

COMMANDS = (["status"], ["validate"], ["recover", "--dry-run"], ["run"])


def _pipeline(tmp_path: Path) -> tuple[LocalPipeline, Path]:
    pipeline = LocalPipeline(tmp_path / "pipé line")  # a space and non-ASCII too
    pipeline.write_input(files=2, lines=30)
    pipeline.run(3)
    config = write_config(
        tmp_path / "orders.yaml",
        {
            "name": pipeline.name,
            "parallelism": pipeline.parallelism,
            "source": {"kind": "files", "path": str(pipeline.root / "in"), "format": "lines"},
            "backlog": {"backlog_epoch_records": 20, "normal_epoch_records": 20},
            "checkpoint": {"retain_checkpoints": pipeline.retain},
            "state": {"path": pipeline.state},
            "sink": {"path": pipeline.sink_path},
        },
    )
    return pipeline, config


def _assert_refused_everywhere(config: Path, *named: str) -> None:
    for command in COMMANDS:
        code, _out, err = run_cli([*command, "--config", str(config)])
        assert code == 2, (command, code, err)
        assert "Traceback" not in err and "ArrowInvalid" not in err and "DeltaError" not in err, err
        (line,) = [e for e in err.splitlines() if "[STATE_ERROR]" in e]
        for text in named:
            assert text in line, (command, text, line)
        assert "recover --config <the pipeline config> --repair" in line


@pytest.mark.parametrize("damage", ["truncated parquet", "garbage log entry"])
def test_damaged_enumerator_state_is_named_by_every_command_and_recover_repair_fixes_it(
    tmp_path: Path, spark: Any, damage: str
) -> None:
    pipeline, config = _pipeline(tmp_path)
    table = f"{pipeline.state}/enumerator_state"
    if damage == "truncated parquet":
        latest = max(glob.glob(f"{table}/checkpoint_id=*"), key=lambda p: int(p.rsplit("=", 1)[1]))
        (damaged,) = glob.glob(f"{latest}/*.parquet")
        os.truncate(damaged, 100)
        _assert_refused_everywhere(config, "table enumerator_state", damaged)
    else:
        damaged = sorted(glob.glob(f"{table}/_delta_log/*.json"))[-1]
        Path(damaged).write_text('{"commitInfo": {"trunc')
        _assert_refused_everywhere(config, f"the Delta table at {table}", f"log file {damaged}")

    code, out, err = run_cli(["recover", "--config", str(config), "--repair", "--dry-run"])
    assert code == 0, err
    assert f"damaged: {damaged} (would be moved aside" in out and "dry run: nothing was written" in out
    assert os.path.exists(damaged)

    code, out, err = run_cli(["recover", "--config", str(config), "--repair"])  # the advice
    assert code == 0, err
    assert f"damaged: {damaged} (was moved aside" in out
    assert "enumerator_state rows was rewritten from its decision record" in out
    aside = Path(damaged.replace("/state/enumerator_state/", "/state/_damaged/enumerator_state/"))
    assert aside.read_bytes() != b"" and os.path.exists(damaged) == (damage == "garbage log entry")

    code, out, err = run_cli(["status", "--config", str(config)])
    assert code == 0, err
    code, out, err = run_cli(["run", "--config", str(config)])
    assert code == 0, err
    assert_sink_is_input(pipeline)
    code, out, err = run_cli(["validate", "--config", str(config)])
    assert code == 0, err + out


def test_a_pipeline_with_spaces_non_ascii_home_and_relative_paths_runs_through_the_cli(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "hö me"
    (home / "in put").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    for f in range(2):
        (home / "in put" / f"día {f}.txt").write_text("".join(f"línea {f}-{i}\n" for i in range(30)))
    config = write_config(
        tmp_path / "conf dir" / "orders.yaml",
        {
            "name": "orders",
            "parallelism": 2,
            "source": {"kind": "files", "path": "~/in put", "format": "lines"},
            "backlog": {"backlog_epoch_records": 40, "normal_epoch_records": 40},
            "state": {"path": "st ate/état"},  # relative to the config's folder
            "sink": {"path": "~/sí nk"},
            "staging": {"path": "../stag ing"},
        },
    )
    code, _out, err = run_cli(["run", "--config", str(config), "--epochs", "1"])
    assert code == 0, err
    code, _out, err = run_cli(["run", "--config", str(config)])  # a restart, then to the end
    assert code == 0, err
    for command in (["status"], ["recover", "--dry-run"]):
        code, _out, err = run_cli([*command, "--config", str(config)])
        assert code == 0, (command, err)
    assert (tmp_path / "conf dir" / "st ate" / "état" / "checkpoints" / "_delta_log").is_dir()
    assert (tmp_path / "stag ing").is_dir()
    got = sink_lines(str(home / "sí nk"))
    assert {Path(k).name: v for k, v in got.items()} == file_lines(home / "in put")
