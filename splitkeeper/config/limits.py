"""The range of a pipeline's parallelism: one definition for the file, the CLI, the services and
the DAGs' Params (standard library and the protocol core only, cheap to import in a DAG file)."""

from __future__ import annotations

from splitkeeper.core.assignment import validate_parallelism
from splitkeeper.errors import InvalidParameterError

#: The highest parallelism a pipeline may have. A region with nothing to read in an epoch costs
#: no task, thread or job (the driver acknowledges it, ``core.driver.regions_to_run``), and the
#: regions with ranges run at most ``max_concurrent_regions`` jobs at once
#: (:func:`splitkeeper.spark.regions.run_regions`), so Spark and the driver's threads no longer
#: bound it. What remains is the protocol core's work per region and epoch, on the driver:
#: planning, acknowledging and checkpointing every region (one ``epoch_plans`` marker row per
#: idle region). Measured in the simulator, the core's per-epoch loops take about 1 s at
#: 10,000 regions and grow linearly: 10,000 keeps an epoch's driver overhead about a second.
#: Through the CLI on 2 cores (load 4-5): parallelism 10,000 over 4 files peaked at 24 driver
#: threads (as parallelism 4 does) in 34 s, 27 s of it at parallelism 4 (the Spark session's start);
#: parallelism 1,000 over 1,000 files (every region busy) at 30 driver threads.
MAX_PARALLELISM = 10_000

#: The most region jobs one epoch runs at once (config ``max_concurrent_regions``). Each runs
#: from its own driver thread holding its own py4j connection to the JVM (a socket) while its
#: job runs, and PySpark's py4j client waits on its sockets with ``select()``, which fails past
#: file descriptor 1023 ("filedescriptor out of range in select()"). Measured on one machine
#: (2 cores, 3 files, one epoch): 8 concurrent region jobs peaked at 30 descriptors and 13
#: threads in the driver, 256 at 286 and 261. 256 keeps a fourfold margin to the wall.
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
            f"an integer from 1 to {MAX_CONCURRENT_REGIONS}, or null (twice the cluster's task slots, "
            "at most 64)",
            "each region job running at once holds a driver thread and a py4j socket, and py4j's "
            f"select() fails past file descriptor 1023; use at most {MAX_CONCURRENT_REGIONS}",
        )
    return value
