"""Which pipeline files the Airflow side works on: ``$SPLITKEEPER_PIPELINE_CONFIG`` and an explicit path.

Imports no Airflow: the task functions (:mod:`splitkeeper.airflow.tasks`), the hook and the DAG
wiring all ask it, so none of them imports another for this.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from splitkeeper.errors import InvalidParameterError

CONFIG_ENV = "SPLITKEEPER_PIPELINE_CONFIG"


def config_path(explicit: str | None = None) -> str:
    """The pipeline config a task works on: the argument, else ``$SPLITKEEPER_PIPELINE_CONFIG``."""
    path = explicit or os.environ.get(CONFIG_ENV, "")
    if not path or (not explicit and os.pathsep in path.strip(os.pathsep)):
        raise InvalidParameterError(
            CONFIG_ENV,
            path,
            "the path of a pipeline config file (several, separated by os.pathsep, only for the DAG "
            "files, which pass each task its pipeline's path)",
            hint=f"export {CONFIG_ENV}=/path/pipeline.yaml, or pass the path",
        )
    return path.strip(os.pathsep)


def config_paths(env: Mapping[str, str] | None = None) -> list[str]:
    """The pipeline config files named by ``$SPLITKEEPER_PIPELINE_CONFIG``: one path, or several
    separated by ``os.pathsep`` (``:``, as in ``PATH``). Empty when it is unset."""
    raw = (os.environ if env is None else env).get(CONFIG_ENV, "")
    return [p.strip() for p in raw.split(os.pathsep) if p.strip()]
