"""DAG tests run real Airflow DAG runs (``dag.test()``) against a real SQLite metadata DB and real Spark.

Airflow reads its configuration when first imported, so the environment is set
here, at collection time, before any test module imports a DAG.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_HOME = Path(tempfile.mkdtemp(prefix="splitkeeper-airflow-"))
os.environ.setdefault("AIRFLOW_HOME", str(_HOME))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", str(REPO / "dags"))
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "False")


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """A migrated Airflow metadata database (SQLite) for this test session."""
    airflow = Path(sys.executable).with_name("airflow")
    done = subprocess.run(
        [str(airflow), "db", "migrate"], capture_output=True, text=True, env=os.environ.copy(), timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    from splitkeeper.airflow.wiring import share_in_process_execution_api

    share_in_process_execution_api()  # dag.test() builds an API server per task otherwise: seconds each
    return Path(os.environ["AIRFLOW_HOME"])


def load_dag(name: str, folder: Path = REPO / "dags"):
    """Import a DAG file of ``folder`` (dags/) the way the scheduler would, and return its DAG."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"dag_{name}", folder / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dag
