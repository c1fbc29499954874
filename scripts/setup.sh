#!/usr/bin/env bash
# Install what splitkeeper needs, into the checkout. Idempotent: a second run
# finds the stamps current and returns in seconds.
#
#   bash scripts/setup.sh                 # what the demo needs: python, jars
#   bash scripts/setup.sh --dev           # that, plus what the tests need: devpython, otelcol, browser, compose
#   bash scripts/setup.sh jars            # only some steps: python, jars, devpython, otelcol, browser, compose, cluster
#   bash scripts/setup.sh cluster         # what scripts/cluster.sh needs (not part of the default run)
#   bash scripts/setup.sh versitygw       # only the object store (the real-S3 tests build it so, on demand)
#   bash scripts/setup.sh iceberg-rest    # only Iceberg's REST catalog test server (its tests fetch it so, on demand)
#   bash scripts/setup.sh fake-gcs azurite  # only the GCS / Azure emulators (the gs://, abfss:// tests build them so)
#
# Steps:
#   python    .venv/ (Python >= 3.11, any bundled pip); that pip installs locks/bootstrap.txt only
#             (the pinned installer uv and setuptools, hashed); uv installs locks/airflow.txt (every
#             extra but dev; hashed, --no-deps: exactly the lock), the product editable and its
#             tools (tools/: splitkeeper-tools, the demo, bench, chaos, cluster) editable
#   jars      Maven (jvm/*.xml) -> .jars/spark/ (spark.jars: Delta, Kafka connector)
#                                -> .jars/kafka/ (a runnable Kafka KRaft broker)
# --dev only (scripts/test.sh runs `setup.sh --dev`):
#   devpython uv pip install --require-hashes --no-deps -r locks/test.txt (pytest, ruff, mypy, ...) into .venv/
#   otelcol   the OpenTelemetry Collector of the metrics tests: go build scripts/otelcol (versions
#             pinned in its go.mod/go.sum) -> .tools/otelcol/bin/otelcol; in the background, in
#             parallel with the other steps (about 3 minutes on a cold Go cache)
#   browser   Debian's chromium for browser tests (SPLITKEEPER_BROWSER_TESTS=0 skips)
#   compose   the docker-compose client, for the test of docker-compose.yml
#   cluster   ONLY WHEN ASKED (scripts/cluster.sh, tests/cluster): PostgreSQL (apt-get), the
#             object store versitygw (go install, pinned in scripts/versitygw.version)
#             -> .tools/versitygw/bin/, and Maven (jvm/s3a.xml) -> .jars/s3a/ (S3A for Spark)
#   versitygw ONLY WHEN ASKED: the object store alone (the versitygw of cluster); the tests' fixture
#             `versitygw` (tests/conftest.py) runs it when the binary is missing
#   iceberg-rest ONLY WHEN ASKED: Maven (jvm/iceberg-rest.xml) -> .jars/iceberg-rest/ (Iceberg's REST
#             catalog test server); the tests' fixture `iceberg_rest` runs it when the jars are missing
#   fake-gcs  ONLY WHEN ASKED: the Google Cloud Storage emulator fake-gcs-server (go install, pinned in
#             scripts/fake-gcs-server.version) -> .tools/fake-gcs-server/bin/; the tests' fixture
#             `fake_gcs` (tests/conftest.py) runs it when the binary is missing
#   azurite   ONLY WHEN ASKED: the Azure Storage emulator Azurite (npm ci of scripts/azurite/package.json
#             and its package-lock.json, Node >= 20) -> .tools/azurite/; the tests' fixture `azurite`
#             runs it when it is missing
#
# Environment:
#   SPLITKEEPER_PYTHON       interpreter that creates .venv (default: python3.11, else python3)
#   SPLITKEEPER_JARS_DIR     jars root (default: <repo>/.jars)
#   SPLITKEEPER_MAVEN_REPO   Maven repository URL (default: Maven Central)
#   SPLITKEEPER_BROWSER_TESTS  0 = do not install chromium
#   SPLITKEEPER_TOOLS_DIR    root of built tools (default: <repo>/.tools)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

