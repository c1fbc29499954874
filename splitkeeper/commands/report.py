"""``splitkeeper report --config FILE [--title TEXT]``: render the run report (HTML with charts).

Reads the pipeline's Delta state and sink (read-only, no Spark; may run while the
pipeline runs) and writes ``report.html`` into the pipeline's reports folder
(``$SPLITKEEPER_REPORTS_DIR/<name>``, else ``<state>/../reports/<name>``), with the
``pipelines.html`` index beside it. The last line printed is ``report: <path>``.
"""

from __future__ import annotations

import argparse

from splitkeeper.commands.common import add_config_argument, load


def configure(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("--title", default=None, help="page title (default: 'splitkeeper run report: NAME')")


def run(args: argparse.Namespace) -> int:
    from splitkeeper.app import services

    path = services.report(load(args), args.title)
    print(f"report: {path}")
    return 0
