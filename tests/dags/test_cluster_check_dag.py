"""splitkeeper_cluster_check: the one-task DAG `tests/cluster` triggers through the REST API."""

from __future__ import annotations

from splitkeeper import resources
from splitkeeper_tools.cluster.local import CLUSTER_DAGS
from tests.dags.conftest import load_dag


def test_cluster_check_dag_is_one_hand_triggered_task():
    dag = load_dag("splitkeeper_cluster_check", CLUSTER_DAGS)
    assert [t.task_id for t in dag.topological_sort()] == ["where_am_i"]
    assert dag.schedule is None if hasattr(dag, "schedule") else True
    assert dag.default_args["retries"] == 0


def test_the_cluster_check_dag_ships_with_the_tools_not_the_product():
    """The product's DAG folder (package data of the wheel) holds only the pipeline DAGs."""
    shipped = sorted(p.name for p in resources.dags_dir().glob("*.py") if p.name != "__init__.py")
    assert "splitkeeper_cluster_check.py" not in shipped
    assert shipped == [
        "splitkeeper_ingest.py",
        "splitkeeper_maintain.py",
        "splitkeeper_recover.py",
        "splitkeeper_rescale.py",
    ]