VENV="$ROOT/.venv"
JARS_DIR="${SPLITKEEPER_JARS_DIR:-$ROOT/.jars}"
TOOLS_DIR="${SPLITKEEPER_TOOLS_DIR:-$ROOT/.tools}"
export SPLITKEEPER_MAVEN_REPO="${SPLITKEEPER_MAVEN_REPO:-https://repo.maven.apache.org/maven2}"
# uv trusts the platform's certificate store, as the venv's pip does (truststore): a machine whose
# registries are reached through a TLS-inspecting proxy, its CA in the system store but no
# SSL_CERT_FILE exported, installs as pip would (uv's own bundled roots refuse it: UnknownIssuer).
export UV_SYSTEM_CERTS="${UV_SYSTEM_CERTS:-1}"
T0=$SECONDS

say() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }

# sha256 of the given files' contents (the stamps' key: when an input changes, the step reruns).
digest() { cat "$@" | sha256sum | cut -d' ' -f1; }

# The pinned installer: the venv's bundled pip (any version) installs only locks/bootstrap.txt
# (uv and setuptools, hashed, no dependencies); uv installs every other lock.
UV="$VENV/bin/uv"
bootstrap() {
    local stamp="$VENV/.splitkeeper-bootstrap.stamp" want log="$VENV/.splitkeeper-pip.log"
    want="$(digest locks/bootstrap.txt)"
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" && -x "$UV" ]]; then
        return
    fi
    say "installer: pip install --require-hashes --no-deps -r locks/bootstrap.txt (uv, setuptools)"
    PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/python" -m pip install --require-hashes --no-deps \
        -r locks/bootstrap.txt > "$log" 2>&1 \
        || { tail -n 40 "$log" >&2; die "pip install -r locks/bootstrap.txt failed (full log: $log)"; }
    "$UV" --version >/dev/null 2>&1 || die "the pinned installer $UV does not run"
    echo "$want" > "$stamp"
}

# uv_install LOCK: exactly the lock's pins (hashes checked, no resolution: nothing released after
# the lock can change what lands), into .venv. --no-config: no uv.toml of the user's applies.
uv_install() {
    local lock="$1" log="$VENV/.splitkeeper-pip.log"
    "$UV" pip install --no-config --python "$VENV/bin/python" --require-hashes --no-deps \
        -r "$lock" >> "$log" 2>&1 \
        || { tail -n 40 "$log" >&2; die "uv pip install -r $lock failed (full log: $log)"; }
}

# Every requirement of what is installed is met (the locks are complete; this proves it).
uv_check() {
    "$UV" pip check --no-config --python "$VENV/bin/python" >/dev/null 2>&1 \
        || { "$UV" pip check --no-config --python "$VENV/bin/python" >&2; die "pip check found broken requirements"; }
}

step_python() {
    if [[ ! -x "$VENV/bin/python" ]]; then
        local py="${SPLITKEEPER_PYTHON:-}"
        if [[ -z "$py" ]]; then
            if command -v python3.11 >/dev/null 2>&1; then py=python3.11; else py=python3; fi
        fi
        command -v "$py" >/dev/null 2>&1 || die "no $py found; install Python 3.11 (apt-get install -y python3 python3-venv)"
        "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
            || die "$py is $("$py" -V 2>&1); splitkeeper needs Python >= 3.11 (set SPLITKEEPER_PYTHON)"
        say "creating $VENV with $("$py" -V 2>&1)"
        "$py" -m venv "$VENV" || die "python venv failed; on Debian: apt-get install -y python3-venv"
    fi
    bootstrap
    local stamp="$VENV/.splitkeeper-python.stamp" want
    want="$(digest locks/bootstrap.txt locks/airflow.txt pyproject.toml tools/pyproject.toml)"
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
        say "python packages: up to date ($VENV)"
        return
    fi
    local log="$VENV/.splitkeeper-pip.log"
    say "python packages: uv pip install --require-hashes --no-deps -r locks/airflow.txt (log $log)"
    uv_install locks/airflow.txt
    say "python packages: uv pip install --no-deps --no-build-isolation -e . -e tools (the product, its tools)"
    "$UV" pip install --no-config --python "$VENV/bin/python" --no-deps --no-build-isolation -e . -e tools \
        >> "$log" 2>&1 || { tail -n 40 "$log" >&2; die "uv pip install -e . -e tools failed (full log: $log)"; }
    uv_check
    echo "$want" > "$stamp"
}

