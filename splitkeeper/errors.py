"""The splitkeeper exception hierarchy.

Every error the project raises on purpose subclasses :class:`SplitkeeperError`.
An error carries a stable ``code`` (tests and callers match on it) and the
parameters that produced it, and its message says what is wrong and how to fix
it. This module imports nothing outside the standard library.
"""

from __future__ import annotations

from typing import Any


class SplitkeeperError(Exception):
    """Base of every error splitkeeper raises deliberately."""

    code: str = "SPLITKEEPER_ERROR"

    def __init__(self, message: str, **params: Any) -> None:
        super().__init__(message)
        self.message = message
        self.params = params

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"


class InvalidParameterError(SplitkeeperError, ValueError):
    """A value given by a user or caller is outside what is allowed.

    The message names the parameter, the value and what is allowed.
    """

    code = "INVALID_PARAMETER"

    def __init__(self, name: str, value: Any, allowed: str, hint: str = "") -> None:
        message = f"{name}={value!r} is not allowed: {allowed}"
        if hint:
            message += f". {hint}"
        super().__init__(message, name=name, value=value, allowed=allowed)
        self.name = name
        self.value = value
        self.allowed = allowed
        self.hint = hint


class ConfigError(SplitkeeperError):
    """A pipeline configuration file is malformed or names an invalid value."""

    code = "CONFIG_ERROR"


class ProtocolError(SplitkeeperError):
    """A call breaks the split-ownership or checkpoint protocol contract."""

    code = "PROTOCOL_VIOLATION"


class CheckpointError(SplitkeeperError):
    """A checkpoint cannot be triggered, completed, found or restored."""

    code = "CHECKPOINT_ERROR"


class StateError(SplitkeeperError):
    """Persisted state is missing, belongs to another pipeline, or is inconsistent."""

    code = "STATE_ERROR"


class ConcurrentRunError(StateError):
    """Another run holds (or just changed) the same pipeline state."""

    code = "CONCURRENT_RUN"


class StoreUnsafeError(StateError):
    """The object store under the state does not refuse a second conditional create of one key
    (``If-None-Match: *`` ignored): two writers of one Delta commit could both land. Raised before
    anything of the pipeline is written."""

    code = "STORE_UNSAFE"


class StagedOutputError(StateError):
    """An epoch's staged output is missing or damaged, so its sink commit did not happen.

    Nothing of the epoch was committed; recovery reads it again. The code stays
    STATE_ERROR.
    """


class DamagedTableError(StateError):
    """A data file or log entry of a Delta table is damaged, truncated or missing; the message names
    the table, the file and what to do. The code stays STATE_ERROR."""


class RunStalledError(CheckpointError):
    """A bounded run stopped because its epochs kept aborting, or none of the epochs it was asked
    for completed; the message names the failing splits and regions, their errors and what to do."""

    code = "RUN_STALLED"


class SplitsQuarantinedError(RunStalledError):
    """A run ended with every split of the pipeline quarantined: it reads nothing until one is
    released. What it committed is kept; the message names the splits and what to do."""

    code = "ALL_QUARANTINED"


class RunInterrupted(SplitkeeperError):
    """A run stopped on SIGINT or SIGTERM: the epoch in progress was finished or abandoned (nothing of
    an abandoned epoch is committed) and the lease released. ``exit_code`` is 128 + the signal number."""

    code = "INTERRUPTED"

    def __init__(self, message: str, signal_number: int, **params: Any) -> None:
        super().__init__(message, signal_number=signal_number, **params)
        self.signal_number = signal_number

    @property
    def exit_code(self) -> int:
        return 128 + self.signal_number


class SourceError(SplitkeeperError):
    """A source cannot be reached or read as configured."""

    code = "SOURCE_ERROR"


class SchemaRegistryError(SourceError):
    """The schema registry failed to give the writer schema of a record's schema id (not a "not
    found", which makes the record a bad one): the range is read again. ``params`` name the
    ``schema_id`` and the record (``index`` in its range; the region task adds its ``offset``)."""

    code = "SCHEMA_REGISTRY"


class InvariantViolation(SplitkeeperError):
    """A protocol section 6 invariant does not hold; ``params['violations']`` lists them."""

    code = "INVARIANT_VIOLATION"


class EnvironmentNotReadyError(SplitkeeperError):
    """A required tool, jar or service is missing; the message says how to install it."""

    code = "ENVIRONMENT_NOT_READY"
