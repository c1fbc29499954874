"""splitkeeper as an Airflow provider: its metadata, and the DAGs of a folder of pipeline files.

- :func:`get_provider_info` is the ``apache_airflow_provider`` entry point (pyproject.toml):
  ``airflow providers list`` shows splitkeeper with its hook, operators, extra link and plugin.
- :func:`splitkeeper_dags` is the one call of a DAG file::

      from splitkeeper.airflow import splitkeeper_dags

      splitkeeper_dags("pipelines/*.yaml")

  gives every pipeline file its ingest, recovery, rescale and maintenance DAGs.
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
from collections.abc import Iterable, MutableMapping
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

    splitkeeper defines no connection type of its own: its hook reads the Kafka provider's
    (``kafka_default``), the Amazon provider's (``aws_default``) and the Spark provider's
    (``spark_default``) connections.
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
        "connection-types": [],
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


__all__ = ["DAG_KINDS", "get_provider_info", "splitkeeper_dags"]