# --dev: the test and check tools (locks/test.txt: the dev extra at the versions of locks/airflow.txt).
step_devpython() {
    [[ -x "$VENV/bin/python" ]] || step_python
    bootstrap
    local stamp="$VENV/.splitkeeper-devpython.stamp" want log="$VENV/.splitkeeper-pip.log"
    want="$(digest locks/bootstrap.txt locks/test.txt locks/airflow.txt)"
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
        say "devpython: up to date ($VENV)"
        return
    fi
    say "devpython: uv pip install --require-hashes --no-deps -r locks/test.txt (log $log)"
    uv_install locks/test.txt
    uv_check
    echo "$want" > "$stamp"
}

# fetch_jars GROUP POM [MAVEN ARGS...]: copy POM's runtime dependencies into $JARS_DIR/GROUP with Maven.
fetch_jars() {
    local group="$1" pom="$2"
    shift 2
    local extra=("$@")
    local out="$JARS_DIR/$group" stamp="$JARS_DIR/.$group.stamp" want
    want="$(digest "$pom" jvm/settings.xml <(echo "${extra[*]}"))"
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] && compgen -G "$out/*.jar" >/dev/null; then
        say "jars/$group: up to date ($(ls "$out" | wc -l) jars in $out)"
        return
    fi
    command -v mvn >/dev/null 2>&1 || die "Maven (mvn) not found; install it: apt-get install -y maven"
    local tmp="$out.partial"
    rm -rf "$tmp"
    mkdir -p "$JARS_DIR"
    local mvn_args=(-q -B -Dstyle.color=never -s jvm/settings.xml -f "$pom"
                    dependency:copy-dependencies "-Dsplitkeeper.jars.out=$tmp" "${extra[@]}")
    # Offline first when the local Maven repository already holds the artifacts
    # (a warm ~/.m2); fall back to the network otherwise.
    say "jars/$group: mvn copy-dependencies from $pom"
    if ! mvn --offline "${mvn_args[@]}" >/dev/null 2>&1; then
        rm -rf "$tmp"
        say "jars/$group: downloading from $SPLITKEEPER_MAVEN_REPO"
        local log="$JARS_DIR/.mvn-$group.log"
        mvn "${mvn_args[@]}" > "$log" 2>&1 || {
            tail -n 30 "$log" >&2
            die "Maven could not fetch the $group jars (log: $log; network? set SPLITKEEPER_MAVEN_REPO to a reachable mirror)"
        }
    fi
    compgen -G "$tmp/*.jar" >/dev/null || die "Maven copied no jar for $group into $tmp"
    rm -rf "$out"
    mv "$tmp" "$out"
    echo "$want" > "$stamp"
    say "jars/$group: $(ls "$out" | wc -l) jars in $out"
}

