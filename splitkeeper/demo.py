"""The main job (``bash scripts/run.sh``): the embedded default, end to end, as a user would run it.

1. a fresh workspace: sample files, a pipeline config, an Airflow home on SQLite;
2. the ``splitkeeper_ingest`` DAG runs a few cycles (real DAG runs on local Spark
   and local Delta); new files arrive between cycles; in the second cycle a
   region fails (an injected fault) and the checkpoint completes regionally;
3. the ``splitkeeper_recover`` DAG is triggered by hand with a new parallelism
   (a rescale from a regional checkpoint), printing every recovery decision;
4. a last ingest cycle reads the source to its end (a global checkpoint);
5. the restart checks (Great Expectations) and the run report.

The last line printed is ``report: <path>``.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _say(text: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {text}", flush=True)


def _make_files(target: Path, files: int, lines: int, first: int) -> None:
    subprocess.run(
        [
            sys.executable,
            str(REPO / "examples" / "make_files.py"),
            str(target),
            "--files",
            str(files),
            "--lines",
            str(lines),
            "--format",
            "jsonl",
            "--first-file",
            str(first),
            "--seed",
            str(first + 7),
        ],
        check=True,
        capture_output=True,
    )


def _config(workspace: Path) -> Path:
    path = workspace / "pipeline.yaml"
    path.write_text(
        """\
# The demo pipeline: JSON-lines files ingested by 3 independent regions into a Delta table.
name: demo-orders
parallelism: 3
regions: per_reader
strategy: least-loaded
source:
  kind: files
  path: incoming
  format: jsonl
  split_bytes: 262144
checkpoint:
  max_consecutive_failures: 2
  max_failure_ratio: 0.5
  region_timeout_s: 60
backlog:
  backlog_epoch_records: 6000
  normal_epoch_records: 6000
state:
  path: state
sink:
  path: sink
transform: splitkeeper.runtime.transforms:enrich_json
""",
        encoding="utf-8",
    )
    return path


def _prepare_airflow(workspace: Path) -> None:
    home = workspace / "airflow"
    os.environ["AIRFLOW_HOME"] = str(home)
    os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
    os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(REPO / "dags")
    airflow = Path(sys.executable).with_name("airflow")
    done = subprocess.run([str(airflow), "db", "migrate"], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"airflow db migrate failed:\n{done.stderr[-3000:]}")


def _dag(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / "dags" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dag


def _run_dag(name: str, conf: dict) -> None:
    _say(f"DAG run {name} {conf}")
    run = _dag(name).test(run_conf=conf)
    _say(f"DAG run {name}: {run.state}")
    if run.state != "success":
        raise SystemExit(f"{name} ended {run.state}; see the task logs above")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="splitkeeper-demo", description=__doc__.splitlines()[0])
    parser.add_argument("--workspace", default=str(REPO / "var" / "demo"), help="demo workspace (recreated)")
    parser.add_argument("--lines", type=int, default=3000, help="lines per input file")
    args = parser.parse_args(argv)

    workspace = Path(args.workspace).resolve()
    shutil.rmtree(workspace, ignore_errors=True)
    (workspace / "incoming").mkdir(parents=True)
    config = _config(workspace)
    os.environ["SPLITKEEPER_PIPELINE_CONFIG"] = str(config)
    os.environ["SPLITKEEPER_REPORTS_DIR"] = str(workspace / "reports")
    _say(f"workspace {workspace}")
    _make_files(workspace / "incoming", files=4, lines=args.lines, first=0)
    _prepare_airflow(workspace)

    from splitkeeper.orchestration import tasks

    _run_dag("splitkeeper_ingest", {"epochs": 2})
    _make_files(workspace / "incoming", files=2, lines=args.lines, first=4)  # a new file drop
    next_epoch = tasks.next_epoch(str(config))
    _say(f"injecting a failure of region 1 at epoch {next_epoch}")
    _run_dag("splitkeeper_ingest", {"epochs": 2, "faults": [f"fail:1@{next_epoch}"]})
    _run_dag("splitkeeper_recover", {"checkpoint_id": "latest", "mode": "global", "parallelism": 4})
    _run_dag("splitkeeper_ingest", {"epochs": 50})
    path = tasks.report(str(config), title="splitkeeper demo: ingest, region failure, recovery and rescale")
    # py4j logs "Closing down clientserver connection" at interpreter exit (through Airflow's
    # log handler, on stdout): keep it quiet so that the report line stays the last one.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    print(f"report: {path}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
