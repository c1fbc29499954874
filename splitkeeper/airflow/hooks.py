"""``SplitkeeperHook``: the pipeline's config, its Airflow connections, and how its work runs.

Every splitkeeper operator and generated DAG goes through this hook:

- **the pipeline config**: :meth:`SplitkeeperHook.load_config` reads the pipeline file with the
  connections it names filled in;
- **connections** (read only when the file names them, never required): ``source.connection``
  names a connection the source's kind reads (the Kafka kind: the Kafka provider's ``kafka`` type,
  its extra the librdkafka config, ``bootstrap.servers`` and SASL settings; the host also works;
  :attr:`splitkeeper.kinds.SourceFactory.connection`), ``state.connection`` /
  ``sink.connection`` an AWS connection (the Amazon provider's ``aws`` type, read through its
  ``AwsBaseHook``: the credentials it resolves, the extra's ``endpoint_url`` (or
  ``service_config.s3.endpoint_url``) and ``region_name``; the ``aws`` extra installs the
  provider), ``decode.registry.connection`` a schema registry (splitkeeper's own type
  ``splitkeeper_schema_registry``, :class:`SchemaRegistryHook`). A pipeline file names
  connections, never secrets;
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

    # this hook's connection is Spark's; Kafka and AWS are the providers' types, the registry's is below
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
        return load_config(path, overrides=overrides, connections=self.named_connections(data) or None)

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

    def named_connections(self, data: Any) -> dict[str, dict[str, Any]]:
        """What the connections a pipeline file (``data``, as read) names give its keys: the
        source's (``source.connection``, :meth:`source_settings`), the files source's event topic's
        (``source.notifications.connection``, a ``kafka`` connection: its servers and client
        settings) and the schema registry's
        (``decode.registry.connection``, :meth:`SchemaRegistryHook.registry_settings`), by
        connection id (:func:`splitkeeper.config.settings.load_config`'s ``connections``)."""
        out: dict[str, dict[str, Any]] = {}
        source = data.get("source") if isinstance(data, Mapping) else None
        conn_id = source.get("connection") if isinstance(source, Mapping) else None
        kind = source.get("kind") if isinstance(source, Mapping) else None
        if isinstance(conn_id, str) and isinstance(kind, str):
            out[conn_id] = self.source_settings(kind, conn_id)
        events = source.get("notifications") if isinstance(source, Mapping) else None
        events_id = events.get("connection") if isinstance(events, Mapping) else None
        if isinstance(events_id, str):
            from splitkeeper.sources.kafka.config import connection_settings

            given = connection_settings(self, events_id)
            out[events_id] = {"bootstrap_servers": given["bootstrap_servers"], "client": given["client"]}
        decode = data.get("decode") if isinstance(data, Mapping) else None
        registry = decode.get("registry") if isinstance(decode, Mapping) else None
        registry_id = registry.get("connection") if isinstance(registry, Mapping) else None
        if isinstance(registry_id, str):
            out[registry_id] = SchemaRegistryHook(registry_id).registry_settings()
        return out

    def store_environment(self, conn_id: str) -> dict[str, str]:
        """The ``AWS_*`` variables an AWS connection gives the object store (delta-rs and Spark's
        S3A read them; :mod:`splitkeeper.delta.storage`), through the Amazon provider's
        ``AwsBaseHook``: the credentials it resolves (the connection's key pair, a role it assumes,
        a profile, or the environment's), the S3 endpoint and the region of the connection's extra."""
        hook = aws_hook(conn_id)
        config = hook.conn_config
        try:
            credentials = hook.get_credentials()
        except AttributeError:  # no credentials anywhere: the store's own default chain decides
            credentials = None
        values = {
            "AWS_ACCESS_KEY_ID": getattr(credentials, "access_key", None),
            "AWS_SECRET_ACCESS_KEY": getattr(credentials, "secret_key", None),
            "AWS_SESSION_TOKEN": getattr(credentials, "token", None),
            "AWS_ENDPOINT_URL": config.get_service_endpoint_url("s3"),
            "AWS_REGION": config.region_name,
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

        from splitkeeper.config.settings import CONNECTIONS_ENV, read_config_file

        env = self.environment(config)
        _, data = read_config_file(self.config_path())
        named = self.named_connections(data)
        if named:
            env[CONNECTIONS_ENV] = json.dumps(named)
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


def aws_hook(conn_id: str) -> Any:
    """The Amazon provider's ``AwsBaseHook`` of the ``aws`` connection ``conn_id`` (S3)."""
    try:
        from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook
    except ImportError as err:
        from splitkeeper.errors import EnvironmentNotReadyError

        raise EnvironmentNotReadyError(
            f"the AWS connection {conn_id!r} (state.connection / sink.connection) is read by the Amazon "
            f'provider, which is not installed ({err}); install it: pip install "splitkeeper[aws]"',
            connection=conn_id,
        ) from None
    return AwsBaseHook(aws_conn_id=conn_id, client_type="s3")


class SchemaRegistryHook(BaseHook):
    """A Confluent-compatible schema registry from an Airflow connection of splitkeeper's type
    ``splitkeeper_schema_registry`` (``decode.registry.connection``).

    The connection: the host is the registry's URL (``https://registry:8081``, or a host name with
    the port and the extra's ``scheme``, default ``http``; the extra's ``url`` wins), login and
    password the HTTP basic auth user and password; the extra may hold ``bearer_token``,
    ``logical_cluster``, ``ssl_ca_location``, ``ssl_certificate_location``, ``ssl_key_location``
    and ``ssl_key_password`` (the ``decode.registry`` keys of the same names).

    :param schema_registry_conn_id: the connection id
    """

    conn_name_attr = "schema_registry_conn_id"
    default_conn_name = "schema_registry_default"
    conn_type = "splitkeeper_schema_registry"
    hook_name = "Schema Registry (splitkeeper)"

    #: The extra's keys a connection may hold, as ``decode.registry`` names them.
    EXTRA_KEYS = (
        "bearer_token",
        "logical_cluster",
        "ssl_ca_location",
        "ssl_certificate_location",
        "ssl_key_location",
        "ssl_key_password",
    )

    def __init__(self, schema_registry_conn_id: str = default_conn_name) -> None:
        super().__init__()
        self.schema_registry_conn_id = schema_registry_conn_id

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """The connection form: the host is the URL, login and password the basic auth."""
        return {
            "hidden_fields": ["schema"],
            "relabeling": {"host": "Registry URL", "login": "User (basic auth)", "password": "Password"},
            "placeholders": {
                "host": "https://registry.example.com:8081",
                "extra": '{"ssl_ca_location": "/etc/ssl/registry-ca.pem", "bearer_token": "..."}',
            },
        }

    def registry_settings(self) -> dict[str, Any]:
        """The ``decode.registry`` keys the connection gives (its URL, user, password, extra)."""
        conn = self.get_connection(self.schema_registry_conn_id)
        extra = dict(conn.extra_dejson or {})
        host = (conn.host or "").rstrip("/")
        url = extra.get("url")
        if not url and host:
            if "://" not in host:
                host = f"{extra.get('scheme', 'http')}://{host}"
            has_port = ":" in host.split("://", 1)[1].split("/", 1)[0]
            url = f"{host}:{conn.port}" if conn.port and not has_port else host
        settings: dict[str, Any] = {
            "url": url or None,
            "user": conn.login or None,
            "password": conn.password or None,
        }
        settings.update({k: extra[k] for k in self.EXTRA_KEYS if extra.get(k) is not None})
        return {k: v for k, v in settings.items() if v is not None}

    def get_conn(self) -> Any:
        """The library's ``SchemaRegistryClient`` for this connection (auth and TLS applied)."""
        from splitkeeper.records.decode import registry_client
        from splitkeeper.records.spec import registry_client_conf

        url, conf = registry_client_conf(
            self.registry_settings(), where=f"connection {self.schema_registry_conn_id!r}"
        )
        return registry_client(url, conf.items)

    def test_connection(self) -> tuple[bool, str]:
        """Whether the registry answers (its subjects listed), for the UI's Test button."""
        try:
            subjects = self.get_conn().get_subjects()
        except Exception as err:  # noqa: BLE001 - the UI shows what failed
            return False, f"{type(err).__name__}: {err}"
        return True, f"the registry answered ({len(subjects)} subjects)"