# jvm/localfs/src -> $JARS_DIR/localfs/splitkeeper-localfs.jar, compiled against pyspark's
# own Hadoop (no Maven plugins to fetch). Optional: without javac, local Delta commits
# fork a chmod/readlink process per file operation and run slower; nothing else changes.
build_localfs() {
    local out="$JARS_DIR/localfs" stamp="$JARS_DIR/.localfs.stamp" want pyjars sources
    if [[ ! -x "$VENV/bin/python" ]]; then
        say "jars/localfs: skipped (no $VENV yet; run the python step first)"
        return
    fi
    pyjars="$("$VENV/bin/python" -c 'from splitkeeper.spark.jars import pyspark_jars_dir; print(pyspark_jars_dir())')"
    mapfile -t sources < <(find jvm/localfs/src -name '*.java' | sort)
    want="$(digest "${sources[@]}" <(ls "$pyjars"))"
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" && -f "$out/splitkeeper-localfs.jar" ]]; then
        say "jars/localfs: up to date ($out/splitkeeper-localfs.jar)"
        return
    fi
    if ! command -v javac >/dev/null 2>&1 || ! command -v jar >/dev/null 2>&1; then
        apt_optional jars/localfs openjdk-17-jdk-headless javac  # a JRE-only machine: add the JDK
    fi
    if ! command -v javac >/dev/null 2>&1 || ! command -v jar >/dev/null 2>&1; then
        say "jars/localfs: javac/jar not found (install a JDK: apt-get install -y openjdk-17-jdk-headless); local Delta commits will be slower"
        return
    fi
    local tmp="$out.partial"
    rm -rf "$tmp"
    mkdir -p "$tmp/classes"
    javac -nowarn --release 17 -d "$tmp/classes" -cp "$pyjars/*" "${sources[@]}" \
        || die "javac could not compile jvm/localfs/src against $pyjars"
    jar cf "$tmp/splitkeeper-localfs.jar" -C "$tmp/classes" .
    rm -rf "$tmp/classes" "$out"
    mv "$tmp" "$out"
    echo "$want" > "$stamp"
    say "jars/localfs: built $out/splitkeeper-localfs.jar"
}

step_jars() {
    if ! command -v java >/dev/null 2>&1; then
        die "Java not found; install a JDK >= 17: apt-get install -y openjdk-17-jdk-headless"
    fi
    # The Spark jars follow the installed pyspark (the Kafka connector is built per Spark release).
    local spark_version=""
    if [[ -x "$VENV/bin/python" ]]; then
        spark_version="$("$VENV/bin/python" -c 'from importlib.metadata import version; print(version("pyspark"))' 2>/dev/null || true)"
    fi
    fetch_jars spark jvm/pom.xml ${spark_version:+"-Dspark.version=$spark_version"}
    fetch_jars kafka jvm/kafka-broker.xml
    build_localfs
    # One rule, in Python: no jar of .jars/spark duplicates one pyspark ships.
    if [[ -x "$VENV/bin/python" ]]; then
        "$VENV/bin/python" -m splitkeeper.spark.jars --root "$JARS_DIR" \
            || die "the Spark jars do not fit this pyspark (see above)"
    fi
}

# ---------------------------------------------------------------------------------
# --dev STEP: chromium for browser tests (pytest -m browser).
# Runs unless SPLITKEEPER_BROWSER_TESTS=0. Never fails the setup: without apt-get or
# root it only prints what to do.
# ---------------------------------------------------------------------------------
# apt_optional NAME PACKAGE COMMAND...: make one of COMMAND... available by installing the
# Debian PACKAGE when none is on PATH. Never fails the setup: without apt-get or root it
# only prints what to do.
apt_optional() {
    local name="$1" package="$2" found=""
    shift 2
    for cmd in "$@"; do
        found="$(command -v "$cmd" || true)"
        [[ -n "$found" ]] && break
    done
    if [[ -n "$found" ]]; then
        say "$name: $package found at $found"
        return
    fi
    if ! command -v apt-get >/dev/null 2>&1 || [[ "$(id -u)" != "0" ]]; then
        say "$name: $package missing; install it with 'sudo apt-get install -y $package'"
        return
    fi
    say "$name: apt-get install -y $package"
    if ! { DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$package" >/dev/null 2>&1 \
           || { apt-get update -q >/dev/null 2>&1 \
                && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$package" >/dev/null 2>&1; }; }; then
        say "$name: could not install $package with apt-get; install it by hand ('apt-get install -y $package')"
        return
    fi
    say "$name: $package installed"
}

