"""The epoch job: run a splitkeeper pipeline's epochs on Spark.

Runnable with spark-submit on any master (the cluster's jars must include Delta)::

    spark-submit --py-files splitkeeper.zip jobs/epoch_job.py --config pipeline.yaml --epochs 5

and callable in-process (the Airflow tasks do that on the embedded default)::

    from jobs.epoch_job import main; main(["--config", "pipeline.yaml", "--epochs", "5"])

Its logic lives in :mod:`splitkeeper.runtime.pipeline`; this file only parses arguments.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    from splitkeeper.cli import main as cli_main

    return cli_main(["run", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    raise SystemExit(main())
