"""CheckpointConfig validation and the coordinator's mode (protocol rules 2.2, 2.3, 2.9)."""

from __future__ import annotations

import math

import pytest

from splitkeeper.core.checkpoint import (
    CheckpointConfig,
    CheckpointMode,
    CheckpointStore,
    RegionalCheckpointCoordinator,
)
from splitkeeper.errors import InvalidParameterError, SplitkeeperError


def test_default_config_is_valid_and_allows_regional_checkpoints() -> None:
    config = CheckpointConfig()
    assert config.max_consecutive_failures == 3
    assert config.max_failure_ratio == 0.5
    assert config.region_timeout_s == 600.0
    assert config.regions_independent is True
    coordinator = RegionalCheckpointCoordinator(config, 4, CheckpointStore())
    assert coordinator.mode is CheckpointMode.REGIONAL
    assert coordinator.mode_reason == (
        "regional checkpoints on: up to 2 of 4 regions may fall back, at most 3 regional checkpoints in a row"
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_failure_ratio": 1.5}, "max_failure_ratio=1.5 is not allowed: a number between 0 and 1"),
        ({"max_failure_ratio": -0.1}, "max_failure_ratio=-0.1 is not allowed: a number between 0 and 1"),
        ({"max_failure_ratio": math.nan}, "max_failure_ratio=nan is not allowed: a number between 0 and 1"),
        ({"max_failure_ratio": "0.5"}, "max_failure_ratio='0.5' is not allowed: a number between 0 and 1"),
        ({"max_failure_ratio": True}, "max_failure_ratio=True is not allowed: a number between 0 and 1"),
        ({"max_consecutive_failures": -1}, "max_consecutive_failures=-1 is not allowed: an integer >= 0"),
        ({"max_consecutive_failures": 1.5}, "max_consecutive_failures=1.5 is not allowed: an integer >= 0"),
        ({"max_consecutive_failures": True}, "max_consecutive_failures=True is not allowed: an integer >= 0"),
        ({"region_timeout_s": 0}, "region_timeout_s=0 is not allowed: a finite number of seconds > 0"),
        ({"region_timeout_s": -5.0}, "region_timeout_s=-5.0 is not allowed: a finite number of seconds > 0"),
        (
            {"region_timeout_s": math.inf},
            "region_timeout_s=inf is not allowed: a finite number of seconds > 0",
        ),
        ({"regions_independent": "yes"}, "regions_independent='yes' is not allowed: True or False"),
    ],
)
def test_bad_config_value_is_rejected_naming_key_value_and_what_is_allowed(
    kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidParameterError) as err:
        CheckpointConfig(**kwargs)  # type: ignore[arg-type]
    assert err.value.message == message
    assert err.value.name == next(iter(kwargs))
    assert isinstance(err.value, SplitkeeperError)


def test_ratio_bounds_zero_and_one_are_inclusive() -> None:
    assert CheckpointConfig(max_failure_ratio=0).max_failure_ratio == 0
    assert CheckpointConfig(max_failure_ratio=1.0).max_failure_ratio == 1.0


def test_from_mapping_builds_a_config_and_rejects_unknown_keys() -> None:
    config = CheckpointConfig.from_mapping({"max_consecutive_failures": 2, "region_timeout_s": 30})
    assert config == CheckpointConfig(max_consecutive_failures=2, region_timeout_s=30)
    with pytest.raises(InvalidParameterError) as err:
        CheckpointConfig.from_mapping({"max_failures": 2})
    assert err.value.message == (
        "checkpoint config key='max_failures' is not allowed: one of max_consecutive_failures, "
        "max_failure_ratio, region_timeout_s, regions_independent, dependence"
    )


def test_regions_not_independent_means_global_only_and_says_so() -> None:
    coordinator = RegionalCheckpointCoordinator(
        CheckpointConfig(regions_independent=False), 4, CheckpointStore()
    )
    assert coordinator.mode is CheckpointMode.GLOBAL_ONLY
    assert "regions are not independent (a shuffle connects the readers)" in coordinator.mode_reason


def test_zero_consecutive_failures_means_global_only() -> None:
    coordinator = RegionalCheckpointCoordinator(
        CheckpointConfig(max_consecutive_failures=0), 4, CheckpointStore()
    )
    assert coordinator.mode is CheckpointMode.GLOBAL_ONLY
    assert coordinator.mode_reason == "global checkpoints only: max_consecutive_failures=0"


def test_ratio_too_small_for_the_parallelism_means_global_only() -> None:
    small = RegionalCheckpointCoordinator(CheckpointConfig(max_failure_ratio=0.2), 4, CheckpointStore())
    assert small.allowed_failures() == 0
    assert small.mode is CheckpointMode.GLOBAL_ONLY
    assert small.mode_reason == (
        "global checkpoints only: max_failure_ratio=0.2 lets no region fail at parallelism 4 "
        "(one region is 0.25 of the job)"
    )
    exact = RegionalCheckpointCoordinator(CheckpointConfig(max_failure_ratio=0.25), 4, CheckpointStore())
    assert exact.allowed_failures() == 1
    assert exact.mode is CheckpointMode.REGIONAL


@pytest.mark.parametrize(
    ("parallelism", "message"),
    [
        (0, "parallelism=0 is not allowed: an integer >= 1"),
        (True, "parallelism=True is not allowed: an integer >= 1"),
        (2.0, "parallelism=2.0 is not allowed: an integer >= 1"),
    ],
)
def test_coordinator_rejects_a_bad_parallelism(parallelism: object, message: str) -> None:
    with pytest.raises(InvalidParameterError) as err:
        RegionalCheckpointCoordinator(CheckpointConfig(), parallelism, CheckpointStore())  # type: ignore[arg-type]
    assert err.value.message == message


def test_coordinator_rejects_a_config_that_is_not_a_checkpoint_config() -> None:
    with pytest.raises(InvalidParameterError, match="config=.* is not allowed: a CheckpointConfig"):
        RegionalCheckpointCoordinator({"max_failure_ratio": 0.5}, 2, CheckpointStore())  # type: ignore[arg-type]
