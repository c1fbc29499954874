"""``splitkeeper jars fetch``: the Spark jars of an installed splitkeeper, without a checkout.

The wheel ships :data:`MANIFEST` (package data ``splitkeeper/spark/spark_jars.json``): for each
Spark version of pyspark's declared range, the Maven coordinates, size and SHA-256 of every jar
of the ``spark`` jar group, i.e. exactly what ``scripts/setup.sh`` copies into ``.jars/spark/``
with Maven from ``jvm/pom.xml`` for that Spark (``-Dspark.version``). The jars follow the
installed pyspark: :func:`load_manifest` picks its version's entry, and a pyspark the manifest
does not know is an error that names the versions it does.
:func:`fetch` downloads them from Maven Central (or ``$SPLITKEEPER_MAVEN_REPO``: any Maven
repository URL, ``file://`` included) into ``<root>/spark/``, verifying each file's SHA-256
before it takes the jar's name, so a half-written or tampered file never reaches
``spark.jars``. A jar already there with the right checksum is not downloaded again.

The root is ``$SPLITKEEPER_JARS_DIR`` when set, else :func:`user_cache_root`
(``~/.cache/splitkeeper/jars/<spark version>/``, under ``$XDG_CACHE_HOME`` when set), which
:func:`splitkeeper.spark.jars.jars_root` uses when there is no checkout ``.jars/``.

The manifest cannot drift from the pom: :func:`manifest_from_maven` asks Maven for the same
resolution setup.sh makes, and a test compares it with the shipped file
(``python -m splitkeeper.spark.fetch --write --online`` regenerates every version's entry). Only
the standard library is imported.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from splitkeeper.errors import EnvironmentNotReadyError

MANIFEST = Path(__file__).resolve().parent / "spark_jars.json"
MAVEN_REPO_ENV = "SPLITKEEPER_MAVEN_REPO"
MAVEN_CENTRAL = "https://repo.maven.apache.org/maven2"
FETCH_FIX = "splitkeeper jars fetch"
_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class JarCoordinate:
    """One jar of the manifest: ``group:artifact:version``, its size and SHA-256."""

    group: str
    artifact: str
    version: str
    size: int
    sha256: str

    @property
    def file_name(self) -> str:
        """``<artifact>-<version>.jar``: Maven's copy-dependencies name, which jars.py parses."""
        return f"{self.artifact}-{self.version}.jar"

    @property
    def repo_path(self) -> str:
        """The jar's path in a Maven repository (``org/apache/spark/<artifact>/<version>/<file>``)."""
        return f"{self.group.replace('.', '/')}/{self.artifact}/{self.version}/{self.file_name}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "artifact": self.artifact,
            "version": self.version,
            "size": self.size,
            "sha256": self.sha256,
        }


@dataclass(frozen=True, slots=True)
class Manifest:
    """The jars of one jar group for one Spark version."""

    spark_version: str
    group: str
    jars: tuple[JarCoordinate, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"jars": [j.to_dict() for j in self.jars]}


@dataclass(frozen=True, slots=True)
class FetchResult:
    folder: Path
    downloaded: tuple[str, ...]
    cached: tuple[str, ...]
    removed: tuple[str, ...]
    bytes_downloaded: int
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "folder": str(self.folder),
            "downloaded": list(self.downloaded),
            "cached": list(self.cached),
            "removed": list(self.removed),
            "bytes_downloaded": self.bytes_downloaded,
            "seconds": round(self.seconds, 3),
        }


def _read_manifest(path: Path) -> dict[str, Any]:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(raw.get("spark_versions"), dict) or not raw["spark_versions"]:
            raise KeyError("spark_versions")
        return dict(raw)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise EnvironmentNotReadyError(
            f"the jar manifest {path} is missing or unreadable ({err}); reinstall splitkeeper",
            manifest=str(path),
        ) from err


def supported_spark_versions(path: Path | None = None) -> tuple[str, ...]:
    """The Spark versions the manifest has jars for, oldest first."""
    versions = _read_manifest(MANIFEST if path is None else path)["spark_versions"]
    return tuple(sorted(versions, key=lambda v: tuple(int(x) for x in v.split(".") if x.isdigit())))


def installed_spark_version() -> str:
    """The installed pyspark's version (package metadata), which the jars must follow."""
    from importlib import metadata

    try:
        return metadata.version("pyspark")
    except metadata.PackageNotFoundError as err:
        raise EnvironmentNotReadyError(
            "pyspark is not installed, so there is no Spark to fetch jars for: "
            'pip install "splitkeeper[spark]"'
        ) from err


