"""README's "Use it in your Airflow", run as written: the wheel in a fresh venv with the oldest and
the newest Airflow the declared range admits (3.1.8 and 3.3.2).

For each: build the wheel from the committable files (as tests/test_package.py does), then run
the README block in an empty folder with no ``SPLITKEEPER_*`` or ``AIRFLOW_*`` variable: a new
venv; Airflow pinned with a constraints file, as Airflow's install docs say; then the wheel with
``[airflow,spark,kafka,quality,metrics]`` and the same Airflow pin, with plain pip and an empty
pip cache; ``splitkeeper jars fetch`` (from a ``file://`` repository made of the checkout's
``.jars/spark``, checksums verified); ``splitkeeper doctor`` (no FAIL, or the block stops); a
pipeline file and a DAG file of one ``splitkeeper_dags`` call, ``airflow db migrate`` (SQLite),
the writer pool, ``airflow dags test splitkeeper_ingest`` (ingest, restart checks, report), then
``splitkeeper status``. Afterwards: ``airflow providers list`` shows splitkeeper, no DAG import
error, and the sink holds the input's records byte for byte.

Airflow's own constraints files live on GitHub, which the test machine cannot reach. The test
makes a stand-in the way Airflow makes them (the highest resolution at release time): ``uv pip
compile apache-airflow==X --exclude-newer <X's upload time + 1 day>`` (the release time read from
PyPI's simple API). Minutes per variant (it downloads Airflow and pyspark): a slow variant,
``pytest --run-slow-variants -m slow_variant tests/test_install_airflow.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

from splitkeeper.spark import fetch as fetchlib
from tests.test_package import _committable_files

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
    for jar in fetchlib.load_manifest().jars:  # the lock's pyspark: the one the airflow extra pins
        (base / jar.repo_path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / ".jars" / "spark" / jar.file_name, base / jar.repo_path)
    return base


def _json_list(output: str) -> list[Any]:
    """The JSON list in an Airflow CLI's ``-o json`` output (log lines may come before it)."""
    start = min((i for i in (output.find("[{"), output.find("[]")) if i >= 0), default=-1)
    assert start >= 0, output[-3000:]
    value, _ = json.JSONDecoder().raw_decode(output[start:])
    return list(value)


README_MARK = "<!-- use-it-in-your-airflow: tests/test_install_airflow.py runs this block -->"


