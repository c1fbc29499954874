"""The task job: the application spark-submit runs for an Airflow task's Spark work on a cluster.

When ``SPLITKEEPER_SPARK_MASTER`` names a cluster, the Airflow tasks whose work starts Spark
(the restart checks of every DAG, the recovery's writing step, the rescale) submit this file
instead of starting a driver in the task (:func:`splitkeeper.airflow.submitted.spark_task`). Its
one argument is the request folder the task wrote under the pipeline's state
(``<state>/_submitted/<id>/``): ``request.json`` names the task function and its arguments; the job
runs it and writes ``result.json`` beside it (the function's result, or its error), which the
task reads once spark-submit returns::

    spark-submit --py-files splitkeeper.zip jobs/task_job.py s3://lake/orders/state/_submitted/<id>
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    from splitkeeper.airflow.submitted import job_main

    return job_main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    raise SystemExit(main())
