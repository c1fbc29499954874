"""The epoch job: the application spark-submit runs to drive a pipeline's epochs on a cluster.

The ingest DAG's epoch task submits it when ``SPLITKEEPER_SPARK_MASTER`` names a cluster
(:func:`splitkeeper.airflow.wiring.spark_submit_epoch_task`; on the embedded default
the task runs the epochs in-process through :mod:`splitkeeper.app.services` and this file is
not used). It takes the options of ``splitkeeper run`` and hands them to that command
unchanged; the cluster's jars must include Delta::

    spark-submit --py-files splitkeeper.zip jobs/epoch_job.py --config pipeline.yaml --epochs 5
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    from splitkeeper.cli import main as cli_main

    return cli_main(["run", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    raise SystemExit(main())
