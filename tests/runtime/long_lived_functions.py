"""A record transform for tests/runtime/test_long_lived_readers.py that kills its own Python worker.

Registered with cloudpickle by value, so it reaches the Python workers without this module being
importable there.
"""

from __future__ import annotations

import os
import signal
import sys

from pyspark import cloudpickle

from splitkeeper.transforms import transform

cloudpickle.register_pickle_by_value(sys.modules[__name__])


@transform
def kill_once(value: str) -> str:
    """The record ``KILL:<file>`` kills the worker (SIGKILL to its own pid) while ``<file>`` exists; the
    kill removes the file first, so it fires once."""
    if value.startswith("KILL:") and os.path.exists(value[5:]):
        os.remove(value[5:])
        os.kill(os.getpid(), signal.SIGKILL)
    return value
