"""``splitkeeper jars fetch``: download the Spark jars an installed splitkeeper needs.

From a wheel there is no checkout and no Maven: the coordinates and SHA-256 checksums of the
jars (Delta, the Spark Kafka connector and their runtime dependencies) ship inside the package
(:mod:`splitkeeper.spark.fetch`). The jars go to ``$SPLITKEEPER_JARS_DIR/spark/`` when that is
set, else to ``~/.cache/splitkeeper/jars/<spark version>/spark/``, where ``run`` finds them from
any directory. Run it again at any time: a jar already there with its checksum stays.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    fetch = sub.add_parser(
        "fetch",
        help="download the Spark jars (checksums verified) into the jars folder",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    fetch.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="jars root (default: $SPLITKEEPER_JARS_DIR, else ~/.cache/splitkeeper/jars/<spark version>)",
    )
    fetch.add_argument(
        "--repo",
        default=None,
        help="Maven repository URL (default: $SPLITKEEPER_MAVEN_REPO, else Maven Central; or file://)",
    )
    fetch.add_argument(
        "--json", action="store_true", help="print a JSON summary on stdout (progress on stderr)"
    )


def run(args: argparse.Namespace) -> int:
    from splitkeeper.spark import fetch as fetchlib
    from splitkeeper.spark.jars import JARS_DIR_ENV

    root = args.dir
    if root is None:
        override = os.environ.get(JARS_DIR_ENV, "").strip()
        root = Path(override) if override else fetchlib.user_cache_root()
    repo = args.repo or os.environ.get(fetchlib.MAVEN_REPO_ENV, "").strip() or fetchlib.MAVEN_CENTRAL
    out = sys.stderr if args.json else sys.stdout

    def say(line: str) -> None:
        print(line, file=out, flush=True)

    result = fetchlib.fetch(Path(root).expanduser().resolve(), repo=repo, say=say)
    if args.json:
        print(json.dumps(result.to_dict()))
    return 0
