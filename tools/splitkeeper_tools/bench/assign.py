"""``splitkeeper-tools bench assign``: split assignment at scale, through the real enumerator.

Steps (each timed with ``time.perf_counter``):

1. discovery: the source's N splits enter the enumerator's pool;
2. full assignment: the last of R readers registers, which triggers the
   first round: every split placed by the strategy through the context;
3. checkpoint 1 (snapshot, tracker bookkeeping);
4. restart: reader 0 fails and comes back with its checkpointed splits
   (partial failover); with a sticky balanced strategy nothing moves;
5. failover: reader R/2 is lost for good; only its splits move, to the others
   (``failover_moved`` counts splits whose owner changed; with ``legacy-hash``
   they wait in the pool for their fixed owner: ``unassigned_after_failover``).

Targets on the 2-core reference machine: full assignment < 1 s, failover < 50 ms
(wall clock; process CPU time is reported beside it, since a busy shared machine
inflates wall time but not the work done).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from splitkeeper.core.assignment import STRATEGIES
from splitkeeper.core.enumerator import (
    RecordingEnumeratorContext,
    enumerator_for,
    fail_reader,
    restart_reader,
)
from splitkeeper.core.invariants import count_spread
from splitkeeper.core.source import ReassignableStaticSplitSource
from splitkeeper.core.types import Split
from splitkeeper.errors import InvalidParameterError

TARGET_FULL_ASSIGNMENT_S = 1.0
TARGET_FAILOVER_S = 0.05
PARTITIONS_PER_TOPIC = 1000


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--splits", type=int, default=1_000_000, help="number of splits (default 1,000,000)")
    parser.add_argument("--readers", type=int, default=10_000, help="number of readers (default 10,000)")
    parser.add_argument(
        "--strategy",
        default="round-robin",
        help=f"assignment strategy: one of {', '.join(sorted(STRATEGIES))} (default round-robin)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def make_splits(n: int) -> list[Split]:
    """``n`` unbounded Kafka-style splits: topics of 1,000 partitions, ids ``tNNNNN-P``."""
    return [
        Split(
            f"t{i // PARTITIONS_PER_TOPIC:05d}-{i % PARTITIONS_PER_TOPIC}",
            f"t{i // PARTITIONS_PER_TOPIC:05d}",
        )
        for i in range(n)
    ]


def bench_assign(n_splits: int, n_readers: int, strategy: str = "round-robin") -> dict[str, Any]:
    """Run the benchmark and return its figures (see module doc)."""
    if isinstance(n_splits, bool) or not isinstance(n_splits, int) or n_splits < 1:
        raise InvalidParameterError("splits", n_splits, "an integer >= 1")
    if isinstance(n_readers, bool) or not isinstance(n_readers, int) or n_readers < 2:
        raise InvalidParameterError("readers", n_readers, "an integer >= 2 (one fails, the others take over)")
    splits = make_splits(n_splits)
    source = ReassignableStaticSplitSource("bench", splits)
    context = RecordingEnumeratorContext(n_readers)
    enumerator = enumerator_for(source, context, strategy)

    t0 = time.perf_counter()
    enumerator.start()  # discovery
    discovery_s = time.perf_counter() - t0

    for reader_id in range(n_readers - 1):
        context.register_reader(reader_id)
        enumerator.add_reader(reader_id)
    t0, c0 = time.perf_counter(), time.process_time()
    context.register_reader(n_readers - 1)
    enumerator.add_reader(n_readers - 1)  # the first round: every split placed
    full_assignment_s = time.perf_counter() - t0
    full_assignment_cpu_s = time.process_time() - c0
    loads = enumerator.loads()
    unassigned_after_full = enumerator.pool_size

    t0 = time.perf_counter()
    snapshot = enumerator.snapshot(1)
    context.on_checkpoint(1)
    context.on_checkpoint_complete(1)
    snapshot_s = time.perf_counter() - t0

    # Partial failover: reader 0 fails and restarts with the splits of its checkpointed state.
    restarted = 0
    restarted_state = snapshot.assignments.get(restarted, ())
    before = enumerator.owners()
    t0 = time.perf_counter()
    fail_reader(enumerator, context, restarted)
    restart_reader(enumerator, context, restarted, restarted_state)
    restart_s = time.perf_counter() - t0
    after = enumerator.owners()
    restart_moved = sum(1 for sid, owner in after.items() if before.get(sid) != owner)

    # Failover: one reader lost for good; its splits go to the others.
    failed = n_readers // 2
    failed_splits = set(enumerator.owned_split_ids(failed))
    before = after
    t0, c0 = time.perf_counter(), time.process_time()
    added_back = context.unregister_reader(failed)
    enumerator.add_splits_back(added_back, failed)
    enumerator.remove_reader(failed)
    failover_s = time.perf_counter() - t0
    failover_cpu_s = time.process_time() - c0
    after = enumerator.owners()
    moved = {sid for sid, owner in after.items() if before.get(sid) != owner}
    final_loads = enumerator.loads()

    return {
        "benchmark": "assign",
        "strategy": strategy,
        "splits": n_splits,
        "readers": n_readers,
        "discovery_s": round(discovery_s, 4),
        "full_assignment_s": round(full_assignment_s, 4),
        "full_assignment_cpu_s": round(full_assignment_cpu_s, 4),
        "unassigned_after_full": unassigned_after_full,
        "load_min": min(loads.values()),
        "load_max": max(loads.values()),
        "snapshot_s": round(snapshot_s, 4),
        "restart_s": round(restart_s, 4),
        "restart_moved": restart_moved,
        "failover_s": round(failover_s, 4),
        "failover_cpu_s": round(failover_cpu_s, 4),
        "failed_reader_splits": len(failed_splits),
        "failover_moved": len(moved),
        "failover_moved_from_other_readers": len(moved - failed_splits),
        "unassigned_after_failover": enumerator.pool_size,
        "final_load_spread": count_spread(final_loads),
        "targets": {"full_assignment_s": TARGET_FULL_ASSIGNMENT_S, "failover_s": TARGET_FAILOVER_S},
        "met": {
            "full_assignment_s": full_assignment_s < TARGET_FULL_ASSIGNMENT_S,
            "failover_s": failover_s < TARGET_FAILOVER_S,
            "only_failed_reader_moved": moved == failed_splits,
        },
    }


def run(args: argparse.Namespace) -> int:
    result = bench_assign(args.splits, args.readers, args.strategy)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        met = result["met"]
        rows = [
            ("splits / readers", f"{result['splits']:,} / {result['readers']:,} ({result['strategy']})"),
            ("discovery", f"{result['discovery_s']:.3f} s"),
            (
                "full assignment",
                f"{result['full_assignment_s']:.3f} s, cpu {result['full_assignment_cpu_s']:.3f} s "
                f"(target < {TARGET_FULL_ASSIGNMENT_S} s: "
                f"{'met' if met['full_assignment_s'] else 'MISSED'}); "
                f"loads {result['load_min']}..{result['load_max']}, "
                f"{result['unassigned_after_full']} unassigned",
            ),
            ("checkpoint snapshot", f"{result['snapshot_s']:.3f} s"),
            (
                "reader restart",
                f"{result['restart_s'] * 1000:.1f} ms, {result['restart_moved']} splits moved",
            ),
            (
                "reader lost",
                f"{result['failover_s'] * 1000:.1f} ms, cpu {result['failover_cpu_s'] * 1000:.1f} ms "
                f"(target < {TARGET_FAILOVER_S * 1000:.0f} ms: "
                f"{'met' if met['failover_s'] else 'MISSED'}); moved {result['failover_moved']} of its "
                f"{result['failed_reader_splits']} splits, "
                f"{result['failover_moved_from_other_readers']} of other readers; "
                f"load spread after {result['final_load_spread']}, "
                f"{result['unassigned_after_failover']} unassigned",
            ),
        ]
        width = max(len(k) for k, _ in rows)
        for key, value in rows:
            print(f"{key:<{width}}  {value}")
    correct = (
        result["unassigned_after_full"] == 0
        and result["failover_moved"] == result["failed_reader_splits"]
        and result["failover_moved_from_other_readers"] == 0
    )
    if not correct:
        print(
            "splitkeeper-tools bench assign: assignment was not complete or moved other readers' splits",
            file=sys.stderr,
        )
    return 0 if correct else 1
