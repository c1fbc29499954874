"""One logging set-up for the CLI, the jobs and the Airflow tasks (structlog over the standard library).

Library code logs with the standard library only (``logging.getLogger("splitkeeper....")``);
the protocol core passes the protocol's context as ``extra`` (``epoch``, ``checkpoint_id``,
``region``, ``kind``). The application layer binds ``pipeline`` for the whole run
(:func:`bind`). :func:`configure` renders every record either as text (one readable line)
or as JSON lines that carry those fields, for a log shipper:

    {"event": "epoch 3 regional ...", "level": "info", "logger": "splitkeeper.driver",
     "timestamp": "...", "pipeline": "orders", "epoch": 3, "checkpoint_id": 3, "kind": "regional"}

Spark, py4j, Airflow, SQLAlchemy and the Kafka client stay at WARNING unless the level asked
for is DEBUG. ``SPLITKEEPER_LOG_LEVEL`` and ``SPLITKEEPER_LOG_FORMAT`` set the defaults of
``--log-level`` and ``--log-format``. Inside an Airflow task, Airflow owns the handlers:
:func:`configure` is not called there, only the library levels are set and the context bound.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

LEVEL_ENV = "SPLITKEEPER_LOG_LEVEL"
FORMAT_ENV = "SPLITKEEPER_LOG_FORMAT"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
FORMATS = ("text", "json")

#: Loggers of the engines around splitkeeper: quiet (WARNING) unless DEBUG is asked for.
NOISY_LOGGERS = (
    "py4j",
    "pyspark",
    "airflow",
    "sqlalchemy",
    "alembic",
    "great_expectations",
    "urllib3",
    "httpx",
    "asyncio",
    "splitkeeper.sources.kafka.librdkafka",
)

#: ``extra`` fields a JSON line carries when a record has them (the protocol's context).
CONTEXT_FIELDS = ("pipeline", "epoch", "checkpoint_id", "region", "kind", "split_id")


def default_level() -> str:
    level = os.environ.get(LEVEL_ENV, "INFO").upper()
    return level if level in LEVELS else "INFO"


def default_format() -> str:
    fmt = os.environ.get(FORMAT_ENV, "text").lower()
    return fmt if fmt in FORMATS else "text"


def quiet_libraries(level: str) -> None:
    """Keep the engines' loggers at WARNING unless ``level`` is DEBUG."""
    noisy = logging.DEBUG if level == "DEBUG" else logging.WARNING
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(noisy)


#: The logger of the run's story (one record per epoch): text mode shows its records as bare lines.
PROGRESS_LOGGER = "splitkeeper.progress"


class _TextFormatter(logging.Formatter):
    """Progress records as they are (``epoch 3 global ...``), others ``level logger: message [context]``."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.name == PROGRESS_LOGGER:
            return message
        context = " ".join(f"{k}={v}" for k, v in context_of(record).items())
        text = f"{record.levelname.lower()} {record.name}: {message}" + (f" [{context}]" if context else "")
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def _formatter(fmt: str) -> logging.Formatter:
    if fmt == "text":
        return _TextFormatter()
    import structlog

    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.ExtraAdder(allow=CONTEXT_FIELDS),
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    return structlog.stdlib.ProcessorFormatter(
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(sort_keys=False),
        ],
        foreign_pre_chain=shared,
    )


def configure(
    level: str | None = None,
    fmt: str | None = None,
    *,
    stream: TextIO | None = None,
    log_file: str | os.PathLike[str] | None = None,
) -> None:
    """Route every record to ``stream`` (stderr) as text or JSON lines; optionally also to ``log_file``.

    Called once by the CLI (and so by the spark-submit epoch job); calling it again replaces
    the handlers it installed. ``log_file`` gets every record at DEBUG, whatever ``level``.
    """
    level = (level or default_level()).upper()
    fmt = (fmt or default_format()).lower()
    if level not in LEVELS:
        from splitkeeper.errors import InvalidParameterError

        raise InvalidParameterError("--log-level", level, "one of " + ", ".join(LEVELS))
    if fmt not in FORMATS:
        from splitkeeper.errors import InvalidParameterError

        raise InvalidParameterError("--log-format", fmt, "one of " + ", ".join(FORMATS))
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_splitkeeper", False)]:
        root.removeHandler(old)
    handler: logging.Handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(_formatter(fmt))
    handler.setLevel(level)
    handler._splitkeeper = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if log_file else level)
    if log_file is not None:
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        to_file: logging.Handler = logging.FileHandler(log_file, encoding="utf-8")
        to_file.setFormatter(_formatter(fmt))
        to_file.setLevel(logging.DEBUG)
        to_file._splitkeeper = True  # type: ignore[attr-defined]
        root.addHandler(to_file)
    quiet_libraries(level)


@contextmanager
def bind(**context: Any) -> Iterator[None]:
    """Add ``context`` (e.g. ``pipeline="orders"``) to every record logged inside the block."""
    import structlog

    tokens = structlog.contextvars.bind_contextvars(**context)
    try:
        yield
    finally:
        structlog.contextvars.reset_contextvars(**tokens)


def context_of(record: logging.LogRecord) -> Mapping[str, Any]:
    """The protocol context fields a record carries, bound ones (``pipeline``) included."""
    import structlog

    bound = {k: v for k, v in structlog.contextvars.get_contextvars().items() if k in CONTEXT_FIELDS}
    return {**bound, **{k: getattr(record, k) for k in CONTEXT_FIELDS if hasattr(record, k)}}
