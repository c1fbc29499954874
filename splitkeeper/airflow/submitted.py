"""The Airflow tasks' Spark work: in the task's process, or a Spark application on the cluster.

:func:`spark_task` is the one door of every task step whose work starts Spark: the restart checks
(``validate`` of every DAG and of :class:`~splitkeeper.airflow.operators.SplitkeeperValidateOperator`),
the recovery's writing step (``reassign_and_rebalance``, also of
:class:`~splitkeeper.airflow.operators.SplitkeeperRecoverOperator`) and the rescale (``rescale``).
On the embedded default (no cluster master) it calls the task function of
:mod:`splitkeeper.airflow.tasks` in the task's process, as before. When
``SPLITKEEPER_SPARK_MASTER`` names a cluster it runs the same function as a Spark application
instead, submitted the way the ingest's epoch task is
(:func:`submit_task`: spark-submit through the Spark connection,
the pipeline's connections in its environment), so the Airflow task starts no Spark driver:

1. the task writes a request, ``<state>/_submitted/<id>/request.json`` (the function's name and
   arguments), under the pipeline's state location: the one place both the task and a driver on
   any host reach (a local folder or the object store);
2. spark-submit runs ``jobs/task_job.py <that folder>`` (:func:`job_main`), which calls the
   function outside Airflow (:func:`~splitkeeper.airflow.tasks.outside_airflow`) and writes
   ``result.json`` beside the request: the function's result (with the Spark application's id),
   or its error (class, code, message, parameters), and exits 1 on an error;
3. once spark-submit returns, the task reads the result, removes the folder, and returns the
   result (its XCom, as in-process; a dict gets the application's id as ``spark_application``) or
   raises the error again: the same splitkeeper error class with the same message (an
   InvariantViolation of the restart checks names its split ids as in-process), else
   :class:`~splitkeeper.errors.SubmittedJobError` with what spark-submit said.

Steps that start no Spark stay in the task: a recovery's dry run and an operator change (a rewind,
an offset reset) are applied without a submit, and the checks are not submitted when the latest
checkpoint passed them already and nothing they read changed since
(:func:`~splitkeeper.airflow.tasks.validated_already`, as the in-process task skips them); the
steps that only read state (the restore preview, the reader reports, the classification, the
report) always run in the task.

Importing this module imports no Airflow and no Spark: the job imports it on the cluster.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from splitkeeper.airflow import tasks
from splitkeeper.errors import InvalidParameterError, SplitkeeperError, SubmittedJobError

log = logging.getLogger("splitkeeper.airflow")

#: The task functions whose work starts Spark, by name: on a cluster master each is a Spark application.
TASKS: dict[str, Callable[..., Any]] = {
    "validate": tasks.validate,
    "reassign_and_rebalance": tasks.reassign_and_rebalance,
    "rescale": tasks.rescale,
}
#: The folder under the pipeline's state location that holds the submitted tasks' requests and results.
FOLDER = "_submitted"
REQUEST = "request.json"
RESULT = "result.json"


def needs_spark(name: str, kwargs: Mapping[str, Any]) -> bool:
    """Whether task ``name`` with ``kwargs`` starts Spark: a recovery's dry run or operator change
    (rewind, offset reset) does not (see :func:`splitkeeper.airflow.tasks.reassign_and_rebalance`)."""
    if name == "reassign_and_rebalance":
        reports = kwargs.get("reports") or {}
        return not ("operator" in reports or reports.get("dry_run"))
    return True


def spark_task(name: str, path: str | None = None, *, spark_conn_id: str | None = None, **kwargs: Any) -> Any:
    """``tasks.<name>(path=path, **kwargs)``: in this process, or as a Spark application on the
    cluster master (the module doc). ``spark_conn_id``: the Spark connection spark-submit uses
    (None: ``$SPLITKEEPER_SPARK_CONN_ID``, else ``spark_default``)."""
    if name not in TASKS:
        raise InvalidParameterError("name", name, f"one of {', '.join(TASKS)}")
    from splitkeeper.airflow.wiring import cluster_master

    if cluster_master() is None or not needs_spark(name, kwargs):
        return TASKS[name](path=path, **kwargs)
    if name == "validate" and kwargs.get("checkpoint_id") is None and kwargs.get("skip_validated", True):
        already = tasks.validated_already(path, kwargs.get("reader_mode"))
        if already is not None:  # nothing changed since the checks passed: nothing to submit
            return already
    return submit_task(name, path, kwargs, spark_conn_id=spark_conn_id)


def submit_task(
    name: str, path: str | None, kwargs: Mapping[str, Any], *, spark_conn_id: str | None = None
) -> Any:
    """Run ``splitkeeper.airflow.tasks.<name>(path=..., **kwargs)`` as a Spark application and return
    its result (or raise its error): the request and the result go through a folder under the
    pipeline's state (this module), spark-submit runs ``jobs/task_job.py``
    through the Spark connection (``spark_conn_id``, else ``$SPLITKEEPER_SPARK_CONN_ID``, else
    ``spark_default``) with the settings the epoch task gets. Blocks until spark-submit exits."""
    from airflow.exceptions import AirflowException
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    from splitkeeper import resources
    from splitkeeper.airflow.hooks import SplitkeeperHook
    from splitkeeper.airflow.spark_submit import job_environment
    from splitkeeper.airflow.wiring import submit_settings

    hook = SplitkeeperHook(path, spark_conn_id)
    resolved = hook.config_path()  # the job reads the same file, not $SPLITKEEPER_PIPELINE_CONFIG
    config, env = job_environment(resolved, spark_conn_id)
    settings = {**submit_settings(), "conn_id": hook.spark_conn_id}
    with request(config.state.path, name, {**kwargs, "path": resolved}) as folder:
        spark = SparkSubmitHook(
            **settings,
            name=f"splitkeeper-{name.replace('_', '-')}",
            application_args=[folder],
            env_vars=env or None,
        )
        log.info("%s: spark-submit of jobs/task_job.py through connection %s", name, hook.spark_conn_id)
        failure: AirflowException | None = None
        try:
            spark.submit(str(resources.task_job()))
        except AirflowException as err:
            failure = err
        outcome = result(folder)
    return outcome_value(name, outcome, failure)


# -- the request folder ----------------------------------------------------------------------


def _write(folder: str, name: str, data: Mapping[str, Any]) -> None:
    from splitkeeper.delta import storage

    fs, inner = storage.filesystem(folder)
    fs.create_dir(inner, recursive=True)
    with fs.open_output_stream(storage.join(inner, name)) as out:
        out.write(json.dumps(data, default=str).encode("utf-8"))


def _read(folder: str, name: str) -> dict[str, Any] | None:
    from splitkeeper.delta import storage

    fs, inner = storage.filesystem(folder)
    try:
        with fs.open_input_stream(storage.join(inner, name)) as stream:
            data: dict[str, Any] = json.loads(stream.read().decode("utf-8"))
    except FileNotFoundError:
        return None
    return data


@contextlib.contextmanager
def request(state_path: str, name: str, kwargs: Mapping[str, Any]) -> Iterator[str]:
    """A new request folder of task ``name`` under the state location,
    ``<state>/_submitted/<random id>``, holding its arguments (JSON, as the task's XComs are);
    removed on leaving, with the folders it created (a local state folder that was not there)."""
    from splitkeeper.delta import storage

    folder = storage.join(state_path, FOLDER, uuid.uuid4().hex)
    local = storage.local_path(state_path)
    created = (
        [] if local is None else [p for p in (os.path.join(local, FOLDER), local) if not os.path.isdir(p)]
    )
    _write(folder, REQUEST, {"task": name, "kwargs": dict(kwargs)})
    try:
        yield folder
    finally:
        fs, inner = storage.filesystem(folder)
        with contextlib.suppress(OSError):
            fs.delete_dir(inner)
        for made in created:  # only when empty: a run may have written state meanwhile
            with contextlib.suppress(OSError):
                os.rmdir(made)


def result(folder: str) -> dict[str, Any] | None:
    """The job's result of the request in ``folder`` (None: it left none)."""
    return _read(folder, RESULT)


def outcome_value(name: str, outcome: Mapping[str, Any] | None, failure: BaseException | None) -> Any:
    """What the task returns for the job's ``outcome``, or raises: the job's error again, or
    SubmittedJobError when it left no result or spark-submit failed after its result (``failure``)."""
    said = f": {failure}" if failure is not None else ""
    if outcome is None:
        raise SubmittedJobError(
            f"{name}'s Spark application left no result{said}; its driver's output is in this task's "
            "log above. The driver must reach the pipeline's state location, where the request and "
            "the result are kept",
            task=name,
        )
    if "error" in outcome:
        raise rebuild_error(name, outcome["error"])
    if failure is not None:
        raise SubmittedJobError(
            f"{name}'s Spark application wrote its result, then spark-submit failed{said}", task=name
        )
    value = outcome.get("result")
    application = outcome.get("application_id")
    log.info("%s ran as Spark application %s", name, application or "(no Spark context was started)")
    if isinstance(value, dict) and application:
        return {**value, "spark_application": application}
    return value


# -- errors, both ways -----------------------------------------------------------------------


def error_data(err: BaseException) -> dict[str, Any]:
    """``err`` as JSON data: class name, code, message and parameters (splitkeeper's own errors)."""
    if isinstance(err, SplitkeeperError):
        params = json.loads(json.dumps(err.params, default=str))
        return {"type": type(err).__name__, "code": err.code, "message": err.message, "params": params}
    return {"type": f"{type(err).__module__}.{type(err).__qualname__}", "message": str(err)}


def _error_classes() -> dict[str, type[SplitkeeperError]]:
    found: dict[str, type[SplitkeeperError]] = {}
    todo: list[type[SplitkeeperError]] = [SplitkeeperError]
    while todo:
        cls = todo.pop()
        found.setdefault(cls.__name__, cls)
        todo.extend(cls.__subclasses__())
    return found


def rebuild_error(name: str, data: Mapping[str, Any]) -> Exception:
    """The error the job reported (:func:`error_data`): the same splitkeeper class, code, message and
    parameters; any other exception as SubmittedJobError naming its class."""
    cls = _error_classes().get(str(data.get("type")))
    if cls is not None and cls.code == data.get("code"):
        err = cls.__new__(cls)
        SplitkeeperError.__init__(err, str(data.get("message")), **dict(data.get("params") or {}))
        return err
    return SubmittedJobError(
        f"{name} failed in its Spark application: {data.get('type')}: {data.get('message')}", task=name
    )


# -- the job (jobs/task_job.py) --------------------------------------------------------------


def _application_id() -> str | None:
    """The id of the Spark application this driver started, if it started one."""
    try:
        from pyspark import SparkContext
    except ImportError:
        return None
    context = SparkContext._active_spark_context
    return None if context is None else str(context.applicationId)


def job_main(argv: Sequence[str]) -> int:
    """``jobs/task_job.py FOLDER``: run the request of ``FOLDER``, write its result beside it;
    exit 0, or 1 when the task function raised (its error is the result)."""
    from splitkeeper import logs

    parser = argparse.ArgumentParser(prog="task_job.py", description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="the request folder the Airflow task wrote (<state>/_submitted/<id>)")
    args = parser.parse_args(list(argv))
    logs.configure(logs.default_level(), logs.default_format())
    request = _read(args.folder, REQUEST)
    if request is None or request.get("task") not in TASKS:
        parser.error(f"{args.folder}: no {REQUEST} naming one of {', '.join(TASKS)}")
    name = str(request["task"])
    code = 0
    try:
        with tasks.outside_airflow():
            outcome: dict[str, Any] = {"result": TASKS[name](**request.get("kwargs", {}))}
    except Exception as err:  # noqa: BLE001 - the task's error is its result, raised again by the task
        log.exception("%s failed", name)
        outcome = {"error": error_data(err)}
        code = 1
    outcome["application_id"] = _application_id()
    _write(args.folder, RESULT, outcome)
    return code
