"""``SplitkeeperHook``: the pipeline's config, its Airflow connections, and how its work runs.

Every splitkeeper operator and generated DAG goes through this hook:

- **the pipeline config**: :meth:`SplitkeeperHook.load_config` reads the pipeline file with the
  connections it names filled in;
- **connections** (read only when the file names them, never required): ``source.connection``
  names a connection the source's kind reads (the Kafka kind: the Kafka provider's ``kafka`` type,
  its extra the librdkafka config, ``bootstrap.servers`` and SASL settings; the host also works;
  :attr:`splitkeeper.kinds.SourceFactory.connection`), ``state.connection`` /
  ``sink.connection`` an AWS connection (the Amazon provider's ``aws`` type: login and password
  are the key pair, the extra's ``endpoint_url`` and ``region_name``). Without the provider
  packages the connection is read generically (``BaseHook.get_connection``). A pipeline file
  names connections, never secrets;
- **how the work runs**: in this process on local Spark, or, when the Spark master is a
  cluster, ``spark-submit`` through the ``spark_default`` connection
  (:meth:`SplitkeeperHook.cluster_master`).

The environment variables of earlier versions keep working: ``${NAME}`` references in the
pipeline file, ``AWS_*`` for the object store, ``SPLITKEEPER_SPARK_MASTER`` and
``SPLITKEEPER_SPARK_CONN_ID`` for the cluster, ``SPLITKEEPER_PIPELINE_CONFIG`` for the file (this
one logs a deprecation note once per process).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

try:
    from airflow.sdk import BaseHook
except ImportError:  # Airflow before 3.1
    from airflow.hooks.base import BaseHook  # type: ignore[no-redef,attr-defined]

log = logging.getLogger("splitkeeper.airflow")

_DEPRECATED: set[str] = set()


def deprecated(variable: str, instead: str) -> None:
    """Log once per process that ``variable`` is used where ``instead`` is the way now."""
    if variable not in _DEPRECATED:
        _DEPRECATED.add(variable)
        log.warning("splitkeeper: $%s is deprecated and still works; use %s instead", variable, instead)


class SplitkeeperHook(BaseHook):
    """The pipeline config, its connections (Kafka, S3, Spark) and where its Spark work runs.

    :param pipeline_config: the pipeline file (None: ``$SPLITKEEPER_PIPELINE_CONFIG``, deprecated)
    :param spark_conn_id: the Spark connection spark-submit uses on a cluster master
    """

    # splitkeeper has no connection type of its own: it reads the Kafka, AWS and Spark providers' ones
    conn_name_attr = "spark_conn_id"
    default_conn_name = "spark_default"
    hook_name = "splitkeeper"

    def __init__(self, pipeline_config: str | None = None, spark_conn_id: str | None = None) -> None:
        super().__init__()
        self.pipeline_config = pipeline_config or None
        self.spark_conn_id = spark_conn_id or os.environ.get("SPLITKEEPER_SPARK_CONN_ID") or "spark_default"

    # -- the pipeline config -------------------------------------------------------------------

    def config_path(self) -> str:
        """The pipeline file: the one given, else ``$SPLITKEEPER_PIPELINE_CONFIG`` (deprecated)."""
        from splitkeeper.airflow.files import CONFIG_ENV, config_path

        if self.pipeline_config is None and os.environ.get(CONFIG_ENV):
            deprecated(CONFIG_ENV, "the operators' pipeline_config or splitkeeper_dags('pipelines/*.yaml')")
        return config_path(self.pipeline_config)

    def load_config(self, overrides: Mapping[str, Any] | None = None) -> Any:
        """The validated pipeline config, ``source.connection``'s servers and client settings filled in."""
        from splitkeeper.config.settings import load_config, read_config_file

        path = self.config_path()
        _, data = read_config_file(path)
        source = data.get("source") if isinstance(data, Mapping) else None
        conn_id = source.get("connection") if isinstance(source, Mapping) else None
        kind = source.get("kind") if isinstance(source, Mapping) else None
        connections = (
            {conn_id: self.source_settings(kind, conn_id)}
            if isinstance(conn_id, str) and isinstance(kind, str)
            else None
        )
        return load_config(path, overrides=overrides, connections=connections)

    # -- connections ---------------------------------------------------------------------------

    @staticmethod
    def connection(conn_id: str) -> Any:
        """The Airflow connection ``conn_id`` (the providers' types, or read generically)."""
        return BaseHook.get_connection(conn_id)

    def source_settings(self, kind: str, conn_id: str) -> dict[str, Any]:
        """What connection ``conn_id`` gives a source of ``kind``: the source keys the kind reads from
        it (the Kafka kind: its servers, group and client settings,
        :func:`splitkeeper.sources.kafka.config.connection_settings`); empty for a kind that reads
        no connection."""
        from splitkeeper.kinds import load, source_factory

        factory = source_factory(kind)
        if factory.connection is None:
            return {}
        settings: dict[str, Any] = load(factory.connection, f"source.kind {kind!r}")(self, conn_id)
        return settings

    def store_environment(self, conn_id: str) -> dict[str, str]:
        """The ``AWS_*`` variables an AWS connection gives the object store (delta-rs and Spark's
        S3A read them; :mod:`splitkeeper.delta.storage`)."""
        conn = self.connection(conn_id)
        extra = dict(conn.extra_dejson or {})
        endpoint = extra.get("endpoint_url") or (extra.get("service_config", {}).get("s3", {}) or {}).get(
            "endpoint_url"
        )
        values = {
            "AWS_ACCESS_KEY_ID": conn.login or extra.get("aws_access_key_id"),
            "AWS_SECRET_ACCESS_KEY": conn.password or extra.get("aws_secret_access_key"),
            "AWS_SESSION_TOKEN": extra.get("aws_session_token"),
            "AWS_ENDPOINT_URL": endpoint or conn.host or None,
            "AWS_REGION": extra.get("region_name"),
        }
        return {k: str(v) for k, v in values.items() if v}

    def environment(self, config: Any) -> dict[str, str]:
        """The variables the pipeline's named store connections give (empty when it names none)."""
        env: dict[str, str] = {}
        for conn_id in getattr(config, "store_connections", ()):
            env.update(self.store_environment(conn_id))
        return env

    def job_environment(self, config: Any) -> dict[str, str]:
        """The variables a job started outside Airflow (spark-submit) needs to reach what the
        connections give: the store's ``AWS_*`` and the source connection's keys as
        ``$SPLITKEEPER_CONNECTIONS`` (read by ``load_config`` in the job). Environment, not
        arguments: no secret on a command line."""
        import json

        from splitkeeper.config.settings import CONNECTIONS_ENV

        env = self.environment(config)
        conn_id = getattr(config.source, "connection", None)
        if conn_id:
            env[CONNECTIONS_ENV] = json.dumps(
                {conn_id: self.source_settings(config.source.kind_name, conn_id)}
            )
        return env

    def apply_environment(self, config: Any) -> None:
        """Put the store connections' variables into this process (a task runs in its own process)."""
        env = self.environment(config)
        if env:
            log.info("object store from connection(s) %s", ", ".join(config.store_connections))
            os.environ.update(env)

    # -- how the work runs ---------------------------------------------------------------------

    @staticmethod
    def cluster_master() -> str | None:
        """The Spark master when it is a cluster (spark://, k8s://, yarn), else None: in-process Spark.

        ``$SPLITKEEPER_SPARK_MASTER``, read when the DAG file is parsed (the DAG's shape depends on
        it; a connection is not read at parse time). spark-submit then runs through
        ``spark_conn_id``."""
        master = os.environ.get("SPLITKEEPER_SPARK_MASTER", "")
        return master if master and not master.startswith("local") else None

    def open(self, overrides: Mapping[str, Any] | None = None) -> Any:
        """The pipeline config, with the store connections' variables applied to this process."""
        config = self.load_config(overrides)
        self.apply_environment(config)
        return config