def readme_walkthrough() -> str:
    """The bash block of README's "Use it in your Airflow", as a user would paste it."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    after = text.split(README_MARK, 1)[1]
    block = after.split("```bash\n", 1)[1].split("\n```", 1)[0]
    return block + "\n"


CONSTRAINTS_URL = (
    "https://raw.githubusercontent.com/apache/airflow/constraints-$AIRFLOW_VERSION/"
    "constraints-$PYTHON_VERSION.txt"
)
EXTRAS = "splitkeeper[airflow,spark,kafka,quality,metrics]"
#: the newest Airflow release the declared range admits, on the day the range was last raised
NEWEST_AIRFLOW = "3.3.2"


def test_the_readme_walkthrough_is_where_the_test_finds_it() -> None:
    block = readme_walkthrough()
    for line in (
        f'pip install "{EXTRAS}" "apache-airflow==$AIRFLOW_VERSION"',
        f'--constraint "{CONSTRAINTS_URL}"',
        f"AIRFLOW_VERSION={_floor('apache-airflow')} ",
        "splitkeeper jars fetch",
        "splitkeeper doctor",
        "airflow dags test splitkeeper_ingest",
    ):
        assert line in block, line
    spec = next(
        Requirement(r).specifier
        for r in PYPROJECT["project"]["optional-dependencies"]["airflow"]
        if r.startswith("apache-airflow>")
    )
    assert spec.contains(NEWEST_AIRFLOW)


def airflow_constraints(version: str, out: Path) -> Path:
    """A stand-in for Airflow's constraints file of ``version`` on this Python: Airflow and its
    dependencies as the newest releases resolved on the day it was published (PyPI's upload time)."""
    import datetime
    import urllib.request

    # the index's simple API (PEP 691 JSON: every file with its upload time)
    request = urllib.request.Request(
        "https://pypi.org/simple/apache-airflow/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=60) as r:
        files = json.load(r)["files"]
    uploaded = min(f["upload-time"] for f in files if f["filename"].startswith(f"apache_airflow-{version}-"))
    cutoff = datetime.datetime.fromisoformat(uploaded.replace("Z", "+00:00")) + datetime.timedelta(days=1)
    uv = Path(sys.executable).with_name("uv")
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    (out / "airflow.in").write_text(f"apache-airflow=={version}\n", encoding="utf-8")
    target = out / f"constraints-{version}-{python}.txt"
    _run(
        [str(uv), "pip", "compile", "--no-config", str(out / "airflow.in"), "--python-version", python]
        + ["--exclude-newer", cutoff.strftime("%Y-%m-%dT%H:%M:%SZ"), "--no-header", "--no-annotate"]
        + ["-o", str(target)],
        cwd=out,
        env=dict(os.environ),
    )
    return target


@pytest.mark.slow_variant
@pytest.mark.slow
@pytest.mark.parametrize("variant", ["oldest", "newest"])
def test_the_readme_walkthrough_from_an_empty_folder_runs_an_ingest_in_a_fresh_airflow(
    variant: str, wheel: Path, maven_repo: Path, tmp_path: Path
) -> None:
    """README's "Use it in your Airflow" block, run as written in an empty folder, with four
    substitutions a user would not need: the Python of this test for ``python``, the Airflow
    version of the variant, a local constraints file for GitHub's, the wheel file for the package
    name, and the local copy of the jars as ``--repo``."""
    home = tmp_path / "home"
    home.mkdir()
    env = _env(home, PIP_NO_CACHE_DIR="1")
    for name in ("AIRFLOW__CORE__DAGS_FOLDER", "AIRFLOW__CORE__LOAD_EXAMPLES", "AIRFLOW_HOME"):
        env.pop(name, None)  # the walkthrough sets them
    airflow_version = _floor("apache-airflow") if variant == "oldest" else NEWEST_AIRFLOW
    constraints = airflow_constraints(airflow_version, tmp_path)
    script = readme_walkthrough()
    for old, new in (
        ("python -m venv venv", f"{sys.executable} -m venv venv"),
        (f"AIRFLOW_VERSION={_floor('apache-airflow')} ", f"AIRFLOW_VERSION={airflow_version} "),
        (CONSTRAINTS_URL, str(constraints)),
        (f'pip install "{EXTRAS}"', f'pip install -q "{wheel}[airflow,spark,kafka,quality,metrics]"'),
        ("splitkeeper jars fetch", f"splitkeeper jars fetch --repo {maven_repo.as_uri()}"),
    ):
        assert old in script
        script = script.replace(old, new)
    checks = (
        "\nairflow version > version.txt"
        "\nairflow providers list -o json > providers.json"
        "\nairflow dags list-import-errors -o json > import-errors.json || true\n"
    )
    (home / "walkthrough.sh").write_text("set -euo pipefail\n" + script + checks, encoding="utf-8")
    done = subprocess.run(
        ["bash", "walkthrough.sh"], cwd=home, env=env, capture_output=True, text=True, timeout=3000
    )
    assert done.returncode == 0, f"{done.stdout[-6000:]}\n{done.stderr[-6000:]}"

    version = (home / "version.txt").read_text().strip().splitlines()[-1]
    assert version == airflow_version
    assert "ready" in done.stdout.splitlines()  # splitkeeper doctor: no FAIL
    assert "splitkeeper" in {p["package_name"] for p in _json_list((home / "providers.json").read_text())}
    errors = (home / "import-errors.json").read_text()
    assert '"filename"' not in errors, errors  # `list-import-errors -o json` lists none
    assert "splitkeeper_ingest" in done.stdout + done.stderr
    # the ingest DAG run wrote the two records to the sink, byte for byte (read with the
    # package's one sink reader; a bare `DeltaTable(...).to_pyarrow_table()` in a short script
    # aborts at interpreter exit half the time with deltalake 1.6.6 and pyarrow 26: see
    # docs/history.md)
    read = (
        "import json; from splitkeeper.sinks.delta.read import read_sink\n"
        f"t = read_sink({str(home / 'data' / 'sink')!r}, ['value'])\n"
        "print(json.dumps(sorted(bytes(v).decode() for v in t.column('value').to_pylist())))\n"
    )
    values = json.loads(
        _run([str(home / "venv" / "bin" / "python"), "-c", read], cwd=home, env=env).splitlines()[-1]
    )
    assert values == ['{"id": 1, "amount": 10}', '{"id": 2, "amount": 20}']
    # and `splitkeeper status` (the walkthrough's last line) saw the checkpoint it took
    assert "orders" in done.stdout
