"""splitkeeper_recover: one DAG per pipeline of $SPLITKEEPER_PIPELINE_CONFIG (splitkeeper.airflow.dags)."""

from splitkeeper.airflow import splitkeeper_dags

dags = splitkeeper_dags(kinds=("recover",))
dag = list(dags.values())[-1]
