"""``splitkeeper recover --config FILE --checkpoint ID|latest [--parallelism P] [--dry-run]``.

A global restore (optionally a rescale): the enumerator is restored from the
checkpoint, every reader reports its restored splits, each split's recovery
decision is printed, and (unless ``--dry-run``) one epoch runs so that the new
assignment is committed by a checkpoint at the new parallelism. A dry run
writes nothing anywhere.

``recover --mode partial --readers 2,5``: after that restore, readers 2 and 5 restart alone, as a
running job restarts a failed reader (protocol rule 1.3: their splits are added back, they
register again with their regions' last good state); their decisions are printed, and the epochs
checkpoint regionally as usual.

``recover --checkpoint N --rewind [--yes --reason TEXT] [--dry-run]`` goes back to retained
checkpoint N: state, sink, dead letters, filtered offsets and an upsert sink's change table, in
one fenced, audited operator checkpoint (:mod:`splitkeeper.app.incident`). Without ``--yes`` it
prints what would change (per split the offsets read again, per table the rows that leave) and
writes nothing; no Spark either way.

``recover --repair [--dry-run]`` restores nothing: it rebuilds the enumerator_state and
audit rows of kept checkpoints lost or damaged after their commit, from their decision
records (:mod:`splitkeeper.delta.repair`), as a ``[STATE_ERROR]`` about them advises.
"""

from __future__ import annotations

import argparse
import json

from splitkeeper.commands.common import (
    add_config_argument,
    add_fault_argument,
    add_reader_mode_argument,
    load,
    reader_mode,
    restart_check_lines,
)
from splitkeeper.config.limits import check_parallelism


def configure(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("--checkpoint", default="latest", help="checkpoint id or 'latest' (default)")
    parser.add_argument("--parallelism", type=int, default=None, help="new parallelism (a rescale)")
    parser.add_argument(
        "--mode",
        default="auto",
        choices=("auto", "global", "partial"),
        help="global: restore the checkpoint, every reader restarts (at any parallelism); partial: the "
        "same restore, then only the --readers restart from their last good state through the "
        "enumerator's partial failover (protocol rule 1.3; no rescale); auto (default): partial when "
        "--readers is given, else global",
    )
    parser.add_argument(
        "--readers",
        type=_reader_ids,
        default=(),
        metavar="R[,R...]",
        help="the readers to restart with --mode partial, e.g. 2,5 (status shows each reader's load)",
    )
    parser.add_argument("--dry-run", action="store_true", help="only print the recovery plan; write nothing")
    parser.add_argument("--epochs", type=int, default=1, help="epochs to run after the restore (default 1)")
    parser.add_argument(
        "--release",
        action="append",
        default=[],
        metavar="SPLIT",
        help="put a quarantined split back (read again from its position); repeatable",
    )
    parser.add_argument(
        "--repair",
        action="store_true",
        help="rebuild the enumerator_state and audit rows of kept checkpoints that were lost or damaged "
        "after their commit, from their decision records (damaged files are moved to <state>/_damaged/); "
        "restores nothing and runs no epoch; with --dry-run only lists what it would do",
    )
    parser.add_argument(
        "--drop",
        action="append",
        default=[],
        metavar="SPLIT",
        help="forget a split whose file is gone (deleted or moved away): its records so far stay in the "
        "sink, the rest is never read; audited; repeatable",
    )
    parser.add_argument(
        "--rewind",
        action="store_true",
        help="go back to the retained checkpoint --checkpoint N: state, sink, dead letters and change "
        "tables as they were at N (Delta RESTORE), audited; the next run reads on from N's positions. "
        "Prints the plan and writes nothing without --yes; no Spark",
    )
    parser.add_argument("--yes", action="store_true", help="with --rewind: apply it (else only the plan)")
    parser.add_argument("--reason", default="", help="with --rewind --yes: why (kept in the audit trail)")
    add_reader_mode_argument(parser)
    add_fault_argument(parser)
    parser.add_argument("--json", action="store_true", help="print a JSON summary on stdout")


def run(args: argparse.Namespace) -> int:
    from splitkeeper.app import services

    if args.repair:
        return _repair(args)
    if args.rewind:
        return _rewind(args)
    checkpoint = services.checkpoint_id_of(args.checkpoint, "--checkpoint")
    if args.parallelism is not None:
        check_parallelism(args.parallelism, "--parallelism")
    result = services.recover(
        load(args),
        checkpoint_id=checkpoint,
        parallelism=args.parallelism,
        mode=args.mode,
        dry_run=args.dry_run,
        epochs=args.epochs,
        faults=args.fault,
        release=args.release,
        drop=args.drop,
        readers=args.readers,
        reader_mode=reader_mode(args),
    )
    opened = result.opened
    if args.json:
        data = result.to_dict()
        flat = {k: v for k, v in data["opened"].items() if k != "audit"}
        print(json.dumps({**flat, **{k: v for k, v in data.items() if k not in ("opened", "epochs")}}))
        return 0
    was = f" (was {opened.previous_parallelism})" if opened.previous_parallelism else ""
    print(f"restored from checkpoint {opened.restored_from} at parallelism {opened.parallelism}{was}")
    if opened.redone_checkpoint is not None:
        verb = "would be" if result.dry_run else "was"
        print(f"checkpoint {opened.redone_checkpoint} {verb} finished from its sink commit (redo)")
    print(opened.mode)
    for d in opened.audit:
        print(f"  {d.split_id:<40} reader {d.reader!s:<5} {d.decision:<32} {d.detail}")
    for line in result.failovers:
        print(line)
    for d in result.failover_audit:
        print(f"  {d.split_id:<40} reader {d.reader!s:<5} {d.decision:<32} {d.detail}")
    print("per-reader load:", opened.loads)
    for split_id in result.released:
        print(f"released from quarantine: {split_id} (read again from its position)")
    for split_id, position in result.dropped:
        print(f"dropped: {split_id} at position {position} (its file is gone; never read again)")
    for line in restart_check_lines(result.pipeline, result.restart_checks):
        print(line)
    if result.dry_run:
        print("dry run: nothing was written")
    elif result.epochs:
        print(f"checkpoints {result.checkpoints}, {result.committed_records:,} records committed")
    return 0


def _reader_ids(text: str) -> tuple[int, ...]:
    """``--readers 2,5`` as reader ids (argparse reports the InvalidParameterError's message)."""
    from splitkeeper.errors import InvalidParameterError

    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            str(InvalidParameterError("--readers", text, "reader ids separated by commas, e.g. 2,5"))
        ) from None


