"""scripts/check.sh and the rules it enforces: the layer contracts break on a forbidden import,
mypy is strict on the core and only there, and the script fails when one check fails."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
CORE_CONTRACT = "core: the protocol core imports no other part of splitkeeper but splitkeeper.errors"
SPARK_CONTRACT = (
    "spark: the engine imports no orchestration, checks, report, services, CLI, simulator or tools"
)
DELTA_CONTRACT = "delta: the Delta package imports no engine-side or user-facing part of splitkeeper"
HISTORY_CONTRACT = "report and checks read state through the Delta package's API, never its tables module"
ENGINES_CONTRACT = "core: the protocol core imports no engine and no config-model library"
PIPELINE_CONTRACT = "commands and the Airflow provider reach the pipeline only through splitkeeper.app"
TOOLS_CONTRACT = "tools: the product never imports splitkeeper_tools"
CLI_CONTRACT = "cli: only python -m splitkeeper imports the CLI"
CONFIG_CONTRACT = (
    "config: the pipeline file's models import no engine, store or user-facing part of splitkeeper"
)
CONTRACTS = (
    CORE_CONTRACT,
    SPARK_CONTRACT,
    DELTA_CONTRACT,
    HISTORY_CONTRACT,
    ENGINES_CONTRACT,
    PIPELINE_CONTRACT,
    TOOLS_CONTRACT,
    CLI_CONTRACT,
    CONFIG_CONTRACT,
)


def _env(root: Path) -> dict[str, str]:
    """The product and its tools (tools/, the splitkeeper-tools distribution) of ``root`` first."""
    pythonpath = f"{root}{os.pathsep}{root / 'tools'}"
    return {**os.environ, "PYTHONPATH": pythonpath, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the package, its tools and pyproject.toml (contracts, mypy settings)."""
    shutil.copy2(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    for folder in ("splitkeeper", "tools/splitkeeper_tools"):
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def _lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "lint-imports"), "--no-cache"],
        cwd=tree,
        env=_env(tree),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _contract_lines(output: str) -> dict[str, str]:
    """Contract name -> KEPT or BROKEN, from lint-imports' summary (a long name wraps onto two lines)."""
    text = " ".join(output.split())
    return {
        name: ("BROKEN" if f"{name} BROKEN" in text else "KEPT" if f"{name} KEPT" in text else "?")
        for name in CONTRACTS
    }


def test_the_contracts_are_kept_by_this_checkout(tree: Path) -> None:
    done = _lint_imports(tree)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _contract_lines(done.stdout) == dict.fromkeys(CONTRACTS, "KEPT")


