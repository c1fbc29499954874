"""Every splitkeeper Spark application on a cluster master: spark-submit through the Spark provider.

Imported only when ``SPLITKEEPER_SPARK_MASTER`` names a cluster: it needs
apache-airflow-providers-apache-spark. Two kinds of applications, one way of submitting them
(the provider's ``SparkSubmitHook``, the settings of :func:`~splitkeeper.airflow.wiring.submit_settings`,
the pipeline's connections in the environment, :func:`job_environment`):

- the ingest's epoch task, :class:`EpochJobSubmitOperator` running ``jobs/epoch_job.py``
  (``spark_submit_epoch_task`` in :mod:`splitkeeper.airflow.wiring`);
- the other tasks' Spark work (restart checks, recovery, rescale):
  :func:`splitkeeper.airflow.submitted.submit_task` running ``jobs/task_job.py``, called by
  :func:`splitkeeper.airflow.submitted.spark_task` inside the task; the task's result comes back
  through a result file under the pipeline's state.

The epoch task's cancel:

:class:`EpochJobSubmitOperator` is the provider's ``SparkSubmitOperator`` with one change. The
provider's ``on_kill`` SIGKILLs spark-submit at once. A continuous run (``--continuous``)
stopped that way ends mid-epoch, and the next run must recover it. On the local path, an
Airflow cancel sends the task SIGTERM, and the run ends on a final global checkpoint
(protocol rule 2.6). Here ``on_kill`` first asks the driver to stop the same way
``splitkeeper stop`` does (:func:`splitkeeper.app.services.stop`). That call records a stop
request in the pipeline's control table, which a driver on any host reads within seconds. It
also sends SIGTERM to the lease holder when the driver runs on this host (client deploy mode).
Then ``on_kill`` waits up to ``stop_timeout_s`` for spark-submit to exit. Only if it is still
running after that does it fall back to the provider's kill.

Bounded runs (``--epochs=N``) are killed at once, as before: nothing in them waits for a stop.

Airflow 3's supervisor sends a cancelled task SIGTERM (the task runner then calls ``on_kill``)
and SIGKILL 5 s later, to the task process only (not its process group). The stop is asked
for within those 5 s, and spark-submit, a separate process, goes on to the final checkpoint.
That follows from Airflow's code; no test cancels a run through Airflow. The wait and the
fallback kill run in full when ``on_kill`` is called without that limit, for example when
``execution_timeout`` expires.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

log = logging.getLogger(__name__)


def job_environment(
    pipeline_config: str | None, spark_conn_id: str | None = None
) -> tuple[Any, dict[str, str]]:
    """The pipeline (read through its connections) and what a job started outside Airflow needs of
    those connections in its environment
    (:meth:`~splitkeeper.airflow.hooks.SplitkeeperHook.job_environment`); logged by name only."""
    from splitkeeper.airflow.hooks import SplitkeeperHook

    hook = SplitkeeperHook(pipeline_config or None, spark_conn_id)
    config = hook.load_config()
    env = hook.job_environment(config)
    if env:
        log.info("spark-submit gets the connections' settings: %s", ", ".join(sorted(env)))
    return config, env


#: How long ``on_kill`` waits for a continuous run's final checkpoint before killing spark-submit.
STOP_TIMEOUT_S = 300.0


class EpochJobSubmitOperator(SparkSubmitOperator):
    """``SparkSubmitOperator`` running ``jobs/epoch_job.py``; a cancelled continuous run stops gracefully.

    ``pipeline_config`` is the config file the job gets (``""``: ``$SPLITKEEPER_PIPELINE_CONFIG``),
    read again by ``on_kill`` to find the pipeline's state tables. ``epoch_args``: in a task group
    (:func:`splitkeeper.airflow.splitkeeper_task_group`), the run's values (epochs, until_caught_up,
    ...), which its ``application_args`` templates read as ``task.epoch_args``; None in the ingest
    DAG, whose templates read its Params.
    """

    def __init__(
        self,
        *,
        pipeline_config: str,
        stop_timeout_s: float = STOP_TIMEOUT_S,
        epoch_args: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.pipeline_config = pipeline_config
        self.stop_timeout_s = stop_timeout_s
        self.epoch_args = dict(epoch_args) if epoch_args is not None else None

    def execute(self, context: Any) -> None:
        """spark-submit, with what the pipeline's connections give in its environment (the job
        runs outside Airflow: :meth:`~splitkeeper.airflow.hooks.SplitkeeperHook.job_environment`)."""
        _config, env = job_environment(self.pipeline_config)
        if env:
            self.env_vars = {**(self.env_vars or {}), **env}
        super().execute(context)

    def _continuous(self) -> bool:
        """The rendered arguments ask for a continuous run (the ``continuous`` Param)."""
        return "--continuous" in [str(a) for a in (self.application_args or [])]

    def _spark_submit(self) -> Any:
        """The running spark-submit process (``subprocess.Popen``), or None."""
        process = getattr(self._hook, "_submit_sp", None) if self._hook is not None else None
        return process if process is not None and process.poll() is None else None

    def on_kill(self) -> None:
        process = self._spark_submit()
        if process is not None and self._continuous() and self._stop_gracefully(process):
            return
        super().on_kill()

    def _stop_gracefully(self, process: Any) -> bool:
        """Ask the continuous run to end on a global checkpoint and wait for spark-submit to exit.

        Returns True when spark-submit exited within ``stop_timeout_s``. Returns False when the
        stop could not be asked for (logged) or the run did not end in time. The caller then
        kills spark-submit.
        """
        from splitkeeper.airflow.hooks import SplitkeeperHook
        from splitkeeper.app import services

        started = time.monotonic()
        try:
            config = SplitkeeperHook(self.pipeline_config or None).open()
            stopped = services.stop(config)
        except Exception:  # noqa: BLE001 - any failure here falls back to the provider's kill
            log.exception("could not ask the continuous run to stop; killing spark-submit")
            return False
        log.info(
            "asked pipeline %s to end on a global checkpoint (SIGTERM to %s); waiting up to %.0f s "
            "for spark-submit (pid %s) to exit",
            config.name,
            stopped.signalled_pid or "no local driver: the control table carries the request",
            self.stop_timeout_s,
            process.pid,
        )
        deadline = started + self.stop_timeout_s
        while process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        if process.poll() is None:
            log.warning(
                "the continuous run did not end within %.0f s; killing spark-submit", self.stop_timeout_s
            )
            return False
        log.log(
            logging.INFO if process.returncode == 0 else logging.WARNING,
            "spark-submit exited with code %s after %.1f s (0: the run ended on its final checkpoint)",
            process.returncode,
            time.monotonic() - started,
        )
        return True
