"""``splitkeeper config schema [--out FILE]``: the JSON Schema of the pipeline file.

1. The schema is generated from the pydantic models that validate every pipeline file
   (:mod:`splitkeeper.config.models`); it is never written by hand, so it cannot
   drift from what :func:`~splitkeeper.config.settings.load_config` accepts.
2. Without ``--out`` it is printed to stdout (JSON, indented); with ``--out`` it is written
   to that file (its directory must exist) and the path is printed.
3. Checking a pipeline file is ``splitkeeper status --config FILE`` or any command taking
   ``--config``: they all validate it first (``validate`` is the restart checks, not this).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from splitkeeper.errors import ConfigError


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    schema = sub.add_parser("schema", help="print the JSON Schema of the pipeline file")
    schema.add_argument("--out", default=None, metavar="FILE", help="write it to FILE instead of stdout")


def run(args: argparse.Namespace) -> int:
    from splitkeeper.config.models import json_schema

    text = json.dumps(json_schema(), indent=2, sort_keys=False) + "\n"
    if args.out is None:
        print(text, end="")
        return 0
    out = Path(args.out).expanduser()
    try:
        out.write_text(text, encoding="utf-8")
    except OSError as err:
        raise ConfigError(
            f"--out {str(out)!r} cannot be written: {err}", key="--out", value=str(out)
        ) from err
    print(f"JSON Schema of the pipeline file written to {out}")
    return 0