@pytest.mark.parametrize(
    ("module", "imports", "broken"),
    [
        # the config module reaches pydantic (its schema), so both core contracts break
        (
            "splitkeeper/core/_probe.py",
            "import splitkeeper.config.settings",
            (CORE_CONTRACT, ENGINES_CONTRACT),
        ),
        ("splitkeeper/core/_probe.py", "import splitkeeper.sim.events", CORE_CONTRACT),
        ("splitkeeper/core/_probe.py", "from splitkeeper import resources", CORE_CONTRACT),
        # the config reads the core only: no engine (ours or pyspark), no store, nothing user-facing
        ("splitkeeper/config/_probe.py", "import splitkeeper.spark.regions", CONFIG_CONTRACT),
        ("splitkeeper/config/_probe.py", "from splitkeeper.delta import serde", CONFIG_CONTRACT),
        ("splitkeeper/config/_probe.py", "import pyspark", CONFIG_CONTRACT),
        ("splitkeeper/config/_probe.py", "from splitkeeper.app import services", CONFIG_CONTRACT),
        ("splitkeeper/spark/_probe.py", "import splitkeeper.airflow.tasks", SPARK_CONTRACT),
        ("splitkeeper/spark/_probe.py", "import splitkeeper.report.html", SPARK_CONTRACT),
        ("splitkeeper/spark/_probe.py", "from splitkeeper.quality import checks", SPARK_CONTRACT),
        ("splitkeeper/spark/sources/_probe.py", "import splitkeeper.cli", (SPARK_CONTRACT, CLI_CONTRACT)),
        ("splitkeeper/spark/_probe.py", "import splitkeeper.commands.run", SPARK_CONTRACT),
        ("splitkeeper/spark/_probe.py", "from splitkeeper.app import services", SPARK_CONTRACT),
        ("splitkeeper/spark/_probe.py", "import splitkeeper.sim.simulator", SPARK_CONTRACT),
        (
            "splitkeeper/spark/_probe.py",
            "import splitkeeper_tools.bench.ingest",
            (SPARK_CONTRACT, TOOLS_CONTRACT),
        ),
        (
            "splitkeeper/spark/sources/_probe.py",
            "import splitkeeper_tools.chaos",
            (SPARK_CONTRACT, TOOLS_CONTRACT),
        ),
        (
            "splitkeeper/spark/_probe.py",
            "import splitkeeper_tools.demo",
            (SPARK_CONTRACT, TOOLS_CONTRACT),
        ),
        # the product (any package, a new one too) imports no tool, and no module but __main__ the CLI
        ("splitkeeper/app/_probe.py", "import splitkeeper_tools.otelcol", TOOLS_CONTRACT),
        ("splitkeeper/commands/_probe.py", "from splitkeeper_tools import fault_proxy", TOOLS_CONTRACT),
        (
            "splitkeeper/delta/_probe.py",
            "from splitkeeper_tools.kafka_broker import free_port",
            (DELTA_CONTRACT, TOOLS_CONTRACT),
        ),
        ("splitkeeper/newpart/_probe.py", "from splitkeeper_tools import cluster", TOOLS_CONTRACT),
        ("splitkeeper/commands/_probe.py", "from splitkeeper import cli", CLI_CONTRACT),
        ("tools/splitkeeper_tools/_probe.py", "import splitkeeper.cli", CLI_CONTRACT),
        ("splitkeeper/commands/_probe.py", "from splitkeeper.app import pipeline", PIPELINE_CONTRACT),
        ("splitkeeper/airflow/_probe.py", "import splitkeeper.app.pipeline", PIPELINE_CONTRACT),
        ("splitkeeper/delta/_probe.py", "import splitkeeper.spark.session", DELTA_CONTRACT),
        ("splitkeeper/delta/_probe.py", "from splitkeeper.app import services", DELTA_CONTRACT),
        ("splitkeeper/report/_probe.py", "from splitkeeper.delta import tables", HISTORY_CONTRACT),
        ("splitkeeper/quality/_probe.py", "import splitkeeper.delta.tables", HISTORY_CONTRACT),
        ("splitkeeper/core/_probe.py", "import pydantic", ENGINES_CONTRACT),
        ("splitkeeper/core/_probe.py", "from pydantic import BaseModel", ENGINES_CONTRACT),
        ("splitkeeper/core/_probe.py", "import pyspark.sql", ENGINES_CONTRACT),
    ],
)
def test_a_forbidden_import_breaks_its_contract_and_names_the_module(
    tree: Path, module: str, imports: str, broken: str | tuple[str, ...]
) -> None:
    expected = [broken] if isinstance(broken, str) else list(broken)
    (tree / module).parent.mkdir(exist_ok=True)
    (tree / module.rpartition("/")[0] / "__init__.py").touch()
    (tree / module).write_text(f"{imports}\n", encoding="utf-8")
    done = _lint_imports(tree)
    assert done.returncode == 1, done.stdout + done.stderr
    states = _contract_lines(done.stdout)
    assert sorted(name for name, state in states.items() if state == "BROKEN") == sorted(expected)
    assert module.removesuffix(".py").removeprefix("tools/").replace("/", ".") in done.stdout


LAYERS_CONTRACT = "layers: the product's packages import downwards only"
SINK_PORT_CONTRACT = "app, checks and report talk to the sink port, never a sink or source kind's package"


def _states(output: str, names: tuple[str, ...]) -> dict[str, str]:
    text = " ".join(output.split())
    return {n: ("BROKEN" if f"{n} BROKEN" in text else "KEPT" if f"{n} KEPT" in text else "?") for n in names}


def test_the_layers_and_the_sink_port_contracts_are_kept_by_this_checkout(tree: Path) -> None:
    done = _lint_imports(tree)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _states(done.stdout, (LAYERS_CONTRACT, SINK_PORT_CONTRACT)) == {
        LAYERS_CONTRACT: "KEPT",
        SINK_PORT_CONTRACT: "KEPT",
    }


@pytest.mark.parametrize(
    ("module", "imports", "broken"),
    [
        # a lower layer reaching up: the engine into a sink kind, the records into the config
        ("splitkeeper/spark/_probe.py", "import splitkeeper.sinks.port", LAYERS_CONTRACT),
        ("splitkeeper/records/_probe.py", "import splitkeeper.config.models", LAYERS_CONTRACT),
        ("splitkeeper/report/_probe.py", "from splitkeeper.quality import upsert", LAYERS_CONTRACT),
        ("splitkeeper/sinks/_probe.py", "import splitkeeper.spark.task", LAYERS_CONTRACT),
        # the application talks to the port; a kind's package is the registry's to import
        ("splitkeeper/app/_probe.py", "import splitkeeper.sinks.delta.sink", SINK_PORT_CONTRACT),
        ("splitkeeper/quality/_probe.py", "from splitkeeper.sinks.delta import read", SINK_PORT_CONTRACT),
        ("splitkeeper/report/_probe.py", "import splitkeeper.sources.kafka.source", SINK_PORT_CONTRACT),
    ],
)
def test_an_import_against_the_layers_or_the_sink_port_breaks_that_contract(
    tree: Path, module: str, imports: str, broken: str
) -> None:
    (tree / module).parent.mkdir(exist_ok=True)
    (tree / module.rpartition("/")[0] / "__init__.py").touch()
    (tree / module).write_text(f"{imports}\n", encoding="utf-8")
    done = _lint_imports(tree)
    assert done.returncode == 1, done.stdout + done.stderr
    assert _states(done.stdout, (broken,)) == {broken: "BROKEN"}


