"""The one logging set-up: JSON lines that carry the protocol's context, bare progress lines in text."""

from __future__ import annotations

import io
import json
import logging

import pytest

from splitkeeper import logs
from splitkeeper.cli import main


@pytest.fixture(autouse=True)
def _restore_root() -> object:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_json_lines_carry_the_bound_pipeline_and_the_record_context() -> None:
    out = io.StringIO()
    logs.configure("INFO", "json", stream=out)
    with logs.bind(pipeline="orders"):
        logging.getLogger("splitkeeper.progress").info(
            "epoch 3 regional", extra={"epoch": 3, "checkpoint_id": 3, "kind": "regional"}
        )
        logging.getLogger("splitkeeper.spark.regions").warning(
            "region 1 timed out", extra={"epoch": 3, "region": 1}
        )
    logging.getLogger("splitkeeper.progress").info("after the run")
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert lines[0]["event"] == "epoch 3 regional" and lines[0]["level"] == "info"
    assert {k: lines[0][k] for k in ("pipeline", "epoch", "checkpoint_id", "kind")} == {
        "pipeline": "orders",
        "epoch": 3,
        "checkpoint_id": 3,
        "kind": "regional",
    }
    assert lines[1]["region"] == 1 and lines[1]["level"] == "warning" and lines[1]["pipeline"] == "orders"
    assert "pipeline" not in lines[2]  # the binding ends with the block
    assert all("timestamp" in line and "logger" in line for line in lines)


def test_text_shows_progress_as_bare_lines_and_keeps_the_engines_at_warning() -> None:
    out = io.StringIO()
    logs.configure("INFO", "text", stream=out)
    logging.getLogger("splitkeeper.progress").info("epoch    1 global  2/2 regions ack")
    logging.getLogger("splitkeeper.driver").warning("a split was dropped", extra={"epoch": 2})
    logging.getLogger("py4j.clientserver").info("Closing down clientserver connection")
    logging.getLogger("airflow.models.dagrun").info("Marking run successful")
    assert out.getvalue().splitlines() == [
        "epoch    1 global  2/2 regions ack",
        "warning splitkeeper.driver: a split was dropped [epoch=2]",
    ]
    logs.configure("DEBUG", "text", stream=out)
    assert logging.getLogger("py4j").level == logging.DEBUG  # asked for: shown


def test_the_cli_takes_log_level_and_format_and_rejects_others(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["simulate", "--log-format", "xml"])
    assert "invalid choice: 'xml'" in capsys.readouterr().err
    assert main(["simulate", "--steps", "5", "--json", "--log-format", "json", "--log-level", "WARNING"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True