def load_manifest(path: Path | None = None, spark_version: str | None = None) -> Manifest:
    """The jars of ``spark_version`` (default: the installed pyspark's) from the shipped manifest
    (or the file at ``path``). A version the manifest does not list is EnvironmentNotReadyError
    naming the versions it does."""
    path = MANIFEST if path is None else path
    raw = _read_manifest(path)
    version = spark_version or installed_spark_version()
    entry = raw["spark_versions"].get(version)
    if entry is None:
        known = ", ".join(supported_spark_versions(path))
        raise EnvironmentNotReadyError(
            f"this splitkeeper has no Spark jars for pyspark {version}: it knows Spark {known}. Install "
            f"one of those (pip install pyspark=={known.rsplit(', ', 1)[-1]}), or a splitkeeper release "
            f"made for Spark {version}",
            spark_version=version,
            supported=known,
        )
    try:
        jars = tuple(
            JarCoordinate(
                group=j["group"],
                artifact=j["artifact"],
                version=j["version"],
                size=int(j["size"]),
                sha256=j["sha256"],
            )
            for j in entry["jars"]
        )
    except (KeyError, TypeError, ValueError) as err:
        raise EnvironmentNotReadyError(
            f"the jar manifest {path} has a damaged entry for Spark {version} ({err}); reinstall splitkeeper",
            manifest=str(path),
        ) from err
    return Manifest(spark_version=version, group=str(raw.get("group", "spark")), jars=jars)


