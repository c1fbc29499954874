"""Run one epoch's regions as the tasks of one Spark job, with per-region isolation and timeouts.

The regions with ranges to read are packed into the partitions of one RDD (:func:`pack_regions`:
dealt in turn into at most ``spark.splitkeeper.regions.tasksPerCore`` (default 2) tasks per core of
the session, ``sc.defaultParallelism``), and the epoch runs one Spark job over it, in its own job
group (:func:`_job_group`), submitted from one driver thread: Spark schedules the tasks on its free
cores, so an epoch of thousands of regions costs one job's scheduling, a driver thread and a py4j
socket, not one of each per region (at 1,000 busy regions a job per region cost about 0.34 s each),
and a few Python worker round trips, not one per region (200 busy regions on 2 cores: 4 tasks, not
200). A task runs its regions one after another; each region still starts (asks the driver) and
ends (reports) on its own, so its timeout, its failure and its result are its own.

Every task reports to the driver as it *starts* and as it *ends*, over a small authenticated socket
server the driver opens for the epoch (:func:`_region_server`, a :class:`SignedServer`: stdlib
``socketserver``, each message signed with HMAC-SHA256 under a random key per epoch and unpickled
only once it checks out, as PySpark's accumulator server checks its token; bound on
``spark.driver.bindAddress`` and reached at ``spark.driver.host``, a port the system picks:
executors must reach the driver host on it, as they reach ``spark.driver.port``). So the driver
learns each region's result as its task ends, and each region's start time, while the job still
runs; the job's ``collect()`` result is a backstop for a report that was still in flight when the
job ended.

Isolation within the one job:

* A region whose task raises fails alone: the task catches the error. While Spark would still
  retry it (``TaskContext.attemptNumber() + 1 < spark.task.maxFailures``, from the master for
  ``local[N,F]``) the task re-raises, so Spark reruns it; every attempt stages its output under its
  own ``attempt=<id>`` folder and the driver commits only the path a finished attempt reported
  (tests/runtime/test_task_retry.py, with the ``flaky`` fault). On the last attempt the task
  reports FAILED with the error's one line and returns normally: the job goes on for the others.
  An attempt that raises and is retried tells the driver so (``retrying``, with its error): the
  region is not silent, so its timeout counts again from its next attempt's start (a region whose
  attempts each raise within the timeout is FAILED with its error however long Spark's retries take
  on a busy cluster: at most ``spark.task.maxFailures`` times the timeout), and a region that then
  times out says what its earlier attempts raised.
* A region still running ``timeout_s`` after its task *started*, or not started while no task
  started or ended for ``timeout_s`` (no free core, a lost executor: the epoch deadline), is
  TIMED_OUT at once (protocol rule 2.3). The driver stops waiting for it and ignores what it
  reports later (its staged output is never committed), and kills its task attempt
  (``SparkContext.killTaskAttempt``), which frees its core for the regions still queued. Spark
  reschedules a killed task; the new attempt asks the driver at each region's start: the regions
  that have an outcome (the timed-out one included) are refused without reading, and the regions
  packed behind the stalled one, which had not started, run then (their epoch deadline counts from
  the kill, not from the last task that started or ended elsewhere). So a stalled region delays
  the regions packed behind it by its timeout, and fails alone
  (``spark.splitkeeper.regions.tasksPerCore`` = 0 gives every region its own task, as before
  packing). Once every region has an outcome the driver lets the job end
  (:data:`JOB_GRACE_S`: a killed Python worker dies within ``spark.python.task.killTimeout``) and
  then cancels the epoch's job group (only such refused or dying attempts can still run then), so
  the epoch ends within the region timeout plus a few seconds.
* A job that fails as a whole (a Python worker killed where Spark gives a task one attempt, as on
  ``local[N]``; a lost executor past ``spark.task.maxFailures``) fails the region that was running
  in the task Spark names in its error (``Task 1 in stage 3.0 failed``: the region of that
  partition that had started and not ended), and the regions the abort took down with it
  that have not reported run again, once, in a second job of the same group (each attempt stages
  apart, as in Spark's own retry). A job that fails again, or without naming a task, fails every
  region that has not reported yet, with the job's error.

A stop request (``interrupt``) refuses every task still to start, cancels the job group and raises
EpochAbandoned. This is what lets a checkpoint complete regionally instead of the whole
micro-batch failing, which is Structured Streaming's behaviour.
"""