def _repair(args: argparse.Namespace) -> int:
    from splitkeeper.app import services

    report = services.repair(load(args), dry_run=args.dry_run)
    if args.json:
        print(json.dumps(report.to_dict()))
        return 0
    verb = "would be" if report.dry_run else "was"
    for path in report.moved:
        print(f"damaged: {path} ({verb} moved aside to _damaged/)")
    for cid in report.rewritten:
        print(f"checkpoint {cid}: enumerator_state rows {verb} rewritten from its decision record")
    for cid in report.audit_rewritten:
        print(f"checkpoint {cid}: audit rows {verb} rewritten from its decision record")
    for cid in report.sink_recorded:
        print(f"checkpoint {cid}: the offset reset {verb} recorded in the sink (its sink commit was missing)")
    if report.unchecked:
        print(f"checkpoints {report.unchecked}: their rows are checked once the damaged files are moved")
    if not report.changed:
        print("nothing to repair: every kept checkpoint reads whole")
    elif report.dry_run:
        print("dry run: nothing was written")
    else:
        print("state repaired; run 'splitkeeper validate' or the pipeline as usual")
    return 0


def _rewind(args: argparse.Namespace) -> int:
    from splitkeeper.app import incident, services
    from splitkeeper.errors import InvalidParameterError

    checkpoint = services.checkpoint_id_of(args.checkpoint, "--checkpoint")
    if checkpoint is None:
        raise InvalidParameterError(
            "--checkpoint", args.checkpoint, "the id of an older checkpoint with --rewind (status lists them)"
        )
    result = incident.rewind(load(args), checkpoint, yes=args.yes, dry_run=args.dry_run, reason=args.reason)
    if args.json:
        print(json.dumps(result.to_dict()))
        return 0
    print(result.text())
    return 0
