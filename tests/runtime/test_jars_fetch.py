"""``splitkeeper jars fetch``: the Spark jars of an installed splitkeeper, from the shipped manifest.

No network: the "Maven repository" is a ``file://`` folder in repository layout built from the
jars ``scripts/setup.sh`` fetched into ``.jars/spark/`` (hard links, so no copy of 23 MB).
The manifest is compared with what Maven resolves from ``jvm/pom.xml`` (``mvn --offline``: the
local Maven repository is warm once setup.sh ran), so the two cannot drift.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from splitkeeper import cli
from splitkeeper.errors import EnvironmentNotReadyError
from splitkeeper.spark import fetch as fetchlib
from splitkeeper.spark import jars as jarlib

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = fetchlib.load_manifest()


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def checkout_jars() -> Path:
    folder = jarlib.group_dir(jarlib.JarGroup.SPARK, ROOT / ".jars")
    assert folder.is_dir(), f"{folder} is missing: run bash scripts/setup.sh jars"
    return folder


@pytest.fixture
def repo(tmp_path: Path, checkout_jars: Path) -> Path:
    """A Maven repository (file://) holding every jar of the manifest, linked from .jars/spark."""
    base = tmp_path / "m2"
    for jar in MANIFEST.jars:
        target = base / jar.repo_path
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(checkout_jars / jar.file_name, target)
        except OSError:
            shutil.copyfile(checkout_jars / jar.file_name, target)
    return base


def _fetch(capsys: pytest.CaptureFixture[str], dest: Path, repo: Path) -> tuple[int, str, str]:
    code = cli.main(["jars", "fetch", "--dir", str(dest), "--repo", repo.as_uri()])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_shipped_manifest_is_exactly_the_checkouts_spark_jars(checkout_jars: Path) -> None:
    on_disk = {p.name: _sha256(p) for p in checkout_jars.glob("*.jar")}
    assert {j.file_name: j.sha256 for j in MANIFEST.jars} == on_disk
    assert MANIFEST.spark_version == fetchlib.pom_spark_version(ROOT / "jvm" / "pom.xml")
    # the jars the session factory insists on are in it
    assert jarlib.find_jar(
        [jarlib.JarFile.parse(Path(j.file_name)) for j in MANIFEST.jars], "delta-spark_4.1_2.13"
    )


def test_the_jars_follow_the_installed_spark_and_cover_the_declared_pyspark_range() -> None:
    """One manifest entry per Spark release of pyspark's range: the Kafka connector is built per
    release, so pyspark 4.1.3 needs spark-sql-kafka 4.1.3; a release it does not know is refused
    with the versions it does, never answered with another release's jars."""
    import tomllib

    from packaging.requirements import Requirement

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    spec = next(Requirement(r).specifier for r in extras["spark"] if r.startswith("pyspark"))
    known = fetchlib.supported_spark_versions()
    assert MANIFEST.spark_version == jarlib._installed_pyspark_version() == known[0]
    for version in ("4.1.0", "4.1.1", "4.1.2", "4.1.3", "4.1.4", "4.1.5", "4.2.0"):
        # every release the range admits has jars, and the manifest knows nothing outside it
        assert spec.contains(version) == (version in known), version
    for version in known:
        connector = next(
            j
            for j in fetchlib.load_manifest(spark_version=version).jars
            if j.artifact.startswith("spark-sql-kafka")
        )
        assert connector.version == version
    with pytest.raises(
        EnvironmentNotReadyError, match=r"no Spark jars for pyspark 4\.1\.4: it knows Spark 4\.1\.1"
    ):
        fetchlib.load_manifest(spark_version="4.1.4")


@pytest.mark.skipif(shutil.which("mvn") is None, reason="Maven (mvn) is not installed")
def test_the_shipped_manifest_is_what_maven_resolves_from_the_pom() -> None:
    # the installed Spark's entry (the local Maven repository holds it once setup.sh ran)
    resolved = fetchlib.manifest_from_maven(ROOT, MANIFEST.spark_version)
    assert resolved == MANIFEST, (
        "splitkeeper/spark/spark_jars.json differs from what Maven resolves from jvm/pom.xml: "
        "regenerate it with `python -m splitkeeper.spark.fetch --write --online`"
    )


def test_fetch_downloads_every_jar_verified_then_finds_them_there(
    repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], checkout_jars: Path
) -> None:
    dest = tmp_path / "jars"
    code, out, err = _fetch(capsys, dest, repo)
    assert code == 0, err
    fetched = dest / "spark"
    assert {p.name: _sha256(p) for p in fetched.iterdir()} == {
        p.name: _sha256(p) for p in checkout_jars.glob("*.jar")
    }
    count = len(MANIFEST.jars)
    assert f"[{count}/{count}]" in out and "(sha256 ok)" in out
    assert f"{count} downloaded" in out.splitlines()[-1]
    # the session factory's check accepts the folder
    assert jarlib.spark_jars(root=dest) == sorted(fetched.glob("*.jar"))
    # any patch of the same Spark minor (pyspark's range) takes these jars; another minor does not
    assert jarlib.spark_jars("4.1.4", root=dest) == sorted(fetched.glob("*.jar"))
    with pytest.raises(EnvironmentNotReadyError, match="delta-spark_4.2_2.13"):
        jarlib.spark_jars("4.2.0", root=dest)

    # again: nothing downloaded; a damaged jar is replaced, a jar the manifest does not list removed
    victim = fetched / MANIFEST.jars[0].file_name
    victim.write_bytes(b"not a jar")
    (fetched / "stale-1.0.jar").write_bytes(b"old")
    code, out, err = _fetch(capsys, dest, repo)
    assert code == 0, err
    assert "1 downloaded" in out.splitlines()[-1] and f"{count - 1} already there" in out
    assert "removed stale-1.0.jar" in out
    assert _sha256(victim) == MANIFEST.jars[0].sha256
    assert not (fetched / "stale-1.0.jar").exists()