from __future__ import annotations

import enum
import functools
import hmac
import logging
import os
import pickle
import re
import socket
import socketserver
import struct
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from splitkeeper.core.failures import clip
from splitkeeper.errors import EpochAbandoned, InvalidParameterError

log = logging.getLogger("splitkeeper.spark.regions")
#: How long an abandoned epoch waits for its cancelled job to wind down.
ABANDON_WAIT_S = 10.0
#: How long an epoch whose regions all have an outcome waits for its job to end before cancelling it.
JOB_GRACE_S = 5.0
#: How long an epoch whose regions all have an outcome waits for its cancelled job to wind down.
WIND_DOWN_S = 30.0
_LOG_TRACEBACK_CHARS = 20_000
#: The Spark conf that bounds an epoch job's tasks: at most this many per core (``sc.defaultParallelism``);
#: 0 = a task per region.
TASKS_PER_CORE_CONF = "spark.splitkeeper.regions.tasksPerCore"
TASKS_PER_CORE = 2


class RegionStatus(enum.Enum):
    FINISHED = "finished"
    FAILED = "failed"
    TIMED_OUT = "timed_out"


@dataclass(frozen=True, slots=True)
class RegionRun:
    """What the driver learned about one region's task."""

    region_id: int
    status: RegionStatus
    result: Any = None  # the task's return value when FINISHED
    error: str = ""
    started_after_s: float | None = None  # queueing delay before the task began
    elapsed_s: float = 0.0


def _job_group(pipeline: str, epoch: int) -> str:
    """The job group of an epoch's one region job."""
    return f"splitkeeper-{pipeline}-e{epoch}"


_TRACEBACK = "Traceback (most recent call last):"


def _short_error(err: BaseException) -> str:
    """One line saying why the epoch's job failed: the task's Python exception when there is one.

    A failed Python task reaches the driver as a JVM error (py4j) that embeds the
    worker's traceback, whose first unindented line after ``Traceback ...`` is
    ``module.ExceptionClass: message``. Other failures (a cancelled job) keep the
    last line that names an error or exception.
    """
    text = str(err)
    lines = text.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].rstrip().endswith(_TRACEBACK):
            for line in lines[i + 1 :]:
                if line.strip() and not line[:1].isspace():
                    return clip(line.strip(), 500)
            break
    for line in reversed(lines):
        line = line.strip()
        if line and ("Error" in line or "Exception" in line) and not line.startswith("at "):
            return clip(line, 500)
    return clip((text.splitlines() or [type(err).__name__])[0], 500)


def _task_error(err: BaseException) -> str:
    """The one line a task reports for its exception, as the worker's traceback ends:
    ``module.ExceptionClass: message`` (builtins without their module), at most 500 characters."""
    line = traceback.format_exception_only(type(err), err)[-1].strip()
    return clip((line.splitlines() or [type(err).__name__])[0], 500)


_LOCAL = re.compile(r"local(?:\[\s*(?:\d+|\*)\s*\])?")
_LOCAL_FAILURES = re.compile(r"local\[\s*(?:\d+|\*)\s*,\s*(\d+)\s*\]")


