"""Where the JVM jars fetched by ``scripts/setup.sh`` live, and which ones to use.

``scripts/setup.sh`` runs Maven on ``jvm/pom.xml`` and ``jvm/kafka-broker.xml`` and
``javac`` on ``jvm/localfs/src`` (and, with its ``cluster`` step, Maven on ``jvm/s3a.xml``),
into separate folders of the jars root:

- ``<root>/spark/``: what Spark needs on ``spark.jars`` beyond pyspark's own jars
  (Delta, the Spark Kafka connector and their runtime dependencies);
- ``<root>/kafka/``: a runnable Apache Kafka broker (KRaft) and its storage tool;
- ``<root>/localfs/``: ``splitkeeper-localfs.jar``, compiled by ``javac`` from
  ``jvm/localfs/src`` against pyspark's Hadoop: Hadoop's local file system without a
  forked ``chmod``/``readlink`` per call (see :func:`localfs_jar`);
- ``<root>/s3a/``: S3A (``hadoop-aws`` at pyspark's Hadoop version and the AWS SDK v2
  modules it calls), for Delta tables on an S3-compatible store. Only ``bash
  scripts/setup.sh cluster`` fetches it, and only sessions configured for S3A use it
  (see :func:`s3a_jars`);
- ``<root>/iceberg-rest/``: Iceberg's REST catalog test server (``jvm/iceberg-rest.xml``), for
  the tests of ``sink.kind: iceberg`` with a REST catalog; only ``bash scripts/setup.sh
  iceberg-rest`` fetches it (the tests' fixture runs that when it is missing).

An installed splitkeeper without a checkout gets the ``spark`` group from ``splitkeeper jars
fetch`` (:mod:`splitkeeper.spark.fetch`: the coordinates and checksums ship in the wheel) into
``~/.cache/splitkeeper/jars/<spark version>/spark/``.

The root is ``$SPLITKEEPER_JARS_DIR`` when set, else ``<checkout>/.jars`` when it exists, else
that user cache (:func:`jars_root`). Every lookup raises :class:`EnvironmentNotReadyError`
with the fix when a jar is missing; nothing here downloads anything. The functions are cheap and may be called
any number of times; they import no Spark.
"""

from __future__ import annotations

import argparse
import enum
import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from splitkeeper.errors import EnvironmentNotReadyError
from splitkeeper.resources import checkout_root
from splitkeeper.spark.fetch import FETCH_FIX

JARS_DIR_ENV = "SPLITKEEPER_JARS_DIR"
SETUP_FIX = "bash scripts/setup.sh"
S3A_SETUP_FIX = "bash scripts/setup.sh cluster"
ICEBERG_REST_SETUP_FIX = "bash scripts/setup.sh iceberg-rest"
SCALA_BINARY_VERSION = "2.13"

_JAR_NAME = re.compile(r"^(?P<artifact>.+?)-(?P<version>\d+\.\d.*)\.jar$")


class JarGroup(enum.Enum):
    """A folder of the jars root; each is one self-contained classpath."""

    SPARK = "spark"
    KAFKA = "kafka"
    LOCALFS = "localfs"
    S3A = "s3a"
    ICEBERG_REST = "iceberg-rest"  # Iceberg's REST catalog test server (tests; setup.sh iceberg-rest)


#: The jar setup.sh compiles from jvm/localfs/src, and the classes Hadoop is pointed at.
LOCALFS_JAR = "splitkeeper-localfs.jar"
LOCALFS_FILE_SYSTEM = "dev.splitkeeper.hadoop.NioLocalFileSystem"
LOCALFS_ABSTRACT_FILE_SYSTEM = "dev.splitkeeper.hadoop.NioLocalFs"


