"""The range of a pipeline's parallelism: one definition for the file, the CLI, the services and
the DAGs' Params (standard library and the protocol core only, cheap to import in a DAG file)."""

from __future__ import annotations

from splitkeeper.core.assignment import validate_parallelism
from splitkeeper.errors import InvalidParameterError

#: The highest parallelism a pipeline may have. Every epoch runs each region that has ranges to
#: read as its own Spark job from its own driver thread (a region with nothing to read gets no
#: task: the driver acknowledges it, ``core.driver.regions_to_run``), and each such thread holds
#: its own py4j connection to the JVM (a socket) while its job runs. PySpark's py4j client
#: waits on its sockets with ``select()``, which fails past file descriptor 1023
#: ("filedescriptor out of range in select()"). Measured on one machine (2 cores, load 14,
#: 3 files, one epoch, when idle regions still ran a job each): parallelism 8 peaked at 30
#: descriptors and 13 threads in the driver, 256 at 286 and 261 (one per region). 256 busy
#: regions keep a fourfold margin to the wall. Idle regions cost no thread now, but a source
#: with as many splits as regions makes them all busy, so higher values stay refused until the
#: busy regions' jobs are bounded too (config ``parallelism``, ``recover --parallelism``, rescale).
MAX_PARALLELISM = 256


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
            f"every region with ranges to read is a Spark job and a driver thread in every epoch; use at "
            f"most {MAX_PARALLELISM} (more regions than source splits or executor cores only add idle "
            "regions)",
        )
    return parallelism
