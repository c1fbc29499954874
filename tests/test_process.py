"""splitkeeper.process: the one reader of /proc/<pid>/stat, process identity, ports, graceful stop.

Linux only (the readers return None elsewhere); no Spark, no broker.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from splitkeeper import process

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")

SLEEPER = "import time; print('ready', flush=True); time.sleep(60)"
DEAF_SLEEPER = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
    "time.sleep(60)"
)


def _start(code: str, executable: str = sys.executable) -> subprocess.Popen[str]:
    child = subprocess.Popen([executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    return child


def test_stat_of_this_process_matches_what_the_os_and_psutil_say() -> None:
    found = process.stat(os.getpid())
    assert found is not None
    assert (found.ppid, found.pgid, found.zombie) == (os.getppid(), os.getpgid(0), False)
    # psutil derives its create time from the same field 22: boot time + ticks / CLK_TCK
    started = psutil.boot_time() + found.start_ticks / os.sysconf("SC_CLK_TCK")
    assert abs(started - psutil.Process().create_time()) < 1.0


def test_a_command_name_with_spaces_and_parentheses_is_parsed(tmp_path: Path) -> None:
    odd = tmp_path / "a) Z 1 (b"  # the kernel's comm is the executable's name
    shutil.copy2(sys.executable, odd)
    child = _start(SLEEPER, str(odd))
    try:
        found = process.stat(child.pid)
        assert found is not None and found.state in ("R", "S") and found.ppid == os.getpid()
        assert process.argv(child.pid) == [str(odd), "-c", SLEEPER]
    finally:
        child.kill()
        child.wait()


def test_a_zombie_is_listed_as_one_and_a_reaped_pid_is_gone() -> None:
    child = _start(SLEEPER)
    started = process.stat(child.pid)
    os.kill(child.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while (found := process.stat(child.pid)) is not None and not found.zombie:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert found is not None and started is not None and found.start_ticks == started.start_ticks
    assert child.pid in dict(process.processes())
    child.wait()
    assert process.stat(child.pid) is None and process.argv(child.pid) == []
    assert process.identity(child.pid) is None


def test_identity_is_boot_pid_namespace_and_start_ticks() -> None:
    child = _start(SLEEPER)
    try:
        identity = process.identity(child.pid)
        found = process.stat(child.pid)
        assert identity is not None and found is not None
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        assert identity == f"{boot}/{os.readlink('/proc/self/ns/pid')}/{found.start_ticks}"
        assert identity == f"{process.namespace()}/{found.start_ticks}"
    finally:
        child.kill()
        child.wait()


def test_a_port_someone_listens_on_is_not_free_and_free_ports_are_distinct() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        taken = sock.getsockname()[1]
        assert not process.port_is_free("127.0.0.1", taken)
    assert process.port_is_free("127.0.0.1", taken)
    ports = process.free_ports("127.0.0.1", 20)
    assert len(set(ports)) == 20 and all(process.port_is_free("127.0.0.1", p) for p in ports)
    assert process.port_is_free("127.0.0.1", process.free_port("127.0.0.1"))


def test_stop_ends_on_sigterm_when_that_suffices() -> None:
    child = _start(SLEEPER)
    t0 = time.monotonic()
    assert process.stop(child.send_signal, lambda: child.poll() is None, timeout_s=10) is False
    assert child.returncode == -signal.SIGTERM and time.monotonic() - t0 < 5


def test_stop_sends_sigkill_after_the_timeout_when_sigterm_is_ignored() -> None:
    child = _start(DEAF_SLEEPER)
    sent: list[signal.Signals] = []

    def send(sig: signal.Signals) -> None:
        sent.append(sig)
        os.kill(child.pid, sig)

    t0 = time.monotonic()
    assert process.stop(send, lambda: child.poll() is None, timeout_s=0.5) is True
    assert sent == [signal.SIGTERM, signal.SIGKILL]
    assert child.returncode == -signal.SIGKILL and 0.5 <= time.monotonic() - t0 < 5


def test_stop_of_something_already_gone_ignores_the_lookup_error() -> None:
    def send(sig: signal.Signals) -> None:
        raise ProcessLookupError

    assert process.stop(send, lambda: False, timeout_s=1) is False


def test_environ_value_reads_a_variable_of_another_process_as_it_started() -> None:
    import os
    import subprocess

    child = subprocess.Popen(["sleep", "30"], env={**os.environ, "SPLITKEEPER_PROBE_VAR": "a=b c"})
    try:
        # Popen returns once the child's exec is past its point of no return, a moment before the
        # kernel lays out the new environment: until then /proc/<pid>/environ reads empty
        deadline = time.monotonic() + 10
        while process.environ_value(child.pid, "PATH") is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert process.environ_value(child.pid, "SPLITKEEPER_PROBE_VAR") == "a=b c"
        assert process.environ_value(child.pid, "SPLITKEEPER_PROBE") is None  # a prefix is not a name
        assert process.environ_value(child.pid, "SPLITKEEPER_NOT_SET_ANYWHERE") is None
    finally:
        child.kill()
        child.wait()
    assert process.environ_value(child.pid, "SPLITKEEPER_PROBE_VAR") is None  # gone
