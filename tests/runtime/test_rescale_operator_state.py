"""The P=4 -> 2 -> 1 walk-through of protocol rule 2.8 on the Spark runtime, both operator-state modes.

``rescale.operator_state`` in the pipeline config chooses even-split or union; ``recover
--parallelism`` (the application service) rescales from the latest checkpoint, with a region
failing in the first epoch at each new parallelism so that the checkpoint is regional and the
failed region contributes the state the restore gave it. The expected operator states are
computed from the checkpoint rows the store holds, not written down: even-split cuts the
concatenation of the regions' lists into contiguous pieces, union gives every region all of it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from splitkeeper.app import services
from splitkeeper.app.pipeline import Pipeline
from splitkeeper.config.settings import config_from_mapping
from splitkeeper.core.types import CheckpointKind

from .helpers import assert_sink_equals_source, pipeline_mapping, write_input

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _lists(store: Any, checkpoint_id: int) -> list[tuple[str, ...]]:
    checkpoint = store.load_checkpoint(checkpoint_id)
    return [tuple(checkpoint.regions[r].operator_state) for r in sorted(checkpoint.regions)]


@pytest.mark.parametrize("mode", ["even-split", "union"])
def test_rescale_four_to_two_to_one_redistributes_operator_state_as_configured(
    mode: str, spark: Any, tmp_path: Path
) -> None:
    input_dir = tmp_path / "in"
    write_input(input_dir, files=4, lines=60)
    mapping = pipeline_mapping(
        tmp_path, f"walk-{mode}", input_dir, parallelism=4, epoch_records=40, max_failure_ratio=1.0
    )
    mapping["checkpoint"]["max_consecutive_failures"] = 2
    mapping["rescale"] = {"operator_state": mode}
    config = config_from_mapping(mapping)

    first = services.run(config, epochs=1)
    assert [e.kind for e in first.epochs] == ["global"]
    pipeline = Pipeline(config, spark)
    store = pipeline.store
    at_four = _lists(store, 1)
    assert all(len(s) == 1 for s in at_four)  # one summary element per region
    everything = tuple(e for s in at_four for e in s)

    to_two = services.recover(config, parallelism=2, faults=["fail:1@2"])
    assert to_two.opened.previous_parallelism == 4 and to_two.opened.parallelism == 2
    checkpoint = store.load_checkpoint(2)
    assert checkpoint.kind is CheckpointKind.REGIONAL and checkpoint.parallelism == 2
    assert checkpoint.regions[1].ref_checkpoint_id == 1 and checkpoint.regions[1].ref_depth == 1
    restored = (everything[:2], everything[2:]) if mode == "even-split" else (everything, everything)
    acked, fell_back = _lists(store, 2)
    assert acked[: len(restored[0])] == restored[0] and len(acked) == len(restored[0]) + 1
    assert fell_back == restored[1]  # the failed region contributes the state the restore gave it

    to_one = services.recover(config, parallelism=1, faults=["fail:0@3"])
    assert to_one.opened.parallelism == 1
    checkpoint = store.load_checkpoint(3)
    assert checkpoint.kind is CheckpointKind.REGIONAL and checkpoint.parallelism == 1
    assert checkpoint.regions[0].ref_checkpoint_id == 2 and checkpoint.regions[0].ref_depth == 2
    assert store.ref_chain(3) == [3, 2, 1]
    assert _lists(store, 3) == [acked + fell_back]  # one region: the whole concatenation, both modes

    rest = services.run(config)  # two regional in a row: the next checkpoint is forced global
    pipeline.close()
    assert rest.finished and rest.epochs[0].kind == "global"
    assert_sink_equals_source(spark, config.sink.path, input_dir)
