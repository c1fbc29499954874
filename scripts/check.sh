#!/usr/bin/env bash
# The static checks, one line each; scripts/test.sh runs them before pytest (so CI does).
#
#   bash scripts/check.sh
#
#   ruff check          lint (pyproject.toml [tool.ruff])
#   ruff format         formatting, --check only: `ruff format .` fixes it
#   mypy                types (pyproject.toml [tool.mypy]; strict on splitkeeper/core)
#   lint-imports        the layer contracts (pyproject.toml [tool.importlinter])
#
# Every check runs; a failing one prints its output after its line, and the script exits 1
# if any failed. The tools come from .venv/ (bash scripts/setup.sh), else from PATH (an
# activated venv). The checkout checked is the one holding this script.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [[ -x "$ROOT/.venv/bin/ruff" ]]; then
    export PATH="$ROOT/.venv/bin:$PATH"
fi
# lint-imports finds the package by importing it: this checkout's, whatever the venv installed.
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

failed=()
check() {
    local name="$1" out started=$SECONDS
    shift
    if out="$("$@" 2>&1)"; then
        printf '[check] %-14s ok (%ss)\n' "$name" "$((SECONDS - started))"
    else
        printf '[check] %-14s FAILED: %s\n' "$name" "$*"
        printf '%s\n' "$out" | sed 's/^/    /'
        failed+=("$name")
    fi
}

check "ruff check" ruff check --no-cache --quiet .
check "ruff format" ruff format --no-cache --check --quiet .
check "mypy" mypy
check "lint-imports" lint-imports --no-cache
if [[ ${#failed[@]} -gt 0 ]]; then
    printf '[check] FAILED: %s (fix them, then run bash scripts/check.sh again)\n' "${failed[*]}" >&2
    exit 1
fi