def test_a_jar_that_fails_its_checksum_is_refused_and_not_kept(
    repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    jar = next(j for j in MANIFEST.jars if j.artifact.startswith("delta-storage"))
    served = repo / jar.repo_path
    data = bytearray(served.read_bytes())
    served.unlink()  # a hard link: never write through it into .jars/spark
    data[len(data) // 2] ^= 0xFF
    served.write_bytes(bytes(data))
    dest = tmp_path / "jars"
    code, out, err = _fetch(capsys, dest, repo)
    assert code == 2
    assert f"{jar.file_name} from {served.as_uri()} fails its checksum" in err
    assert hashlib.sha256(bytes(data)).hexdigest() in err and jar.sha256 in err
    assert "SPLITKEEPER_MAVEN_REPO" in err
    assert not (dest / "spark" / jar.file_name).exists()
    assert not list((dest / "spark").glob("*.partial"))


def test_a_missing_jar_names_the_url_and_the_mirror_variable(
    repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    jar = MANIFEST.jars[-1]
    (repo / jar.repo_path).unlink()
    code, _, err = _fetch(capsys, tmp_path / "jars", repo)
    assert code == 2
    assert (
        f"could not download {jar.group}:{jar.artifact}:{jar.version}" in err
        and "SPLITKEEPER_MAVEN_REPO" in err
    )


def test_without_a_checkout_the_jars_root_is_the_user_cache_fetch_fills(
    repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setattr(jarlib, "checkout_root", lambda: None)  # as from a wheel
    monkeypatch.delenv(jarlib.JARS_DIR_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    root = jarlib.jars_root()
    assert root == (cache / "splitkeeper" / "jars" / MANIFEST.spark_version).resolve()
    with pytest.raises(EnvironmentNotReadyError, match="run `splitkeeper jars fetch`"):
        jarlib.spark_jars()
    # `jars fetch` without --dir fills that cache, and the session factory's lookup finds it
    monkeypatch.setenv(fetchlib.MAVEN_REPO_ENV, repo.as_uri())
    assert cli.main(["jars", "fetch"]) == 0
    assert f"in {root / 'spark'}" in capsys.readouterr().out
    assert [p.name for p in jarlib.spark_jars()] == sorted(j.file_name for j in MANIFEST.jars)
    # SPLITKEEPER_JARS_DIR still wins
    monkeypatch.setenv(jarlib.JARS_DIR_ENV, str(tmp_path / "elsewhere"))
    assert jarlib.jars_root() == (tmp_path / "elsewhere").resolve()
