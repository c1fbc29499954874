"""Long-lived region readers: one Spark job whose tasks serve the regions of many epochs.

``readers: long_lived`` (:class:`~splitkeeper.spark.runner.LongLivedRegionRunner`). Where
:func:`~splitkeeper.spark.regions.run_regions` starts a Spark job per epoch, a :class:`ReaderPool`
starts one job for the run (in a background thread, its own job group) whose tasks stay: each task
(a *reader slot*) opens one connection to the pool's socket server, kept for the run, says hello
with its slot, task attempt id and Python worker pid, and then loops: receive ``("run", epoch,
region, payload)``, run the region task (:func:`~splitkeeper.spark.task.region_task`), send
``("finished", epoch, region, result)`` or ``("failed", epoch, region, error, traceback)``, wait
for the next. Every message, both ways, is framed and signed as the per-epoch server's are
(:func:`~splitkeeper.spark.regions._frame` / ``_unframe``, HMAC-SHA256 under a random key per
run). The epoch barrier replaces the job launch; the protocol does not change: the driver still
writes the epoch's plan ahead, collects one outcome per region, and commits the epoch and the
checkpoint as with a job per epoch. A slot keeps the source clients its regions' reads hand
back (:func:`splitkeeper.clients.kept_clients`: a Kafka consumer stays connected from one epoch
to the next; a failed read closes its client) and closes them when it stops.

A continuous run starts the pool's job when it opens (:meth:`ReaderPool.prepare`, from
:meth:`~splitkeeper.core.ports.RegionRunner.prepare`): each slot, once it said hello, is sent
``("warm", payload)`` and runs the pool's ``warm`` function (the reader's client for its regions'
splits, kept by the slot; :func:`~splitkeeper.spark.task.warm_task`), answers ``("warmed", ...)``
or ``("warm_failed", ...)``, and is busy until then; the regions it warmed for go to it first. A
failed warm-up is logged and changes nothing else (the first read pays the set-up, or fails as it
would have).

The pool keeps ``min(regions to read, slots)`` slots, ``slots`` being the Spark conf
:data:`SLOTS_CONF` (default ``sc.defaultParallelism``, every core): a slot holds a task slot (a
core) for the run, so a session that runs other jobs too (a Structured Streaming query beside the
pipeline) gives the readers fewer. An epoch's regions queue for the free slots; a region goes back
to the slot that served it last when that slot is free (a Kafka reader keeps its consumer warm),
else to any free slot.

Isolation, as in :mod:`splitkeeper.spark.regions`:

* A region whose task raises is FAILED for this epoch alone; the task catches the error, reports
  it, and serves the next epoch (a ``flaky`` fault therefore declines once: the task's attempt is
  the slot's, not the region's).
* A region still running ``timeout_s`` after it was sent to its slot, or not sent while no slot
  was free for ``timeout_s`` (the epoch deadline), is TIMED_OUT. The slot's task attempt is killed
  (``SparkContext.killTaskAttempt``); Spark reschedules a killed task, and the new attempt says
  hello for the same slot and serves the next region. Whatever the killed attempt reports later
  is ignored (its staged output is never committed).
* A slot whose connection drops while it runs a region (its Python worker killed) fails that
  region: at once when the slot's job failed naming the slot's task, or after
  :data:`LOST_GRACE_S` while the job goes on (Spark retries the task where it allows attempts).
  Where Spark gives a task one attempt (``local[N]``) the whole job fails: the regions the abort
  took down with it run again, once, on the slots of a replacement job.
* A job that ended (failed, cancelled) is replaced by a new one for its slots when an epoch next
  needs them.

:meth:`ReaderPool.close` (the run's end, a stop, an error) sends every slot ``stop``, closes the
connections and cancels the pool's job groups.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import itertools
import logging
import os
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from splitkeeper import clients
from splitkeeper.errors import EpochAbandoned
from splitkeeper.spark.regions import (
    _LOG_TRACEBACK_CHARS,
    SOCKET_TIMEOUT_S,
    RegionRun,
    RegionStatus,
    SignedServer,
    _failed_task_index,
    _frame,
    _kill_task,
    _server_addresses,
    _task_error,
    _task_failure,
    _unframe,
    lighten_worker_imports,
)

log = logging.getLogger("splitkeeper.spark.readers")

#: The Spark conf that caps the reader slots (task slots held for the run; a session's conf, read
#: when the pool starts: a continuous run's open, else its first epoch that reads); default every core.
SLOTS_CONF = "spark.splitkeeper.readers.slots"
#: How long a region whose slot's connection dropped waits for the slot's job to say why.
LOST_GRACE_S = 2.0
#: How long :meth:`ReaderPool.close` waits for the pool's jobs to end.
CLOSE_WAIT_S = 10.0

Slot = tuple[int, int]  # (the pool's job number, the task's partition)
#: What a slot that warms up is busy with (no epoch or region has this id).
WARMING = (-1, -1)


# --------------------------------------------------------------------------- the task side


def _reader_partition(
    address: tuple[str, int],
    authkey: bytes,
    job: int,
    task: Callable[[Any], Any],
    warm: Callable[[Any], Any] | None,
    items: Iterator[int],
) -> Iterator[tuple[int, int]]:
    """The body of a reader slot's task: serve regions until the driver says stop or goes away."""
    from pyspark import TaskContext

    lighten_worker_imports()
    # import what the region task needs before saying hello: a fresh worker's imports (seconds on a
    # busy host) are not counted in the first region's timeout (a function shipped by value may name
    # a module the worker does not have)
    with contextlib.suppress(ImportError):
        importlib.import_module(getattr(task, "__module__", None) or "splitkeeper.spark.task")
    context = TaskContext.get()
    index = next(iter(items), 0)
    attempt = context.attemptNumber() if context is not None else 0
    task_id = context.taskAttemptId() if context is not None else -1
    sock = socket.create_connection(address, timeout=SOCKET_TIMEOUT_S)
    with sock, clients.kept_clients():  # a source's client stays open from one region to the next
        sock.sendall(_frame(authkey, ("hello", job, index, attempt, task_id, os.getpid())))
        sock.settimeout(None)  # the next epoch may be a while
        while True:
            try:
                message = _unframe(authkey, sock)
            except (EOFError, OSError):
                break  # the driver closed the run
            if message[0] == "warm" and warm is not None:
                try:
                    reply_warm: tuple[Any, ...] = ("warmed", WARMING[0], WARMING[1], warm(message[1]))
                except Exception as err:
                    detail = traceback.format_exc()[-_LOG_TRACEBACK_CHARS:]
                    reply_warm = ("warm_failed", WARMING[0], WARMING[1], _task_error(err), detail)
                sock.sendall(_frame(authkey, reply_warm))
                continue
            if message[0] != "run":
                break
            _kind, epoch, region, payload = message
            try:
                reply: tuple[Any, ...] = ("finished", epoch, region, task(payload))
            except Exception as err:
                detail = traceback.format_exc()[-_LOG_TRACEBACK_CHARS:]
                reply = ("failed", epoch, region, _task_error(err), detail)
            sock.sendall(_frame(authkey, reply))
    yield job, index


