"""The package as a user installs it: the wheel built from this checkout, installed with its base
dependencies only into a fresh venv, run from a folder outside the checkout.

The wheel is built from a copy of the files git would commit (tracked, plus untracked files that
are not ignored), so nothing left in the checkout (``build/``, ``state/local/``, ``var/``) can leak
into it, and the build leaves nothing behind in the checkout. It is built with this venv's
setuptools (``--no-build-isolation``: locks/bootstrap.txt pins it); installing it fetches PyYAML
from PyPI.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from splitkeeper.quality.checks import SUITES

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))

# package data folder -> the files of it the wheel must hold (as the checkout has them now)
SHIPPED = {
    "state": sorted(p.name for p in (ROOT / "state").glob("*.ddl")),
    "expectations": sorted(p.name for p in (ROOT / "expectations").glob("*.json")),
    "jobs": ["epoch_job.py", "task_job.py"],
    "dags": sorted(p.name for p in (ROOT / "dags").glob("splitkeeper_*.py")),
}

# Run inside the installed venv: what importlib.resources and splitkeeper.resources find there.
PROBE = """
import importlib.resources, json, sys
from splitkeeper import resources
from splitkeeper.errors import EnvironmentNotReadyError
from splitkeeper.quality.checks import load_suite_specs
from splitkeeper.spark import jars

folders = {
    name: {
        "path": str(importlib.resources.files("splitkeeper._data." + name)),
        "files": sorted(p.name for p in importlib.resources.files("splitkeeper._data." + name).iterdir()),
    }
    for name in ("state", "expectations", "jobs", "dags")
}
cache_root = jars.jars_root({"XDG_CACHE_HOME": "/nonexistent/cache"})
try:
    jars.list_jars(jars.JarGroup.SPARK, cache_root)
    jars_error = None
except EnvironmentNotReadyError as err:
    jars_error = str(err)
print(json.dumps({
    "prefix": sys.prefix,
    "folders": folders,
    "epoch_job": str(resources.epoch_job()),
    "task_job": str(resources.task_job()),
    "dags_dir": str(resources.dags_dir()),
    "checkout": None if resources.checkout_root() is None else str(resources.checkout_root()),
    "ddl_checkpoints": (importlib.resources.files("splitkeeper._data.state") / "checkpoints.ddl").read_text(),
    "suites": sorted(load_suite_specs()),
    "jars_error": jars_error,
    "jars_cache_root": str(cache_root),
    "jars_with_env": str(jars.jars_root({"SPLITKEEPER_JARS_DIR": "/opt/jars"})),
    "pyspark": importlib.util.find_spec("pyspark") is not None,
}))
"""


def _clean_env() -> dict[str, str]:
    """The environment without this checkout on PYTHONPATH and without splitkeeper's overrides."""
    return {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME") and not k.startswith("SPLITKEEPER_")
    }


