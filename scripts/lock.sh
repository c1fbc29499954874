#!/usr/bin/env bash
# Regenerate the hashed lock files of locks/ (locks/README.md says what each is for) with
# `uv pip compile --universal --generate-hashes`, using the uv that locks/bootstrap.txt pins.
# uv goes into a throwaway venv, never into .venv.
#
#   bash scripts/lock.sh                 # keep every pinned version (only new requirements resolve)
#   bash scripts/lock.sh --upgrade       # newest versions within pyproject.toml's ranges
#   bash scripts/lock.sh --upgrade-package certifi [--upgrade-package X ...]
#                                        # keep every pin but these (a new requirement needs newer)
#
# Universal locks: one file serves every Python >= 3.11 and platform (markers say which pins
# apply where); scripts/setup.sh installs them with --no-deps, so they must be complete, which
# `uv pip check` after the install proves.
#
# Environment: SPLITKEEPER_PYTHON (interpreter for the throwaway venv; default python3.11/python3).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
say() { printf '[lock] %s\n' "$*"; }

upgrade=()
release=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --upgrade) upgrade=(--upgrade) ;;
        --upgrade-package)
            [[ -n "${2:-}" ]] || { echo "[lock] ERROR: --upgrade-package needs a package name" >&2; exit 2; }
            release+=("$2"); shift ;;
        *) echo "[lock] ERROR: unknown argument '$1'; use --upgrade, --upgrade-package NAME or nothing" >&2; exit 2 ;;
    esac
    shift
done

py="${SPLITKEEPER_PYTHON:-}"
[[ -n "$py" ]] || { if command -v python3.11 >/dev/null 2>&1; then py=python3.11; else py=python3; fi; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$py" -m venv "$tmp/venv"
# the pinned uv of the bootstrap lock (hashes checked), not whatever uv is newest today
"$tmp/venv/bin/python" -m pip install -q --disable-pip-version-check --require-hashes --no-deps \
    -r locks/bootstrap.txt
uv="$tmp/venv/bin/uv"
common=(--no-config --universal --python-version 3.11 --generate-hashes --no-header --quiet "${upgrade[@]}")
# Without --upgrade every version already pinned stays: the previous locks are the constraints.
# --upgrade-package NAME: NAME's pin (its line and its hash lines) is left out of the kept copy.
pins() {
    [[ ${#upgrade[@]} -eq 0 && -f "$1" ]] || return 0
    local kept
    kept="$tmp/keep-$(basename "$1")"
    "$py" "$ROOT/scripts/unpin.py" "$1" "$kept" "${release[@]}"
    printf -- '-c\n%s\n' "$kept"
}
mapfile -t keep_bootstrap < <(pins locks/bootstrap.txt)
mapfile -t keep_runtime < <(pins locks/runtime.txt)
mapfile -t keep_airflow < <(pins locks/airflow.txt)
mapfile -t keep_executor < <(pins locks/executor.txt)
mapfile -t keep_test < <(pins locks/test.txt)

# label FILE TEXT: the "# via" lines name the .in file's role, not a throwaway path.
label() { sed -i "s|$tmp/[a-z]*\.in|$2|" "$1"; }

say "locks/bootstrap.txt: the installer (uv) and the build backend (setuptools)"
printf 'uv\nsetuptools>=70.1\n' > "$tmp/bootstrap.in"
head -n 5 locks/bootstrap.txt | grep '^#' > "$tmp/bootstrap.head" || true
"$uv" pip compile "$tmp/bootstrap.in" "${common[@]}" "${keep_bootstrap[@]}" -o "$tmp/bootstrap.txt"
label "$tmp/bootstrap.txt" "scripts/lock.sh (bootstrap)"
cat "$tmp/bootstrap.head" "$tmp/bootstrap.txt" > locks/bootstrap.txt

say "locks/runtime.txt: splitkeeper[spark,kafka,quality,metrics] + locks/runtime.in"
"$uv" pip compile pyproject.toml locks/runtime.in --extra spark --extra kafka --extra quality --extra metrics \
    "${common[@]}" "${keep_runtime[@]}" -o locks/runtime.txt
say "locks/airflow.txt: splitkeeper[all] + locks/airflow.in, the runtime lock's versions kept"
"$uv" pip compile pyproject.toml locks/airflow.in --extra all \
    "${common[@]}" -c locks/runtime.txt "${keep_airflow[@]}" -o locks/airflow.txt
say "locks/executor.txt: what a Spark executor imports (the Spark image), at the runtime lock's versions"
"$uv" pip compile pyproject.toml locks/executor.in "${common[@]}" -c locks/runtime.txt "${keep_executor[@]}" \
    -o locks/executor.txt
say "locks/test.txt: the dev extra (test and check tools), at the airflow lock's versions"
"$tmp/venv/bin/python" - > "$tmp/test.in" <<'PY'
import tomllib
for req in tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["dev"]:
    print(req)
PY
"$uv" pip compile "$tmp/test.in" "${common[@]}" -c locks/airflow.txt "${keep_test[@]}" -o locks/test.txt
label locks/test.txt "the dev extra of pyproject.toml (scripts/lock.sh)"
sed -i "s|$tmp/keep-|locks/|" locks/*.txt  # a kept copy is named as the lock it came from
say "done: $(grep -c '==' locks/bootstrap.txt) + $(grep -c '==' locks/runtime.txt) + $(grep -c '==' locks/airflow.txt) + $(grep -c '==' locks/executor.txt) + $(grep -c '==' locks/test.txt) pins"