# --------------------------------------------------------------------------- the driver side


@dataclass(eq=False)
class _Worker:
    slot: Slot
    sock: socket.socket
    task_id: int
    pid: int
    alive: bool = True
    busy: tuple[int, int] | None = None  # (epoch, region) it runs
    lost_at: float | None = None


@dataclass(eq=False)
class _Job:
    number: int
    slots: int
    group: str
    thread: threading.Thread | None = None
    error: BaseException | None = None
    ended: bool = False
    hellos: int = 0
    started_at: float = field(default_factory=time.monotonic)


class ReaderPool:
    """The run's reader slots: their socket server, their Spark jobs, and each epoch's dispatch."""

    def __init__(
        self,
        spark: Any,
        pipeline: str,
        task: Callable[[Any], Any],
        poll_s: float = 0.02,
        warm: Callable[[Any], Any] | None = None,
    ) -> None:
        self.sc = spark.sparkContext
        self.pipeline = pipeline
        self.task = task
        self.warm = warm  # a slot's warm-up (a payload of prepare()), run before its first region
        self._warm_groups: list[tuple[list[int], Any]] = []  # (regions, warm payload) per slot to come
        self.warmed: dict[Slot, float | str] = {}  # each slot's warm-up: its seconds, or its error
        self.poll_s = poll_s
        self.cap = max(1, int(spark.conf.get(SLOTS_CONF, None) or self.sc.defaultParallelism))
        self._lock = threading.Lock()
        self._changed = threading.Event()
        self._workers: dict[Slot, _Worker] = {}
        self._jobs: dict[int, _Job] = {}
        self._numbers = itertools.count(1)
        self._results: dict[tuple[int, int], tuple[str, Any, str]] = {}
        self._last_slot: dict[int, Slot] = {}
        self._closed = False
        self._stirred = time.monotonic()  # when a job last started or a slot last said hello
        self._start_failure: tuple[float, BaseException] | None = None  # a job that failed before any hello
        pool = self

        def serve(sock: socket.socket, authkey: bytes) -> None:
            try:
                hello = _unframe(authkey, sock)
                if hello[0] != "hello":
                    return
                _kind, job, index, _attempt, task_id, pid = hello
            except Exception:  # a stranger, a reset connection
                log.debug("reader server: a hello failed: %s", traceback.format_exc())
                return
            sock.settimeout(None)
            worker = pool._register((job, index), sock, task_id, pid)
            if worker is None:
                return
            pool._send_warm(worker)
            try:
                while True:
                    pool._on_message(worker, _unframe(authkey, sock))
            except Exception:  # EOF: the task ended or its worker died
                log.debug("reader server: slot %s gone: %s", worker.slot, traceback.format_exc(limit=1))
            pool._on_lost(worker)

        bind, host = _server_addresses(self.sc)
        self._server = SignedServer(bind, host, serve, name="splitkeeper-reader-server", concurrent=True)
        self.authkey = self._server.authkey
        self.address: tuple[str, int] = self._server.address

    # -- the server's threads --

    def _register(self, slot: Slot, sock: socket.socket, task_id: int, pid: int) -> _Worker | None:
        with self._lock:
            job = self._jobs.get(slot[0])
            if self._closed or job is None or job.ended:
                sock.close()
                return None
            old = self._workers.get(slot)
            if old is not None and old.alive:
                old.alive = False
                old.lost_at = time.monotonic()
            worker = _Worker(slot, sock, task_id, pid)
            self._workers[slot] = worker
            job.hellos += 1
            self._stirred = time.monotonic()
            log.info("reader slot %s ready (task %s, pid %s)", slot, task_id, pid)
            self._changed.set()
            return worker

    def _send_warm(self, worker: _Worker) -> None:
        """Send a slot that just said hello the next warm-up of :meth:`prepare`, if one is left: it is
        busy (:data:`WARMING`) until it answers, and its regions go to it first."""
        with self._lock:
            if self.warm is None or not self._warm_groups or not worker.alive or worker.busy is not None:
                return
            regions, payload = self._warm_groups.pop(0)
            worker.busy = WARMING
            for region in regions:
                self._last_slot.setdefault(region, worker.slot)
        try:
            worker.sock.sendall(_frame(self.authkey, ("warm", payload)))
        except OSError as err:
            log.warning("reader slot %s unreachable for its warm-up: %s", worker.slot, err)
            with self._lock:
                worker.busy = None
                self._changed.set()

    def _on_message(self, worker: _Worker, message: tuple[Any, ...]) -> None:
        with self._lock:
            if not worker.alive or worker.busy is None:
                return  # a killed attempt's late report: never committed
            kind, epoch, region = message[0], message[1], message[2]
            if worker.busy == WARMING and kind in ("warmed", "warm_failed"):
                worker.busy = None
                self.warmed[worker.slot] = message[3]
                if kind == "warmed":
                    log.info("reader slot %s warmed up in %ss", worker.slot, message[3])
                else:
                    log.warning(
                        "reader slot %s could not warm up (its first region pays the set-up): %s",
                        worker.slot,
                        message[3],
                    )
                self._changed.set()
                return
            if worker.busy != (epoch, region):
                return
            worker.busy = None
            detail = message[4] if kind == "failed" else ""
            self._results[(epoch, region)] = (kind, message[3], detail)
            self._changed.set()

    def _on_lost(self, worker: _Worker) -> None:
        with self._lock:
            if worker.alive:
                worker.alive = False
                worker.lost_at = time.monotonic()
            self._changed.set()

    # -- the jobs --

    def _capacity(self) -> int:
        return sum(job.slots for job in self._jobs.values() if not job.ended)

    def _ensure(self, wanted: int) -> None:
        """Start a job for the slots missing to reach ``wanted`` (under the lock)."""
        missing = min(wanted, self.cap) - self._capacity()
        if missing <= 0 or self._closed:
            return
        number = next(self._numbers)
        job = _Job(number, missing, f"splitkeeper-{self.pipeline}-readers-{number}")
        self._jobs[number] = job
        body = functools.partial(_reader_partition, self.address, self.authkey, number, self.task, self.warm)

        def submit() -> None:
            self.sc.setJobGroup(job.group, f"splitkeeper {self.pipeline}: {missing} region readers", True)
            try:
                self.sc.parallelize(range(missing), missing).mapPartitions(body).collect()
            except BaseException as err:  # a failed or cancelled job
                job.error = err
            finally:
                with self._lock:
                    job.ended = True
                    if job.error is not None and job.hellos == 0:
                        self._start_failure = (time.monotonic(), job.error)
                    for slot, worker in self._workers.items():
                        if slot[0] == number and worker.alive:
                            worker.alive = False
                            worker.lost_at = time.monotonic()
                    self._changed.set()
                if job.error is not None and not self._closed:
                    log.warning("reader job %s ended: %s", number, _task_failure(job.error))

        self._stirred = time.monotonic()
        log.info("starting reader job %s: %s slots", number, missing)
        job.thread = threading.Thread(target=submit, name=f"splitkeeper-readers-{number}", daemon=True)
        job.thread.start()

    def prepare(self, regions: Sequence[int], payload_of: Callable[[Sequence[int]], Any]) -> None:
        """Start the slots for ``regions`` now, before any epoch needs them, and warm each one up as
        it says hello: the slot runs ``warm(payload_of(its regions))`` (a slot serves ``regions``
        dealt round-robin over ``min(len(regions), cap)`` slots) and those regions go to it first.
        Returns at once; an epoch that starts meanwhile waits for a warming slot as for a busy one."""
        if not regions or self.warm is None:
            return
        with self._lock:
            if self._closed:
                return
            slots = min(len(regions), self.cap)
            ordered = sorted(regions)
            self._warm_groups = [(ordered[i::slots], payload_of(ordered[i::slots])) for i in range(slots)]
            self._ensure(slots)

    # -- an epoch --

    def run_epoch(
        self,
        epoch: int,
        payloads: Mapping[int, Any],
        timeout_s: float,
        *,
        interrupt: threading.Event | None = None,
    ) -> dict[int, RegionRun]:
        """Send every region of ``payloads`` to a slot, collect each one's outcome (see the module doc)."""
        if not payloads:
            return {}
        regions = sorted(payloads)
        pending = list(regions)
        running: dict[int, tuple[_Worker, float]] = {}
        runs: dict[int, RegionRun] = {}
        started: dict[int, float] = {}
        retried: set[int] = set()
        epoch_start = time.monotonic()
        progress = epoch_start
        extra = {"epoch": epoch, "checkpoint_id": epoch}
        with self._lock:
            self._results = {k: v for k, v in self._results.items() if k[0] >= epoch}
        while len(runs) < len(regions):
            if interrupt is not None and interrupt.is_set():
                log.warning("epoch %s abandoned in its read phase (regions %s)", epoch, sorted(running))
                raise EpochAbandoned(
                    f"epoch {epoch} of pipeline {self.pipeline!r} was abandoned in its read phase: a stop "
                    "was requested",
                    epoch=epoch,
                )
            kill: list[tuple[int, _Worker, str]] = []
            with self._lock:
                now = time.monotonic()
                failure = self._start_failure
                no_new_failure = failure is None or failure[0] < epoch_start
                if pending and not no_new_failure and not any(w.alive for w in self._workers.values()):
                    # the reader job failed before any task started (a task that cannot be
                    # unpickled, no Python): the regions still queued fail; the next epoch tries anew
                    assert failure is not None
                    why = f"the reader job failed before its tasks started: {_task_failure(failure[1])}"
                    log.warning("epoch %s: %s; regions %s fail", epoch, why, pending, extra=extra)
                    for region in pending:
                        runs[region] = RegionRun(region, RegionStatus.FAILED, error=why)
                    pending = []
                if pending:
                    self._ensure(len(pending) + len(running))
                progress = max(progress, self._stirred)
                for region in list(running):
                    worker, began = running[region]
                    result = self._results.pop((epoch, region), None)
                    if result is not None:
                        kind, value, detail = result
                        del running[region]
                        progress = now
                        if kind == "finished":
                            runs[region] = RegionRun(region, RegionStatus.FINISHED, result=value)
                        else:
                            log.warning(
                                "region %s of epoch %s failed: %s",
                                region,
                                epoch,
                                value,
                                extra={**extra, "region": region},
                            )
                            log.debug("region %s task failed:\n%s", region, detail, extra=extra)
                            runs[region] = RegionRun(region, RegionStatus.FAILED, error=str(value))
                    elif not worker.alive and worker.lost_at is not None:
                        why = self._lost_verdict(worker, region, retried, now)
                        if why == "again":
                            del running[region]
                            retried.add(region)
                            pending.insert(0, region)
                            log.warning(
                                "region %s of epoch %s: its reader's job failed in another slot; "
                                "running it again",
                                region,
                                epoch,
                                extra=extra,
                            )
                        elif why:
                            del running[region]
                            progress = now
                            log.warning("region %s of epoch %s failed: %s", region, epoch, why, extra=extra)
                            runs[region] = RegionRun(region, RegionStatus.FAILED, error=why)
                    elif now - began > timeout_s:
                        del running[region]
                        worker.alive = False
                        worker.lost_at = now
                        why = f"no result within {timeout_s:g}s"
                        runs[region] = RegionRun(region, RegionStatus.TIMED_OUT, error=why)
                        kill.append((region, worker, why))
                idle = [w for w in self._workers.values() if w.alive and w.busy is None]
                if pending and not idle and now - progress > timeout_s:
                    for region in pending:
                        why = f"no reader slot was free within {timeout_s:g}s (epoch deadline)"
                        runs[region] = RegionRun(region, RegionStatus.TIMED_OUT, error=why)
                    pending = []
                for region, worker in self._assign(pending, idle):
                    try:
                        worker.sock.sendall(_frame(self.authkey, ("run", epoch, region, payloads[region])))
                    except OSError as err:
                        log.warning(
                            "reader slot %s unreachable (%s); region %s waits", worker.slot, err, region
                        )
                        worker.alive = False
                        worker.lost_at = time.monotonic()
                        continue
                    pending.remove(region)
                    worker.busy = (epoch, region)
                    self._last_slot[region] = worker.slot
                    now = time.monotonic()
                    started.setdefault(region, now)
                    running[region] = (worker, now)
                    progress = now
            for region, worker, why in kill:
                log.warning(
                    "region %s of epoch %s timed out: %s; killing its reader task %s",
                    region,
                    epoch,
                    why,
                    worker.task_id,
                    extra={**extra, "region": region},
                )
                _kill_task(
                    self.sc, worker.task_id, f"splitkeeper: region {region} of epoch {epoch} timed out"
                )
            if len(runs) < len(regions):
                self._changed.wait(self.poll_s)
                self._changed.clear()
        end = time.monotonic()
        out: dict[int, RegionRun] = {}
        for region, run in runs.items():
            first = started.get(region)
            out[region] = RegionRun(
                region,
                run.status,
                run.result,
                run.error,
                None if first is None else round(first - epoch_start, 3),
                round(end - epoch_start, 3),
            )
        return dict(sorted(out.items()))

    def _assign(self, pending: list[int], idle: list[_Worker]) -> list[tuple[int, _Worker]]:
        """Pair queued regions with free slots: a region's last slot first, then in order."""
        free = {w.slot: w for w in idle}
        pairs: list[tuple[int, _Worker]] = []
        for region in pending:
            slot = self._last_slot.get(region)
            if slot is not None and slot in free:
                pairs.append((region, free.pop(slot)))
        taken = {r for r, _w in pairs}
        rest = [r for r in pending if r not in taken]
        for region, worker in zip(rest, list(free.values()), strict=False):
            pairs.append((region, worker))
        return pairs

    def _lost_verdict(self, worker: _Worker, region: int, retried: set[int], now: float) -> str:
        """A region whose slot's connection dropped: ``'again'`` (an abort took it down with another
        slot's task: run it once more), the error that fails it, or ``''`` (wait for the job)."""
        job = self._jobs.get(worker.slot[0])
        if job is not None and job.ended:
            if job.error is None:
                return "its reader task ended"
            index = _failed_task_index(job.error)
            if index is not None and index != worker.slot[1] and region not in retried:
                return "again"
            return _task_failure(job.error)
        assert worker.lost_at is not None
        if now - worker.lost_at > LOST_GRACE_S:
            return "its reader's Python worker exited (the connection to it dropped)"
        return ""

    def close(self) -> None:
        """Stop every slot and the pool's jobs; close the server. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            workers = list(self._workers.values())
            jobs = [j for j in self._jobs.values() if not j.ended]
        for worker in workers:
            with contextlib.suppress(OSError):
                worker.sock.sendall(_frame(self.authkey, ("stop",)))
            with contextlib.suppress(OSError):
                worker.sock.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + CLOSE_WAIT_S
        for job in jobs:
            if job.thread is not None:
                job.thread.join(timeout=max(0.0, min(2.0, deadline - time.monotonic())))
            if job.thread is not None and job.thread.is_alive():
                self.sc.cancelJobGroup(job.group)
                job.thread.join(timeout=max(0.0, deadline - time.monotonic()))
        for worker in workers:
            with contextlib.suppress(OSError):
                worker.sock.close()
        self._server.close()
