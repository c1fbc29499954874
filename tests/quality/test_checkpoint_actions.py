"""The restart checks run as one Great Expectations Checkpoint; a pipeline attaches its own actions.

A real ``ValidationAction`` subclass defined here records what the checkpoint handed it (its
result: success, each suite's verdict and offending split ids; the Data Docs pages the
``UpdateDataDocsAction`` built before it) to a JSON-lines file. A failing check and a passing one
each fire it; the Data Docs index keeps both runs. ``checks.actions`` names such an action in a
pipeline file (a function marked ``@checkpoint_action``); a wrong one is refused at load.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

import pytest
from great_expectations.checkpoint import ValidationAction

from splitkeeper import checkpoint_action
from splitkeeper.config.settings import load_config
from splitkeeper.delta.checkpoints import DeltaStateStore
from splitkeeper.errors import ConfigError
from splitkeeper.quality.checks import resolve_actions
from tests.quality.test_expectations import (
    PIPELINE,
    copy_of,
    failing,
    healthy,
    run_checks,
    split_owned_twice,
    write,
)

pytestmark = pytest.mark.spark

RECORD_ENV = "SPLITKEEPER_TEST_ACTION_RECORD"


class RecordAction(ValidationAction):
    """Appends one JSON line per checkpoint run to ``path``: what a Slack or e-mail action would see."""

    type: Literal["splitkeeper_test_record"] = "splitkeeper_test_record"
    path: str

    def run(self, checkpoint_result: Any, action_context: Any = None) -> dict:
        suites = {}
        for result in checkpoint_result.run_results.values():
            failed = {
                str(r.expectation_config.kwargs["column"]): sorted(
                    {str(row["split_id"]) for row in (r.result or {}).get("unexpected_index_list") or []}
                )
                for r in result.results
                if not r.success
            }
            suites[result.suite_name] = {"success": bool(result.success), "failed": failed}
        pages = [
            url
            for key_pages in (self._get_data_docs_pages_from_prior_action(action_context) or {}).values()
            for url in key_pages.values()
        ]
        line = {
            "checkpoint": checkpoint_result.name,
            "run_name": checkpoint_result.run_id.run_name,
            "success": bool(checkpoint_result.success),
            "suites": suites,
            "data_docs_pages": pages,
        }
        with open(self.path, "a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")
        return {"recorded": self.path}


@checkpoint_action
def record_to_file() -> RecordAction:
    """What a pipeline's ``checks.actions`` names: returns the action, configured from the environment."""
    return RecordAction(name="record", path=os.environ[RECORD_ENV])


@checkpoint_action
def not_an_action() -> str:
    return "slack"


def unmarked() -> RecordAction:
    return RecordAction(name="record", path="unused")


@pytest.fixture(scope="module")
def healthy_state(spark, tmp_path_factory) -> Path:
    """test_expectations' healthy scenario (two readers, a regional checkpoint 2), written once."""
    root = tmp_path_factory.mktemp("healthy")
    write(spark, root, healthy())
    return root


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_a_failing_and_a_passing_check_fire_the_pipelines_action_and_the_data_docs_keep_both(
    spark, healthy_state, tmp_path, monkeypatch
):
    record = tmp_path / "actions.jsonl"
    monkeypatch.setenv(RECORD_ENV, str(record))
    actions = resolve_actions([f"{__name__}:record_to_file"])
    docs = tmp_path / "docs"

    store, sink = copy_of(spark, healthy_state, tmp_path)
    split_owned_twice(spark, store, sink)  # checkpoint 3: reader 0 also holds orders-1
    failed = run_checks(spark, store, sink, docs, actions=actions)

    assert not failed.success
    assert failing(failed) == {
        ("ownership", "expect_column_values_to_be_null(owned_more_than_once)"): ("orders-1",)
    }
    (first,) = _records(record)
    assert first["checkpoint"] == first["run_name"] == f"{PIPELINE}-checkpoint-3"
    assert first["success"] is False
    assert first["suites"]["splitkeeper_ownership"] == {
        "success": False,
        "failed": {"owned_more_than_once": ["orders-1"]},
    }
    assert all(v["success"] for k, v in first["suites"].items() if k != "splitkeeper_ownership")
    assert first["data_docs_pages"] and all(p.startswith("file://") for p in first["data_docs_pages"])

    healthy = DeltaStateStore(healthy_state / "state", PIPELINE, "kafka:orders")
    passed = run_checks(spark, healthy, str(healthy_state / "sink"), docs, actions=actions)

    assert passed.success, passed.summary()
    second = _records(record)[1]
    assert second["run_name"] == f"{PIPELINE}-checkpoint-2"
    assert second["success"] is True
    assert second["suites"] and all(v == {"success": True, "failed": {}} for v in second["suites"].values())

    assert passed.data_docs_index == (docs / "index.html").resolve()
    index = passed.data_docs_index.read_text(encoding="utf-8")
    assert f"{PIPELINE}-checkpoint-3" in index and f"{PIPELINE}-checkpoint-2" in index  # the history
    pages = {p.relative_to(docs).parts[1] for p in (docs / "validations").rglob("*.html")}
    assert "splitkeeper_ownership" in pages
    run_pages = [str(p) for p in (docs / "validations" / "splitkeeper_ownership").rglob("*.html")]
    assert any(f"{PIPELINE}-checkpoint-3" in p for p in run_pages)
    assert any(f"{PIPELINE}-checkpoint-2" in p for p in run_pages)


