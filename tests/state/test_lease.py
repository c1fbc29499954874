"""The pipeline lease (splitkeeper.delta.lease): take, refusal, expiry takeover, heartbeat, release.

No Spark."""

from __future__ import annotations

import multiprocessing
import time
from datetime import UTC, datetime, timedelta

import pytest
from deltalake import DeltaTable

from splitkeeper.delta.lease import (
    LeaseHeldError,
    LeaseLostError,
    LeaseOwner,
    PipelineLease,
    held,
)
from splitkeeper.delta.tables import StateTables
from splitkeeper.errors import ConcurrentRunError
from splitkeeper.process import identity as process_identity

from . import workers

RUN_A = LeaseOwner("host-a", 101, "splitkeeper run --config orders.yaml")
RUN_B = LeaseOwner("host-b", 202, "splitkeeper recover --config orders.yaml")


@pytest.fixture
def root(tmp_path) -> str:
    return str(tmp_path / "state")


def _lease(root: str) -> PipelineLease:
    return PipelineLease(StateTables(root), "orders")


def test_a_free_lease_is_taken_and_a_second_run_is_refused_naming_the_holder_and_what_to_do(root):
    first = _lease(root)
    assert first.holder() is None
    taken = first.take(RUN_A, ttl_s=60)
    assert taken.generation == 1 and not taken.released
    with pytest.raises(LeaseHeldError) as err:
        _lease(root).take(RUN_B, ttl_s=60)
    text = str(err.value)
    assert isinstance(err.value, ConcurrentRunError) and err.value.code == "LEASE_HELD"
    assert "pipeline 'orders' is driven by 'splitkeeper run --config orders.yaml' (pid 101 on host-a)" in text
    assert f"since {taken.acquired_at.isoformat(timespec='seconds')}" in text
    assert f"runs until {taken.expires_at.isoformat(timespec='seconds')}" in text
    assert "Wait for that run to finish, or stop it" in text and "taken over after" in text
    holder = _lease(root).holder()
    assert holder is not None and holder.owner == RUN_A and holder.token == taken.token


def test_an_expired_lease_is_taken_over_and_the_old_holder_cannot_heartbeat_any_more(root, caplog):
    old = _lease(root)
    old.take(RUN_A, ttl_s=0.5)
    time.sleep(0.8)  # no heartbeat: the lease expires
    new = _lease(root)
    with caplog.at_level("WARNING", logger="splitkeeper.delta.lease"):
        taken = new.take(RUN_B, ttl_s=60)
    assert "taking over the lease of 'splitkeeper run --config orders.yaml'" in caplog.text
    assert taken.generation == 2 and taken.owner == RUN_B
    version = DeltaTable(f"{root}/lease").version()
    with pytest.raises(LeaseLostError) as err:
        old.heartbeat()
    assert "was taken over by 'splitkeeper recover --config orders.yaml' (pid 202 on host-b)" in str(
        err.value
    )
    assert DeltaTable(f"{root}/lease").version() == version  # the old holder wrote nothing
    assert old.release() is False  # not ours to release
    assert DeltaTable(f"{root}/lease").version() == version
    assert new.heartbeat().expires_at > taken.expires_at


def test_a_holder_killed_on_this_host_is_taken_over_at_once_and_a_live_one_is_not(root, caplog):
    import socket
    import subprocess
    import sys

    here = socket.gethostname()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        running = LeaseOwner(
            here, sleeper.pid, "splitkeeper run --config orders.yaml", process_identity(sleeper.pid)
        )
        assert running.process is not None  # recorded on Linux, and read back from the row
        _lease(root).take(running, ttl_s=600)
        holder = _lease(root).holder()
        assert holder is not None and holder.owner == running
        with pytest.raises(LeaseHeldError):  # alive: refused although it is on this host
            _lease(root).take(RUN_B, ttl_s=60)
    finally:
        sleeper.kill()
        sleeper.wait()
    with caplog.at_level("WARNING", logger="splitkeeper.delta.lease"):
        taken = _lease(root).take(RUN_B, ttl_s=60)  # SIGKILLed: no need to wait 600 s
    assert taken.generation == 2
    assert "is no longer running on this host" in caplog.text
    elsewhere = LeaseOwner("another-host", sleeper.pid, "splitkeeper run")
    assert not elsewhere.gone()  # another host's process cannot be checked: the expiry decides