@dataclass(frozen=True, slots=True)
class JarFile:
    """One jar named ``<artifact>-<version>.jar`` (Maven's copy-dependencies layout)."""

    path: Path
    artifact: str
    version: str

    @classmethod
    def parse(cls, path: Path) -> JarFile:
        match = _JAR_NAME.match(path.name)
        if match is None:
            return cls(path=path, artifact=path.name.removesuffix(".jar"), version="")
        return cls(path=path, artifact=match["artifact"], version=match["version"])


def jars_root(env: Mapping[str, str] | None = None) -> Path:
    """The jars root: ``$SPLITKEEPER_JARS_DIR`` if set and non-empty, else ``<checkout>/.jars``
    when a checkout has one, else the user cache ``splitkeeper jars fetch`` fills
    (``~/.cache/splitkeeper/jars/<spark version>/``, see :mod:`splitkeeper.spark.fetch`).

    An installed splitkeeper (a wheel) has no checkout: it uses the user cache, and a lookup
    there that finds nothing says to run ``splitkeeper jars fetch``.
    """
    env = os.environ if env is None else env
    override = env.get(JARS_DIR_ENV, "").strip()
    if override:
        return Path(override).expanduser().resolve()
    checkout = checkout_root()
    if checkout is not None and (checkout / ".jars").is_dir():
        return checkout / ".jars"
    from splitkeeper.spark.fetch import user_cache_root

    return user_cache_root(env=env)


def setup_fix(group: JarGroup, root: Path | None = None) -> str:
    """The command that fills ``group`` under ``root``: ``splitkeeper jars fetch`` for the spark
    group outside a checkout's ``.jars``, else setup.sh (which alone builds the other groups)."""
    if group is JarGroup.ICEBERG_REST:
        return ICEBERG_REST_SETUP_FIX
    checkout = checkout_root()
    root = jars_root() if root is None else Path(root)
    in_checkout = checkout is not None and root.resolve() == (checkout / ".jars").resolve()
    return FETCH_FIX if group is JarGroup.SPARK and not in_checkout else SETUP_FIX


def group_dir(group: JarGroup, root: Path | None = None) -> Path:
    """The folder of ``group`` under ``root`` (default :func:`jars_root`); it may not exist."""
    return (jars_root() if root is None else Path(root)) / group.value


def list_jars(group: JarGroup, root: Path | None = None) -> list[JarFile]:
    """Every jar of ``group``, sorted by file name.

    Raises EnvironmentNotReadyError when the folder is missing or holds no jar.
    """
    folder = group_dir(group, root)
    if not folder.is_dir():
        raise EnvironmentNotReadyError(
            f"the {group.value} jars folder {folder} does not exist; run `{setup_fix(group, root)}` "
            f"(or point {JARS_DIR_ENV} at a folder holding {group.value}/*.jar)",
            folder=str(folder),
            group=group.value,
        )
    jars = sorted((JarFile.parse(p) for p in folder.glob("*.jar")), key=lambda j: j.path.name)
    if not jars:
        raise EnvironmentNotReadyError(
            f"the {group.value} jars folder {folder} holds no jar; run `{setup_fix(group, root)}`",
            folder=str(folder),
            group=group.value,
        )
    return jars


def find_jar(jars: Iterable[JarFile], artifact: str) -> JarFile | None:
    """The jar whose artifact id is exactly ``artifact``, or None."""
    return next((j for j in jars if j.artifact == artifact), None)


def delta_artifact(spark_version: str) -> str:
    """Delta's artifact id for a Spark version: ``delta-spark_<spark major.minor>_2.13``."""
    major_minor = ".".join(spark_version.split(".")[:2])
    return f"delta-spark_{major_minor}_{SCALA_BINARY_VERSION}"


def kafka_connector_artifact() -> str:
    return f"spark-sql-kafka-0-10_{SCALA_BINARY_VERSION}"