def max_task_failures(sc: Any) -> int:
    """How many attempts Spark gives a task: 1 on ``local``/``local[N]``, F on ``local[N,F]``, else
    ``spark.task.maxFailures`` (default 4), as ``SparkContext.createTaskScheduler`` decides."""
    master = str(sc.master).strip()
    if _LOCAL.fullmatch(master):
        return 1
    matched = _LOCAL_FAILURES.fullmatch(master)
    if matched:
        return max(1, int(matched.group(1)))
    return max(1, int(sc.getConf().get("spark.task.maxFailures", "4")))


def pack_regions(regions: list[int], cores: int, per_core: int = TASKS_PER_CORE) -> list[list[int]]:
    """The epoch job's partitions: ``regions`` (sorted) dealt in turn into at most ``cores *
    per_core`` lists, so neighbouring regions run side by side and the lists differ by at most one
    region; ``per_core`` 0 is one list per region. Partition ``i`` of the job holds list ``i``."""
    if not regions:
        return []
    count = len(regions) if per_core <= 0 else max(1, min(len(regions), max(1, cores) * per_core))
    return [regions[i::count] for i in range(count)]


def tasks_per_core(spark: Any) -> int:
    """``spark.splitkeeper.regions.tasksPerCore`` of the session (default :data:`TASKS_PER_CORE`; a
    runtime conf, so ``spark.conf.set`` changes it for the next epoch)."""
    raw = spark.conf.get(TASKS_PER_CORE_CONF, None)
    if raw is None or not str(raw).strip():
        return TASKS_PER_CORE
    try:
        value = int(str(raw).strip())
    except ValueError:
        value = -1
    if value < 0:
        raise InvalidParameterError(
            TASKS_PER_CORE_CONF,
            raw,
            "a whole number >= 0 (region tasks per core of the session; 0 = a task per region)",
            f"Set the Spark conf {TASKS_PER_CORE_CONF} to e.g. 2, or remove it",
        )
    return value


def _packed_partition(
    address: tuple[str, int],
    authkey: bytes,
    max_failures: int,
    task: Callable[[Any], Any],
    packs: Iterator[list[tuple[int, Any]]],
) -> Iterator[tuple[int, str, Any]]:
    """The body of a packed partition (one list of ``(region, payload)``): its regions one after
    another, each as :func:`_region_partition` runs it."""
    yield from _region_partition(
        address, authkey, max_failures, task, (item for pack in packs for item in pack)
    )


# --------------------------------------------------------------------------- the task side

_FRAME = struct.Struct("!I")  # the body's length; then its HMAC-SHA256, then the body (a pickle)
_MAX_BODY = 256 * 1024 * 1024
#: How long either side waits on the socket for one message.
SOCKET_TIMEOUT_S = 60.0
#: How often the epoch's region server looks whether it is being closed (``serve_forever``'s poll
#: interval): closing it, once per epoch, waits for the next look. At 0.1 s closing took 0.04-0.26 s
#: (measured at load 25); a look is one ``select`` call on the server's thread.
SERVER_POLL_S = 0.005


def _frame(authkey: bytes, message: object) -> bytes:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _FRAME.pack(len(body)) + hmac.digest(authkey, body, "sha256") + body


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(min(size - len(chunks), 1 << 20))
        if not chunk:
            raise EOFError("the connection closed mid-message")
        chunks += chunk
    return bytes(chunks)


def _unframe(authkey: bytes, sock: socket.socket) -> Any:
    """The message on ``sock``, unpickled only once its HMAC proves it came with ``authkey``."""
    (size,) = _FRAME.unpack(_read_exactly(sock, _FRAME.size))
    if size > _MAX_BODY:
        raise ValueError(f"a message of {size} bytes")
    digest = _read_exactly(sock, 32)
    body = _read_exactly(sock, size)
    if not hmac.compare_digest(digest, hmac.digest(authkey, body, "sha256")):
        raise PermissionError("a message without the epoch's key")
    return pickle.loads(body)