def test_a_live_pid_in_another_pid_namespace_or_with_another_start_time_is_judged_right(root):
    """Same host name, same pid: only the recorded identity tells a live holder from a dead one."""
    import socket
    import subprocess
    import sys

    here = socket.gethostname()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        identity = process_identity(sleeper.pid)
        assert identity is not None
        boot, namespace, started = identity.rsplit("/", 2)
        alive = LeaseOwner(here, sleeper.pid, "splitkeeper run", identity)
        assert not alive.gone()
        # a container sharing the host name (host networking) but not the pid namespace: a pid
        # seen here says nothing about its process, so only the expiry may free the lease
        other_container = LeaseOwner(here, sleeper.pid + 100_000, "splitkeeper run", f"{boot}/pid:[1]/1")
        assert not other_container.gone()
        _lease(root).take(other_container, ttl_s=600)
        with pytest.raises(LeaseHeldError):
            _lease(root).take(RUN_B, ttl_s=60)
        # the pid now names another process than the holder's (reused after the holder died)
        reused = LeaseOwner(here, sleeper.pid, "splitkeeper run", f"{boot}/{namespace}/{int(started) - 1}")
        assert reused.gone()
    finally:
        sleeper.kill()
        sleeper.wait()
    assert alive.gone()  # its pid is free now


def test_heartbeats_extend_the_lease_and_a_release_frees_it_without_waiting(root):
    lease = _lease(root)
    taken = lease.take(RUN_A, ttl_s=60)
    time.sleep(0.05)
    beat = lease.heartbeat()
    assert beat.token == taken.token and beat.generation == taken.generation + 1
    assert beat.expires_at > taken.expires_at and beat.heartbeat_at > taken.heartbeat_at
    assert lease.release() is True
    holder = _lease(root).holder()
    assert holder is not None and holder.released
    assert _lease(root).take(RUN_B, ttl_s=60).generation == beat.generation + 2
    assert DeltaTable(f"{root}/lease").to_pyarrow_table().num_rows == 1  # one row, replaced


def test_holder_reads_only_and_a_missing_table_has_no_holder(root, tmp_path):
    assert PipelineLease(StateTables(root, read_only=True), "orders").holder() is None
    assert not (tmp_path / "state").exists()
    _lease(root).take(RUN_A)
    version = DeltaTable(f"{root}/lease").version()
    holder = PipelineLease(StateTables(root, read_only=True), "orders").holder()
    assert holder is not None and holder.live(datetime.now(UTC))
    assert not holder.live(datetime.now(UTC) + timedelta(seconds=61))
    assert DeltaTable(f"{root}/lease").version() == version


def test_the_held_context_heartbeats_in_the_background_and_releases_on_exit(root):
    lease = _lease(root)
    with held(lease, RUN_A, ttl_s=0.6, interval_s=0.1) as holding:
        time.sleep(0.9)  # longer than the ttl: only the heartbeats keep it
        holding.check()  # renewed: still ours
        assert lease.mine is not None and lease.mine.generation >= 3
        with pytest.raises(LeaseHeldError):
            _lease(root).take(RUN_B, ttl_s=60)
    current = _lease(root).holder()
    assert current is not None and current.owner == RUN_A and current.released


def test_check_raises_once_a_late_heartbeat_finds_the_lease_taken_over(root):
    lease = _lease(root)
    with held(lease, RUN_A, ttl_s=0.3, interval_s=1.2) as holding:  # a paused driver: heartbeats too late
        time.sleep(0.5)
        holding.check()  # nothing noticed yet
        _lease(root).take(RUN_B, ttl_s=60)  # the lease expired: another run takes it over
        time.sleep(1.2)
        with pytest.raises(LeaseLostError, match="taken over by 'splitkeeper recover"):
            holding.check()
    current = _lease(root).holder()
    assert current is not None and current.owner == RUN_B and not current.released  # not released by A


def test_two_processes_taking_a_free_lease_at_once_one_holds_it(root):
    _lease(root).take(RUN_A, ttl_s=0.1)
    time.sleep(0.3)  # expired: both may try
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(2)
    results = context.Queue()
    procs = [
        context.Process(target=workers.take_lease, args=(root, host, barrier, results))
        for host in ("h1", "h2")
    ]
    for p in procs:
        p.start()
    outcomes = {host: (kind, detail) for host, kind, detail in (results.get(timeout=180) for _ in procs)}
    for p in procs:
        p.join(timeout=60)
    assert sorted(kind for kind, _ in outcomes.values()) == ["holder", "refused"], outcomes
    winner = next(h for h, (kind, _) in outcomes.items() if kind == "holder")
    holder = _lease(root).holder()
    assert holder is not None and holder.owner.host == winner and holder.token == outcomes[winner][1]
