"""The defaults of the pipeline file that the core, the simulator and the state store use too.

Each is stated once, here: the pipeline file's models (:mod:`splitkeeper.config.models`) take
their defaults (and so the JSON Schema's) from these constants, and the core's own settings
(:class:`~splitkeeper.core.checkpoint.CheckpointConfig`,
:class:`~splitkeeper.core.backlog.BacklogConfig`,
:class:`~splitkeeper.core.driver.DriverSettings`) default to the same constants for callers that
build them without a file (the simulator, the benchmarks, tests). A default only the file has
(``parallelism``, ``maintenance.history_hours`` ...) lives in the models alone.
"""

from __future__ import annotations

from typing import Final

from splitkeeper.core.types import SplitChangePolicy, SplitFailurePolicy

#: ``checkpoint.max_consecutive_failures``: regional checkpoints in a row before one is forced global.
MAX_CONSECUTIVE_FAILURES: Final = 3
#: ``checkpoint.max_failure_ratio``: the largest share of regions that may fail in a regional checkpoint.
MAX_FAILURE_RATIO: Final = 0.5
#: ``checkpoint.region_timeout_s``: how long a region may stay silent before it counts as failed.
REGION_TIMEOUT_S: Final = 600.0
#: ``checkpoint.retain_checkpoints``: completed checkpoints kept besides those still referenced.
RETAIN_CHECKPOINTS: Final = 3
#: ``checkpoint.on_split_failure``: what a split whose reads keep failing does.
ON_SPLIT_FAILURE: Final = SplitFailurePolicy.QUARANTINE
#: ``checkpoint.quarantine_after``: failed epochs in a row before a split is parked (quarantine).
QUARANTINE_AFTER: Final = 3
#: ``checkpoint.full_snapshot_every``: checkpoints per full enumerator snapshot in the state store.
FULL_SNAPSHOT_EVERY: Final = 20
#: ``checkpoint.max_consecutive_aborts``: aborted epochs in a row after which a bounded run stops.
MAX_CONSECUTIVE_ABORTS: Final = 5

#: ``backlog``: records per epoch and checkpoint interval while processing backlog and afterwards.
BACKLOG_EPOCH_RECORDS: Final = 1_000_000
NORMAL_EPOCH_RECORDS: Final = 10_000
BACKLOG_INTERVAL_S: Final = 60.0
NORMAL_INTERVAL_S: Final = 5.0

#: ``strategy``: the assignment strategy (protocol rule 1.6).
STRATEGY: Final = "least-loaded"
#: ``weighted.rebalance_threshold``: the readers' max / min load that makes them re-weight.
REBALANCE_THRESHOLD: Final = 1.25
#: ``source.on_file_change``: what a known split whose data changed does (protocol rule 1.9).
ON_FILE_CHANGE: Final = SplitChangePolicy.FAIL
#: ``source.recheck_finished_every``: a finished split's data is checked against its identity at the
#: first discovery after a restore and then every this many epochs (protocol rule 1.9); live ones
#: at every epoch.
RECHECK_FINISHED_EVERY: Final = 10
#: ``lease.ttl_s``: a writer that stops heartbeating loses the pipeline's lease after this.
LEASE_TTL_S: Final = 60.0

#: ``errors.max_bad_ratio``: the share of a region's records in one epoch that may be bad records
#: (dead letters) before the region fails: a poison topic never fills the dead-letter table silently.
MAX_BAD_RATIO = 0.1
