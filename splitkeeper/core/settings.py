"""A pipeline's checkpoint settings as the core reads them: the ``checkpoint`` section, checked.

:class:`CheckpointSettings` is the section itself: the pipeline file's ``checkpoint`` keys are its
fields (the config validates the section into it, :func:`splitkeeper.config.base.core_section`),
and constructing it runs the core's checks, in the order of the settings they belong to: the
coordinator's (:class:`~splitkeeper.core.checkpoint.CheckpointConfig`), the driver's retention,
quarantine and abort limits, the state store's snapshot spacing. ``regions_independent`` is not a
key of the section: it comes from the pipeline's ``regions``.
"""

from __future__ import annotations

from dataclasses import dataclass

from splitkeeper.core import defaults
from splitkeeper.core.checkpoint import CheckpointConfig, check_full_snapshot_every
from splitkeeper.core.driver import check_abort_limit, check_quarantine_after, check_retain_checkpoints
from splitkeeper.core.types import SplitFailurePolicy

__all__ = ["CheckpointSettings"]


@dataclass(frozen=True, slots=True)
class CheckpointSettings:
    """The ``checkpoint`` section (module doc). The coordinator's settings are :meth:`core`.

    ``retain_checkpoints``: completed checkpoints kept besides those a later checkpoint still
    references (protocol rule 2.7). ``on_split_failure``: ``quarantine`` (after
    ``quarantine_after`` failed epochs in a row a split is parked and the rest goes on; protocol
    rule 1.8) or ``stall`` (a split whose reads keep failing blocks the pipeline until fixed).
    ``max_consecutive_aborts``: a bounded run stops with an error naming what fails after that
    many aborted epochs in a row. ``full_snapshot_every``: the state store writes the enumerator
    state of at most that many checkpoints per full snapshot, the others as deltas against it.
    """

    max_consecutive_failures: int = defaults.MAX_CONSECUTIVE_FAILURES
    max_failure_ratio: float = defaults.MAX_FAILURE_RATIO
    region_timeout_s: float = defaults.REGION_TIMEOUT_S
    retain_checkpoints: int = defaults.RETAIN_CHECKPOINTS
    on_split_failure: SplitFailurePolicy = defaults.ON_SPLIT_FAILURE
    quarantine_after: int = defaults.QUARANTINE_AFTER
    full_snapshot_every: int = defaults.FULL_SNAPSHOT_EVERY
    max_consecutive_aborts: int = defaults.MAX_CONSECUTIVE_ABORTS
    regions_independent: bool = True

    def __post_init__(self) -> None:
        self.core()
        check_retain_checkpoints(self.retain_checkpoints)
        check_quarantine_after(self.quarantine_after)
        check_full_snapshot_every(self.full_snapshot_every)
        check_abort_limit(self.max_consecutive_aborts, self.on_split_failure, self.quarantine_after)

    def core(self) -> CheckpointConfig:
        """The coordinator's checkpoint settings."""
        return CheckpointConfig(
            max_consecutive_failures=self.max_consecutive_failures,
            max_failure_ratio=self.max_failure_ratio,
            region_timeout_s=self.region_timeout_s,
            regions_independent=self.regions_independent,
        )
