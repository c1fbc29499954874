#!/usr/bin/env bash
# Install everything (scripts/setup.sh), run the static checks (scripts/check.sh: ruff,
# mypy, lint-imports; a failing check fails the run before any test), then the test suite
# with pytest.
#
#   bash scripts/test.sh                       # the whole suite (what CI runs)
#   bash scripts/test.sh tests/runtime -x -q   # any pytest arguments pass through
#   bash scripts/test.sh -m "not spark and not kafka"
#
# A run that collects no test (pytest exit code 5, e.g. a -m or -k that matches
# nothing) fails loudly instead of passing silently.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

bash scripts/setup.sh --dev  # the demo's steps plus the test tools, chromium, docker-compose, otelcol
bash scripts/check.sh

status=0
"$ROOT/.venv/bin/python" -m pytest "$@" || status=$?
if [[ $status -eq 5 ]]; then
    echo "[test] ERROR: pytest collected no tests (exit code 5) for: pytest $*" >&2
    echo "[test] a selection that matches nothing is a failure, not a pass; check the paths, -k and -m" >&2
fi
exit "$status"
