"""The wheel in a fresh venv with the lowest and the newest Airflow the declared ranges admit.

For each: build the wheel from the committable files (as tests/test_package.py does), install
``splitkeeper[airflow,spark,quality]`` into a new venv (the lowest variant pins Airflow and the
Spark provider to pyproject.toml's floors), then, from a folder outside the checkout and with no
``SPLITKEEPER_*`` variable but the pipeline file: ``splitkeeper jars fetch`` (from a ``file://``
repository made of the checkout's ``.jars/spark``, checksums verified), ``airflow providers
list`` (when the wheel declares the provider entry point), the shipped DAG files parsed by
Airflow's DagBag without an import error, and one task run by Airflow: ``airflow tasks test``
of the ingest DAG's ``run_epochs`` on a SQLite metadata database, whose records are then read
back from the sink by content. Minutes per variant (it downloads Airflow and pyspark): a slow
variant, ``pytest --run-slow-variants -m slow_variant tests/test_install_airflow.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from splitkeeper.spark import fetch as fetchlib
from tests.test_package import _committable_files

pytestmark = [pytest.mark.slow_variant, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _floor(name: str) -> str:
    for line in PYPROJECT["project"]["optional-dependencies"]["airflow"]:
        req = Requirement(line)
        if req.name == name:
            return next(s.version for s in req.specifier if s.operator == ">=")
    raise AssertionError(f"{name} is not in the airflow extra")


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")
        and not k.startswith(("SPLITKEEPER_", "AIRFLOW_", "XDG_"))
    }
    env.update(
        AIRFLOW_HOME=str(home / "airflow"),
        XDG_CACHE_HOME=str(home / "cache"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__DAGS_FOLDER=str(home / "nodags"),
        **extra,
    )
    return env


def _run(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 900) -> str:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(args)}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = tmp_path_factory.mktemp("source")
    for name in _committable_files():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, source / name)
    out = tmp_path_factory.mktemp("dist")
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q"]
        + ["-w", str(out), str(source)],
        cwd=out,
        env=dict(os.environ),
    )
    (built,) = out.glob("splitkeeper-*.whl")
    return built


@pytest.fixture(scope="module")
def maven_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("m2")
    for jar in fetchlib.load_manifest().jars:
        (base / jar.repo_path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / ".jars" / "spark" / jar.file_name, base / jar.repo_path)
    return base


@pytest.mark.parametrize("variant", ["lowest", "newest"])
def test_the_wheel_in_a_fresh_venv_lists_parses_and_runs_one_task(
    variant: str, wheel: Path, maven_repo: Path, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    (home / "nodags").mkdir(parents=True)
    env = _env(home)
    venv = home / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=home, env=env)
    bin_dir = venv / "bin"
    pins: list[str] = []
    if variant == "lowest":
        airflow_floor = _floor("apache-airflow")
        pins = [
            f"apache-airflow=={airflow_floor}",
            f"apache-airflow-providers-apache-spark=={_floor('apache-airflow-providers-apache-spark')}",
        ]
    _run(
        [str(bin_dir / "python"), "-m", "pip", "install", "-q", f"{wheel}[airflow,spark,quality]", *pins],
        cwd=home,
        env=env,
        timeout=1800,
    )
    version = _run([str(bin_dir / "airflow"), "version"], cwd=home, env=env).strip().splitlines()[-1]
    if variant == "lowest":
        assert version == _floor("apache-airflow")

    # the jars, from the shipped coordinates, into the user cache; then `run` finds them from here
    fetched = _run(
        [str(bin_dir / "splitkeeper"), "jars", "fetch", "--repo", maven_repo.as_uri()], cwd=home, env=env
    )
    assert f"in {home / 'cache'}" in fetched

    # the provider, when the wheel declares one
    entry_points = PYPROJECT["project"].get("entry-points", {})
    if "apache_airflow_provider" in entry_points:
        listed = _run([str(bin_dir / "airflow"), "providers", "list", "-o", "json"], cwd=home, env=env)
        assert "splitkeeper" in {p["package_name"] for p in json.loads(listed)}

    # a pipeline outside the checkout; the shipped DAG files parse in this Airflow
    (home / "in").mkdir()
    records = [json.dumps({"id": i, "amount": i * 10}) for i in range(40)]
    (home / "in" / "part-0.jsonl").write_text("\n".join(records) + "\n")
    config = home / "pipeline.yaml"
    config.write_text(
        "name: wheeltest\nparallelism: 2\nsource: {kind: files, path: in, format: jsonl}\n"
        "state: {path: state}\nsink: {path: sink}\n",
        encoding="utf-8",
    )
    env = _env(home, SPLITKEEPER_PIPELINE_CONFIG=str(config), SPLITKEEPER_SPARK_MASTER="local[2]")
    dags_dir = _run(
        [str(bin_dir / "python"), "-c", "from splitkeeper.resources import dags_dir; print(dags_dir())"],
        cwd=home,
        env=env,
    ).strip()
    env["AIRFLOW__CORE__DAGS_FOLDER"] = dags_dir
    parse = (
        "import json; from airflow.models.dagbag import DagBag\n"
        f"bag = DagBag(dag_folder={dags_dir!r}, include_examples=False)\n"
        "print(json.dumps({'errors': {k: str(v)[-500:] for k, v in bag.import_errors.items()},"
        " 'dags': sorted(bag.dag_ids)}))\n"
    )
    parsed = json.loads(_run([str(bin_dir / "python"), "-c", parse], cwd=home, env=env).splitlines()[-1])
    assert parsed["errors"] == {}
    ingest = sorted(d for d in parsed["dags"] if d.startswith("splitkeeper_ingest"))
    assert ingest, parsed["dags"]

    # one task, run by Airflow: the ingest, on a SQLite metadata database
    _run([str(bin_dir / "airflow"), "db", "migrate"], cwd=home, env=env)
    # the DAGs and their assets reach the metadata database (as the DAG processor would write them):
    # Airflow 3.0 refuses to run a task whose outlet assets are not active yet
    _run([str(bin_dir / "airflow"), "dags", "reserialize"], cwd=home, env=env)
    pool = ["pools", "set", "splitkeeper-wheeltest", "1", "the pipeline's writer pool"]
    _run([str(bin_dir / "airflow"), *pool], cwd=home, env=env)
    ran = subprocess.run(
        [str(bin_dir / "airflow"), "tasks", "test", ingest[0], "run_epochs"],
        cwd=home,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    task_log = f"{ran.stdout[-6000:]}\n{ran.stderr[-6000:]}"
    assert ran.returncode == 0 and (home / "sink" / "_delta_log").is_dir(), task_log
    read = (
        "import json; from deltalake import DeltaTable\n"
        f"t = DeltaTable({str(home / 'sink')!r}).to_pyarrow_table()\n"
        "print(json.dumps(sorted(bytes(v).decode() if isinstance(v, bytes) else v"
        " for v in t.column('value').to_pylist())))\n"
    )
    values = json.loads(_run([str(bin_dir / "python"), "-c", read], cwd=home, env=env).splitlines()[-1])
    assert sorted(values) == sorted(records)
