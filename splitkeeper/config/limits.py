"""The range of a pipeline's parallelism: one definition for the file, the CLI, the services and
the DAGs' Params (standard library and the protocol core only, cheap to import in a DAG file)."""

from __future__ import annotations

from splitkeeper.core.assignment import validate_parallelism
from splitkeeper.errors import InvalidParameterError

#: The highest parallelism a pipeline may have. A region with nothing to read in an epoch costs
#: no task, thread or job (the driver acknowledges it, ``core.driver.regions_to_run``), and the
#: regions with ranges are the tasks of one Spark job per epoch
#: (:func:`splitkeeper.spark.regions.run_regions`), so Spark and the driver's threads no longer
#: bound it. What remains is the protocol core's work per region and epoch, on the driver:
#: planning, acknowledging and checkpointing every region (one ``epoch_plans`` marker row per
#: idle region). Measured in the simulator, the core's per-epoch loops take about 1 s at
#: 10,000 regions and grow linearly: 10,000 keeps an epoch's driver overhead about a second.
#: Through the CLI on 2 cores (load 4-5): parallelism 10,000 over 4 files peaked at 24 driver
#: threads (as parallelism 4 does) in 34 s, 27 s of it at parallelism 4 (the Spark session's start);
#: parallelism 1,000 over 1,000 files (every region busy) at 30 driver threads.
MAX_PARALLELISM = 10_000

#: The range of config ``max_concurrent_regions``, which is accepted and ignored (with a warning):
#: it bounded the region jobs an epoch ran at once, each from its own driver thread and py4j socket
#: (py4j's ``select()`` fails past file descriptor 1023). An epoch is now one Spark job whose tasks
#: are its regions, and Spark's cores bound the tasks running at once. The key still loads, so a
#: pipeline file written for the job-per-region runner keeps working; its range is still checked.
MAX_CONCURRENT_REGIONS = 256


def check_parallelism(value: object, name: str = "parallelism", or_else: str = "") -> int:
    """``value`` if it is an integer from 1 to :data:`MAX_PARALLELISM`, else InvalidParameterError
    naming ``name`` (below 1: the core's message, :func:`~splitkeeper.core.assignment.validate_parallelism`,
    with ``or_else`` added to what is allowed)."""
    parallelism = validate_parallelism(value, name, or_else)
    if parallelism > MAX_PARALLELISM:
        raise InvalidParameterError(
            name,
            parallelism,
            f"an integer from 1 to {MAX_PARALLELISM}",
            f"the driver plans, acknowledges and checkpoints every region in every epoch (about 1 s an "
            f"epoch at 10,000 regions); use at most {MAX_PARALLELISM} (more regions than source splits "
            "only add idle regions)",
        )
    return parallelism


def check_max_concurrent_regions(value: object, name: str = "max_concurrent_regions") -> int:
    """``value`` if it is an integer from 1 to :data:`MAX_CONCURRENT_REGIONS`, else
    InvalidParameterError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CONCURRENT_REGIONS:
        raise InvalidParameterError(
            name,
            value,
            f"an integer from 1 to {MAX_CONCURRENT_REGIONS}, or null",
            "the key is ignored (an epoch's regions are the tasks of one Spark job); remove it, or "
            f"use at most {MAX_CONCURRENT_REGIONS}",
        )
    return value
