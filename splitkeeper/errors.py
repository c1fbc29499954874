"""The splitkeeper exception hierarchy.

Every error the project raises on purpose subclasses :class:`SplitkeeperError`.
An error carries a stable ``code`` (tests and callers match on it) and the
parameters that produced it, and its message says what is wrong and how to fix
it. This module imports nothing outside the standard library.
"""

from __future__ import annotations

import re
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
    """A pipeline configuration file is malformed or names an invalid value.

    Every config error is built here, so this is where a secret is kept out of it
    (:func:`redact_config_message`): whoever raises one passes ``key`` and ``value`` and may write
    the value into the message; the message, ``params`` and ``args`` never carry it when the key
    names a secret (:func:`is_secret_key`) or the value looks like one (:func:`looks_secret`), and
    any ``<secret word>=...`` or ``scheme://user:password@`` left in the text is masked.
    """

    code = "CONFIG_ERROR"

    def __init__(self, message: str, **params: Any) -> None:
        message, params = redact_config_message(message, params)
        super().__init__(message, **params)


# --------------------------------------------------------------------------- secrets

#: What a secret is shown as.
REDACTED = "***"
#: Words that make a setting's value a secret (librdkafka, Spark, object store and OAuth names),
#: wherever the setting appears: its value is never printed, logged or returned.
SECRET_KEY_WORDS = (
    "password",
    "passwd",
    "secret",
    "token",
    "jaas",
    "credential",
    "private",
    "oauthbearer",
    "ssl.key",
    "keystore",
    ".pem",
    "apikey",
    "api.key",
    "api_key",
    "access.key",
    "access_key",
    "session.key",
)
_SECRET_ASSIGNMENT = re.compile(
    r"(?i)([\w.-]*(?:secret|password|passwd|pwd|token|credential|api[_.-]?key)[\w.-]*['\"]?\s*[=:]\s*['\"]?)"
    r"((?![<*])[^'\"\s,;&}\]]+)"  # not what is shown already: '***', '<not shown>'
)
_URL_PASSWORD = re.compile(r"(?i)([a-z][a-z0-9+.-]*://[^/\s@:'\"]+:)([^/\s@'\"]+)(@)")


def is_secret_key(key: str) -> bool:
    """Whether a setting named ``key`` holds a secret (``sasl.password``, ``sasl.oauthbearer.config``,
    ``ssl.key.pem``, ``source.client.sasl.oauthbearer.client.secret`` ...)."""
    lowered = str(key).lower()
    return any(word in lowered for word in SECRET_KEY_WORDS)


def looks_secret(value: Any) -> bool:
    """Whether ``value`` (any type; containers by their text) carries a secret whatever its key:
    a ``clientSecret=...`` or ``password: ...`` inside it, a URL with a password, or a mapping key
    that names one."""
    text = value if isinstance(value, str) else repr(value)
    if _SECRET_ASSIGNMENT.search(text) or _URL_PASSWORD.search(text):
        return True
    return isinstance(value, dict) and any(is_secret_key(k) for k in value)


def redact_text(text: str) -> str:
    """``text`` with the value of every ``<secret word>=value`` (or ``: value``) and the password of
    every ``scheme://user:password@`` replaced by :data:`REDACTED`."""
    text = _SECRET_ASSIGNMENT.sub(lambda m: m.group(1) + REDACTED, text)
    return _URL_PASSWORD.sub(lambda m: m.group(1) + REDACTED + m.group(3), text)


def hide_value(text: str, value: str, shown: str = REDACTED) -> str:
    """``text`` with every occurrence of ``value`` (as written, and as its ``repr``) replaced by
    ``shown``; a short value only where it stands alone (not inside a longer word or number)."""
    if not value:
        return text
    for form in dict.fromkeys((repr(value), value)):
        if len(form) >= 8:
            text = text.replace(form, shown)
        else:
            text = re.sub(rf"(?<![\w.]){re.escape(form)}(?![\w])", lambda _m: shown, text)
    return text


def redact_config_message(message: str, params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The message and parameters of a config error with no secret in them (:class:`ConfigError`)."""
    value = params.get("value")
    secret = is_secret_key(str(params.get("key", ""))) or looks_secret(value)
    if value is not None and value != REDACTED and secret:
        if isinstance(value, str):
            message = hide_value(message, value)
        else:
            message = message.replace(f"={value!r}", f"={REDACTED}")
            message = hide_value(message, repr(value))
        params = {**params, "value": REDACTED}
    return redact_text(message), params


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


class SubmittedJobError(SplitkeeperError):
    """An Airflow task's Spark application (spark-submit on a cluster master) failed without a
    splitkeeper error of its own to report, or left no result; the message names the task, and the
    task log above it holds spark-submit's output."""

    code = "SUBMITTED_JOB_FAILED"


# --------------------------------------------------------------------------- the data path


class TransformError(SplitkeeperError):
    """A transform failed on one record, or returned something other than a string."""

    code = "TRANSFORM_ERROR"


class SparkTransformError(SplitkeeperError):
    """A Spark transform raised, broke its contract, or returned columns the sink does not have."""

    code = "SPARK_TRANSFORM_FAILED"


class SchemaDriftError(SplitkeeperError):
    """A record has a field the declared schema does not name, and ``on_new_fields`` is ``fail``."""

    code = "SCHEMA_DRIFT"


class BadRecordError(SplitkeeperError):
    """A record could not be decoded, did not fit the declared columns, or its transform failed."""

    code = "BAD_RECORD"


class UpsertError(SplitkeeperError, ValueError):
    """A bad ``sink.key`` or ``sink.delete_when``; ``key`` says which (``"key"`` or ``"delete_when"``),
    the message what is allowed."""

    code = "UPSERT_ERROR"

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message, key=key)
        self.key = key


# --------------------------------------------------------------------------- the region tasks


class InjectedFault(SplitkeeperError):
    """A region task failed on purpose, because the fault plan said so."""

    code = "INJECTED_FAULT"


class SplitReadError(SplitkeeperError):
    """Reading (or transforming) one split of a region failed; the message names the split first.

    The region declines. Its message starts ``split "<id>" at offset <n>:`` (the id as JSON) so the
    driver can tell which split failed across the executor boundary
    (:data:`splitkeeper.spark.task.SPLIT_READ_FAILED`), and count it towards
    ``checkpoint.on_split_failure: quarantine`` (protocol rule 1.8).
    """

    code = "SPLIT_READ_FAILED"

    def __init__(self, split_id: str, offset: int, cause: BaseException) -> None:
        import json

        super().__init__(
            f"split {json.dumps(split_id)} at offset {offset}: {type(cause).__name__}: {cause}",
            split_id=split_id,
            offset=offset,
        )


class EpochAbandoned(SplitkeeperError):
    """The epoch's read phase was abandoned because a stop was requested (``params['epoch']``).

    The epoch's job was cancelled; nothing of the epoch is committed.
    """

    code = "INTERRUPTED"


# --------------------------------------------------------------------------- the lease


class LeaseHeldError(ConcurrentRunError):
    """Another live run holds the pipeline's lease."""

    code = "LEASE_HELD"


class LeaseLostError(ConcurrentRunError):
    """This run's lease was taken over (it had expired) or changed under it."""

    code = "LEASE_LOST"
