"""The one place a SparkSession is built: Delta enabled, jars from the local folder.

Jobs call :func:`get_spark` (usually with :meth:`SparkSettings.from_env`) on the
driver, once per process; later calls return the same session. The same job code
runs on ``local[*]``, ``spark://``, ``k8s://`` or ``yarn``: only the settings change.

Spark never downloads anything here: ``spark.jars`` lists the files fetched by
``scripts/setup.sh`` into ``.jars/spark/`` (plus ``.jars/s3a/`` when the conf sets
``spark.hadoop.fs.s3a.*`` keys; see :mod:`splitkeeper.spark.jars`), and
``spark.jars.packages`` is refused.

``SPLITKEEPER_SPARK_CONF`` may carry credentials (S3A keys, ``spark.authenticate.secret``):
errors about it name an entry's position and key, never its text, and
``repr(SparkSettings)`` hides the values of credential keys.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from splitkeeper.errors import EnvironmentNotReadyError, InvalidParameterError
from splitkeeper.spark import jars as jarlib

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"

ENV_MASTER = "SPLITKEEPER_SPARK_MASTER"
ENV_APP_NAME = "SPLITKEEPER_SPARK_APP_NAME"
ENV_UI = "SPLITKEEPER_SPARK_UI"
ENV_SHUFFLE_PARTITIONS = "SPLITKEEPER_SPARK_SHUFFLE_PARTITIONS"
ENV_DRIVER_MEMORY = "SPLITKEEPER_SPARK_DRIVER_MEMORY"
ENV_WAREHOUSE = "SPLITKEEPER_SPARK_WAREHOUSE"
ENV_CONF = "SPLITKEEPER_SPARK_CONF"
#: ``0`` keeps Hadoop's own local file system even when splitkeeper's jar is there.
ENV_LOCAL_FS = "SPLITKEEPER_LOCAL_FS"

_MASTER = re.compile(r"^(local(\[(\*|\d+)(,\d+)?\])?|local-cluster\[\d+,\d+,\d+\]|spark://.+|k8s://.+|yarn)$")
_MASTER_ALLOWED = (
    "local, local[N], local[*], local[N,F], local-cluster[N,C,M], spark://HOST:PORT, k8s://URL or yarn"
)
_TRUE = {"1", "true", "yes", "on"}
# What Spark's own spark.redaction.regex hides in its UI and event logs, plus the S3A keys.
_SECRET_KEY = re.compile(r"(?i)secret|password|token|credential|access[._-]?key|session[._-]?key")
_CONF_KEY = re.compile(r"spark\.[A-Za-z0-9_.\-]+")
_REDACTED = "*********(redacted)"
_FALSE = {"0", "false", "no", "off"}
# Set by get_spark itself; extra_conf may not override them.
_RESERVED = {"spark.jars", "spark.jars.packages", "spark.sql.extensions", "spark.sql.catalog.spark_catalog"}


@dataclass(frozen=True, slots=True)
class SparkSettings:
    """How to build the session. Immutable; ``extra_conf`` is a tuple of (key, value).

    ``driver_memory`` and ``master`` take effect only when this call starts the JVM.
    ``jars_dir`` overrides the jars root (else ``$SPLITKEEPER_JARS_DIR`` or ``.jars``).
    """

    master: str = "local[*]"
    app_name: str = "splitkeeper"
    ui_enabled: bool = True
    shuffle_partitions: int = 8
    driver_memory: str | None = None
    warehouse_dir: str | None = None
    jars_dir: Path | None = None
    extra_conf: tuple[tuple[str, str], ...] = field(default=())

    def __post_init__(self) -> None:
        if not _MASTER.match(self.master):
            raise InvalidParameterError("master", self.master, _MASTER_ALLOWED)
        if not self.app_name.strip():
            raise InvalidParameterError("app_name", self.app_name, "a non-empty name")
        if self.shuffle_partitions < 1:
            raise InvalidParameterError("shuffle_partitions", self.shuffle_partitions, "an integer >= 1")
        for key, _value in self.extra_conf:
            if key in _RESERVED:
                raise InvalidParameterError(
                    "extra_conf",
                    key,
                    f"any Spark key except {', '.join(sorted(_RESERVED))}",
                    hint="splitkeeper sets these itself from the jars fetched by scripts/setup.sh",
                )

    def __repr__(self) -> str:
        # extra_conf may hold credentials (S3A keys, spark.authenticate.secret): keys only.
        names = ("master", "app_name", "ui_enabled", "shuffle_partitions", "driver_memory", "warehouse_dir")
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in (*names, "jars_dir"))
        return f"SparkSettings({fields}, extra_conf={redact_conf(self.extra_conf)!r})"

    @property
    def is_local(self) -> bool:
        return self.master.startswith("local")

    @property
    def uses_s3a(self) -> bool:
        """The conf configures S3A (a ``spark.hadoop.fs.s3a.*`` key): the s3a jar group goes on spark.jars."""
        return any(key.startswith("spark.hadoop.fs.s3a.") for key, _value in self.extra_conf)

    @property
    def in_one_jvm(self) -> bool:
        """``local``/``local[...]``: executors run in the driver's JVM (not ``local-cluster``)."""
        return self.master == "local" or self.master.startswith("local[")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> SparkSettings:
        """Settings from ``SPLITKEEPER_SPARK_*`` variables; keyword ``overrides`` win.

        ``SPLITKEEPER_SPARK_CONF`` holds extra Spark conf as ``key=value`` pairs
        separated by ``;`` (values may contain ``,`` and ``=``).
        """
        env = os.environ if env is None else env
        values: dict[str, object] = {}
        if env.get(ENV_MASTER, "").strip():
            values["master"] = env[ENV_MASTER].strip()
        if env.get(ENV_APP_NAME, "").strip():
            values["app_name"] = env[ENV_APP_NAME].strip()
        if env.get(ENV_UI, "").strip():
            values["ui_enabled"] = _parse_bool(ENV_UI, env[ENV_UI])
        if env.get(ENV_SHUFFLE_PARTITIONS, "").strip():
            values["shuffle_partitions"] = _parse_positive_int(
                ENV_SHUFFLE_PARTITIONS, env[ENV_SHUFFLE_PARTITIONS]
            )
        if env.get(ENV_DRIVER_MEMORY, "").strip():
            values["driver_memory"] = env[ENV_DRIVER_MEMORY].strip()
        if env.get(ENV_WAREHOUSE, "").strip():
            values["warehouse_dir"] = env[ENV_WAREHOUSE].strip()
        if env.get(jarlib.JARS_DIR_ENV, "").strip():
            values["jars_dir"] = jarlib.jars_root(env)
        if env.get(ENV_CONF, "").strip():
            values["extra_conf"] = _parse_conf(env[ENV_CONF])
        values.update(overrides)
        return cls(**values)  # type: ignore[arg-type]

    def spark_conf(self, jar_paths: list[Path]) -> dict[str, str]:
        """Every conf key :func:`get_spark` sets (besides master and app name), in order."""
        conf = {
            "spark.jars": ",".join(str(p) for p in jar_paths),
            "spark.sql.extensions": DELTA_EXTENSION,
            "spark.sql.catalog.spark_catalog": DELTA_CATALOG,
            "spark.ui.enabled": str(self.ui_enabled).lower(),
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": str(self.shuffle_partitions),
            "spark.sql.session.timeZone": "UTC",
        }
        if self.is_local:
            # Delta's default of 50 snapshot partitions makes every small local table
            # scan run 50 tasks; match the shuffle width instead.
            conf["spark.databricks.delta.snapshotPartitions"] = str(self.shuffle_partitions)
            # Python workers run this interpreter (the venv), not whatever python3 is on PATH.
            conf["spark.pyspark.python"] = sys.executable
            conf["spark.pyspark.driver.python"] = sys.executable
            # Local runs stay on the loopback interface whatever the host name resolves to.
            conf["spark.driver.host"] = "127.0.0.1"
            conf["spark.driver.bindAddress"] = "127.0.0.1"
        # Delta keeps a small table's whole file list in each commit's checksum when this is
        # on; building it costs every commit a query plan (and the first commit of a table a
        # state reconstruction). splitkeeper's tables take many small commits and read the
        # checksum only for the set transactions, which Delta writes either way.
        conf["spark.databricks.delta.allFilesInCrc.enabled"] = "false"
        conf.update(self._local_fs_conf())
        if self.driver_memory:
            conf["spark.driver.memory"] = self.driver_memory
        if self.warehouse_dir:
            conf["spark.sql.warehouse.dir"] = self.warehouse_dir
        conf.update(dict(self.extra_conf))
        return conf

    def _local_fs_conf(self) -> dict[str, str]:
        """Hadoop's ``file:`` scheme on splitkeeper's local file system, when it can be.

        Only when executors share the driver's JVM, the jar is built
        (:func:`~splitkeeper.spark.jars.localfs_jar`), ``SPLITKEEPER_LOCAL_FS`` is not
        ``0``, and this process starts that JVM (``spark.driver.extraClassPath`` means
        nothing to a JVM spark-submit already started).
        """
        if not self.in_one_jvm or os.environ.get(ENV_LOCAL_FS, "1").strip() == "0":
            return {}
        if os.environ.get("PYSPARK_GATEWAY_PORT"):
            return {}  # launched by spark-submit: the classpath is fixed
        jar = jarlib.localfs_jar(self.jars_dir)
        if jar is None:
            return {}
        return {
            "spark.driver.extraClassPath": str(jar),
            "spark.hadoop.fs.file.impl": jarlib.LOCALFS_FILE_SYSTEM,
            "spark.hadoop.fs.AbstractFileSystem.file.impl": jarlib.LOCALFS_ABSTRACT_FILE_SYSTEM,
        }


