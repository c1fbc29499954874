"""scripts/setup.sh's python step on a fresh copy of the checkout, into a new venv that the
system's ``python3 -m venv`` creates: its bundled pip, whatever its version, only installs the
pinned installer (locks/bootstrap.txt); uv installs exactly the locks.

This is the step a fresh machine failed on 2026-12-04 (issue 35): the bundled pip 23.2.1 resolved
``uvicorn[standard]>=0.15.0`` to a release made after the lock and stopped in --require-hashes
mode. No pip cache is used (``PIP_NO_CACHE_DIR``); uv's download cache is the machine's, so the
test costs seconds once set-up ran, not a download of pyspark. No variable names a CA bundle
(``SSL_CERT_FILE`` ...): set-up trusts the system's store, as the bundled pip does (a fresh
machine behind a TLS-inspecting proxy failed on uv's own roots, 2026-12-05).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.test_package import _committable_files

ROOT = Path(__file__).resolve().parents[1]


def _system_python() -> str:
    python = shutil.which("python3")
    assert python is not None, "no python3 on PATH"
    return python


#: variables naming a CA bundle; a fresh machine may export none (its CAs only in the system store)
_CA_BUNDLES = ("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")


@pytest.mark.slow
def test_the_python_step_installs_the_locks_into_a_new_venv_of_the_systems_python(tmp_path: Path) -> None:
    source = tmp_path / "checkout"
    for name in _committable_files():
        target = source / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME") + _CA_BUNDLES
        and not k.startswith(("PIP_", "SPLITKEEPER_", "UV_"))
    }
    env.update(PIP_NO_CACHE_DIR="1", SPLITKEEPER_PYTHON=_system_python(), SPLITKEEPER_BROWSER_TESTS="0")
    done = subprocess.run(
        ["bash", "scripts/setup.sh", "python"],
        cwd=source,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    venv = source / ".venv"
    bundled = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "--version"], capture_output=True, text=True, check=True
    ).stdout
    system = subprocess.run(
        [_system_python(), "-m", "pip", "--version"], capture_output=True, text=True, check=False
    ).stdout
    # the venv's pip is the one python -m venv bundled (set-up never upgrades it), whatever it is
    assert bundled.split()[1] == system.split()[1] if system else bundled.startswith("pip ")
    assert "installer: pip install --require-hashes --no-deps -r locks/bootstrap.txt" in done.stdout
    # exactly the lock's versions, every requirement met
    probe = (
        "import importlib.metadata as m, pyspark, airflow, splitkeeper, splitkeeper_tools;"
        "print(m.version('uvicorn'), m.version('pyspark'), m.version('apache-airflow'))"
    )
    versions = subprocess.run(
        [str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True, check=True, cwd=tmp_path
    ).stdout.split()
    lock = (ROOT / "locks" / "airflow.txt").read_text(encoding="utf-8")
    for name, version in zip(("uvicorn", "pyspark", "apache-airflow"), versions, strict=True):
        assert f"\n{name}=={version} " in lock, (name, version)
    check = subprocess.run(
        [str(venv / "bin" / "uv"), "pip", "check", "--python", str(venv / "bin" / "python")],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    # the product and its tools are the copy's, editable
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import splitkeeper_tools; print(splitkeeper_tools.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    ).stdout.strip()
    assert where.startswith(str(source / "tools"))
    # a second run finds the stamps current
    again = subprocess.run(
        ["bash", "scripts/setup.sh", "python"],
        cwd=source,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0 and "python packages: up to date" in again.stdout
