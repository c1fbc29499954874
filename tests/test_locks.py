"""The hashed lock files of locks/, what set-up installs from them, and the version ranges.

locks/runtime.txt (every extra but airflow and dev), locks/airflow.txt (every extra but dev, plus
Airflow's PostgreSQL drivers) and locks/test.txt (the dev extra alone) are written by
``scripts/lock.sh`` with ``uv pip compile --generate-hashes``; requirements.lock is their union
without hashes, for the Docker images. Reading files only: no install here (the install of the
locks into a fresh venv is measured by hand; the wheel in fresh venvs is
tests/test_install_airflow.py, a slow variant).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
LOCKS = ROOT / "locks"
_PIN = re.compile(r"^([A-Za-z0-9_.-]+)==([^ ;\\]+)")


def _lock(name: str) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes) of one hashed lock file."""
    entries: dict[str, tuple[str, list[str]]] = {}
    current = ""
    for line in (LOCKS / name).read_text(encoding="utf-8").splitlines():
        if m := _PIN.match(line):
            current = canonicalize_name(m[1])
            assert current not in entries, f"{name}: {current} pinned twice"
            entries[current] = (m[2], [])
        elif (h := line.strip()).startswith("--hash=sha256:"):
            entries[current][1].append(h.removeprefix("--hash=sha256:").rstrip(" \\"))
        else:
            assert not line.strip() or line.lstrip().startswith("#"), f"{name}: unexpected line {line!r}"
    return entries


def _pins(entries: dict[str, tuple[str, list[str]]]) -> dict[str, str]:
    return {name: version for name, (version, _) in entries.items()}


RUNTIME, AIRFLOW, TEST = _lock("runtime.txt"), _lock("airflow.txt"), _lock("test.txt")
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
EXTRAS = PYPROJECT["project"]["optional-dependencies"]


@pytest.mark.parametrize("name", ["runtime.txt", "airflow.txt", "test.txt"])
def test_every_pin_of_every_lock_carries_sha256_hashes(name: str) -> None:
    entries = _lock(name)
    assert entries
    bare = [pkg for pkg, (_, hashes) in entries.items() if not hashes]
    assert bare == [], f"locks/{name}: pins without a hash (pip --require-hashes refuses them): {bare}"
    assert all(re.fullmatch(r"[0-9a-f]{64}", h) for _, hashes in entries.values() for h in hashes)


def test_the_locks_agree_with_each_other_and_with_requirements_lock() -> None:
    runtime, airflow, test = _pins(RUNTIME), _pins(AIRFLOW), _pins(TEST)
    # one version of a package whichever lock brings it (pip installs airflow.txt and test.txt together)
    assert {n: v for n, v in runtime.items() if airflow.get(n) != v} == {}
    assert {n: v for n, v in test.items() if n in airflow and airflow[n] != v} == {}
    union = {**airflow, **test}
    freeze = {}
    for line in (ROOT / "requirements.lock").read_text(encoding="utf-8").splitlines():
        if m := _PIN.match(line):
            freeze[canonicalize_name(m[1])] = m[2]
    assert freeze == union, "requirements.lock is not the union of the locks: run bash scripts/lock.sh"


def test_each_lock_holds_its_part_and_test_tools_only_the_test_lock() -> None:
    tools = {canonicalize_name(Requirement(r).name) for r in EXTRAS["dev"]}
    assert tools <= set(_pins(TEST)) and "setuptools" in _pins(TEST)
    # jsonschema is also a runtime dependency (Great Expectations, altair); the others are tools only
    assert tools & set(_pins(AIRFLOW)) == {"jsonschema"}, "a test tool in locks/airflow.txt"
    assert "apache-airflow" not in _pins(TEST) and "pyspark" not in _pins(TEST)
    assert {"pyspark", "delta-spark", "deltalake", "confluent-kafka", "great-expectations"} <= set(
        _pins(RUNTIME)
    )
    assert "apache-airflow" not in _pins(RUNTIME)
    assert {"apache-airflow", "pyspark-client", "psycopg2-binary", "asyncpg"} <= set(_pins(AIRFLOW))
    assert _pins(AIRFLOW)["pyspark-client"] == _pins(AIRFLOW)["pyspark"]  # they share the pyspark/ folder


def test_every_lock_pin_is_inside_the_declared_ranges() -> None:
    declared = [Requirement(r) for r in PYPROJECT["project"]["dependencies"]]
    for reqs in EXTRAS.values():
        declared += [Requirement(r) for r in reqs if not r.startswith("splitkeeper")]
    union = {**_pins(AIRFLOW), **_pins(TEST)}
    outside = [
        f"{r} (locked {union[canonicalize_name(r.name)]})"
        for r in declared
        if not r.specifier.contains(union[canonicalize_name(r.name)], prereleases=True)
    ]
    assert outside == []


def test_floors_are_wide_and_every_range_is_capped() -> None:
    declared = {
        canonicalize_name(Requirement(r).name): Requirement(r).specifier
        for reqs in [PYPROJECT["project"]["dependencies"], *EXTRAS.values()]
        for r in reqs
        if not r.startswith("splitkeeper")
    }
    # a team on Airflow 3.0 keeps its Airflow; the base install does not force the newest pydantic
    assert declared["apache-airflow"].contains("3.0.0") and not declared["apache-airflow"].contains("4.0")
    # floors from the APIs used (pyproject.toml says which), not the lock's own versions
    for name, floor, below in [
        ("pydantic", "2.5.0", "2.4.2"),
        ("structlog", "21.5.0", "21.4.0"),
        ("rich", "10.0.0", "9.13.0"),
    ]:
        assert declared[name].contains(floor) and not declared[name].contains(below), name
    uncapped = [name for name, spec in declared.items() if not any(s.operator == "<" for s in spec)]
    assert uncapped == []


def test_setup_installs_the_demos_needs_by_default_and_the_test_tools_with_dev() -> None:
    setup = (ROOT / "scripts" / "setup.sh").read_text(encoding="utf-8")
    assert 'pip install --require-hashes -r locks/airflow.txt > "$log"' in setup
    assert 'pip install --require-hashes -r locks/test.txt >> "$log"' in setup
    assert "steps=(python jars)" in setup  # no chromium, docker-compose, Go build or test tools
    assert "--dev) steps+=(otelcol python jars devpython browser compose)" in setup
    test_sh = (ROOT / "scripts" / "test.sh").read_text(encoding="utf-8")
    assert re.search(r"^bash scripts/setup\.sh --dev\b", test_sh, re.M)
    run_sh = (ROOT / "scripts" / "run.sh").read_text(encoding="utf-8")
    assert re.search(r"^bash scripts/setup\.sh$", run_sh, re.M)
