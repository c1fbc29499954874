"""splitkeeper as an Airflow provider: its metadata, and the DAGs of a folder of pipeline files.

- :func:`get_provider_info` is the ``apache_airflow_provider`` entry point (pyproject.toml):
  ``airflow providers list`` shows splitkeeper with its hook, operators, extra link and plugin.
- :func:`splitkeeper_dags` is the one call of a DAG file::

      from splitkeeper.airflow import splitkeeper_dags

      splitkeeper_dags("pipelines/*.yaml")

  gives every pipeline file its ingest, recovery, rescale and maintenance DAGs.
- :func:`splitkeeper_task_group` puts one pipeline's ingest -> validate -> report steps into a
  DAG of one's own, as a TaskGroup::

      with DAG("orders_daily", schedule="@daily"):
          extract() >> splitkeeper_task_group("pipelines/orders.yaml") >> publish()
- :mod:`splitkeeper.airflow.triggers` (``SplitkeeperNewDataTrigger``): the event trigger an Asset
  watcher runs for ``airflow.schedule: on_new_data`` (the ingest runs when the source has
  something new; no Spark while it waits).
- :mod:`splitkeeper.airflow.hooks` (``SplitkeeperHook``) and :mod:`splitkeeper.airflow.operators`
  (``SplitkeeperIngestOperator``, ``SplitkeeperRecoverOperator``, ``SplitkeeperValidateOperator``,
  ``SplitkeeperReportOperator``, ``SplitkeeperMaintainOperator``) are for DAGs of one's own.

Importing this package imports no Airflow and no Spark: the providers manager calls
:func:`get_provider_info` in every Airflow process.
"""

from __future__ import annotations

import glob
import inspect
import os
from collections.abc import Iterable, Mapping, MutableMapping
from pathlib import Path
from typing import Any

PACKAGE = "splitkeeper"
#: The DAG kinds :func:`splitkeeper_dags` builds for each pipeline, by their DAG id's base.
DAG_KINDS = ("ingest", "recover", "rescale", "maintain")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(PACKAGE)
    except PackageNotFoundError:  # a checkout on sys.path, not installed
        from splitkeeper import __version__

        return __version__


def get_provider_info() -> dict[str, Any]:
    """The provider's metadata, as Airflow's ``provider_info.schema.json`` describes it.

    splitkeeper reads the Kafka provider's (``kafka``), the Amazon provider's (``aws``, through its
    ``AwsBaseHook``) and the Spark provider's (``spark``) connection types; its one type of its own
    is the schema registry's (``splitkeeper_schema_registry``, ``SchemaRegistryHook``), which no
    provider has.
    """
    return {
        "package-name": PACKAGE,
        "name": "splitkeeper",
        "description": "Flink-style split ownership, recovery and regional checkpoints for Spark "
        "ingestion pipelines: hook, operators, generated DAGs and the run report plugin.",
        "versions": [_version()],
        "integrations": [{"integration-name": "splitkeeper", "tags": ["software"]}],
        "hooks": [{"integration-name": "splitkeeper", "python-modules": ["splitkeeper.airflow.hooks"]}],
        "operators": [
            {"integration-name": "splitkeeper", "python-modules": ["splitkeeper.airflow.operators"]}
        ],
        "triggers": [{"integration-name": "splitkeeper", "python-modules": ["splitkeeper.airflow.triggers"]}],
        "connection-types": [
            {
                "connection-type": "splitkeeper_schema_registry",
                "hook-class-name": "splitkeeper.airflow.hooks.SchemaRegistryHook",
            }
        ],
        "extra-links": ["splitkeeper.airflow.plugin.RunReportLink"],
        "plugins": [{"name": "splitkeeper", "plugin-class": "splitkeeper.airflow.plugin.SplitkeeperPlugin"}],
    }