def spark_jars(spark_version: str | None = None, root: Path | None = None) -> list[Path]:
    """The jars to put on ``spark.jars``: everything in ``<root>/spark``.

    Checks that the Delta jar built for ``spark_version`` (default: the installed
    pyspark's) and the Spark Kafka connector of the same Spark version are there, so
    a stale folder fails here with the fix instead of deep inside the JVM.
    """
    jars = list_jars(JarGroup.SPARK, root)
    version = spark_version or _installed_pyspark_version()
    wanted = delta_artifact(version)
    if find_jar(jars, wanted) is None:
        present = ", ".join(j.path.name for j in jars if j.artifact.startswith("delta-spark")) or "none"
        raise EnvironmentNotReadyError(
            f"no {wanted} jar in {group_dir(JarGroup.SPARK, root)} for Spark {version} "
            f"(found: {present}); run `{setup_fix(JarGroup.SPARK, root)}`",
            wanted=wanted,
        )
    connector = find_jar(jars, kafka_connector_artifact())
    # Spark's patch releases of one minor are binary compatible (pyspark's range is one minor,
    # and `splitkeeper jars fetch` brings the connector of the minor's first tested patch)
    if connector is None or _minor(connector.version) != _minor(version):
        found = connector.path.name if connector else "none"
        raise EnvironmentNotReadyError(
            f"no {kafka_connector_artifact()}-{_minor(version)}.x jar for Spark {version} in "
            f"{group_dir(JarGroup.SPARK, root)} "
            f"(found: {found}); run `{setup_fix(JarGroup.SPARK, root)}`",
            wanted=f"{kafka_connector_artifact()}-{version}",
        )
    return [j.path for j in jars]


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def s3a_jars(root: Path | None = None) -> list[Path]:
    """The jars S3A needs on ``spark.jars``: everything in ``<root>/s3a``.

    Checks that ``hadoop-aws`` is there at the version of the Hadoop client pyspark
    bundles (S3A and Hadoop's core must be one release). Raises
    EnvironmentNotReadyError with the fix (``bash scripts/setup.sh cluster``) otherwise.
    """
    folder = group_dir(JarGroup.S3A, root)
    jars = sorted((JarFile.parse(p) for p in folder.glob("*.jar")), key=lambda j: j.path.name)
    aws = find_jar(jars, "hadoop-aws")
    if aws is None:
        raise EnvironmentNotReadyError(
            f"no hadoop-aws jar in {folder}: S3A (s3a:// paths) needs the s3a jar group; "
            f"run `{S3A_SETUP_FIX}`",
            folder=str(folder),
            group=JarGroup.S3A.value,
        )
    hadoop = pyspark_hadoop_version()
    if hadoop is not None and aws.version != hadoop:
        raise EnvironmentNotReadyError(
            f"{aws.path.name} in {folder} does not match pyspark's Hadoop {hadoop}; run `{S3A_SETUP_FIX}`",
            wanted=f"hadoop-aws-{hadoop}",
        )
    return [j.path for j in jars]


def pyspark_hadoop_version() -> str | None:
    """The version of the Hadoop client pyspark bundles (``hadoop-client-api-<v>.jar``), if found."""
    try:
        folder = pyspark_jars_dir()
    except EnvironmentNotReadyError:
        return None
    jar = find_jar((JarFile.parse(p) for p in folder.glob("hadoop-client-api-*.jar")), "hadoop-client-api")
    return jar.version if jar else None


def localfs_jar(root: Path | None = None) -> Path | None:
    """``<root>/localfs/splitkeeper-localfs.jar`` when setup.sh built it, else None.

    Without Hadoop's native library (pyspark ships none), Hadoop's local file system
    starts a ``chmod`` process for every file it creates and a ``readlink`` process for
    every rename's status check: about twenty processes per Delta commit on a local
    table. The jar's classes do both with ``java.nio``. It is optional: without it local
    runs are slower, not different.
    """
    jar = group_dir(JarGroup.LOCALFS, root) / LOCALFS_JAR
    return jar if jar.is_file() else None


