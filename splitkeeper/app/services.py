"""The application services: each use case of splitkeeper, once, for the CLI and the Airflow tasks.

``run``, ``recover`` (and ``rescale``), ``preview_recovery``, ``status``,
``validate`` and ``report`` take a validated :class:`PipelineConfig`, do one use
case and return a typed result (:mod:`splitkeeper.app.results`). The CLI
commands (``splitkeeper/commands``) format those results; the Airflow tasks
(``splitkeeper/airflow/tasks.py``) return their ``to_dict()``. Neither
holds logic of its own.

Each use case is a module of its own (:mod:`~splitkeeper.app.run` with ``stop``,
:mod:`~splitkeeper.app.recover`, :mod:`~splitkeeper.app.status`, :mod:`~splitkeeper.app.validate`,
:mod:`~splitkeeper.app.maintain`, :mod:`~splitkeeper.app.report`; what they share is
:mod:`~splitkeeper.app.assembly`); this module is their one door.

Read-only services (``status``, ``preview_recovery``, a dry-run ``recover``)
write nothing anywhere: no table is created, no redo is committed, no staging
is cleaned.

The services own the pipeline's lease (protocol rule 5.6): a writing use case takes it
(:func:`writer_lease`, before Spark starts), then assembles the pipeline over it and opens
it; read-only ones take none. :func:`leased_pipeline` is the same for callers that drive
the pipeline themselves (the benchmarks, the tests' helpers).
"""

from splitkeeper.app.assembly import (
    REPORTS_ENV,
    checkpoint_id_of,
    leased_pipeline,
    reports_dir,
    spark_session,
    writer_lease,
)
from splitkeeper.app.maintain import maintain
from splitkeeper.app.recover import (
    RECOVERY_MODES,
    check_recovery_mode,
    preview_recovery,
    recover,
    recovery_mode,
    repair,
    rescale,
)
from splitkeeper.app.report import report
from splitkeeper.app.run import run, stop
from splitkeeper.app.status import metrics_text, next_epoch, pending_work, status
from splitkeeper.app.validate import validate, validated_already

__all__ = [
    "RECOVERY_MODES",
    "REPORTS_ENV",
    "check_recovery_mode",
    "checkpoint_id_of",
    "leased_pipeline",
    "maintain",
    "metrics_text",
    "next_epoch",
    "pending_work",
    "preview_recovery",
    "recover",
    "recovery_mode",
    "repair",
    "report",
    "reports_dir",
    "rescale",
    "run",
    "spark_session",
    "status",
    "stop",
    "validate",
    "validated_already",
    "writer_lease",
]