def _pipeline_files(pattern: str | None, base: Path) -> list[str] | None:
    """The files ``pattern`` matches (relative to ``base``, the calling DAG file's folder), sorted;
    None for no pattern (``$SPLITKEEPER_PIPELINE_CONFIG``, deprecated)."""
    from splitkeeper.errors import InvalidParameterError

    if pattern is None:
        return None
    full = os.path.expanduser(pattern)
    if not os.path.isabs(full):
        full = str(base / full)
    files = sorted(glob.glob(full))
    if not files:
        raise InvalidParameterError(
            "pattern",
            pattern,
            "a glob matching pipeline files (.yaml, .yml or .toml)",
            hint=f"nothing matches {full}; a relative pattern is relative to the DAG file's folder {base}",
        )
    return files


def splitkeeper_dags(
    pattern: str | None = None,
    *,
    kinds: Iterable[str] = DAG_KINDS,
    register: MutableMapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The DAGs of every pipeline file ``pattern`` matches, registered into the caller's globals.

    :param pattern: a glob of pipeline files, relative to the calling DAG file's folder (e.g.
        ``"pipelines/*.yaml"``); None: the files ``$SPLITKEEPER_PIPELINE_CONFIG`` names (deprecated)
    :param kinds: which DAGs per pipeline: ``ingest`` (scheduled by the file's ``airflow.schedule``;
        ``on_new_data``: on an Asset whose watcher fires when the source has something new),
        ``recover`` and ``rescale`` (triggered by hand), ``maintain`` (daily)
    :param register: where to put each DAG under its id (default: the calling module's globals,
        where Airflow's DagBag finds DAGs)
    :return: the DAGs by DAG id. With one pipeline the ids are the plain ones
        (``splitkeeper_ingest``); with several each ends with ``__<pipeline name>``.
    """
    from splitkeeper.airflow import dags as builders
    from splitkeeper.airflow.files import CONFIG_ENV, config_paths
    from splitkeeper.airflow.hooks import deprecated
    from splitkeeper.airflow.wiring import dag_pipelines
    from splitkeeper.errors import InvalidParameterError

    caller = inspect.currentframe()
    caller_globals = caller.f_back.f_globals if caller is not None and caller.f_back is not None else {}
    base = Path(caller_globals.get("__file__") or os.getcwd()).resolve()
    paths = _pipeline_files(pattern, base.parent if base.is_file() else base)
    if paths is None and config_paths():
        deprecated(CONFIG_ENV, 'splitkeeper_dags("pipelines/*.yaml") in the DAG file')
    chosen = list(kinds)
    unknown = [k for k in chosen if k not in DAG_KINDS]
    if unknown:
        raise InvalidParameterError("kinds", unknown, "some of " + ", ".join(DAG_KINDS))
    out: dict[str, Any] = {}
    for pipeline in dag_pipelines(paths=paths):
        for kind in chosen:
            dag = builders.BUILDERS[kind](pipeline)
            out[dag.dag_id] = dag
    target = caller_globals if register is None else register
    target.update(out)
    return out


def _caller_folder(frame: Any) -> Path:
    """The folder of the DAG file that called (relative pipeline paths are relative to it), else
    the working directory."""
    caller_globals = frame.f_back.f_globals if frame is not None and frame.f_back is not None else {}
    base = Path(caller_globals.get("__file__") or os.getcwd()).resolve()
    return base.parent if base.is_file() else base


def splitkeeper_task_group(
    pipeline: str | os.PathLike[str] | Any,
    *,
    group_id: str | None = None,
    epochs: int = 3,
    until_caught_up: bool = True,
    overrides: Mapping[str, Any] | None = None,
    reset_backlog: bool = False,
    reader_mode: str | None = None,
    validate: bool = True,
    report: bool = True,
    tooltip: str | None = None,
    default_args: Mapping[str, Any] | None = None,
) -> Any:
    """One pipeline's ingest as a TaskGroup of the DAG being defined: ``run_epochs -> validate ->
    report``, the ingest DAG's steps (the same operators, the pipeline's writer pool, spark-submit
    on a cluster master, a report with trigger rule all_done)::

        with DAG("orders_daily", schedule="@daily"):
            extract() >> splitkeeper_task_group("pipelines/orders.yaml", group_id="orders") >> publish()

    The task ids are ``<group_id>.run_epochs``, ``<group_id>.validate`` and ``<group_id>.report``.
    The report step fails when a task of its group failed (a failed validate turns the DAG run
    red, its report still written); the other tasks of the DAG do not count in its verdict. The
    schedule, the Params and recovery are the DAG's: recovery stays the hand-triggered
    ``splitkeeper_recover`` DAG of :func:`splitkeeper_dags`.

    :param pipeline: the pipeline file (relative to the calling DAG file's folder), or a
        :class:`~splitkeeper.airflow.wiring.DagPipeline`
    :param group_id: the group's id; default: the pipeline's name (``.`` becomes ``_``)
    :param epochs: epochs (checkpoints) per run, 1 to 1000 (the ingest DAG's ``epochs`` Param)
    :param until_caught_up: Kafka: stop at the global checkpoint where every partition reached the
        end it had when the run began; file sources end by themselves
    :param overrides: this run's overrides of the config's tuning sections (the ingest DAG's
        ``pipeline`` Param), e.g. ``{"backlog": {"normal_epoch_records": 5000}}``
    :param reset_backlog: Kafka: the end offsets now become every partition's backlog boundary
    :param reader_mode: ``deferred``, ``legacy`` or None (the file's ``source.reader_mode``)
    :param validate: add the Great Expectations restart checks step
    :param report: add the run report step
    :param tooltip: the group's tooltip in the UI; default: the pipeline's name and file
    :param default_args: over the pipeline's (no retries, a 2 h timeout, the failure notification)
    :return: the TaskGroup (``a >> group >> b`` runs the ingest between a and b)
    :raises InvalidParameterError: a missing pipeline file, a value outside the ingest DAG's Param,
        a group_id another task or group of the DAG has, or no DAG being defined
    :raises ConfigError: the pipeline file does not load (names the key and the file)
    """
    from airflow.exceptions import ParamValidationError

    from splitkeeper.airflow import dags as builders
    from splitkeeper.airflow.hooks import SplitkeeperHook
    from splitkeeper.airflow.wiring import DagPipeline
    from splitkeeper.errors import InvalidParameterError

    if isinstance(pipeline, DagPipeline):
        chosen = pipeline
    elif isinstance(pipeline, (str, os.PathLike)):
        folder = _caller_folder(inspect.currentframe())
        path = Path(os.path.expanduser(os.fspath(pipeline)))
        path = path if path.is_absolute() else folder / path
        if not path.is_file():
            raise InvalidParameterError(
                "pipeline",
                os.fspath(pipeline),
                "a pipeline file (.yaml, .yml or .toml)",
                hint=f"There is no file {path}; a relative path is relative to the DAG file's folder "
                f"{folder}",
            )
        # as the tasks load it: the connections the file names fill in what they give
        chosen = DagPipeline(str(path), SplitkeeperHook(str(path)).load_config())
    else:
        raise InvalidParameterError(
            "pipeline", pipeline, "the path of a pipeline file or a DagPipeline (splitkeeper.airflow.wiring)"
        )
    config = chosen.config
    name = config.name if config is not None else Path(chosen.path).stem
    params = builders.ingest_params()
    given: dict[str, Any] = {
        "epochs": epochs,
        "until_caught_up": until_caught_up,
        "reset_backlog": reset_backlog,
        "reader_mode": reader_mode,
        "pipeline": {} if overrides is None else dict(overrides),
    }
    for key, value in given.items():
        try:
            params[key].resolve(value)
        except ParamValidationError as err:
            argument = "overrides" if key == "pipeline" else key
            why = getattr(err.args[0], "message", str(err)) if err.args else str(err)  # jsonschema's
            raise InvalidParameterError(argument, value, str(params[key].description), hint=why) from err
    epoch_args: dict[str, Any] = {**given, "continuous": False, "faults": []}
    return builders.ingest_group(
        chosen,
        group_id or name.replace(".", "_"),
        epoch_args,
        validate=validate,
        report=report,
        tooltip=f"splitkeeper pipeline {name} ({chosen.path})" if tooltip is None else tooltip,
        default_args=default_args,
    )


__all__ = ["DAG_KINDS", "get_provider_info", "splitkeeper_dags", "splitkeeper_task_group"]
