"""The suite's own selection rules (tests/conftest.py): ``slow_variant`` tests are deselected by default.

A pytest run in a scratch folder with this suite's conftest and markers: a ``slow_variant``
test is deselected (reported as such, not skipped) unless ``--run-slow-variants`` or
``SPLITKEEPER_SLOW_VARIANTS=1`` asks for it; the run lists its slowest tests.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent

SAMPLE = """
import pytest

def test_default():
    assert True

@pytest.mark.slow_variant
def test_bigger():
    assert True
"""


def _pytest(folder: Path, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", *argv, str(folder)],
        cwd=str(folder),
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def sample(tmp_path: Path) -> Path:
    """This suite's conftest and pytest settings, a default test and a slow_variant test."""
    (tmp_path / "conftest.py").write_text((TESTS / "conftest.py").read_text(encoding="utf-8"))
    (tmp_path / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    return tmp_path


def _outcome(done: subprocess.CompletedProcess[str]) -> tuple[set[str], str]:
    passed = set(re.findall(r"::(test_\w+) PASSED", done.stdout))
    return passed, done.stdout.strip().splitlines()[-1]


def test_a_slow_variant_is_deselected_by_default_and_runs_on_request(sample: Path) -> None:
    default = _pytest(sample, env={"SPLITKEEPER_SLOW_VARIANTS": ""})
    assert default.returncode == 0, default.stdout[-3000:]
    passed, last = _outcome(default)
    assert passed == {"test_default"}
    assert "1 passed, 1 deselected" in last and "skipped" not in last
    assert "slowest 30 durations" in default.stdout  # --durations=30 from the addopts

    asked = _pytest(sample, "--run-slow-variants", env={"SPLITKEEPER_SLOW_VARIANTS": ""})
    assert asked.returncode == 0, asked.stdout[-3000:]
    assert _outcome(asked)[0] == {"test_default", "test_bigger"}

    only = _pytest(sample, "-m", "slow_variant", env={"SPLITKEEPER_SLOW_VARIANTS": "1"})
    assert only.returncode == 0, only.stdout[-3000:]
    assert _outcome(only)[0] == {"test_bigger"}  # the variable asks for them too; -m then selects


#: The fixtures that build an object store on demand, and what their failed build says.
STORE_FIXTURES = {
    "versitygw": "the real-S3 tests need versitygw and building it failed",
    "fake_gcs": "the gs:// tests need fake-gcs-server and building it failed",
    "azurite": "the abfss:// tests need Azurite and installing it failed",
}


def test_a_test_that_needs_an_object_store_errors_when_it_cannot_be_built_and_never_skips(
    sample: Path, tmp_path: Path
) -> None:
    """The real-S3 tests (tests/state/test_fence.py) take the ``versitygw`` fixture, the gs:// and
    abfss:// ones ``fake_gcs`` and ``azurite``, which build the store when it is missing: a build that
    fails fails them (an ERROR naming the build), whatever ran before; they are never skipped for want
    of another test's fixture."""
    (sample / "test_store.py").write_text(
        "".join(f"def test_store_{f}({f}):\n    assert {f}.exists()\n\n\n" for f in STORE_FIXTURES)
    )
    done = _pytest(sample, "-k", "test_store", env={"SPLITKEEPER_TOOLS_DIR": str(tmp_path / "no-tools")})
    assert done.returncode == 1, done.stdout[-2000:]
    assert "SKIPPED" not in done.stdout
    for fixture, message in STORE_FIXTURES.items():
        assert f"test_store_{fixture} ERROR" in done.stdout and message in done.stdout, fixture