def test_checks_actions_names_a_marked_factory_and_a_wrong_one_is_refused_at_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "incoming").mkdir()
    base = "name: orders\nsource: {kind: files, path: incoming}\nstate: {path: state}\nsink: {path: sink}\n"

    def load(actions: str) -> Any:
        path = tmp_path / "p.yaml"
        path.write_text(base + f"checks: {{actions: [{actions}]}}\n")
        return load_config(path)

    good = f"'{__name__}:record_to_file'"
    assert load(good).checks.actions == [f"{__name__}:record_to_file"]
    assert load_config(_write(tmp_path, base)).checks.actions == []

    for spec, why in (
        ("os:system", "os:system is not marked as a checkpoint action"),
        (f"{__name__}:unmarked", "is not marked as a checkpoint action"),
        ("splitkeeper.transforms:identity", "is not marked as a checkpoint action"),
        ("no_such_module_x:f", "cannot be imported"),
    ):
        with pytest.raises(ConfigError) as info:
            load(f"{good}, '{spec}'")
        assert info.value.params["key"] == "checks.actions[1]", spec
        assert why in info.value.message, info.value.message
        assert "a module-level function marked @checkpoint_action" in info.value.message  # what is allowed
        if "not marked" in why:  # the fix
            assert "decorate it in its module with @checkpoint_action (from splitkeeper import" in (
                info.value.message
            )
    with pytest.raises(ConfigError) as info:
        load("'not a spec'")
    assert "checks.actions" in str(info.value)

    monkeypatch.setenv(RECORD_ENV, str(tmp_path / "r.jsonl"))
    (action,) = resolve_actions([f"{__name__}:record_to_file"])
    assert isinstance(action, RecordAction)
    with pytest.raises(ConfigError) as info:
        resolve_actions([f"{__name__}:record_to_file", f"{__name__}:not_an_action"])
    assert info.value.params["key"] == "checks.actions[1]"
    assert "it returned a str, not an instance of a great_expectations.checkpoint.ValidationAction" in (
        info.value.message
    )


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "plain.yaml"
    path.write_text(text)
    return path


def test_a_frame_whose_index_columns_repeat_is_read_back_by_row_position(tmp_path: Path) -> None:
    """GE names an offending row by the frame's index; where the suite's index columns are not
    unique (two rows of one split), the frame keeps its row positions and the report reads the
    split ids back from it: every offender is still named."""
    import great_expectations as gx
    import pyarrow as pa

    from splitkeeper.quality import checks

    spec = checks.load_suite_specs(keys=("ownership",))["ownership"]
    table = pa.table(
        {
            "split_id": ["orders-1", "orders-1", "orders-2"],
            "owned_more_than_once": ["held by readers 0 and 1", None, "held by readers 0 and 1"],
            "not_owned": [None, None, None],
        }
    )
    path, frame = checks._write_batch(table, spec.index_columns, tmp_path / "split_places.parquet")
    assert frame is not None  # not unique: by position
    context = checks._context(tmp_path / "docs")
    batch = (
        context.data_sources.add_pandas(name="splitkeeper")
        .add_parquet_asset(name="split_places", path=path)
        .add_batch_definition_whole_dataframe("all")
    )
    definition = context.validation_definitions.add(
        gx.ValidationDefinition(name="ownership", data=batch, suite=context.suites.add(spec.to_suite()))
    )
    checkpoint = context.checkpoints.add(
        gx.Checkpoint(
            name="positions",
            validation_definitions=[definition],
            actions=checks._checkpoint_actions(()),
            result_format={"result_format": "COMPLETE"},
        )
    )
    (result,) = checkpoint.run().run_results.values()
    outcome = next(
        checks._outcome_of(r, spec, frame)
        for r in result.results
        if r.expectation_config.kwargs["column"] == "owned_more_than_once"
    )
    assert not outcome.success
    assert outcome.unexpected_count == 2
    assert outcome.split_ids == ("orders-1", "orders-2")
    assert outcome.details == ("held by readers 0 and 1",)
    assert (tmp_path / "docs" / "index.html").is_file()