step_browser() {
    if [[ "${SPLITKEEPER_BROWSER_TESTS:-1}" == "0" ]]; then
        say "browser: skipped (SPLITKEEPER_BROWSER_TESTS=0)"
        return
    fi
    apt_optional browser chromium chromium chromium-browser
}

# --dev STEP: docker-compose (the client only; no engine runs here) so the test of
# docker-compose.yml can run `docker-compose config -q` on a fresh machine.
step_compose() {
    if docker compose version >/dev/null 2>&1; then
        say "compose: docker compose plugin found"
        return
    fi
    apt_optional compose docker-compose docker-compose
}

# ---------------------------------------------------------------------------------
# STEP ON REQUEST: what scripts/cluster.sh starts (a Spark standalone cluster, PostgreSQL,
# Airflow on PostgreSQL, an S3-compatible object store, Kafka), beyond the default steps.
# Not in the default run: `bash scripts/setup.sh cluster` (tests/cluster asks for it).
# ---------------------------------------------------------------------------------

# The folder holding PostgreSQL's server programs (initdb, pg_ctl, postgres, pg_isready).
postgres_bin() {
    local dir
    if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1 && command -v pg_isready >/dev/null 2>&1; then
        dirname "$(command -v initdb)"
        return
    fi
    # Debian keeps the server programs out of PATH, one folder per major version: the newest.
    for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        [[ -x "$dir/initdb" && -x "$dir/pg_ctl" && -x "$dir/pg_isready" ]] && { echo "$dir"; return; }
    done
    return 1
}

cluster_postgres() {
    local bin
    if bin="$(postgres_bin)"; then
        say "cluster/postgres: $("$bin/postgres" --version 2>/dev/null || echo postgres) in $bin"
        return
    fi
    [[ "$(id -u)" == "0" ]] && command -v apt-get >/dev/null 2>&1 \
        || die "PostgreSQL server programs (initdb, pg_ctl) not found; install them: sudo apt-get install -y postgresql"
    say "cluster/postgres: apt-get install -y postgresql"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null 2>&1 \
             && DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >/dev/null 2>&1; } \
        || die "apt-get install -y postgresql failed"
    bin="$(postgres_bin)" || die "postgresql installed, but no initdb/pg_ctl/pg_isready found under /usr/lib/postgresql"
    say "cluster/postgres: installed ($bin)"
}

