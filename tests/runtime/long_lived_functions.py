"""A record transform for tests/runtime/test_long_lived_readers.py that kills its own Python worker.

Registered with cloudpickle by value, so it reaches the Python workers without this module being
importable there, with the value :data:`MARKER` has when the region task is pickled.
"""

from __future__ import annotations

import os
import signal
import sys

from pyspark import cloudpickle

from splitkeeper.transforms import transform

cloudpickle.register_pickle_by_value(sys.modules[__name__])

#: A file whose existence arms the kill (the test sets it); the kill removes it first, so it fires once.
MARKER = ""


@transform
def kill_once(value: str) -> str:
    """The record ``KILL`` kills the worker (SIGKILL to its own pid) while :data:`MARKER` exists."""
    if value in ("KILL", b"KILL") and MARKER and os.path.exists(MARKER):
        os.remove(MARKER)
        os.kill(os.getpid(), signal.SIGKILL)
    return value
