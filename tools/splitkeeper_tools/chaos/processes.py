"""The processes of a chaos run: ``python -m splitkeeper`` children, and the process tree under them.

- :func:`run_splitkeeper` runs one command in a child process (its own driver and JVM),
  echoes its progress, calls back on every epoch line while it runs, and returns a
  :class:`RunOutcome` (exit status, epoch lines, the crash it reported, its output).
- :func:`pyspark_workers` finds the Python workers of a driver: its JVM's (local Spark) or its
  executors' (``--profile cluster``: children of the Spark workers, not of the driver)
  ``pyspark.daemon`` and the workers forked from it, told apart from other drivers' by the
  :data:`DRIVER_TAG_ENV` each driver carries and hands its executors; :func:`in_sleep` tells
  whether one sleeps (a region task's injected stall). Linux ``/proc`` only.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from splitkeeper import process, resources

RUN_TIMEOUT_S = 1200.0
#: Each driver of a chaos run gets a value of its own (its environment; with ``--profile cluster``
#: also ``spark.executorEnv``): its processes, and its executors' on the Spark workers, carry it.
DRIVER_TAG_ENV = "SPLITKEEPER_CHAOS_DRIVER"

# the progress line of an epoch (splitkeeper.core.driver.EpochReport.line):
# "epoch    7 regional 3/4 regions ack (r1 decline) committed ..."
_EPOCH_LINE = re.compile(
    r"^epoch\s+(\d+)\s+(global|regional|aborted)\s+(\d+)/(\d+) regions ack(?: \(([^)]*)\))?"
)
_FAILED_REGION = re.compile(r"r(\d+) (decline|timeout)")
_CRASH_LINE = re.compile(r"crash injected at ([a-z_]+) of epoch (\d+)")
_ECHO = re.compile(r"^(epoch |splitkeeper( \w+)?: |restored from )")  # progress, crash and CLI error lines


def say(text: str) -> None:
    """A progress line on stderr."""
    print(f"[chaos {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


@dataclass(frozen=True, slots=True)
class EpochLine:
    epoch: int
    kind: str  # global, regional, aborted
    regions: int  # the parallelism it ran at
    failed: dict[int, str]  # region -> decline / timeout

    @property
    def completed(self) -> bool:
        return self.kind != "aborted"


def parse_epoch_line(line: str) -> EpochLine | None:
    m = _EPOCH_LINE.match(line)
    if m is None:
        return None
    failed = {int(r): how for r, how in _FAILED_REGION.findall(m.group(5) or "")}
    return EpochLine(int(m.group(1)), m.group(2), int(m.group(4)), failed)


@dataclass
class RunOutcome:
    """What one ``splitkeeper`` child did."""

    label: str
    argv: list[str]
    pid: int = 0
    returncode: int | None = None
    epochs: list[EpochLine] = field(default_factory=list)
    crash: tuple[str, int] | None = None  # (point, epoch) from its "crash injected" line
    stdout: str = ""
    stderr: str = ""
    elapsed_s: float = 0.0
    ended_at: float = 0.0  # time.monotonic() when it exited

    @property
    def killed(self) -> bool:
        return self.returncode == -9

    def epoch(self, epoch_id: int) -> EpochLine | None:
        return next((e for e in self.epochs if e.epoch == epoch_id), None)

    def to_json(self) -> dict[str, object]:
        return {
            "run": self.label,
            "argv": self.argv[:1],
            "exit": self.returncode,
            "epochs": [e.epoch for e in self.epochs],
            "crash": None if self.crash is None else f"{self.crash[0]}@{self.crash[1]}",
            "elapsed_s": self.elapsed_s,
        }


OnEpoch = Callable[[EpochLine, "subprocess.Popen[str]"], None]


def run_splitkeeper(
    label: str,
    argv: Sequence[str],
    *,
    cwd: Path,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    on_epoch: OnEpoch | None = None,
    hidden_env: Mapping[str, str] | None = None,
) -> RunOutcome:
    """Run ``python -m splitkeeper <argv>`` in a child process and wait for it.

    The child inherits this environment minus ``SPLITKEEPER_CRASH_AT``, plus ``hidden_env`` (not
    echoed: it may hold secrets) and ``env`` (echoed with the command), with
    the checkout this ``splitkeeper`` was imported from first on ``PYTHONPATH``
    (:func:`splitkeeper.resources.checkout_root`; it runs the same code as this process,
    whatever the venv installed; an installed splitkeeper is the venv's own). Its progress and error
    lines are echoed; ``on_epoch`` is called on every epoch line, from this thread (keep it
    short: start a thread for anything slow). A child that runs past RUN_TIMEOUT_S is killed.
    """
    child_env = {k: v for k, v in os.environ.items() if k != "SPLITKEEPER_CRASH_AT"}
    # The child runs from the work folder: put the checkout this package came from first on its
    # path, so it runs this code (a checkout or worktree beside an editable install of another one).
    checkout = resources.checkout_root()
    if checkout is not None:
        child_env["PYTHONPATH"] = os.pathsep.join(
            [str(checkout), *(p for p in child_env.get("PYTHONPATH", "").split(os.pathsep) if p)]
        )
    child_env.setdefault("SPLITKEEPER_SPARK_UI", "false")
    child_env["PYSPARK_PYTHON"] = sys.executable
    child_env.update(hidden_env or {})
    child_env.update(env or {})
    cmd = [sys.executable, "-m", "splitkeeper", *argv]
    shown = " ".join(["splitkeeper", *argv]) + "".join(f" {k}={v}" for k, v in (env or {}).items())
    say(f"[{label}] {shown}")
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env, cwd=str(cwd)
    )
    outcome = RunOutcome(label, list(argv), proc.pid)
    out_chunks: list[str] = []

    def read_out() -> None:
        assert proc.stdout is not None
        out_chunks.append(proc.stdout.read())

    reader = threading.Thread(target=read_out, daemon=True)
    reader.start()
    watchdog = threading.Timer(RUN_TIMEOUT_S, proc.kill)  # a hung run is killed, and reported
    watchdog.start()
    err_lines: list[str] = []
    assert proc.stderr is not None
    for raw in proc.stderr:
        line = raw.rstrip("\n")
        err_lines.append(line)
        if _ECHO.match(line):
            say(f"[{label}]   {line[:220]}")
        crash = _CRASH_LINE.search(line)
        if crash is not None:
            outcome.crash = (crash.group(1), int(crash.group(2)))
        parsed = parse_epoch_line(line)
        if parsed is not None:
            outcome.epochs.append(parsed)
            if on_epoch is not None:
                on_epoch(parsed, proc)
    outcome.returncode = proc.wait()
    outcome.ended_at = time.monotonic()
    watchdog.cancel()
    reader.join(timeout=30)
    outcome.stdout = "".join(out_chunks)
    outcome.stderr = "\n".join(err_lines)
    outcome.elapsed_s = round(outcome.ended_at - started, 1)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text(
        f"$ {' '.join(cmd)}\n--- stdout\n{outcome.stdout}\n--- stderr\n{outcome.stderr}\n", encoding="utf-8"
    )
    say(f"[{label}] exit {outcome.returncode} after {outcome.elapsed_s:.0f}s")
    return outcome


# --------------------------------------------------------------------------- the process tree


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process."""
    return {pid: stat.ppid for pid, stat in process.processes()}


def command_line(pid: int) -> str:
    """``pid``'s command line, its arguments joined by spaces ("" when it is gone)."""
    return " ".join(process.argv(pid)).strip()


def descendants(pid: int) -> list[int]:
    parents = _parents()
    children: dict[int, list[int]] = {}
    for child, parent in parents.items():
        children.setdefault(parent, []).append(child)
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _describe(pid: int) -> str:
    """``pid (command)``: the program's name, not its folder (a long checkout path must not hide the
    module); a JVM by its main class (``java org.apache.spark.executor.CoarseGrainedExecutorBackend``)."""
    argv = process.argv(pid)
    if argv:
        argv[0] = os.path.basename(argv[0])
    if argv and argv[0] == "java":
        main = next((a for a in argv[1:] if a.startswith("org.apache.spark.")), None)
        argv = ["java", main] if main else argv[:1]
    return f"{pid} ({' '.join(argv[:4]).strip()[:60]})"


def ancestry(pid: int, stop: int) -> str:
    """``pid (command) <- parent (command) <- ...`` up to ``stop``: how a worker hangs under a driver.

    A worker of an executor on a Spark worker (``--profile cluster``) does not hang under the
    driver: the chain ends at the first process without the driver's :data:`DRIVER_TAG_ENV` (the
    Spark worker that started the executor)."""
    parents = _parents()
    tag = driver_tag(stop)
    hops: list[str] = []
    while pid and pid != stop and len(hops) < 8:
        hops.append(_describe(pid))
        if tag is not None and driver_tag(pid) != tag:
            return " <- ".join(hops)
        pid = parents.get(pid, 0)
    hops.append(f"{stop} (the driver)")
    return " <- ".join(hops)


def driver_tag(pid: int) -> str | None:
    """The :data:`DRIVER_TAG_ENV` in ``pid``'s environment (None: none, or ``pid`` is gone)."""
    return process.environ_value(pid, DRIVER_TAG_ENV)


def pyspark_workers(driver_pid: int) -> list[int]:
    """The Python workers of a driver: processes forked by a ``pyspark.daemon``, or ``pyspark.worker``
    processes a JVM started directly (daemon off); under the driver (local Spark), or carrying its
    :data:`DRIVER_TAG_ENV` (its executors' on the Spark workers)."""
    tree = set(descendants(driver_pid))
    tag = driver_tag(driver_pid)
    parents = _parents()
    commands = {}
    for pid in parents:
        cmd = command_line(pid)
        if "pyspark." in cmd and (pid in tree or (tag is not None and driver_tag(pid) == tag)):
            commands[pid] = cmd
    daemons = {pid for pid, cmd in commands.items() if "pyspark.daemon" in cmd}
    workers = []
    for pid, cmd in commands.items():
        forked = parents.get(pid) in daemons
        direct = "pyspark.worker" in cmd and "pyspark.daemon" not in cmd
        if forked or direct:
            workers.append(pid)
    return sorted(workers)


# clock_nanosleep and nanosleep by machine: what time.sleep calls
_SLEEP_SYSCALLS = {"x86_64": {"230", "35"}, "aarch64": {"115", "101"}}


def in_sleep(pid: int) -> bool:
    """True when ``pid``'s main thread sleeps in ``clock_nanosleep``/``nanosleep`` (``time.sleep``)."""
    try:
        if "nanosleep" in Path(f"/proc/{pid}/wchan").read_text():
            return True
        syscall = Path(f"/proc/{pid}/syscall").read_text().split()
    except OSError:
        return False
    return bool(syscall) and syscall[0] in _SLEEP_SYSCALLS.get(platform.machine(), set())