def get_spark(settings: SparkSettings | None = None) -> SparkSession:
    """The process's SparkSession, created on first call with Delta and the local jars.

    Called on the driver only. A second call returns the running session unchanged
    (its settings, JVM-level and SQL alike, stay as first built). Raises
    EnvironmentNotReadyError when the jars are missing, or when a session without Delta
    is already running in this process.
    """
    settings = SparkSettings.from_env() if settings is None else settings
    jar_paths = jarlib.spark_jars(root=settings.jars_dir)
    if settings.uses_s3a:
        jar_paths += jarlib.s3a_jars(root=settings.jars_dir)
    conf = settings.spark_conf(jar_paths)

    if "--packages" in os.environ.get("PYSPARK_SUBMIT_ARGS", ""):
        raise EnvironmentNotReadyError(
            "PYSPARK_SUBMIT_ARGS asks Spark to download --packages; splitkeeper uses the jars in "
            f"{jarlib.group_dir(jarlib.JarGroup.SPARK, settings.jars_dir)} instead: unset it",
        )
    try:
        from pyspark.sql import SparkSession
    except ImportError as err:
        raise EnvironmentNotReadyError(
            f"pyspark cannot be imported ({err}); run `{jarlib.SETUP_FIX}`"
        ) from err

    if settings.is_local:
        # PySpark picks the workers' interpreter from PYSPARK_PYTHON when the context starts
        # (the spark.pyspark.python conf alone is not read in-process): use this venv's.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark import SparkContext

    if SparkContext._active_spark_context is not None:
        # A session already runs in this process: return it unchanged. Re-applying these
        # settings would silently change the runtime SQL conf of a session someone else
        # configured (a test fixture, a notebook, an Airflow worker running several tasks).
        spark = SparkSession.builder.getOrCreate()
    else:
        builder = SparkSession.builder.master(settings.master).appName(settings.app_name)
        for key, value in conf.items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
    extensions = spark.conf.get("spark.sql.extensions", "") or ""
    if DELTA_EXTENSION not in extensions:
        raise EnvironmentNotReadyError(
            "a SparkSession without Delta was already running in this process "
            f"(spark.sql.extensions={extensions!r}); stop it before calling get_spark()",
        )
    return spark


