"""``splitkeeper validate --config FILE [--checkpoint ID] [--content] [--skip-validated] [--json]``.

The restart checks: runs the Great Expectations suites (``expectations/``, protocol section 6) on a
checkpoint's Delta state and the sink; exits 1 naming the offending split ids when
any fails. ``--content`` also compares each finished file split's committed values
with the file (count and hash; meaningful while the pipeline has only ever used the
identity transform). For an upsert sink (``sink.mode: upsert``) the records accounted are the
change table's and the ``upsert_fold`` suite runs too (on Spark): its verdict (keys, offenders,
the first differing keys) is printed as a note. A Spark transform's filtered ranges count as
accounted offsets. A passing run on the latest checkpoint is recorded in the validations table;
``--skip-validated`` names that run instead of checking again when nothing the checks read changed.
"""

from __future__ import annotations

import argparse
import json

from splitkeeper.commands.common import add_config_argument, add_reader_mode_argument, load, reader_mode
from splitkeeper.errors import InvariantViolation


def configure(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("--checkpoint", type=int, default=None, help="checkpoint id (default: latest)")
    parser.add_argument(
        "--content",
        action="store_true",
        help="also compare each finished file's committed lines (count and hash) with the file "
        "(for pipelines that never had a transform)",
    )
    parser.add_argument(
        "--skip-validated",
        action="store_true",
        help="when the latest checkpoint passed already and nothing the checks read changed since, "
        "name that run instead of running the checks again (no Spark; what the DAGs' validate task does)",
    )
    add_reader_mode_argument(parser)
    parser.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    from splitkeeper.app import services

    try:
        result = services.validate(
            load(args),
            args.checkpoint,
            content=args.content,
            skip_validated=args.skip_validated,
            reader_mode=reader_mode(args),
        )
    except InvariantViolation as err:
        if args.json:
            print(
                json.dumps({"success": False, "error": str(err), "split_ids": list(err.params["split_ids"])})
            )
        else:
            print(f"splitkeeper validate: {err}")
        return 1
    if args.json:
        print(json.dumps(result.to_dict()))
        return 0
    if result.already_validated_at is not None:
        print(f"restart checks of checkpoint {result.checkpoint_id} passed already: {result.suites}")
    else:
        print(f"restart checks passed: {result.suites}")
    for note in result.notes:
        print(f"  note: {note}")
    return 0
