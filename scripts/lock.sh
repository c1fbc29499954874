#!/usr/bin/env bash
# Regenerate the hashed lock files of locks/ with `uv pip compile --generate-hashes`, one per
# use (see locks/README.md). uv goes into a throwaway venv, never into .venv.
#
#   bash scripts/lock.sh                 # keep every pinned version (only new requirements resolve)
#   bash scripts/lock.sh --upgrade       # newest versions within pyproject.toml's ranges
#
# Environment: SPLITKEEPER_PYTHON (interpreter for the throwaway venv; default python3.11/python3).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
say() { printf '[lock] %s\n' "$*"; }

upgrade=()
case "${1:-}" in
    "") ;;
    --upgrade) upgrade=(--upgrade) ;;
    *) echo "[lock] ERROR: unknown argument '$1'; use --upgrade or nothing" >&2; exit 2 ;;
esac

py="${SPLITKEEPER_PYTHON:-}"
[[ -n "$py" ]] || { if command -v python3.11 >/dev/null 2>&1; then py=python3.11; else py=python3; fi; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$py" -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install -q uv
uv="$tmp/venv/bin/uv"
common=(--python-version 3.11 --generate-hashes --no-header --quiet "${upgrade[@]}")
# Without --upgrade every version already pinned stays: the previous locks are the constraints.
pins() { [[ ${#upgrade[@]} -eq 0 && -f "$1" ]] && printf -- '-c\n%s\n' "$1" || true; }
mapfile -t keep_runtime < <(pins locks/runtime.txt)
mapfile -t keep_airflow < <(pins locks/airflow.txt)
mapfile -t keep_test < <(pins locks/test.txt)

say "locks/runtime.txt: splitkeeper[spark,kafka,quality,metrics]"
"$uv" pip compile pyproject.toml --extra spark --extra kafka --extra quality --extra metrics \
    "${common[@]}" "${keep_runtime[@]}" -o locks/runtime.txt
say "locks/airflow.txt: splitkeeper[all] + locks/airflow.in, the runtime lock's versions kept"
"$uv" pip compile pyproject.toml locks/airflow.in --extra all \
    "${common[@]}" -c locks/runtime.txt "${keep_airflow[@]}" -o locks/airflow.txt
say "locks/test.txt: the dev extra (test and check tools) + setuptools, at the airflow lock's versions"
"$tmp/venv/bin/python" - > "$tmp/test.in" <<'PY'
import tomllib
for req in tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["dev"]:
    print(req)
print("setuptools>=70.1")  # tests/test_package.py builds the wheel with --no-build-isolation
PY
"$uv" pip compile "$tmp/test.in" "${common[@]}" -c locks/airflow.txt "${keep_test[@]}" -o locks/test.txt
sed -i "s|$tmp/test.in|the dev extra of pyproject.toml (scripts/lock.sh)|" locks/test.txt
say "done: $(grep -c '==' locks/runtime.txt) + $(grep -c '==' locks/airflow.txt) + $(grep -c '==' locks/test.txt) pins"

# requirements.lock: the union of both locks' pins without hashes (the Docker images read it).
"$tmp/venv/bin/python" - <<'PY'
import re
from pathlib import Path

pin = re.compile(r"^([A-Za-z0-9_.-]+)==([^ ;\\]+)")
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()  # noqa: E731
old = Path("requirements.lock").read_text().splitlines()
header = [ln for ln in old if ln.startswith("#")]
# keep the spelling the lock has (pip freeze's; the Dockerfiles grep for it)
spelling = {norm(m[1]): m[1] for ln in old if (m := pin.match(ln))}
pins = {}
for lock in ("locks/airflow.txt", "locks/test.txt"):
    for line in Path(lock).read_text().splitlines():
        if m := pin.match(line):
            pins[norm(m[1])] = f"{spelling.get(norm(m[1]), m[1])}=={m[2]}"
body = sorted(pins.values(), key=str.lower)
Path("requirements.lock").write_text("\n".join(header + body) + "\n")
PY
say "requirements.lock: rewritten from locks/airflow.txt + locks/test.txt"