def user_cache_root(spark_version: str | None = None, env: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CACHE_HOME/splitkeeper/jars/<spark version>`` (default ``~/.cache/...``).

    ``spark_version`` defaults to the installed pyspark's: the Spark the jars are fetched for
    (without pyspark, the newest the manifest knows: nothing runs Spark there anyway).
    """
    env = os.environ if env is None else env
    base = env.get("XDG_CACHE_HOME", "").strip()
    cache = Path(base).expanduser() if base else Path(env.get("HOME") or Path.home()).expanduser() / ".cache"
    if spark_version:
        version = spark_version
    else:
        try:
            version = installed_spark_version()
        except EnvironmentNotReadyError:
            version = supported_spark_versions()[-1]
    return (cache / "splitkeeper" / "jars" / version).resolve()


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def fetch(
    root: Path,
    repo: str = MAVEN_CENTRAL,
    manifest: Manifest | None = None,
    say: Callable[[str], None] = print,
) -> FetchResult:
    """Download every jar of ``manifest`` from ``repo`` into ``<root>/<group>/``, checksums verified.

    Idempotent: a jar already there with its SHA-256 stays; one with another checksum is
    downloaded again; a ``*.jar`` of the folder the manifest does not list is removed (it
    would land on ``spark.jars``). A download whose SHA-256 differs from the manifest's
    raises EnvironmentNotReadyError naming the jar, the URL and both checksums, and
    leaves nothing under the jar's name.
    """
    manifest = load_manifest() if manifest is None else manifest
    folder = Path(root) / manifest.group
    folder.mkdir(parents=True, exist_ok=True)
    base = repo.rstrip("/")
    t0 = time.monotonic()
    downloaded: list[str] = []
    cached: list[str] = []
    total = 0
    count = len(manifest.jars)
    for n, jar in enumerate(manifest.jars, start=1):
        target = folder / jar.file_name
        tag = f"[{n}/{count}] {jar.file_name}"
        if target.is_file() and target.stat().st_size == jar.size and sha256_of(target) == jar.sha256:
            cached.append(jar.file_name)
            say(f"jars: {tag}: already there (sha256 ok)")
            continue
        url = f"{base}/{jar.repo_path}"
        started = time.monotonic()
        size, digest = _download(url, folder / f"{jar.file_name}.partial", jar)
        os.replace(folder / f"{jar.file_name}.partial", target)
        total += size
        downloaded.append(jar.file_name)
        say(f"jars: {tag}: {size / 2**20:.1f} MiB in {time.monotonic() - started:.1f}s (sha256 ok)")
    wanted = {j.file_name for j in manifest.jars}
    removed = sorted(p.name for p in folder.glob("*.jar") if p.name not in wanted)
    for name in removed:
        (folder / name).unlink()
        say(f"jars: removed {name} (not in the manifest of Spark {manifest.spark_version})")
    result = FetchResult(
        folder=folder,
        downloaded=tuple(downloaded),
        cached=tuple(cached),
        removed=tuple(removed),
        bytes_downloaded=total,
        seconds=time.monotonic() - t0,
    )
    say(
        f"jars: {count} jars for Spark {manifest.spark_version} in {folder}: {len(downloaded)} downloaded "
        f"({total / 2**20:.1f} MiB from {base}), {len(cached)} already there, in {result.seconds:.1f}s"
    )
    return result


def _download(url: str, partial: Path, jar: JarCoordinate) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    try:
        with urllib.request.urlopen(url, timeout=60) as response, partial.open("wb") as out:  # noqa: S310
            while chunk := response.read(_CHUNK):
                out.write(chunk)
                digest.update(chunk)
                size += len(chunk)
    except (urllib.error.URLError, OSError) as err:
        partial.unlink(missing_ok=True)
        raise EnvironmentNotReadyError(
            f"could not download {jar.group}:{jar.artifact}:{jar.version} from {url} ({err}); "
            f"check the network, or set {MAVEN_REPO_ENV} to a reachable Maven repository (a mirror "
            "of Maven Central, or file:///path/to/a/repository)",
            url=url,
            jar=jar.file_name,
        ) from err
    got = digest.hexdigest()
    if got != jar.sha256:
        partial.unlink(missing_ok=True)
        raise EnvironmentNotReadyError(
            f"{jar.file_name} from {url} fails its checksum: sha256 {got} ({size} bytes), the manifest "
            f"says {jar.sha256} ({jar.size} bytes); nothing was kept. The repository serves another "
            f"file under these coordinates: point {MAVEN_REPO_ENV} at a faithful mirror of Maven Central",
            url=url,
            jar=jar.file_name,
            expected=jar.sha256,
            got=got,
        )
    return size, got


# --- the manifest, from Maven ------------------------------------------------------------------


def pom_spark_version(pom: Path) -> str:
    """The ``spark.version`` property of ``pom``."""
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    node = ET.parse(pom).getroot().find("m:properties/m:spark.version", ns)
    if node is None or not (node.text or "").strip():
        raise EnvironmentNotReadyError(f"{pom} has no <spark.version> property", pom=str(pom))
    return (node.text or "").strip()


def manifest_from_folder(folder: Path, spark_version: str, group: str = "spark") -> Manifest:
    """The manifest of a folder in Maven repository layout (``group/path/artifact/version/*.jar``)."""
    jars = []
    for path in sorted(folder.rglob("*.jar")):
        rel = path.relative_to(folder).parts
        if len(rel) < 4:
            raise EnvironmentNotReadyError(f"{path} is not in Maven repository layout", path=str(path))
        artifact, version = rel[-3], rel[-2]
        jars.append(
            JarCoordinate(
                group=".".join(rel[:-3]),
                artifact=artifact,
                version=version,
                size=path.stat().st_size,
                sha256=sha256_of(path),
            )
        )
    jars.sort(key=lambda j: j.file_name)
    return Manifest(spark_version=spark_version, group=group, jars=tuple(jars))


def manifest_from_maven(
    checkout: Path, spark_version: str | None = None, pom: str = "jvm/pom.xml", offline: bool = True
) -> Manifest:
    """What Maven resolves from ``pom`` for ``spark_version`` (default: the pom's own
    ``spark.version``): setup.sh's own command, in repository layout."""
    version = spark_version or pom_spark_version(checkout / pom)
    env = dict(os.environ)
    env.setdefault(MAVEN_REPO_ENV, MAVEN_CENTRAL)
    with tempfile.TemporaryDirectory(prefix="splitkeeper-jars-") as tmp:
        cmd = [
            "mvn",
            *(["--offline"] if offline else []),
            "-q",
            "-B",
            "-Dstyle.color=never",
            "-s",
            str(checkout / "jvm" / "settings.xml"),
            "-f",
            str(checkout / pom),
            "dependency:copy-dependencies",
            f"-Dsplitkeeper.jars.out={tmp}",
            f"-Dspark.version={version}",
            "-Dmdep.useRepositoryLayout=true",
        ]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise EnvironmentNotReadyError(
                f"Maven could not resolve {pom} ({' '.join(cmd)}): {(done.stdout + done.stderr)[-2000:]}",
                pom=pom,
            )
        return manifest_from_folder(Path(tmp), version)


def manifest_document(manifests: Sequence[Manifest]) -> dict[str, Any]:
    """The JSON document of :data:`MANIFEST` for ``manifests`` (one per Spark version)."""
    return {
        "group": "spark",
        "source": "jvm/pom.xml with -Dspark.version=<each> "
        "(python -m splitkeeper.spark.fetch --write --online regenerates this file)",
        "spark_versions": {m.spark_version: m.to_dict() for m in manifests},
    }


def _main(argv: Sequence[str] | None = None) -> int:
    """``python -m splitkeeper.spark.fetch --write``: regenerate the manifest from jvm/pom.xml."""
    parser = argparse.ArgumentParser(prog="python -m splitkeeper.spark.fetch", description=_main.__doc__)
    parser.add_argument("--write", action="store_true", help=f"write {MANIFEST.name} (else print it)")
    parser.add_argument("--online", action="store_true", help="let Maven use the network")
    parser.add_argument(
        "--spark-versions",
        default="",
        help="comma-separated Spark versions (default: those the manifest lists now)",
    )
    args = parser.parse_args(argv)
    checkout = Path(__file__).resolve().parents[2]
    versions = [v.strip() for v in args.spark_versions.split(",") if v.strip()] or list(
        supported_spark_versions()
    )
    manifests = [manifest_from_maven(checkout, v, offline=not args.online) for v in versions]
    text = json.dumps(manifest_document(manifests), indent=2) + "\n"
    if args.write:
        MANIFEST.write_text(text, encoding="utf-8")
        print(f"wrote {MANIFEST} (Spark {', '.join(versions)})")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(_main())
