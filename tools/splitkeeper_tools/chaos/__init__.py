"""``splitkeeper-tools chaos --source kafka``: ingest under injected faults, then prove exactly-once.

Modelled on Kafka's transactions system test (``tests/kafkatest/tests/core/transactions_test.py``):
a known set of messages goes into input topics, the system under test copies it while
processes are killed and the broker is SIGKILLed, and at the end the output must hold
every input message exactly once.

1. A Kafka broker (the project's :class:`~splitkeeper_tools.kafka_broker.KafkaBroker`,
   in a temporary folder; or ``--bootstrap-servers``), two topics with 8 partitions in
   all, and N messages whose key and value name them (``<seq>|<topic>|<partition>|<payload>``)
   produced by an idempotent producer; every delivery report is the oracle. 70% are
   produced first, the rest while the pipeline runs.
2. The pipeline (a generated YAML config, P=4, a consumer group of its own) runs as
   separate ``python -m splitkeeper run|recover`` processes, each with its own driver and
   JVM; the next one starts as soon as the last exited (a SIGKILLed driver's lease is
   taken over at once: its process on this host is gone). The fault table
   (:data:`~splitkeeper_tools.chaos.schedule.PLANNED`) and the schedule drawn from ``--seed``
   (:func:`~splitkeeper_tools.chaos.schedule.draw_schedule`) put
   the faults on six driver processes, each of which dies by SIGKILL at a different crash
   point of protocol rule 5.5: a region that raises, a region stalled past its timeout, a
   Python worker SIGKILLed in a region task, a second ``run`` and a ``recover`` started
   while a run runs (both refused by the pipeline lease, rule 5.6), the broker SIGKILLed
   twice while messages and commits are in flight, a rescale 4 -> 6 and one 6 -> 4. A
   smaller ``--messages`` shrinks the epochs, never the faults.
   With ``--readers long_lived`` every driver's config says ``readers: long_lived``: its regions
   run on a reader job held for its run (:mod:`splitkeeper.spark.readers`), and every fault is
   injected the same; the worker SIGKILL's evidence must then name the reader slot the killed
   Python worker held (:class:`~splitkeeper_tools.chaos.live.WorkerKill`).
   With ``--sink upsert`` the messages are keyed (40 keys per partition) and 2% of them end with
   ``|delete``: the pipeline decodes ``text`` into an upsert sink keyed by the Kafka key with
   ``delete_when: value LIKE '%|delete'``; its change table is then what must hold every message
   once, and the keyed table must equal the fold of the delivery reports (per key the message
   with the highest offset, absent when that one deletes).
   With ``--bad-records SHARE`` that share of the messages is malformed (a byte that is
   not UTF-8 before the payload) and the pipeline decodes ``text`` with
   ``errors.tolerance: all`` and a dead-letter table: the bad ones must be exactly the
   dead letters.
   With ``--store s3`` the state, sink, staging and dead letters live on the local S3 server
   (versitygw) and the drivers reach it through a fault proxy that answers a share of their requests with
   503 SlowDown, a reset connection or a slow answer, drawn from ``--seed``
   (:mod:`~splitkeeper_tools.chaos.store`); the ``rescale-down`` driver is also SIGSTOPped past
   its lease's ttl while a takeover run commits, then SIGCONTed
   (:class:`~splitkeeper_tools.chaos.live.DriverPause`). The JSON's ``store`` counts the injected
   store faults (``conditional_put_resets``: those on Delta commits, before and after the put
   reached the store), the drivers' own retries (``driver_retries``: their
   ``splitkeeper_store_retries_total``, from their metrics files) and names the driver runs that
   failed on the store.
   With ``--profile cluster`` (``--store s3`` implied) every driver runs on a Spark standalone
   master with 2 workers the command starts in ``<workdir>/cluster``
   (:mod:`~splitkeeper_tools.chaos.cluster`: the local cluster's Spark part, authentication on,
   loopback): its region tasks run in executors the workers start, one on each. State, sink and
   dead letters are on versitygw as with ``--store s3``: the drivers commit them with
   delta-rs/pyarrow through the fault proxy. So is staging (the default ``<state>/_staging``, with
   ``--store s3`` too): the region tasks write their staged files through the proxy with pyarrow
   (the executors get the store's ``AWS_*`` variables by ``spark.executorEnv``). Each worker runs in
   a mount namespace of its own with a private /tmp, and the cluster's Spark conf refuses a local
   staging folder: drivers and executors share nothing but the store, the broker and the network.
   The executors' Python workers are children of the Spark workers, not of the driver: the worker
   SIGKILL finds them by the driver's tag (``spark.executorEnv``), and Spark, which gives a task 4
   attempts there, runs the killed task again (the region acknowledges from the new attempt). A
   SIGSTOP freezes the driver's own processes; its executors stay up and idle. The JSON adds
   ``profile``, ``spark_master`` and ``spark_cluster`` (the applications and executors in the
   workers' work folders). Before the executors staged on the store (a local staging folder):
   ``--profile cluster --messages 200 --seed 7 --bad-records 0.01 --store-fault-rate 0.02`` (the
   slow variant of tests/test_chaos.py) passed twice in 9 min on 2 cores: 0 lost, 0 duplicated,
   every fault kind injected, 447-512 store faults in 7,392-8,564 requests, 13 checkpoints (11
   global, 2 regional), 5-6 drivers' executors on each worker. A third run failed with the data
   exact: a reset Delta commit (``[STATE_ERROR]``, whether it landed unknown) stopped the act with
   the region faults in epoch 2, and its faults were reported missing, as can happen with ``--store
   s3`` on local Spark.
3. Runs continue until the consumer group's offsets reach the end of every partition on
   a global checkpoint; then :mod:`~splitkeeper_tools.chaos.verify` compares the Delta sink (read
   with delta-rs) with the delivery reports, the group's committed offsets (Kafka's admin API) with the ends
   and the last checkpoint, and runs the restart checks (Great Expectations). With
   ``--bad-records`` the sink and the dead-letter table together must hold every delivered
   message exactly once, byte for byte.

Progress goes to stderr; ``--json`` prints one JSON object on stdout (``faults_by_kind``,
``concurrent_drivers_refused``, ``records_lost``, ...). Exit 0 when nothing was lost,
duplicated or unexpected, the offsets are aligned, the restart checks passed and every
fault of the table was injected with evidence; 1 otherwise; 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from splitkeeper.config.models import Readers
from splitkeeper.errors import InvalidParameterError
from splitkeeper_tools.chaos.store import DEFAULT_FAULT_RATE, MAX_FAULT_RATE, STORES, versitygw_binary
from splitkeeper_tools.kafka_testbed import check_bootstrap_servers

#: What ``--source`` accepts (only Kafka keeps positions outside the pipeline and can be killed).
SOURCES = ("kafka",)
PROFILES = ("local", "cluster")
SINKS = ("append", "upsert")
READERS = tuple(r.value for r in Readers)  # the pipeline's ``readers:`` (the default first)
DEFAULT_MESSAGES = 100_000
MIN_MESSAGES = 100  # enough for every share of the schedule to hold messages
MAX_BAD_SHARE = 0.5  # --bad-records: most messages stay well-formed


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--source", required=True, choices=SOURCES, help="what to ingest (kafka)")
    parser.add_argument(
        "--messages",
        type=int,
        default=DEFAULT_MESSAGES,
        help=f"messages to produce (default {DEFAULT_MESSAGES:,}; at least {MIN_MESSAGES})",
    )
    parser.add_argument("--seed", type=int, default=1, help="draws the fault schedule and the payloads")
    parser.add_argument(
        "--bad-records",
        type=float,
        default=0.0,
        help="share of malformed messages (not UTF-8; e.g. 0.01): the pipeline decodes text with "
        "errors.tolerance all, and they must be exactly the dead letters (default 0)",
    )
    parser.add_argument(
        "--sink",
        default="append",
        choices=SINKS,
        help="append (default), or upsert: keyed messages (40 keys per partition, 2%% deletes) into an "
        "upsert sink keyed by the Kafka key; its change table must hold every message once and the keyed "
        "table the latest message of every live key",
    )
    parser.add_argument(
        "--readers",
        default="per_epoch",
        choices=READERS,
        help="the drivers' readers: per_epoch (default), a Spark job per epoch; long_lived, one job for a "
        "driver's run whose tasks serve the regions of every epoch (every fault kind is injected the same)",
    )
    parser.add_argument(
        "--profile",
        default="local",
        choices=PROFILES,
        help="local (default): every driver on local Spark; cluster: on a Spark standalone master with 2 "
        "workers the command starts (the local cluster's Spark part), with --store s3",
    )
    parser.add_argument(
        "--store",
        default=None,
        choices=STORES,
        help="local (default with --profile local): state and sink in the work folder; s3 (the only one "
        "with --profile cluster): on the local S3 server (versitygw, built by scripts/setup.sh cluster) "
        "through a fault proxy that injects 503 SlowDown, reset connections and slow answers on a "
        "schedule drawn from --seed",
    )
    parser.add_argument(
        "--store-fault-rate",
        type=float,
        default=DEFAULT_FAULT_RATE,
        help=f"with --store s3: the share of the drivers' store requests that meets each fault kind "
        f"(default {DEFAULT_FAULT_RATE}; at most {MAX_FAULT_RATE})",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument(
        "--bootstrap-servers",
        default=None,
        help="use this Kafka instead of starting one (the broker SIGKILLs are then skipped)",
    )
    parser.add_argument(
        "--workdir", default=None, help="folder for broker, state, sink, logs (default: temporary)"
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the work folder (it is kept anyway on failure)"
    )


def run(args: argparse.Namespace) -> int:
    from splitkeeper_tools.chaos.processes import say
    from splitkeeper_tools.chaos.runner import KafkaChaos

    if isinstance(args.messages, bool) or args.messages < MIN_MESSAGES:
        raise InvalidParameterError(
            "--messages", args.messages, f"an integer >= {MIN_MESSAGES}", hint="e.g. --messages 4000"
        )
    if not 0 <= args.bad_records < MAX_BAD_SHARE:
        raise InvalidParameterError(
            "--bad-records",
            args.bad_records,
            f"a share >= 0 and < {MAX_BAD_SHARE}",
            hint="e.g. --bad-records 0.01",
        )
    profile = getattr(args, "profile", "local")
    store = getattr(args, "store", None) or ("s3" if profile == "cluster" else "local")
    if profile == "cluster" and store != "s3":
        raise InvalidParameterError(
            "--store",
            store,
            "s3 with --profile cluster (state, sink and dead letters on the object store, as on a cluster)",
            hint="drop --store, or use --profile local",
        )
    fault_rate = getattr(args, "store_fault_rate", DEFAULT_FAULT_RATE)
    if not 0 < fault_rate <= MAX_FAULT_RATE:
        raise InvalidParameterError(
            "--store-fault-rate",
            fault_rate,
            f"a share > 0 and <= {MAX_FAULT_RATE} of the requests, for each fault kind",
            hint="e.g. --store-fault-rate 0.01",
        )
    for option, value, needs in (("--profile", profile, "cluster"), ("--store", store, "s3")):
        if value == needs and versitygw_binary() is None:  # the profile first: it implies the store
            raise InvalidParameterError(
                option,
                value,
                f"local, or {needs} where the local S3 server (versitygw) is built",
                hint="build it with: bash scripts/setup.sh cluster (it goes to .tools/versitygw/bin)",
            )
    if profile == "cluster":
        from splitkeeper_tools.chaos.cluster import spark_unavailable

        missing = spark_unavailable()
        if missing is not None:
            raise InvalidParameterError(
                "--profile",
                profile,
                "local, or cluster where a Spark standalone master can start (pyspark's bin/spark-class)",
                hint=f"{missing}; install the Python packages with: bash scripts/setup.sh",
            )
    # the verification reads the sink with Spark through S3A: checked before minutes of work
    if store == "s3":
        from splitkeeper.errors import EnvironmentNotReadyError
        from splitkeeper.spark.jars import s3a_jars

        try:
            s3a_jars()
        except EnvironmentNotReadyError as err:
            option, value = ("--profile", profile) if profile == "cluster" else ("--store", store)
            raise InvalidParameterError(
                option,
                value,
                f"local, or {value} where Spark can read the object store (the s3a jar group, which the "
                "verification's Spark reads of the sink need)",
                hint=err.message,
            ) from err
    check_bootstrap_servers(args.bootstrap_servers)
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="splitkeeper-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    chaos = KafkaChaos(
        workdir,
        args.messages,
        args.seed,
        args.bootstrap_servers,
        args.bad_records,
        getattr(args, "sink", "append"),
        store,
        fault_rate,
        profile,
        getattr(args, "readers", "per_epoch"),
    )
    try:
        result = chaos.execute()
    finally:
        chaos.shutdown()
    ok = result["passed"]
    if ok and not args.keep and not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
        result["workdir"] = None
    say(
        f"{'PASSED' if ok else 'FAILED'}: {result['messages']:,} messages, lost {result['records_lost']}, "
        f"duplicated {result['records_duplicated']}, unexpected {result['records_unexpected']}, "
        f"dead letters {result['dead_letters']} of {result['dead_letters_expected']} malformed, offsets "
        f"aligned {result['offsets_aligned']}, "
        + (
            f"keyed table {result['keys_in_table']} keys (matches the delivery reports: "
            f"{result['keyed_matches']}), "
            if result.get("sink") == "upsert"
            else ""
        )
        + f"faults {result['faults_by_kind']}, "
        + (
            f"store faults {result['store']['faults']} ({len(result['store']['runs_failed_by_store'])} "
            "driver runs failed on the store; the drivers' own retries "
            f"{result['store']['driver_retries']}), "
            if result["store"]["kind"] == "s3"
            else ""
        )
        + "concurrent drivers "
        f"refused {result['concurrent_drivers_refused']}, "
        + (
            f"drivers on {result['spark_master']} ({result['spark_cluster']['applications']} "
            "applications on its 2 workers), "
            if profile == "cluster"
            else ""
        )
        + f"{result['elapsed_s']:.0f}s"
        + ("" if ok else f"; work folder kept: {workdir}")
    )
    if args.json:
        print(json.dumps(result))
    return 0 if ok else 1
