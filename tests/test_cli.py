"""The ``splitkeeper`` entry point: ``--version``, ``--help`` and the command table."""

from __future__ import annotations

import subprocess
import sys
import types
from importlib import metadata

import pytest

from splitkeeper.cli import COMMANDS, Command, main


def test_version_prints_the_installed_distribution_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"splitkeeper {metadata.version('splitkeeper')}\n"


def test_help_lists_version_and_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "--version" in out
    assert all(name in out for name in COMMANDS)
    examples = out.split("examples:")[1].splitlines()
    for line in examples:  # every example names a real command
        if line.strip().startswith("splitkeeper ") and "COMMAND" not in line:
            assert line.split()[1] in COMMANDS, line


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_module_exists_and_has_configure_and_run(name: str) -> None:
    module = COMMANDS[name].load()
    assert callable(module.configure) and callable(module.run)


def test_help_imports_no_command_module() -> None:
    """``--help`` lists the commands from the registry alone: no command module (nor Spark) is imported."""
    probe = (
        "import sys\n"
        "from splitkeeper.cli import main\n"
        "main(['--help'])\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith(('splitkeeper.', 'pyspark')))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    loaded = set(done.stdout.splitlines()[-1].split())
    assert loaded <= {"splitkeeper.cli", "splitkeeper.errors", "splitkeeper.logs"}, loaded


def _fake_command(monkeypatch: pytest.MonkeyPatch, missing: str) -> None:
    module = types.ModuleType("splitkeeper_test_fake_command")

    def run(args: object) -> int:
        raise ModuleNotFoundError(f"No module named {missing!r}", name=missing)

    module.configure = lambda parser: None  # type: ignore[attr-defined]
    module.run = run  # type: ignore[attr-defined]
    monkeypatch.setitem(COMMANDS, "fake", Command("a command whose engine is missing", lambda: module))


@pytest.mark.parametrize(
    ("missing", "extra"),
    [("pyarrow.parquet", "spark"), ("confluent_kafka", "kafka"), ("great_expectations", "quality")],
)
def test_a_missing_engine_names_the_extra_that_installs_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], missing: str, extra: str
) -> None:
    _fake_command(monkeypatch, missing)
    assert main(["fake"]) == 2
    err = capsys.readouterr().err
    assert f"needs {missing.partition('.')[0]}, which is not installed" in err
    assert f"pip install 'splitkeeper[{extra}]'" in err


def test_a_missing_module_that_no_extra_installs_is_not_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_command(monkeypatch, "no_such_module")
    with pytest.raises(ModuleNotFoundError, match="no_such_module"):
        main(["fake"])


def test_a_command_whose_module_is_not_in_the_build_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def load() -> types.ModuleType:
        raise ModuleNotFoundError("No module named 'splitkeeper.quality'", name="splitkeeper.quality")

    monkeypatch.setitem(COMMANDS, "fake", Command("a tool left out of this build", load))
    assert main(["fake"]) == 2
    assert (
        "splitkeeper fake: not available in this build (splitkeeper.quality missing)"
        in capsys.readouterr().err
    )
