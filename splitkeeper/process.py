"""Processes and ports of this host: identity, listing, port probing, graceful stop (Linux ``/proc``).

- :func:`stat` is the one reader of ``/proc/<pid>/stat``; :func:`processes` lists every
  process with it. Off Linux, or for a pid that is gone, they return None or nothing.
- :func:`identity` is ``<boot id>/<pid namespace>/<start time>``: a pid and its start time
  name one process only within one boot and one pid namespace. The pipeline lease records
  it (:mod:`splitkeeper.delta.lease`), so a reused pid is never taken for the holder.
- :func:`port_is_free` and :func:`free_port` probe TCP ports on one host address.
- :func:`stop` sends SIGTERM, waits, then SIGKILL: to a pid, a process group or a set of
  processes, as its caller's ``send`` decides.

Standard library only: the product (the lease) uses it, and psutil offers no start time in
clock ticks, which the lease rows and the local cluster's ``cluster.json`` hold.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

__all__ = [
    "ProcStat",
    "argv",
    "environ_value",
    "free_port",
    "free_ports",
    "identity",
    "namespace",
    "port_is_free",
    "processes",
    "stat",
    "stop",
]


@dataclass(frozen=True, slots=True)
class ProcStat:
    """The fields of ``/proc/<pid>/stat`` that splitkeeper reads (proc(5) numbers them from 1)."""

    state: str  # field 3: R running, S sleeping, Z zombie, ...
    ppid: int  # field 4
    pgid: int  # field 5: the process group
    start_ticks: int  # field 22: start time in clock ticks since boot

    @property
    def zombie(self) -> bool:
        """Exited, not yet reaped by its parent: gone for every purpose but its pid."""
        return self.state == "Z"


def stat(pid: int) -> ProcStat | None:
    """``pid``'s ``/proc/<pid>/stat``, or None when it does not exist (or no ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ")"
    fields = raw[raw.rfind(b")") + 2 :].split()
    if len(fields) < 20:
        return None
    return ProcStat(fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[19]))


def processes() -> Iterator[tuple[int, ProcStat]]:
    """(pid, stat) of every process this one can see; processes that end meanwhile are skipped."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return
    for entry in entries:
        if entry.isdigit():
            found = stat(int(entry))
            if found is not None:
                yield int(entry), found


def argv(pid: int) -> list[str]:
    """``pid``'s command line, one item per argument (``/proc/<pid>/cmdline``); [] when unknown."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            raw = handle.read()
    except OSError:
        return []
    return [arg.decode(errors="replace") for arg in raw.removesuffix(b"\0").split(b"\0")] if raw else []


def environ_value(pid: int, name: str) -> str | None:
    """The value of variable ``name`` in ``pid``'s environment as it started
    (``/proc/<pid>/environ``); None when it has none or ``pid`` cannot be read."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            raw = handle.read()
    except OSError:
        return None
    prefix = f"{name}=".encode()
    for item in raw.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix) :].decode(errors="replace")
    return None


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


def namespace() -> str | None:
    """``<boot id>/<pid namespace>``: where a pid and a start time mean one process; None off Linux."""
    boot = _read_text("/proc/sys/kernel/random/boot_id")
    try:
        pid_ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
    return None if boot is None else f"{boot}/{pid_ns}"


def identity(pid: int) -> str | None:
    """``<boot id>/<pid namespace>/<start time>`` of ``pid`` as this process sees it; None when unknown."""
    where, found = namespace(), stat(pid)
    return None if where is None or found is None else f"{where}/{found.start_ticks}"


def port_is_free(host: str, port: int) -> bool:
    """True when a TCP socket can bind ``host:port`` now (``SO_REUSEADDR``: TIME_WAIT does not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def free_port(host: str) -> int:
    """A TCP port on ``host`` that nothing listens on right now (the kernel's choice)."""
    return free_ports(host, 1)[0]


def free_ports(host: str, count: int) -> list[int]:
    """``count`` distinct free TCP ports on ``host`` (held open together, so none repeats)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(sock)
            sock.bind((host, 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for sock in socks:
            sock.close()


def stop(
    send: Callable[[signal.Signals], object],
    running: Callable[[], bool],
    timeout_s: float,
    *,
    kill_wait_s: float = 10.0,
    poll_s: float = 0.1,
) -> bool:
    """Stop gracefully: ``send(SIGTERM)``, wait up to ``timeout_s`` while ``running()``, then
    ``send(SIGKILL)`` and wait up to ``kill_wait_s`` more.

    ``send`` signals whatever is to stop (a pid, a process group, a set of pids);
    ProcessLookupError from it (gone meanwhile) is ignored. Returns True when SIGKILL was
    sent (what was stopped ignored SIGTERM for ``timeout_s``).
    """
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, kill_wait_s)):
        with contextlib.suppress(ProcessLookupError):
            send(sig)
        deadline = time.monotonic() + wait_s
        while running():
            if time.monotonic() > deadline:
                break
            time.sleep(poll_s)
        else:
            return sig is signal.SIGKILL
    return True
