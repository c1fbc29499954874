"""``splitkeeper stop --config FILE``: end a continuous run on a final global checkpoint.

Records a stop request beside the pipeline's state (a run on any host sees it within a
few seconds) and sends SIGTERM to the run when it holds the pipeline's lease on this host.
The run ends on a final checkpoint that is global, retried until it is, and exits 0.
"""

from __future__ import annotations

import argparse
import json

from splitkeeper.commands.common import add_config_argument, load_to_read


def configure(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("--json", action="store_true", help="print a JSON summary on stdout")


def run(args: argparse.Namespace) -> int:
    from splitkeeper.app import services

    result = services.stop(load_to_read(args))
    if args.json:
        print(json.dumps(result.to_dict()))
        return 0
    if result.running is None:
        print(f"{result.pipeline}: no run holds the pipeline now; the stop request is recorded")
    else:
        how = (
            f"SIGTERM sent to pid {result.signalled_pid}"
            if result.signalled_pid
            else "it will see the request"
        )
        print(f"{result.pipeline}: asked {result.running} to stop on a global checkpoint ({how})")
    return 0
