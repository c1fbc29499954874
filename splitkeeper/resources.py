"""Where splitkeeper finds its files: the package data, and what only a source checkout has.

Every lookup of a file that is not a Python module goes through this module.

Package data, read with :mod:`importlib.resources` from ``splitkeeper._data.<folder>``
(the top-level folders of the source tree, mapped into the package by pyproject.toml's
``[tool.setuptools.package-dir]``; see :mod:`splitkeeper._data`). It works the same from a
wheel, from the editable install ``scripts/setup.sh`` makes, and from a source tree on
``PYTHONPATH``:

==========================  ======================  ================================
function                    folder                  environment override
==========================  ======================  ================================
:func:`expectations_dir`    ``expectations/``       ``SPLITKEEPER_EXPECTATIONS_DIR``
:func:`epoch_job`           ``jobs/epoch_job.py``
:func:`task_job`            ``jobs/task_job.py``
:func:`dags_dir`            ``dags/``
==========================  ======================  ================================

Checkout only: the jars that ``scripts/setup.sh`` fetches (``.jars/``, or
``SPLITKEEPER_JARS_DIR``), ``scripts/`` and ``examples/``. :func:`require_checkout` returns
the checkout, or raises EnvironmentNotReadyError saying what to set or run when splitkeeper
is an installed wheel.

Only the standard library is imported.
"""

from __future__ import annotations

import importlib.resources
import os
from collections.abc import Mapping
from importlib.resources.abc import Traversable
from pathlib import Path

from splitkeeper.errors import EnvironmentNotReadyError, InvalidParameterError

EXPECTATIONS_DIR_ENV = "SPLITKEEPER_EXPECTATIONS_DIR"

#: The package the data folders are mapped into: ``<DATA_PACKAGE>.state`` is ``state/``.
DATA_PACKAGE = "splitkeeper._data"

#: The folders shipped as package data (each a sub-package of :data:`DATA_PACKAGE`).
DATA_FOLDERS = ("state", "expectations", "jobs", "dags")

_PACKAGE_DIR = Path(__file__).resolve().parent


def checkout_root() -> Path | None:
    """The source checkout splitkeeper is imported from, or None when it is an installed package.

    A checkout is the folder above the ``splitkeeper/`` package that holds ``pyproject.toml``
    and ``scripts/setup.sh`` (an editable install imports from there too).
    """
    root = _PACKAGE_DIR.parent
    if (root / "pyproject.toml").is_file() and (root / "scripts" / "setup.sh").is_file():
        return root
    return None


def require_checkout(what: str, fix: str = "") -> Path:
    """The source checkout, for ``what`` (a thing only a checkout has), or EnvironmentNotReadyError.

    ``fix`` says how to do without a checkout (e.g. an environment variable to set); the
    message always adds how to get one.
    """
    root = checkout_root()
    if root is not None:
        return root
    how = "run splitkeeper from a source checkout (git clone, then bash scripts/setup.sh)"
    raise EnvironmentNotReadyError(
        f"{what} is part of a source checkout of splitkeeper, and this splitkeeper is an installed "
        f"package ({_PACKAGE_DIR}): {f'{fix}, or {how}' if fix else how}",
        what=what,
        package=str(_PACKAGE_DIR),
    )


def data_folder(name: str) -> Traversable:
    """The package data folder ``name`` (one of :data:`DATA_FOLDERS`), found by importlib.resources."""
    if name not in DATA_FOLDERS:
        raise InvalidParameterError("name", name, f"one of {', '.join(DATA_FOLDERS)}")
    try:
        return importlib.resources.files(f"{DATA_PACKAGE}.{name}")
    except ModuleNotFoundError as err:
        raise EnvironmentNotReadyError(
            f"splitkeeper's package data {DATA_PACKAGE}.{name} ({name}/ of the source tree) is not "
            f"installed with the package at {_PACKAGE_DIR}: reinstall it (pip install splitkeeper, or "
            "bash scripts/setup.sh in a checkout)",
            folder=name,
        ) from err


def _override(env: Mapping[str, str] | None, variable: str) -> Path | None:
    value = (os.environ if env is None else env).get(variable, "").strip()
    return Path(value) if value else None


def expectations_dir(env: Mapping[str, str] | None = None) -> Traversable:
    """The folder of the suites: ``$SPLITKEEPER_EXPECTATIONS_DIR``, else ``expectations/``."""
    return _override(env, EXPECTATIONS_DIR_ENV) or data_folder("expectations")


def _on_disk(resource: Traversable, what: str) -> Path:
    # A regular package on a file system yields a Path; a zipped one (spark-submit --py-files)
    # does not, and spark-submit and Airflow need real files.
    if isinstance(resource, Path):
        return resource
    raise EnvironmentNotReadyError(
        f"{what} must be a file on disk, and splitkeeper is imported from an archive ({resource}): "
        "install the splitkeeper wheel with pip where it runs",
        resource=str(resource),
    )


def epoch_job() -> Path:
    """``jobs/epoch_job.py``, the application ``spark-submit`` runs (a file on disk)."""
    return _on_disk(data_folder("jobs") / "epoch_job.py", "the epoch job jobs/epoch_job.py")


def task_job() -> Path:
    """``jobs/task_job.py``, the application ``spark-submit`` runs for an Airflow task's Spark work
    on a cluster master (validate, recover, rescale; :mod:`splitkeeper.airflow.submitted`)."""
    return _on_disk(data_folder("jobs") / "task_job.py", "the task job jobs/task_job.py")


def dags_dir() -> Path:
    """``dags/``, the folder to point ``AIRFLOW__CORE__DAGS_FOLDER`` at (a folder on disk)."""
    return _on_disk(data_folder("dags"), "the DAG folder dags/")
