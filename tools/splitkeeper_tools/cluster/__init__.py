"""A multi-process splitkeeper deployment on one machine, without Docker (``scripts/cluster.sh``).

:mod:`splitkeeper_tools.cluster.local` starts, probes and stops, on 127.0.0.1 only: a Spark
standalone master and workers (pyspark's own ``bin/spark-class``, Spark authentication on),
PostgreSQL (Airflow's metadata database), Airflow 3 (api-server, scheduler with the
LocalExecutor, dag-processor, triggerer; simple auth manager with generated users), an
S3-compatible object store (versitygw, built by ``scripts/setup.sh cluster``) and the
project's Kafka broker. :mod:`splitkeeper_tools.cluster.s3` is the small S3 client of the probes.
"""

from splitkeeper_tools.cluster.local import ClusterError, LocalCluster, ServiceStatus

__all__ = ["ClusterError", "LocalCluster", "ServiceStatus"]