def _send(address: tuple[str, int], authkey: bytes, message: tuple[Any, ...], reply: bool) -> Any:
    try:
        with socket.create_connection(address, timeout=SOCKET_TIMEOUT_S) as sock:
            sock.sendall(_frame(authkey, message))
            if not reply:
                sock.shutdown(socket.SHUT_WR)
                sock.recv(1)  # the server closes once it took the message
                return None
            return _read_exactly(sock, 1) == b"1"
    except Exception as err:
        raise ConnectionError(
            f"region task cannot reach the driver's region server at {address[0]}:{address[1]}: "
            f"{type(err).__name__}: {err} (executors must reach the driver host on any port)"
        ) from err


def lighten_worker_imports() -> int:
    """Drop the zip and jar finders from this Python worker's import cache; returns how many.

    PySpark's worker calls ``importlib.invalidate_caches()`` at the start of every task, and on
    Python before 3.12 each cached zip finder then re-reads its whole archive's directory at once
    (CPython gh-103200, made lazy in 3.12). A worker's path holds ``pyspark.zip``, the py4j zip and
    ``spark-core.jar`` (thousands of entries), with a finder per package imported from them: measured
    here, 0.13 s of every task on 2 cores, 200 empty tasks 25.7 s against 5.2 s once they are dropped
    (a JVM-only job of 200 tasks: 2.8 s). The modules already imported stay imported, and an import
    that needs such a finder again makes a new one, so nothing changes but the cost. The jar holds no
    Python, so it also leaves the path. Called at the start of each region task; from 3.12 a no-op."""
    if sys.version_info >= (3, 12):
        return 0
    for entry in [p for p in sys.path if isinstance(p, str) and p.endswith(".jar")]:
        sys.path.remove(entry)
    stale = [k for k in sys.path_importer_cache if isinstance(k, str) and (".zip" in k or ".jar" in k)]
    for key in stale:
        sys.path_importer_cache.pop(key, None)
    return len(stale)


def _region_partition(
    address: tuple[str, int],
    authkey: bytes,
    max_failures: int,
    task: Callable[[Any], Any],
    items: Iterator[tuple[int, Any]],
) -> Iterator[tuple[int, str, Any]]:
    """The body of the epoch job's tasks: the partition's regions one after another, each asking
    the driver at its start and reporting its end (see the module docstring).

    Yields ``(region, status, value)`` for the job's collect() (the backstop): ``finished`` with
    the task's result, ``failed`` with its error line, ``refused`` when the driver no longer
    wanted the region when this attempt started.
    """
    from pyspark import TaskContext

    lighten_worker_imports()
    context = TaskContext.get()
    attempt = context.attemptNumber() if context is not None else 0
    task_id = context.taskAttemptId() if context is not None else -1
    for region, payload in items:
        if not _send(address, authkey, ("start", region, attempt, task_id, os.getpid()), reply=True):
            yield region, "refused", None
            continue
        try:
            result = task(payload)
        except Exception as err:
            error = _task_error(err)
            detail = traceback.format_exc()[-_LOG_TRACEBACK_CHARS:]
            if attempt + 1 < max_failures:  # Spark retries the task: a later attempt may succeed
                _send(address, authkey, ("retrying", region, attempt, error, detail), reply=False)
                raise
            _send(address, authkey, ("failed", region, attempt, error, detail), reply=False)
            yield region, "failed", error
            continue
        _send(address, authkey, ("finished", region, attempt, result), reply=False)
        yield region, "finished", result


# --------------------------------------------------------------------------- the driver side