def test_the_import_graph_has_no_cycle_between_modules() -> None:
    """Every strongly connected group of the product's import graph (imports inside functions and
    for the type checker included) is one module: no two modules import each other, even through
    others."""
    import grimp

    graph = grimp.build_graph("splitkeeper")
    modules = sorted(graph.modules)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    counter = 0
    for root in modules:  # Tarjan's algorithm, iteratively
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            if i < len(edges[node]):
                work.append((node, i + 1))
                nxt = edges[node][i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    circles.append(sorted(group))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    assert circles == []


def test_the_import_graph_holds_an_arrow_from_the_cli_to_every_command_module() -> None:
    """The CLI registers its commands with plain imports, so the contracts above see those arrows."""
    import grimp

    from splitkeeper.cli import COMMANDS

    graph = grimp.build_graph("splitkeeper")
    for name, command in COMMANDS.items():
        module = command.load().__name__  # type: ignore[attr-defined]
        assert graph.direct_import_exists(importer="splitkeeper.cli", imported=module), name


def test_the_core_may_import_the_errors_module(tree: Path) -> None:
    (tree / "splitkeeper/core/_probe.py").write_text("from splitkeeper.errors import ProtocolError\n")
    done = _lint_imports(tree)
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_is_strict_on_the_core_and_only_there(tmp_path: Path) -> None:
    shutil.copy2(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    untyped = "def half(x):\n    return x / 2\n\n\ndef table() -> dict:\n    return {}\n"
    for package in ("splitkeeper", "splitkeeper/core", "splitkeeper/sim"):
        (tmp_path / package).mkdir(exist_ok=True)
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "splitkeeper/core/probe.py").write_text(untyped)
    (tmp_path / "splitkeeper/sim/probe.py").write_text(untyped)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / ".mypy_cache")]
        + ["splitkeeper/core/probe.py", "splitkeeper/sim/probe.py"],
        cwd=tmp_path,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    assert {line.split(":")[0] for line in errors} == {"splitkeeper/core/probe.py"}
    assert any("missing a type annotation" in line for line in errors)
    assert any('Missing type arguments for generic type "dict"' in line for line in errors)


def _check_sh(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(root / "scripts" / "check.sh")],
        cwd=root,
        env={**_env(root), "PYTHONPATH": ""},
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_check_sh_prints_one_line_per_check_and_passes_on_this_checkout() -> None:
    done = _check_sh(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert [line.split()[1:3] for line in lines] == [
        ["ruff", "check"],
        ["ruff", "format"],
        ["mypy", "ok"],
        ["lint-imports", "ok"],
    ]
    assert all(line.startswith("[check] ") for line in lines)
    assert lines[0].split()[3] == "ok" and lines[1].split()[3] == "ok"


def test_check_sh_fails_when_a_check_fails_and_still_runs_the_others(tmp_path: Path) -> None:
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, tmp_path / name)
    for folder in ("splitkeeper", "scripts", "tools/splitkeeper_tools"):
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    if (ROOT / ".mypy_cache").is_dir():  # mypy from a warm cache: seconds instead of a minute
        shutil.copytree(ROOT / ".mypy_cache", tmp_path / ".mypy_cache")
    (tmp_path / "splitkeeper/spark/_probe.py").write_text("import splitkeeper.cli  # noqa: F401\n")
    done = _check_sh(tmp_path)
    assert done.returncode == 1
    lines = [line for line in done.stdout.splitlines() if line.startswith("[check] ")]
    assert [line.split()[1] for line in lines] == ["ruff", "ruff", "mypy", "lint-imports"]
    assert "FAILED" in lines[-1] and all("FAILED" not in line for line in lines[:-1])
    assert "splitkeeper.spark._probe -> splitkeeper.cli" in done.stdout
    assert "[check] FAILED: lint-imports" in done.stderr


def test_test_sh_runs_the_checks_between_setup_and_pytest() -> None:
    text = (ROOT / "scripts" / "test.sh").read_text()
    assert text.index("bash scripts/setup.sh") < text.index("bash scripts/check.sh") < text.index("-m pytest")