def _run(args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, cwd=cwd, env=_clean_env(), capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(args)}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def _committable_files() -> list[str]:
    done = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return [name for name in done.stdout.split("\0") if name and (ROOT / name).is_file()]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    setuptools_version = tuple(int(p) for p in metadata.version("setuptools").split(".")[:2])
    assert setuptools_version >= (70, 1), (
        f"setuptools {metadata.version('setuptools')} in {sys.prefix} cannot build the wheel without the "
        "`wheel` package: run bash scripts/setup.sh (locks/bootstrap.txt pins setuptools)"
    )
    source = tmp_path_factory.mktemp("source")
    for name in _committable_files():
        target = source / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    out = tmp_path_factory.mktemp("dist")
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q"]
        + ["--disable-pip-version-check", "-w", str(out), str(source)],
        cwd=out,
    )
    (built,) = out.glob("splitkeeper-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel and its base dependencies; returns its bin/ folder."""
    home = tmp_path_factory.mktemp("venv")
    _run([sys.executable, "-m", "venv", str(home)], cwd=home)
    bin_dir = home / "bin"
    _run(
        [str(bin_dir / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel)],
        cwd=home,
        timeout=300,
    )
    return bin_dir


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A working folder outside the checkout."""
    assert ROOT not in tmp_path.parents
    return tmp_path


def test_the_wheel_holds_every_package_and_the_data_files(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    packages = {
        str(init.parent.relative_to(ROOT)).replace(os.sep, ".")
        for init in (ROOT / "splitkeeper").rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    missing = sorted(p for p in packages if f"{p.replace('.', '/')}/__init__.py" not in names)
    assert missing == [], (
        f"packages missing from the wheel (pyproject.toml [tool.setuptools] packages): {missing}"
    )
    for folder, files in SHIPPED.items():
        assert files, f"the checkout has no files in {folder}/"
        for name in files:
            assert f"splitkeeper/_data/{folder}/{name}" in names, f"{folder}/{name} is not in the wheel"
    templates = sorted(p.name for p in (ROOT / "splitkeeper" / "report" / "templates").glob("*.j2"))
    assert templates and all(f"splitkeeper/report/templates/{t}" in names for t in templates)
    assert "splitkeeper/spark/spark_jars.json" in names  # what `splitkeeper jars fetch` downloads
    assert not [n for n in names if n.startswith(("tests/", "state/", "dags/", "jobs/", "scripts/"))]
    assert not [n for n in names if "/local/" in n or n.endswith(".pyc")]


def test_the_wheel_declares_light_base_dependencies_and_the_engines_as_extras(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        (meta_name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        meta = archive.read(meta_name).decode()
    requires = [
        line.removeprefix("Requires-Dist: ")
        for line in meta.splitlines()
        if line.startswith("Requires-Dist:")
    ]
    base = [Requirement(r).name.lower() for r in requires if "extra ==" not in r]
    # config models and files, the one logging set-up, the SQL parser of sink.delete_when
    assert base == ["pydantic", "pyyaml", "structlog", "sqlglot"]
    extras = {
        line.removeprefix("Provides-Extra: ")
        for line in meta.splitlines()
        if line.startswith("Provides-Extra:")
    }
    assert extras == {"spark", "kafka", "airflow", "aws", "iceberg", "quality", "metrics", "dev", "all"}
    by_extra = {
        extra: {Requirement(r).name.lower() for r in requires if f'extra == "{extra}"' in r}
        for extra in extras
    }
    assert {"pyspark", "delta-spark", "deltalake", "pyarrow"} <= by_extra["spark"]
    assert by_extra["kafka"] == {"confluent-kafka"}
    assert {"apache-airflow", "apache-airflow-providers-apache-spark", "pyspark-client"} <= by_extra[
        "airflow"
    ]
    assert "apache-airflow-providers-apache-kafka" in by_extra["airflow"]
    assert by_extra["aws"] == {"apache-airflow-providers-amazon"}
    assert by_extra["iceberg"] == {"pyiceberg"}
    assert "great-expectations" in by_extra["quality"]
    assert by_extra["metrics"] == {
        "opentelemetry-sdk",
        "opentelemetry-exporter-otlp-proto-http",
        "prometheus-client",
    }
    assert {"pytest", "hypothesis", "ruff", "mypy", "import-linter"} <= by_extra["dev"]


def _locked_pins() -> dict[str, str]:
    """name -> version of the hashed locks set-up installs (locks/airflow.txt and locks/test.txt)."""
    pins: dict[str, str] = {}
    for lock in ("airflow.txt", "test.txt"):
        for line in (ROOT / "locks" / lock).read_text(encoding="utf-8").splitlines():
            if m := re.match(r"^([A-Za-z0-9_.-]+)==([^ ;\\]+)", line):
                pins[m[1].lower().replace("_", "-")] = m[2]
    return pins


def test_every_declared_requirement_admits_the_version_the_locks_pin() -> None:
    pins = _locked_pins()
    project = PYPROJECT["project"]
    declared = list(project["dependencies"]) + [
        r
        for reqs in project["optional-dependencies"].values()
        for r in reqs
        if not r.startswith("splitkeeper[")
    ]
    for text in declared:
        requirement = Requirement(text)
        name = requirement.name.lower()
        assert name in pins, f"{name} is declared in pyproject.toml but not pinned in locks/"
        assert requirement.specifier.contains(pins[name]), f"{text} excludes the locked {name}=={pins[name]}"
    # pyspark-client installs into pyspark's own folder: the airflow extra pins both to one release
    airflow = {Requirement(r).name: Requirement(r) for r in project["optional-dependencies"]["airflow"]}
    assert airflow["pyspark-client"].specifier == airflow["pyspark"].specifier
    assert str(airflow["pyspark"].specifier).startswith("==")


def test_version_from_the_installed_package_outside_the_checkout(venv: Path, outside: Path) -> None:
    done = _run([str(venv / "splitkeeper"), "--version"], cwd=outside)
    assert done.stdout.strip() == f"splitkeeper {PYPROJECT['project']['version']}"
    helped = _run([str(venv / "splitkeeper"), "--help"], cwd=outside)
    assert "--version" in helped.stdout


def test_simulate_runs_from_the_installed_package_with_base_dependencies_only(
    venv: Path, outside: Path
) -> None:
    args = ["simulate", "--readers", "3", "--splits", "12", "--steps", "60", "--failure-rate", "0.2"]
    done = _run([str(venv / "splitkeeper"), *args, "--seed", "3", "--json"], cwd=outside)
    payload = json.loads(done.stdout)
    assert payload["ok"] is True
    assert payload["steps_run"] == 60 and payload["config"]["steps"] == 60
    assert payload["records_lost"] == 0 and payload["records_duplicated"] == 0


def test_importlib_resources_finds_the_data_inside_the_installed_package(venv: Path, outside: Path) -> None:
    done = _run([str(venv / "python"), "-c", PROBE], cwd=outside)
    found = json.loads(done.stdout)
    site = Path(found["prefix"])
    assert found["checkout"] is None  # an installed package, not a checkout
    for folder, files in SHIPPED.items():
        where = Path(found["folders"][folder]["path"])
        assert site in where.parents and where.parts[-2:] == ("_data", folder), where
        assert set(files) <= set(found["folders"][folder]["files"]), folder
    assert Path(found["epoch_job"]) == Path(found["folders"]["jobs"]["path"]) / "epoch_job.py"
    assert Path(found["task_job"]) == Path(found["folders"]["jobs"]["path"]) / "task_job.py"
    assert Path(found["dags_dir"]) == Path(found["folders"]["dags"]["path"])
    # the readers of that data work from the wheel
    # the shipped documentation of the state tables (delta/schemas.py is the schema; a test keeps them equal)
    assert "checkpoint_id BIGINT NOT NULL" in found["ddl_checkpoints"]
    assert found["suites"] == sorted(SUITES)
    # what only a checkout has says what to do instead
    # no checkout: the Spark jars are `splitkeeper jars fetch`'s, in the user cache
    assert found["jars_cache_root"].startswith("/nonexistent/cache/splitkeeper/jars/")
    assert "run `splitkeeper jars fetch`" in found["jars_error"]
    assert found["jars_with_env"] == "/opt/jars"
    assert found["pyspark"] is False  # the base install pulls no engine


def test_images_that_install_the_project_editable_copy_every_mapped_folder_first() -> None:
    # An editable install fails when a folder that package-dir maps is missing.
    mapped = {folder.rstrip("/") for folder in PYPROJECT["tool"]["setuptools"]["package-dir"].values()}
    checked = 0
    for dockerfile in sorted((ROOT / "docker").glob("*/Dockerfile")):
        lines = dockerfile.read_text(encoding="utf-8").splitlines()
        install = next((i for i, line in enumerate(lines) if "pip install" in line and " -e " in line), None)
        if install is None:
            continue
        copied = {
            word.rstrip("/")
            for line in lines[:install]
            if line.startswith("COPY ") and "--from" not in line
            for word in line.split()[1:-1]
            if not word.startswith("--")
        }
        assert mapped <= copied, f"{dockerfile.relative_to(ROOT)} does not copy {sorted(mapped - copied)}"
        checked += 1
    assert checked == 2  # the Airflow and the Spark image


def test_in_a_checkout_the_data_folders_are_the_checkouts_own() -> None:
    from splitkeeper import resources

    assert resources.checkout_root() == ROOT
    for folder in SHIPPED:
        assert Path(str(resources.data_folder(folder))) == ROOT / folder


def test_a_command_whose_engine_is_missing_names_the_extra(venv: Path, outside: Path) -> None:
    config = outside / "pipeline.yaml"
    config.write_text(
        "name: p\nsource: {kind: files, path: in}\nstate: {path: state}\nsink: {path: sink}\n",
        encoding="utf-8",
    )
    done = subprocess.run(
        [str(venv / "splitkeeper"), "run", "--config", str(config)],
        cwd=outside,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "which is not installed: pip install 'splitkeeper[spark]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_each_engine_module_the_cli_knows_is_installed_by_the_extra_it_names() -> None:
    from splitkeeper.cli import ENGINE_EXTRAS

    providers = metadata.packages_distributions()
    extras = PYPROJECT["project"]["optional-dependencies"]
    for module, extra in ENGINE_EXTRAS.items():
        declared = {Requirement(r).name.lower() for r in extras[extra]}
        installed_by = {d.lower().replace("_", "-") for d in providers.get(module, [])}
        assert installed_by, f"{module} is not installed here"
        if module != "py4j":  # pyspark's own dependency
            assert installed_by & declared, f"{module} comes from {installed_by}, none of them in [{extra}]"