def _parse_bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise InvalidParameterError(name, raw, "one of 1/0, true/false, yes/no, on/off")


def _parse_positive_int(name: str, raw: str) -> int:
    try:
        value = int(raw.strip())
    except ValueError:
        value = 0
    if value < 1:
        raise InvalidParameterError(name, raw, "an integer >= 1")
    return value


def _parse_conf(raw: str) -> tuple[tuple[str, str], ...]:
    """``key=value;key=value`` -> pairs. A malformed entry is reported by its position and
    key, never by its text: the variable carries credentials (S3 keys, the Spark auth secret)."""
    pairs: list[tuple[str, str]] = []
    for position, item in enumerate(raw.split(";"), start=1):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            where = f"entry {position}"
            if sep:
                where += " (no key before '=')"
            elif _CONF_KEY.fullmatch(item.strip()):
                where += f" (key {item.strip()!r} has no '=value')"
            else:
                where += " (no '=' in it; its text is not shown, it may hold a secret)"
            raise InvalidParameterError(
                ENV_CONF,
                _REDACTED,
                "key=value pairs separated by ';'",
                hint=f"bad {where}",
            )
        pairs.append((key.strip(), value.strip()))
    return tuple(pairs)


def redact_conf(conf: Mapping[str, str] | tuple[tuple[str, str], ...]) -> dict[str, str]:
    """The conf with the value of every key that names a credential replaced (for logs)."""
    items = conf.items() if isinstance(conf, Mapping) else conf
    return {key: (_REDACTED if _SECRET_KEY.search(key) else value) for key, value in items}
