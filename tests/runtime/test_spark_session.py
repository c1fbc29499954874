"""The Spark session factory: Delta from the local jars, settings from the environment."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from splitkeeper.errors import EnvironmentNotReadyError, InvalidParameterError
from splitkeeper.spark import jars as jarlib
from splitkeeper.spark.session import DELTA_CATALOG, DELTA_EXTENSION, SparkSettings, get_spark

# -- Delta round trip on the shared session ---------------------------------------


@pytest.mark.spark
def test_delta_round_trip_write_append_read_time_travel_and_history(spark, scratch):
    from delta.tables import DeltaTable

    path = scratch.table("events")
    spark.createDataFrame([(i, f"v{i}") for i in range(5)], "id INT, value STRING").write.format(
        "delta"
    ).save(path)
    spark.createDataFrame([(i, f"v{i}") for i in range(5, 8)], "id INT, value STRING").write.format(
        "delta"
    ).mode("append").save(path)

    current = spark.read.format("delta").load(path)
    assert sorted(r.id for r in current.collect()) == list(range(8))

    version0 = spark.read.format("delta").option("versionAsOf", 0).load(path)
    assert sorted(r.id for r in version0.collect()) == list(range(5))

    history = DeltaTable.forPath(spark, path).history().select("version", "operation").collect()
    assert [(h.version, h.operation) for h in sorted(history, key=lambda h: h.version)] == [
        (0, "WRITE"),
        (1, "WRITE"),
    ]
    described = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").select("version").collect()
    assert sorted(r.version for r in described) == [0, 1]


@pytest.mark.spark
def test_idempotent_delta_append_with_txn_app_id_commits_once(spark, scratch):
    # The exactly-once sink relies on Delta's txnAppId/txnVersion dedup (protocol section 5).
    path = scratch.table("sink")
    batch = spark.createDataFrame([(1,), (2,)], "id INT")
    for _ in range(2):
        batch.write.format("delta").mode("append").option("txnAppId", "pipe-1").option("txnVersion", 7).save(
            path
        )
    assert spark.read.format("delta").load(path).count() == 2


@pytest.mark.spark
def test_session_is_configured_for_delta_from_local_jars_without_downloads(spark):
    conf = spark.sparkContext.getConf()
    assert conf.get("spark.sql.extensions") == DELTA_EXTENSION
    assert conf.get("spark.sql.catalog.spark_catalog") == DELTA_CATALOG
    assert conf.get("spark.jars.packages") in (None, "")
    jars = conf.get("spark.jars").split(",")
    expected = {str(p) for p in jarlib.spark_jars()}
    assert set(jars) == expected
    assert conf.get("spark.ui.enabled") == "false"
    assert spark.conf.get("spark.sql.shuffle.partitions") == "2"
    assert spark.sparkContext.master == "local[2]"


@pytest.mark.spark
def test_get_spark_twice_returns_the_running_session(spark):
    again = get_spark(SparkSettings(master="local[2]", ui_enabled=False, shuffle_partitions=2))
    assert again.sparkContext is spark.sparkContext


@pytest.mark.spark
def test_a_second_get_spark_does_not_change_the_running_sessions_conf(spark):
    before = spark.conf.get("spark.sql.shuffle.partitions")
    again = get_spark(SparkSettings(master="local[2]", ui_enabled=False, shuffle_partitions=13))
    assert again.conf.get("spark.sql.shuffle.partitions") == before != "13"


@pytest.mark.spark
def test_spark_kafka_connector_class_loads_from_local_jars(spark):
    # The connector and Delta classes come from .jars/spark, not from a download.
    jvm = spark.sparkContext._jvm
    loader = jvm.Thread.currentThread().getContextClassLoader()
    for name in (
        "org.apache.spark.sql.kafka010.KafkaSourceProvider",
        "org.apache.spark.kafka010.KafkaConfigUpdater",
        "org.apache.kafka.clients.consumer.KafkaConsumer",
        "io.delta.sql.DeltaSparkSessionExtension",
    ):
        assert loader.loadClass(name).getName() == name


# -- the jars folder ---------------------------------------------------------------


def test_missing_jars_dir_raises_environment_not_ready_with_the_fix(tmp_path):
    settings = SparkSettings(jars_dir=tmp_path / "nowhere", ui_enabled=False)
    with pytest.raises(EnvironmentNotReadyError) as info:
        get_spark(settings)
    message = str(info.value)
    assert "ENVIRONMENT_NOT_READY" in message
    assert str(tmp_path / "nowhere" / "spark") in message
    # a jars root other than the checkout's .jars/ (setup.sh's) is filled by `splitkeeper jars fetch`
    assert "run `splitkeeper jars fetch`" in message
    with pytest.raises(EnvironmentNotReadyError, match="run `bash scripts/setup.sh`"):
        jarlib.list_jars(jarlib.JarGroup.KAFKA, tmp_path / "nowhere")  # the broker's jars: setup.sh only
    from splitkeeper_tools.iceberg_rest import classpath

    with pytest.raises(EnvironmentNotReadyError, match="run `bash scripts/setup.sh iceberg-rest`"):
        classpath(tmp_path / "nowhere")  # Iceberg's REST catalog server: its own setup step


def test_jars_dir_without_the_delta_jar_for_this_spark_names_the_wanted_artifact(tmp_path):
    folder = tmp_path / "spark"
    folder.mkdir()
    (folder / "delta-spark_3.5_2.13-3.2.0.jar").write_bytes(b"")
    with pytest.raises(
        EnvironmentNotReadyError, match=r"delta-spark_4\.1_2\.13.*found: delta-spark_3\.5_2\.13-3\.2\.0\.jar"
    ):
        jarlib.spark_jars("4.1.1", root=tmp_path)


def test_jars_dir_env_var_overrides_the_repo_folder(tmp_path):
    assert jarlib.jars_root({jarlib.JARS_DIR_ENV: str(tmp_path)}) == tmp_path.resolve()
    assert jarlib.jars_root({}) == Path(__file__).resolve().parents[2] / ".jars"


def test_spark_jars_do_not_duplicate_pyspark_jars():
    ours = jarlib.list_jars(jarlib.JarGroup.SPARK)
    bundled = [jarlib.JarFile.parse(p) for p in jarlib.pyspark_jars_dir().glob("*.jar")]
    assert len(bundled) > 100  # pyspark's own jars were found
    assert jarlib.duplicate_jars(ours, bundled) == []
    artifacts = {j.artifact for j in ours}
    assert {
        "delta-spark_4.1_2.13",
        "delta-storage",
        "spark-sql-kafka-0-10_2.13",
        "kafka-clients",
    } <= artifacts
    assert not any(a.startswith(("scala-library", "spark-core", "spark-sql_")) for a in artifacts)


@pytest.mark.parametrize(
    ("file_name", "artifact", "version"),
    [
        ("spark-sql-kafka-0-10_2.13-4.1.1.jar", "spark-sql-kafka-0-10_2.13", "4.1.1"),
        ("delta-spark_4.1_2.13-4.4.0.jar", "delta-spark_4.1_2.13", "4.4.0"),
        ("hive-exec-2.3.10-core.jar", "hive-exec", "2.3.10-core"),
        (
            "netty-codec-native-quic-4.2.7.Final-linux-x86_64.jar",
            "netty-codec-native-quic",
            "4.2.7.Final-linux-x86_64",
        ),
        ("kafka_2.13-4.1.1.jar", "kafka_2.13", "4.1.1"),
    ],
)
def test_jar_file_names_parse_into_artifact_and_version(file_name, artifact, version):
    jar = jarlib.JarFile.parse(Path(file_name))
    assert (jar.artifact, jar.version) == (artifact, version)


# -- settings ----------------------------------------------------------------------


def test_settings_from_env_read_every_variable(tmp_path):
    env = {
        "SPLITKEEPER_SPARK_MASTER": "spark://head:7077",
        "SPLITKEEPER_SPARK_APP_NAME": "ingest",
        "SPLITKEEPER_SPARK_UI": "0",
        "SPLITKEEPER_SPARK_SHUFFLE_PARTITIONS": "16",
        "SPLITKEEPER_SPARK_DRIVER_MEMORY": "2g",
        "SPLITKEEPER_SPARK_WAREHOUSE": "/data/wh",
        "SPLITKEEPER_SPARK_CONF": "spark.executor.memory=4g; spark.executor.extraJavaOptions=-Da=b,c",
        "SPLITKEEPER_JARS_DIR": str(tmp_path),
    }
    settings = SparkSettings.from_env(env)
    assert settings == SparkSettings(
        master="spark://head:7077",
        app_name="ingest",
        ui_enabled=False,
        shuffle_partitions=16,
        driver_memory="2g",
        warehouse_dir="/data/wh",
        jars_dir=tmp_path.resolve(),
        extra_conf=(("spark.executor.memory", "4g"), ("spark.executor.extraJavaOptions", "-Da=b,c")),
    )
    assert SparkSettings.from_env({}) == SparkSettings()
    assert SparkSettings.from_env({"SPLITKEEPER_SPARK_MASTER": "yarn"}, app_name="x").app_name == "x"


@pytest.mark.parametrize(
    "master",
    ["local", "local[*]", "local[4]", "local[2,3]", "spark://h:7077", "k8s://https://api:6443", "yarn"],
)
def test_settings_accept_every_supported_master(master):
    assert SparkSettings(master=master).master == master


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"master": "mesos://x"}, "master"),
        ({"master": "local[two]"}, "master"),
        ({"shuffle_partitions": 0}, "shuffle_partitions"),
        ({"app_name": " "}, "app_name"),
        ({"extra_conf": (("spark.jars.packages", "io.delta:delta-spark_4.1_2.13:4.4.0"),)}, "extra_conf"),
    ],
)
def test_settings_reject_invalid_values_naming_the_parameter(kwargs, name):
    with pytest.raises(InvalidParameterError) as info:
        SparkSettings(**kwargs)
    assert info.value.name == name


@pytest.mark.parametrize(
    ("env", "name"),
    [
        ({"SPLITKEEPER_SPARK_UI": "maybe"}, "SPLITKEEPER_SPARK_UI"),
        ({"SPLITKEEPER_SPARK_SHUFFLE_PARTITIONS": "many"}, "SPLITKEEPER_SPARK_SHUFFLE_PARTITIONS"),
        ({"SPLITKEEPER_SPARK_CONF": "spark.a=1;oops"}, "SPLITKEEPER_SPARK_CONF"),
    ],
)
def test_settings_from_env_reject_malformed_variables(env, name):
    with pytest.raises(InvalidParameterError) as info:
        SparkSettings.from_env(env)
    assert info.value.name == name


S3_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
SPARK_SECRET = "d2b7c1f0-spark-auth-secret"


@pytest.mark.parametrize(
    ("bad_entry", "position", "named"),
    [
        (S3_SECRET, 3, None),  # a value pasted without its key
        (f"={S3_SECRET}", 3, None),  # a value without a key
        ("spark.hadoop.fs.s3a.secret.key", 3, "spark.hadoop.fs.s3a.secret.key"),  # a key without '='
    ],
)
def test_malformed_spark_conf_names_the_entry_never_a_value(bad_entry, position, named):
    raw = (
        "spark.hadoop.fs.s3a.endpoint=http://127.0.0.1:9000;"
        f"spark.hadoop.fs.s3a.access.key=splitkeeper;{bad_entry};"
        f"spark.authenticate.secret={SPARK_SECRET}"
    )
    with pytest.raises(InvalidParameterError) as info:
        SparkSettings.from_env({"SPLITKEEPER_SPARK_CONF": raw})
    err = info.value
    text = " ".join([str(err), repr(err), repr(err.params), repr(err.args), str(err.value)])
    assert err.name == "SPLITKEEPER_SPARK_CONF"
    assert f"entry {position}" in str(err)
    for secret in (S3_SECRET, SPARK_SECRET, "splitkeeper", "127.0.0.1"):
        assert secret not in text
    if named:
        assert repr(named) in str(err)


def test_settings_repr_hides_credentials_but_shows_keys():
    raw = (
        f"spark.hadoop.fs.s3a.access.key=AKIAEXAMPLE;spark.hadoop.fs.s3a.secret.key={S3_SECRET};"
        f"spark.authenticate.secret={SPARK_SECRET};spark.executor.memory=1g"
    )
    env = {"SPLITKEEPER_SPARK_CONF": raw, "SPLITKEEPER_SPARK_MASTER": "spark://h:7077"}
    settings = SparkSettings.from_env(env)
    shown = repr(settings)
    assert S3_SECRET not in shown and SPARK_SECRET not in shown and "AKIAEXAMPLE" not in shown
    assert "spark.hadoop.fs.s3a.secret.key" in shown and "'spark.executor.memory': '1g'" in shown
    assert "spark://h:7077" in shown
    assert dict(settings.extra_conf)["spark.hadoop.fs.s3a.secret.key"] == S3_SECRET  # the value is kept
    assert settings.uses_s3a and not SparkSettings().uses_s3a


def test_s3a_jars_are_a_separate_group_checked_against_pysparks_hadoop(tmp_path):
    with pytest.raises(EnvironmentNotReadyError, match="setup.sh cluster"):
        jarlib.s3a_jars(tmp_path)
    hadoop = jarlib.pyspark_hadoop_version()
    assert hadoop and hadoop[0].isdigit()
    folder = tmp_path / "s3a"
    folder.mkdir()
    (folder / "hadoop-aws-3.3.1.jar").touch()
    with pytest.raises(EnvironmentNotReadyError, match=f"pyspark's Hadoop {hadoop}"):
        jarlib.s3a_jars(tmp_path)
    (folder / "hadoop-aws-3.3.1.jar").unlink()
    (folder / f"hadoop-aws-{hadoop}.jar").touch()
    (folder / "s3-2.29.52.jar").touch()
    assert [p.name for p in jarlib.s3a_jars(tmp_path)] == [f"hadoop-aws-{hadoop}.jar", "s3-2.29.52.jar"]


def test_spark_conf_for_local_and_cluster_masters():
    jars = [Path("/j/a.jar"), Path("/j/b.jar")]
    local = SparkSettings(master="local[2]", shuffle_partitions=3, ui_enabled=False).spark_conf(jars)
    assert local["spark.jars"] == "/j/a.jar,/j/b.jar"
    assert local["spark.sql.extensions"] == DELTA_EXTENSION
    assert local["spark.sql.catalog.spark_catalog"] == DELTA_CATALOG
    assert local["spark.ui.enabled"] == "false"
    assert local["spark.sql.shuffle.partitions"] == "3"
    assert local["spark.databricks.delta.snapshotPartitions"] == "3"
    assert local["spark.pyspark.python"] == sys.executable
    assert "spark.jars.packages" not in local

    cluster = SparkSettings(master="k8s://https://api:6443", extra_conf=(("spark.executor.instances", "4"),))
    conf = cluster.spark_conf(jars)
    assert "spark.pyspark.python" not in conf  # executors use their image's Python
    assert "spark.driver.host" not in conf
    assert conf["spark.executor.instances"] == "4"


def test_pyspark_submit_args_with_packages_are_refused(monkeypatch):
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", "--packages io.delta:delta-spark_4.1_2.13:4.4.0 pyspark-shell")
    with pytest.raises(EnvironmentNotReadyError, match="--packages"):
        get_spark(SparkSettings(ui_enabled=False))


@pytest.mark.spark
def test_python_workers_run_the_drivers_interpreter(spark):
    import sys

    seen = spark.sparkContext.parallelize([0], 1).map(lambda _: __import__("sys").executable).collect()
    assert seen == [sys.executable]


def _localfs_root(tmp_path: Path) -> Path:
    jar = tmp_path / "jars" / "localfs" / jarlib.LOCALFS_JAR
    jar.parent.mkdir(parents=True)
    jar.write_bytes(b"")
    return tmp_path / "jars"


def test_local_masters_use_splitkeepers_local_file_system_when_its_jar_is_built(tmp_path, monkeypatch):
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    monkeypatch.delenv("SPLITKEEPER_LOCAL_FS", raising=False)
    root = _localfs_root(tmp_path)
    conf = SparkSettings(master="local[2]", jars_dir=root).spark_conf([])
    assert conf["spark.driver.extraClassPath"] == str(root / "localfs" / jarlib.LOCALFS_JAR)
    assert conf["spark.hadoop.fs.file.impl"] == jarlib.LOCALFS_FILE_SYSTEM
    assert conf["spark.hadoop.fs.AbstractFileSystem.file.impl"] == jarlib.LOCALFS_ABSTRACT_FILE_SYSTEM
    assert conf["spark.databricks.delta.allFilesInCrc.enabled"] == "false"

    # Hadoop's own file system wherever the jar could not be on every JVM's classpath:
    for master in ("local-cluster[2,1,1024]", "spark://h:7077", "k8s://https://api:6443", "yarn"):
        assert "spark.hadoop.fs.file.impl" not in SparkSettings(master=master, jars_dir=root).spark_conf([])
    assert "spark.hadoop.fs.file.impl" not in SparkSettings(jars_dir=tmp_path / "none").spark_conf([])
    monkeypatch.setenv("SPLITKEEPER_LOCAL_FS", "0")  # turned off
    assert "spark.hadoop.fs.file.impl" not in SparkSettings(jars_dir=root).spark_conf([])
    monkeypatch.delenv("SPLITKEEPER_LOCAL_FS")
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "4040")  # spark-submit started the JVM
    assert "spark.hadoop.fs.file.impl" not in SparkSettings(jars_dir=root).spark_conf([])


@pytest.mark.spark
def test_the_test_session_runs_on_splitkeepers_local_file_system(spark):
    # setup.sh builds the jar with the JDK's javac; without it local commits fork processes
    assert jarlib.localfs_jar() is not None, "run `bash scripts/setup.sh jars` to build the local file system"
    jvm = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    uri = jvm.java.net.URI("file:///")
    file_system = jvm.org.apache.hadoop.fs.FileSystem.get(uri, conf)
    assert file_system.getClass().getName() == jarlib.LOCALFS_FILE_SYSTEM
    context = jvm.org.apache.hadoop.fs.FileContext.getFileContext(uri, conf)
    assert context.getDefaultFileSystem().getClass().getName() == jarlib.LOCALFS_ABSTRACT_FILE_SYSTEM


@pytest.mark.spark
def test_local_file_system_sets_permissions_and_reads_links_as_hadoop_does(spark, tmp_path):
    from py4j.protocol import Py4JJavaError

    jvm = spark._jvm
    hadoop = jvm.org.apache.hadoop.fs
    root, conf = jvm.java.net.URI("file:///"), spark._jsc.hadoopConfiguration()
    raw = hadoop.FileSystem.get(root, conf).getRawFileSystem()
    assert raw.getClass().getName() == "dev.splitkeeper.hadoop.NioRawLocalFileSystem"
    data = tmp_path / "data.txt"
    data.write_text("twelve bytes")
    raw.setPermission(hadoop.Path(str(data)), hadoop.permission.FsPermission("640"))
    assert data.stat().st_mode & 0o777 == 0o640
    raw.setPermission(hadoop.Path(str(data)), hadoop.permission.FsPermission("755"))
    assert data.stat().st_mode & 0o777 == 0o755
    with pytest.raises(Py4JJavaError, match="FileNotFoundException"):
        raw.setPermission(hadoop.Path(str(tmp_path / "missing")), hadoop.permission.FsPermission("644"))

    plain = raw.getFileLinkStatus(hadoop.Path(str(data)))
    assert not plain.isSymlink() and plain.getLen() == 12
    link = tmp_path / "link.txt"
    link.symlink_to(data)
    status = raw.getFileLinkStatus(hadoop.Path(str(link)))
    assert status.isSymlink() and str(status.getSymlink().getName()) == "data.txt"
    with pytest.raises(Py4JJavaError, match="FileNotFoundException"):
        raw.getFileLinkStatus(hadoop.Path(str(tmp_path / "missing")))

    # FileContext's rename (Delta's log store) still refuses to replace an existing file
    context = hadoop.FileContext.getFileContext(root, conf)
    other = tmp_path / "other.txt"
    other.write_text("x")
    rename = getattr(hadoop, "Options$Rename")
    options = spark.sparkContext._gateway.new_array(rename, 1)
    options[0] = rename.NONE
    with pytest.raises(Py4JJavaError, match="FileAlreadyExistsException"):
        context.rename(hadoop.Path(str(other)), hadoop.Path(str(data)), options)
    assert data.read_text() == "twelve bytes"


def test_splitkeeper_run_with_a_malformed_spark_conf_prints_no_secret(tmp_path):
    """The CLI end to end (its own process, debug logs): a malformed ``SPLITKEEPER_SPARK_CONF``
    carrying an S3 secret key fails the run before Spark starts; neither stdout nor stderr holds
    a value of the conf."""
    from tests.runtime.helpers import pipeline_mapping, splitkeeper_subprocess, write_config, write_input

    write_input(tmp_path / "in", files=1, lines=5)
    config = write_config(tmp_path / "p.yaml", pipeline_mapping(tmp_path, "conf-leak", tmp_path / "in"))
    access_key = "AKIAEXAMPLEKEY7Q"
    raw = (
        "spark.hadoop.fs.s3a.endpoint=http://127.0.0.1:9000;"
        f"spark.hadoop.fs.s3a.access.key={access_key};"
        f"spark.hadoop.fs.s3a.secret.key {S3_SECRET};"  # '=' typed as a space: malformed entry 3
        f"spark.authenticate.secret={SPARK_SECRET}"
    )
    done = splitkeeper_subprocess(
        ["run", "--config", str(config), "--epochs", "1", "--log-level", "DEBUG"],
        timeout_s=120,
        SPLITKEEPER_SPARK_CONF=raw,
        SPLITKEEPER_SPARK_MASTER="spark://127.0.0.1:7077",
    )
    output = done.stdout + done.stderr
    assert done.returncode == 2, output[-3000:]
    assert "SPLITKEEPER_SPARK_CONF" in done.stderr and "entry 3" in done.stderr, done.stderr[-2000:]
    for value in (S3_SECRET, SPARK_SECRET, access_key, "127.0.0.1:9000"):
        assert value not in output, f"{value!r} reached the CLI's output"
    assert "Traceback" not in output
