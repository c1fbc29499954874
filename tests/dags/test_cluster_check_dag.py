"""splitkeeper_cluster_check: the one-task DAG `tests/cluster` triggers through the REST API."""

from __future__ import annotations

from tests.dags.conftest import load_dag


def test_cluster_check_dag_is_one_hand_triggered_task():
    dag = load_dag("splitkeeper_cluster_check")
    assert [t.task_id for t in dag.topological_sort()] == ["where_am_i"]
    assert dag.schedule is None if hasattr(dag, "schedule") else True
    assert dag.default_args["retries"] == 0
