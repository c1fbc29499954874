"""The protocol core imports no engine and no config-model library: no pyspark, delta, airflow,
great_expectations or pydantic (STYLE)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import splitkeeper.core

FORBIDDEN = ("pyspark", "py4j", "delta", "deltalake", "airflow", "great_expectations", "pydantic")
CORE_DIR = Path(splitkeeper.core.__file__).parent


def core_modules() -> list[str]:
    return sorted(
        "splitkeeper.core" + ("" if p.stem == "__init__" else "." + p.stem) for p in CORE_DIR.glob("*.py")
    )


def test_importing_every_core_module_loads_no_engine_package():
    modules = core_modules()
    assert "splitkeeper.core.enumerator" in modules and len(modules) >= 8
    code = (
        "import importlib, json, sys\n"
        f"mods = {modules!r}\n"
        "for m in mods: importlib.import_module(m)\n"
        f"bad = sorted(n for n in sys.modules if n.split('.')[0] in {FORBIDDEN!r})\n"
        "print(json.dumps({'imported': [m for m in mods if m in sys.modules], 'forbidden': bad}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    result = json.loads(out.stdout)
    assert result["imported"] == modules
    assert result["forbidden"] == []


def test_no_core_source_file_imports_an_engine_package():
    offenders = []
    for path in sorted(CORE_DIR.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            offenders += [f"{path.name}:{node.lineno} {n}" for n in names if n.split(".")[0] in FORBIDDEN]
    assert offenders == []


def test_the_static_scan_would_catch_an_engine_import():
    tree = ast.parse("from pyspark.sql import SparkSession\nimport great_expectations as gx\n")
    found = [
        n.module if isinstance(n, ast.ImportFrom) else n.names[0].name
        for n in ast.walk(tree)
        if isinstance(n, ast.Import | ast.ImportFrom)
    ]
    assert [f for f in found if f and f.split(".")[0] in FORBIDDEN] == ["pyspark.sql", "great_expectations"]