# go install one Go program at the version pinned in scripts/<name>.version into
# $TOOLS_DIR/<name>/bin (static, stripped), again only when the pin or Go's version changed:
#   go_install_tool LABEL NAME MIN_GO CHECK_ARG WHAT
# CHECK_ARG: an argument the built binary must answer with exit 0 (--version, -help).
go_install_tool() {
    local label="$1" name="$2" need="$3" check="$4" what="$5"
    local spec out="$TOOLS_DIR/$name" stamp="$TOOLS_DIR/.$name.stamp" want gov
    spec="$(grep -v '^#' "scripts/$name.version" | grep -m1 .)"
    command -v go >/dev/null 2>&1 || die "Go not found: $what ($name) is built with 'go install'; install Go >= $need"
    gov="$(go env GOVERSION)"
    want="$(echo "$spec $gov" | sha256sum | cut -d' ' -f1)"
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" && -x "$out/bin/$name" ]]; then
        say "$label: up to date ($out/bin/$name)"
        return
    fi
    if [[ "$(printf '%s\n%s\n' "$need" "${gov#go}" | sort -V | head -n1)" != "$need" ]]; then
        die "$gov is too old to build $name (needs go >= $need)"
    fi
    local tmp="$out.partial" log="$TOOLS_DIR/.go-$name.log" t0=$SECONDS
    rm -rf "$tmp"
    mkdir -p "$tmp/bin"
    say "$label: go install $spec (a few minutes the first time; log $log)"
    # Static, stripped; GOTOOLCHAIN=local: never fetch another Go toolchain.
    GOBIN="$tmp/bin" CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-buildvcs=false \
        go install -trimpath -ldflags='-s -w' "$spec" > "$log" 2>&1 \
        || { tail -n 30 "$log" >&2; die "go install $spec failed (log: $log)"; }
    "$tmp/bin/$name" "$check" >/dev/null 2>&1 || die "the built $name does not run"
    rm -rf "$out"
    mv "$tmp" "$out"
    echo "$want" > "$stamp"
    say "$label: built in $((SECONDS - t0))s, $(du -h "$out/bin/$name" | cut -f1) ($out/bin/$name)"
}

# go install the object store at the version pinned in scripts/versitygw.version (its go.mod: Go >= 1.25).
cluster_object_store() {
    go_install_tool cluster/versitygw versitygw 1.25 --version "the object store"
}

# go install the GCS emulator at the version pinned in scripts/fake-gcs-server.version (its go.mod: Go >= 1.26).
step_fake_gcs() {
    go_install_tool fake-gcs fake-gcs-server 1.26 -help "the GCS emulator"
}

# npm ci the Azure Storage emulator: exactly scripts/azurite/package-lock.json (integrity-checked,
# no install scripts) -> $TOOLS_DIR/azurite/node_modules/.bin/azurite-blob.
step_azurite() {
    local out="$TOOLS_DIR/azurite" stamp="$TOOLS_DIR/.azurite.stamp" want nodev
    command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 \
        || die "Node.js and npm not found: the Azure emulator (Azurite) is installed with 'npm ci'; install Node >= 20 (apt-get install -y nodejs npm)"
    nodev="$(node --version)"
    [[ "${nodev#v}" =~ ^([0-9]+) ]] && (( BASH_REMATCH[1] >= 20 )) || die "node $nodev is too old for Azurite (needs >= 20)"
    want="$(digest scripts/azurite/package.json scripts/azurite/package-lock.json <(echo "$nodev"))"
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" && -x "$out/node_modules/.bin/azurite-blob" ]]; then
        say "azurite: up to date ($out/node_modules/.bin/azurite-blob)"
        return
    fi
    local tmp="$out.partial" log="$TOOLS_DIR/.npm-azurite.log" t0=$SECONDS
    rm -rf "$tmp"
    mkdir -p "$tmp"
    cp scripts/azurite/package.json scripts/azurite/package-lock.json "$tmp/"
    say "azurite: npm ci (scripts/azurite/package-lock.json; log $log)"
    (cd "$tmp" && npm ci --omit=dev --ignore-scripts --no-audit --no-fund) > "$log" 2>&1 \
        || { tail -n 30 "$log" >&2; die "npm ci of scripts/azurite failed (log: $log; network? set npm's registry to a reachable mirror)"; }
    node "$tmp/node_modules/.bin/azurite-blob" --version >/dev/null 2>&1 || die "the installed Azurite does not run"
    rm -rf "$out"
    mv "$tmp" "$out"
    echo "$want" > "$stamp"
    say "azurite: installed in $((SECONDS - t0))s, $(du -sh "$out" | cut -f1) ($out/node_modules/.bin/azurite-blob)"
}

# go build scripts/otelcol (a minimal OpenTelemetry Collector: OTLP receiver, Prometheus exporter;
# versions pinned in scripts/otelcol/go.mod and go.sum) -> $TOOLS_DIR/otelcol/bin/otelcol.
step_otelcol() {
    local out="$TOOLS_DIR/otelcol" stamp="$TOOLS_DIR/.otelcol.stamp" want gov version
    command -v go >/dev/null 2>&1 || die "Go not found: the metrics tests' collector (scripts/otelcol) is built with 'go build'; install Go >= 1.26"
    gov="$(go env GOVERSION)"
    want="$(digest scripts/otelcol/main.go scripts/otelcol/go.mod scripts/otelcol/go.sum <(echo "$gov"))"
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" && -x "$out/bin/otelcol" ]]; then
        say "otelcol: up to date ($out/bin/otelcol)"
        return
    fi
    version="$(sed -n 's|^[[:space:]]*go.opentelemetry.io/collector/otelcol \(v[^ ]*\).*|\1|p' scripts/otelcol/go.mod)"
    local tmp="$out.partial" log="$TOOLS_DIR/.go-otelcol.log" t0=$SECONDS
    rm -rf "$tmp"
    mkdir -p "$tmp/bin"
    say "otelcol: go build scripts/otelcol (collector $version; in the background, a few minutes the first time; log $log)"
    # Static, stripped; GOTOOLCHAIN=local: never fetch another Go toolchain; go.sum must match.
    (cd scripts/otelcol && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-buildvcs=false -mod=readonly" \
        go build -trimpath -ldflags="-s -w -X main.version=$version" -o "$tmp/bin/otelcol" .) > "$log" 2>&1 \
        || { tail -n 30 "$log" >&2; die "go build scripts/otelcol failed (log: $log)"; }
    "$tmp/bin/otelcol" --version >/dev/null 2>&1 || die "the built collector does not run"
    rm -rf "$out"
    mv "$tmp" "$out"
    echo "$want" > "$stamp"
    say "otelcol: built in $((SECONDS - t0))s, $(du -h "$out/bin/otelcol" | cut -f1) ($out/bin/otelcol)"
}

step_cluster() {
    command -v java >/dev/null 2>&1 || die "Java not found; install a JDK >= 17: apt-get install -y openjdk-17-jdk-headless"
    cluster_postgres
    cluster_object_store
    fetch_jars s3a jvm/s3a.xml
    if [[ -x "$VENV/bin/python" ]]; then
        "$VENV/bin/python" -m splitkeeper.spark.jars --root "$JARS_DIR" \
            || die "the S3A jars do not fit this pyspark (see above)"
    fi
}

# The demo's steps by default; --dev adds what the tests need (scripts/test.sh).
steps=()
for arg in "$@"; do
    case "$arg" in
        --dev) steps+=(otelcol python jars devpython browser compose) ;;  # otelcol first: it builds in the background
        *) steps+=("$arg") ;;
    esac
done
[[ ${#steps[@]} -gt 0 ]] || steps=(python jars)
otelcol_pid=""
for step in "${steps[@]}"; do
    case "$step" in
        otelcol) mkdir -p "$TOOLS_DIR"; step_otelcol & otelcol_pid=$! ;;  # in parallel with the rest
        python) step_python ;;
        jars) step_jars ;;
        devpython) step_devpython ;;
        browser) step_browser ;;
        compose) step_compose ;;
        cluster) step_cluster ;;
        versitygw) mkdir -p "$TOOLS_DIR"; cluster_object_store ;;
        fake-gcs) mkdir -p "$TOOLS_DIR"; step_fake_gcs ;;
        azurite) mkdir -p "$TOOLS_DIR"; step_azurite ;;
        iceberg-rest)
            command -v java >/dev/null 2>&1 || die "Java not found; install a JDK >= 17: apt-get install -y openjdk-17-jdk-headless"
            fetch_jars iceberg-rest jvm/iceberg-rest.xml ;;
        *) die "unknown step '$step'; choose from: --dev python jars devpython otelcol browser compose cluster versitygw iceberg-rest fake-gcs azurite" ;;
    esac
done
if [[ -n "$otelcol_pid" ]]; then
    wait "$otelcol_pid" || die "the otelcol step failed (see above)"
fi
say "done in $((SECONDS - T0))s (steps: ${steps[*]})"