class SignedServer:
    """A driver-side socket server of one channel of signed messages (:func:`_frame` /
    :func:`_unframe` with its own random ``authkey``): the epoch's region server and the long-lived
    reader pool's server are each one.

    ``serve(sock, authkey)`` handles one connection (its timeout is :data:`SOCKET_TIMEOUT_S`); an
    exception it raises ends the connection and is logged at debug level (a stranger, a reset
    connection: the task retries or times out). ``concurrent``: a thread per connection (the
    reader slots' long connections), else one connection at a time on the server's thread.
    """

    def __init__(
        self,
        bind: str,
        host: str,
        serve: Callable[[socket.socket, bytes], None],
        *,
        name: str,
        concurrent: bool = False,
    ) -> None:
        self.authkey = os.urandom(32)
        authkey = self.authkey

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                sock: socket.socket = self.request
                sock.settimeout(SOCKET_TIMEOUT_S)
                try:
                    serve(sock, authkey)
                except Exception:
                    log.debug("%s: a connection failed: %s", name, traceback.format_exc())

        class Server(socketserver.ThreadingTCPServer if concurrent else socketserver.TCPServer):  # type: ignore[misc]
            daemon_threads = True
            allow_reuse_address = concurrent

        self._server = Server((bind, 0), Handler)
        self.address: tuple[str, int] = (host, self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(SERVER_POLL_S,), name=name, daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()  # returns once serve_forever has (within its poll interval)
        self._server.server_close()
        self._thread.join(timeout=5)


def _region_server(
    bind: str,
    host: str,
    on_start: Callable[[int, int, int], bool],
    on_end: Callable[[int, str, Any, str], None],
    on_retry: Callable[[int, int, str, str], None] | None = None,
) -> SignedServer:
    """The epoch's server: tasks' start and end messages, one at a time on one thread.

    ``on_start(region, attempt, task_id) -> bool`` says whether the attempt may run;
    ``on_end(region, status, value, detail)`` takes a region's end; ``on_retry(region, attempt,
    error, detail)`` an attempt that raised and that Spark retries. All run on the server's thread.
    A message is unpickled only when its HMAC with the epoch's random key checks out.
    """

    def serve(sock: socket.socket, authkey: bytes) -> None:
        message = _unframe(authkey, sock)
        if message[0] == "start":
            _kind, region, attempt, task_id, _pid = message
            sock.sendall(b"1" if on_start(region, attempt, task_id) else b"0")
        elif message[0] == "finished":
            on_end(message[1], "finished", message[3], "")
        elif message[0] == "failed":
            on_end(message[1], "failed", message[3], message[4])
        elif message[0] == "retrying" and on_retry is not None:
            on_retry(message[1], message[2], message[3], message[4])

    return SignedServer(bind, host, serve, name="splitkeeper-region-server")


#: Each SparkContext's driver addresses (:func:`_server_addresses`), read once per context.
_ADDRESSES: weakref.WeakKeyDictionary[Any, tuple[str, str]] = weakref.WeakKeyDictionary()


def _server_addresses(sc: Any) -> tuple[str, str]:
    """(the address to bind, the address executors reach): Spark's own driver addresses.

    Read once per SparkContext (they are fixed when it starts): ``SparkContext.getConf()`` copies
    the whole conf over py4j, 5-14 ms of every epoch measured at load 25."""
    known = _ADDRESSES.get(sc)
    if known is None:
        conf = sc.getConf()
        host = conf.get("spark.driver.host", None) or "127.0.0.1"
        known = _ADDRESSES[sc] = (conf.get("spark.driver.bindAddress", None) or host, host)
    return known


def run_regions(
    spark: Any,
    pipeline: str,
    epoch: int,
    payloads: Mapping[int, Any],
    task: Callable[[Any], Any],
    timeout_s: float,
    poll_s: float = 0.05,
    *,
    interrupt: threading.Event | None = None,
) -> dict[int, RegionRun]:
    """Run ``task(payload)`` for every region as one task of the epoch's one Spark job; return each
    region's outcome.

    Called by the epoch runner on the driver, once per epoch. ``task`` and the payloads cross to
    executors: they must be picklable. The regions are packed into at most
    ``spark.splitkeeper.regions.tasksPerCore`` tasks per core (:func:`pack_regions`), each running its
    regions in region order. A region's timeout
    counts from its task's start (its start message); a region whose task has not started while no
    task started or ended for ``timeout_s`` times out too (it may never be scheduled). Once
    ``interrupt`` is set, the job is cancelled and EpochAbandoned is raised (after the job wound
    down, at most ``ABANDON_WAIT_S``). No payload (every region declined before reading): no job, an
    empty result.
    """
    if not payloads:
        return {}
    sc = spark.sparkContext
    per_core = tasks_per_core(spark)
    regions = sorted(payloads)
    runs: dict[int, RegionRun] = {}
    started: dict[int, float] = {}  # region -> when its first attempt started (the report's figure)
    clock: dict[int, float] = {}  # region -> when its running attempt started (its timeout counts from it)
    retried: dict[int, tuple[int, str]] = {}  # region -> (attempts that raised and were retried, last error)
    task_ids: dict[int, int] = {}
    lock = threading.Lock()
    changed = threading.Event()
    stopping = threading.Event()
    epoch_start = time.monotonic()
    progress = [epoch_start]  # when a task last started or ended (the epoch deadline counts from it)
    part_of: dict[int, int] = {}  # region -> its partition in the job running now
    killed_at: dict[int, float] = {}  # partition -> when a task of it was killed (a timed-out region)
    extra = {"epoch": epoch, "checkpoint_id": epoch}

    def record(region: int, run: RegionRun) -> None:  # under lock
        if region not in runs:
            runs[region] = run
            changed.set()

    def on_start(region: int, attempt: int, task_id: int) -> bool:
        with lock:
            if stopping.is_set() or region in runs or region not in payloads:
                return False
            now = time.monotonic()
            progress[0] = now
            started.setdefault(region, now)
            clock.setdefault(region, now)
            task_ids[region] = task_id
            return True

    def on_retry(region: int, attempt: int, error: str, detail: str) -> None:
        with lock:
            now = time.monotonic()
            progress[0] = now
            if region not in payloads or region in runs:
                return
            clock.pop(region, None)  # silent again only once its next attempt has started
            task_ids.pop(region, None)  # that attempt has ended: nothing to kill
            count = retried.get(region, (0, ""))[0] + 1
            retried[region] = (count, error)
        log.warning(
            "region %s of epoch %s: attempt %s raised, Spark retries it: %s",
            region,
            epoch,
            attempt,
            error,
            extra={**extra, "region": region},
        )
        log.debug(
            "region %s attempt %s failed:\n%s", region, attempt, detail, extra={**extra, "region": region}
        )

    def on_end(region: int, status: str, value: Any, detail: str) -> None:
        with lock:
            progress[0] = time.monotonic()
            if region not in payloads:
                return
            if status == "finished":
                record(region, RegionRun(region, RegionStatus.FINISHED, result=value))
            else:
                if region not in runs:  # Spark no longer logs it: the task returned normally
                    log.warning(
                        "region %s of epoch %s failed: %s",
                        region,
                        epoch,
                        value,
                        extra={**extra, "region": region},
                    )
                    log.debug("region %s task failed:\n%s", region, detail, extra={**extra, "region": region})
                record(region, RegionRun(region, RegionStatus.FAILED, error=str(value)))

    bind, host = _server_addresses(sc)
    server = _region_server(bind, host, on_start, on_end, on_retry)
    group = _job_group(pipeline, epoch)
    job_error: list[BaseException] = []
    backstop: list[tuple[int, str, Any]] = []
    body = functools.partial(_packed_partition, server.address, server.authkey, max_task_failures(sc), task)

    def submit() -> None:
        sc.setJobGroup(group, f"splitkeeper {pipeline} epoch {epoch}: {len(regions)} regions", True)
        todo = regions
        try:
            for again in (False, True):
                packs = pack_regions(todo, sc.defaultParallelism, per_core)
                with lock:
                    part_of.clear()
                    part_of.update({r: i for i, pack in enumerate(packs) for r in pack})
                    killed_at.clear()
                try:
                    rdd = sc.parallelize([[(r, payloads[r]) for r in pack] for pack in packs], len(packs))
                    backstop.extend(rdd.mapPartitions(body).collect())
                    return
                except BaseException as err:  # a failed or cancelled job
                    with lock:
                        index = _failed_task_index(err)
                        culprit = (
                            None
                            if again or stopping.is_set() or index is None or index >= len(packs)
                            else _running_region(packs[index], started, runs)
                        )
                        if culprit is None:
                            job_error.append(err)
                            return
                        # One task failed the job (a Python worker killed where Spark gives a task
                        # one attempt): the region it was running fails; the regions the abort took
                        # down with it run again in a second job (each attempt stages apart, as
                        # Spark's retry).
                        record(culprit, RegionRun(culprit, RegionStatus.FAILED, error=_task_failure(err)))
                        todo = [r for r in todo if r not in runs]
                    if not todo:
                        return
                    log.warning(
                        "epoch %s job failed in region %s's task (%s); running regions %s again",
                        epoch,
                        culprit,
                        _task_failure(err),
                        todo,
                        extra=extra,
                    )
        finally:
            changed.set()

    job = threading.Thread(target=submit, name=f"splitkeeper-epoch-{epoch}-job", daemon=True)
    try:
        job.start()
        while True:
            if interrupt is not None and interrupt.is_set():
                _abandon(sc, pipeline, epoch, group, job, stopping, lock, runs, regions)
            with lock:
                if len(runs) == len(regions):
                    break
                job_ended = not job.is_alive()
                now = time.monotonic()
                expired: list[tuple[int, str]] = []
                for region in regions:
                    if region in runs:
                        continue
                    why = ""
                    if region in clock:
                        if now - clock[region] > timeout_s:
                            why = f"no result within {timeout_s:g}s"
                    elif now - max(progress[0], killed_at.get(part_of.get(region, -1), 0.0)) > timeout_s:
                        why = f"its task did not start within {timeout_s:g}s (epoch deadline)"
                    if why and region in retried:
                        count, error = retried[region]
                        why += f" after {count} attempt{'s' if count > 1 else ''} that raised (last: {error})"
                    if why:
                        expired.append((region, why))
                for region, why in expired:
                    record(region, RegionRun(region, RegionStatus.TIMED_OUT, error=why))
                kill = [(r, task_ids[r]) for r, _why in expired if r in task_ids]
                for region, _task_id in kill:  # the regions packed behind it start in the task's retry
                    killed_at[part_of.get(region, -1)] = now
            for region, why in expired:
                log.warning(
                    "region %s of epoch %s timed out: %s; killing its task",
                    region,
                    epoch,
                    why,
                    extra={**extra, "region": region},
                )
            for region, task_id in kill:
                _kill_task(sc, task_id, f"splitkeeper: region {region} of epoch {epoch} timed out")
            if job_ended:
                _settle(job_error, backstop, regions, runs, lock, epoch, extra)
                break
            changed.wait(poll_s)
            changed.clear()
        # Every region has an outcome. The tasks that reported are returning, a killed attempt's
        # retry is refused at its start: the job ends on its own in a moment. What is still running
        # after JOB_GRACE_S (a killed worker slow to die) is cancelled with the job group.
        job.join(timeout=JOB_GRACE_S)
        if job.is_alive():
            sc.cancelJobGroup(group)
            job.join(timeout=WIND_DOWN_S)
    finally:
        stopping.set()
        server.close()
    end = time.monotonic()
    out: dict[int, RegionRun] = {}
    for region, run in runs.items():
        began = started.get(region)
        out[region] = RegionRun(
            run.region_id,
            run.status,
            run.result,
            run.error,
            None if began is None else round(began - epoch_start, 3),
            round(end - epoch_start, 3),
        )
    return dict(sorted(out.items()))


def _settle(
    job_error: list[BaseException],
    backstop: list[tuple[int, str, Any]],
    regions: list[int],
    runs: dict[int, RegionRun],
    lock: threading.Lock,
    epoch: int,
    extra: dict[str, Any],
) -> None:
    """The job ended: the regions it reported in its result but whose messages were still in flight
    take that result; a job that failed as a whole fails every region that has not reported."""
    with lock:
        for region, status, value in backstop:
            if region in runs or status == "refused":
                continue
            if status == "finished":
                runs[region] = RegionRun(region, RegionStatus.FINISHED, result=value)
            else:
                runs[region] = RegionRun(region, RegionStatus.FAILED, error=str(value))
        missing = [r for r in regions if r not in runs]
        if not missing:
            return
        why = _short_error(job_error[0]) if job_error else "the epoch's job ended without its result"
        log.warning("epoch %s job failed (%s): regions %s fail", epoch, why, missing, extra=extra)
        if job_error:
            log.debug("epoch %s job failed: %s", epoch, "".join(traceback.format_exception(job_error[0])))
        for region in missing:
            runs[region] = RegionRun(region, RegionStatus.FAILED, error=why)


_FAILED_TASK = re.compile(r"Task (\d+) in stage \d+\.\d+ failed \d+ times?")


_MOST_RECENT = re.compile(r"most recent failure: Lost task [^\n]*?\(TID \d+\)(?: \([^)]*\))?: ([^\n]+)")


def _task_failure(err: BaseException) -> str:
    """Why the task that aborted the job failed (Spark's ``most recent failure: Lost task ...``,
    e.g. ``Python worker exited unexpectedly``), else :func:`_short_error`."""
    matched = _MOST_RECENT.search(str(err))
    return clip(matched.group(1).strip(), 500) if matched else _short_error(err)


def _running_region(
    pack: list[int], started: Mapping[int, float], runs: Mapping[int, RegionRun]
) -> int | None:
    """The region of ``pack`` (a failed task's partition) that was running when the task died: the
    one that started and has no outcome; else (it died before its first region's start message)
    the first without an outcome; None when every region of it has one."""
    pending = [r for r in pack if r not in runs]
    running = [r for r in pending if r in started]
    return running[-1] if running else (pending[0] if pending else None)


def _failed_task_index(err: BaseException) -> int | None:
    """The partition whose task aborted the job (``Task 1 in stage 3.0 failed 1 times``), if named."""
    matched = _FAILED_TASK.search(str(err))
    return None if matched is None else int(matched.group(1))


def _kill_task(sc: Any, task_id: int, reason: str) -> None:
    """Kill one task attempt (its core is freed; Spark reschedules it, and the new attempt is
    refused at its start). A task already ended is left alone."""
    try:
        sc._jsc.sc().killTaskAttempt(task_id, True, reason)
    except Exception as err:  # the JVM refused: the task stays until the job group is cancelled
        log.warning("could not kill task %s: %s", task_id, err)


def _abandon(
    sc: Any,
    pipeline: str,
    epoch: int,
    group: str,
    job: threading.Thread,
    stopping: threading.Event,
    lock: threading.Lock,
    runs: Mapping[int, RegionRun],
    regions: list[int],
) -> None:
    """Refuse every task still to start, cancel the epoch's job and raise EpochAbandoned once it
    wound down."""
    stopping.set()
    with lock:
        running = [r for r in regions if r not in runs]
    log.warning("epoch %s abandoned: cancelling its job (regions %s)", epoch, running, extra={"epoch": epoch})
    sc.cancelJobGroup(group)
    job.join(timeout=ABANDON_WAIT_S)
    raise EpochAbandoned(
        f"epoch {epoch} of pipeline {pipeline!r} was abandoned in its read phase: a stop was requested",
        epoch=epoch,
    )