def kafka_classpath(root: Path | None = None) -> str:
    """The ``java -cp`` value running the Kafka broker: ``<root>/kafka/*``.

    Raises EnvironmentNotReadyError unless the folder holds the broker (kafka_2.13).
    """
    jars = list_jars(JarGroup.KAFKA, root)
    if find_jar(jars, f"kafka_{SCALA_BINARY_VERSION}") is None:
        raise EnvironmentNotReadyError(
            f"no kafka_{SCALA_BINARY_VERSION} jar in {group_dir(JarGroup.KAFKA, root)}; run `{SETUP_FIX}`"
        )
    return str(group_dir(JarGroup.KAFKA, root) / "*")


def java_executable() -> str:
    """``$JAVA_HOME/bin/java`` when JAVA_HOME is set and holds one, else ``java`` (from PATH)."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    return "java"


def pyspark_jars_dir() -> Path:
    """The folder of jars pyspark bundles (Spark, Scala, Hadoop, ...)."""
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise EnvironmentNotReadyError(f"pyspark is not installed; run `{SETUP_FIX}`")
    return Path(spec.origin).parent / "jars"


def duplicate_jars(jars: Sequence[JarFile], bundled: Sequence[JarFile]) -> list[tuple[JarFile, JarFile]]:
    """Pairs (ours, bundled) naming the same artifact, whatever the versions.

    Any pair means a library would sit twice on the driver classpath; jvm/pom.xml
    excludes what pyspark already ships so this list stays empty.
    """
    by_artifact = {j.artifact: j for j in bundled}
    return [(j, by_artifact[j.artifact]) for j in jars if j.artifact in by_artifact]


def _installed_pyspark_version() -> str:
    from splitkeeper.spark.fetch import installed_spark_version

    return installed_spark_version()


def _check_main(argv: Sequence[str] | None = None) -> int:
    """``python -m splitkeeper.spark.jars``: setup.sh's post-fetch check of ``<root>/spark``."""
    parser = argparse.ArgumentParser(prog="python -m splitkeeper.spark.jars", description=_check_main.__doc__)
    parser.add_argument(
        "--root", type=Path, default=None, help=f"jars root (default: .jars or ${JARS_DIR_ENV})"
    )
    args = parser.parse_args(argv)
    try:
        ours = list_jars(JarGroup.SPARK, args.root)
        spark_jars(root=args.root)
        kafka_classpath(args.root)
        bundled = [JarFile.parse(p) for p in sorted(pyspark_jars_dir().glob("*.jar"))]
    except EnvironmentNotReadyError as err:
        print(err, file=sys.stderr)
        return 1
    if group_dir(JarGroup.S3A, args.root).is_dir():
        try:
            s3a = [JarFile.parse(p) for p in s3a_jars(args.root)]
        except EnvironmentNotReadyError as err:
            print(err, file=sys.stderr)
            return 1
        twice = duplicate_jars(s3a, ours)
        for mine, theirs in twice:
            print(f"in both jar groups: {mine.path.name} (s3a) vs {theirs.path.name} (spark)")
        if twice:
            print("exclude these artifacts in jvm/s3a.xml (excludeArtifactIds)", file=sys.stderr)
            return 1
        ours = ours + s3a
    dups = duplicate_jars(ours, bundled)
    for mine, theirs in dups:
        print(f"duplicate on the Spark classpath: {mine.path.name} (ours) vs {theirs.path.name} (pyspark)")
    if dups:
        print("exclude these artifacts in jvm/pom.xml or jvm/s3a.xml (excludeArtifactIds)", file=sys.stderr)
        return 1
    folders = ", ".join(
        str(group_dir(g, args.root))
        for g in (JarGroup.SPARK, JarGroup.S3A)
        if group_dir(g, args.root).is_dir()
    )
    print(f"spark jars: {len(ours)} in {folders}, none duplicates pyspark's")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(_check_main())
