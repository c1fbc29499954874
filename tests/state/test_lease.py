"""The pipeline lease (splitkeeper.delta.lease): take, refusal, takeover of a silent holder, heartbeat,
re-check before a commit, release.

No Spark. Takeovers are decided by the reader's monotonic clock: the tests inject one
(:class:`FakeClock`) and move it, instead of sleeping past a ttl."""

from __future__ import annotations

import multiprocessing
import time
from datetime import UTC, datetime, timedelta

import pytest
from deltalake import DeltaTable

from splitkeeper.delta import retries
from splitkeeper.delta.lease import (
    HeldLease,
    LeaseClock,
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


class FakeClock(LeaseClock):
    """A reader's or holder's clocks under the test's control: ``sleep`` moves the monotonic clock on;
    ``skew`` shifts the wall clock (what the row's timestamps are written with)."""

    def __init__(self, skew: timedelta = timedelta(0)) -> None:
        super().__init__(monotonic=lambda: self.t, wall=lambda: datetime.now(UTC) + skew, sleep=self.advance)
        self.t = 1000.0
        self.slept = 0.0

    def advance(self, seconds: float) -> None:
        self.t += seconds
        self.slept += seconds


@pytest.fixture
def root(tmp_path) -> str:
    return str(tmp_path / "state")


def _lease(root: str, clock: LeaseClock | None = None) -> PipelineLease:
    return PipelineLease(StateTables(root), "orders", clock=clock or FakeClock())


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
    assert "generation 1" in text and "ttl 60 s" in text
    assert "Wait for that run to finish, or stop it" in text
    assert (
        "a run that waits (lease.wait_s >= 60) takes the lease over once no heartbeat came for 60 s" in text
    )
    holder = _lease(root).holder()
    assert holder is not None and holder.owner == RUN_A and holder.token == taken.token


def test_a_silent_holder_is_taken_over_after_its_ttl_of_the_readers_clock_and_cannot_heartbeat(root, caplog):
    old = _lease(root)
    old.take(RUN_A, ttl_s=30)
    reader = FakeClock()
    new = _lease(root, reader)
    with pytest.raises(LeaseHeldError, match="this run does not wait: lease.wait_s 0"):
        new.take(RUN_B, ttl_s=60)  # first seen now: not proven silent
    reader.advance(29.9)
    with pytest.raises(LeaseHeldError):
        new.take(RUN_B, ttl_s=60)  # seen unchanged for less than its ttl
    reader.advance(0.1)
    with caplog.at_level("WARNING", logger="splitkeeper.delta.lease"):
        taken = new.take(RUN_B, ttl_s=60)  # unchanged for its 30 s ttl on the reader's own clock
    assert "taking over the lease of 'splitkeeper run --config orders.yaml'" in caplog.text
    assert "did not heartbeat for 30.0 s of this host's clock" in caplog.text
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
    assert holder is not None and holder.live() and holder.ttl_s == 60
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
    with held(lease, RUN_A, ttl_s=5, interval_s=1.0) as holding:  # heartbeats too late for the reader
        holding.check()  # nothing noticed yet
        reader = FakeClock()
        new = _lease(root, reader)
        # the reader watches the row for the holder's ttl of its own clock (its sleep moves it)
        new.take(RUN_B, ttl_s=60, wait_s=30)
        assert reader.slept == pytest.approx(5)
        deadline = time.monotonic() + 60  # the holder's next heartbeat comes within a second
        while holding.error is None:
            assert time.monotonic() < deadline, "the heartbeat never noticed the takeover"
            time.sleep(0.05)
        with pytest.raises(LeaseLostError, match="taken over by 'splitkeeper recover"):
            holding.check()
        with pytest.raises(LeaseLostError, match="taken over by 'splitkeeper recover"):
            holding.verify()
    current = _lease(root).holder()
    assert current is not None and current.owner == RUN_B and not current.released  # not released by A


def test_two_processes_taking_a_free_lease_at_once_one_holds_it(root):
    first = _lease(root)
    first.take(RUN_A, ttl_s=60)
    assert first.release()  # free: both may take it
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


def test_a_holder_that_keeps_heartbeating_is_never_taken_over_by_a_waiting_reader(root):
    holder = _lease(root)
    holder.take(RUN_A, ttl_s=10)
    reader = FakeClock()
    new = _lease(root, reader)
    for _ in range(5):  # the reader watches 9 s of its clock between heartbeats, 45 s in all
        with pytest.raises(LeaseHeldError):
            new.take(RUN_B, ttl_s=60)
        reader.advance(9)
        holder.heartbeat()
    slept = reader.slept
    with pytest.raises(LeaseHeldError, match="would have to watch it 10.0 s more, past its lease.wait_s 9.5"):
        new.take(RUN_B, ttl_s=60, wait_s=9.5)  # a new generation: 10 s more to watch, refused at once
    assert reader.slept == slept
    current = _lease(root).holder()
    assert current is not None and current.owner == RUN_A and current.generation == 6


@pytest.mark.parametrize("skew_minutes", [-10, 10])
def test_clock_skew_of_minutes_between_holder_and_reader_changes_nothing(root, skew_minutes):
    """The holder's wall clock is minutes off the reader's: its ``expires_at`` is long past (or far
    ahead) for the reader. The reader decides only by its own monotonic clock: refused while the
    holder heartbeats, a takeover after exactly the holder's ttl of silence."""
    holder = _lease(root, FakeClock(skew=timedelta(minutes=skew_minutes)))
    taken = holder.take(RUN_A, ttl_s=20)
    assert abs(
        (taken.expires_at - datetime.now(UTC)) - timedelta(minutes=skew_minutes, seconds=20)
    ) < timedelta(seconds=10)
    reader = FakeClock()
    new = _lease(root, reader)
    with pytest.raises(LeaseHeldError):
        new.take(RUN_B, ttl_s=60)
    reader.advance(15)
    holder.heartbeat()
    reader.advance(15)
    with pytest.raises(LeaseHeldError):
        new.take(RUN_B, ttl_s=60)  # 30 s since first seen, but the generation changed 15 s ago
    reader.advance(19.9)
    with pytest.raises(LeaseHeldError):
        new.take(RUN_B, ttl_s=60)
    reader.advance(0.1)
    assert new.take(RUN_B, ttl_s=60).owner == RUN_B
    with pytest.raises(LeaseLostError):
        holder.heartbeat()


def test_verify_before_a_commit_renews_a_lease_a_pause_left_old_and_fails_after_a_takeover(root):
    clock = FakeClock()
    lease = _lease(root, clock)
    taken = lease.take(RUN_A, ttl_s=10)
    lease.verify()  # fresh: a fenced read, nothing written
    assert _lease(root).holder().generation == taken.generation
    clock.advance(6)  # paused past half its ttl: renew before committing
    lease.verify()
    assert _lease(root).holder().generation == taken.generation + 1
    reader = FakeClock()
    new = _lease(root, reader)
    with pytest.raises(LeaseHeldError):
        new.take(RUN_B, ttl_s=60)
    reader.advance(10)
    new.take(RUN_B, ttl_s=60)
    version = DeltaTable(f"{root}/lease").version()
    with pytest.raises(LeaseLostError, match="was taken over by 'splitkeeper recover"):
        lease.verify()  # fresh by its own clock: the fenced read finds the takeover
    clock.advance(6)
    with pytest.raises(LeaseLostError):
        lease.verify()  # old: the renewal is fenced out
    assert DeltaTable(f"{root}/lease").version() == version  # nothing written by the old holder


def _failing_writes(monkeypatch, failures: int) -> list[str]:
    """Make the lease table's next ``failures`` heartbeat writes raise a store error (then succeed)."""
    import deltalake

    real = deltalake.write_deltalake
    failed: list[str] = []

    def write(table, data, *args, **kwargs):
        if len(failed) < failures and data.column("released")[0].as_py() is False:
            failed.append("503")
            raise OSError("Generic S3 error: 503 Slow Down (injected)")
        return real(table, data, *args, **kwargs)

    monkeypatch.setattr(deltalake, "write_deltalake", write)
    return failed


def test_a_heartbeat_that_fails_twice_then_succeeds_keeps_the_lease(root, monkeypatch, caplog):
    lease = PipelineLease(StateTables(root), "orders")  # the real clocks: the retries really wait
    monkeypatch.setattr(HeldLease, "RETRY_S", 0.05)
    before = retries.counts()["lease_heartbeat"]
    with held(lease, RUN_A, ttl_s=30, interval_s=0.1) as holding:
        failed = _failing_writes(monkeypatch, 2)
        with caplog.at_level("WARNING", logger="splitkeeper.delta.lease"):
            deadline = time.monotonic() + 30  # the ttl: retries end well within it
            while lease.mine is None or lease.mine.generation < 2:
                assert time.monotonic() < deadline and holding.error is None, holding.error
                time.sleep(0.02)
        assert failed == ["503", "503"] and holding.retries == 2
        assert retries.counts()["lease_heartbeat"] == before + 2  # splitkeeper_store_retries_total
        holding.check()
        holding.verify()
        # the fence names the store's error and that nothing was committed (fence step 5)
        assert (
            "lease heartbeat failed ([STATE_ERROR] pipeline 'orders': the commit of lease generation"
            in caplog.text
        )
        assert "failed in the store (Generic S3 error: 503 Slow Down (injected))" in caplog.text
        assert "decision record); retry 2 in " in caplog.text
    current = _lease(root).holder()
    assert current is not None and current.owner == RUN_A and current.released  # ours to the end


def test_a_heartbeat_failing_for_the_whole_ttl_gives_the_lease_up(root, monkeypatch):
    lease = PipelineLease(StateTables(root), "orders")
    monkeypatch.setattr(HeldLease, "RETRY_S", 0.05)
    with held(lease, RUN_A, ttl_s=1.0, interval_s=0.2) as holding:
        failed = _failing_writes(monkeypatch, 10_000)
        deadline = time.monotonic() + 60
        while holding.error is None:
            assert time.monotonic() < deadline, "the heartbeats never gave up"
            time.sleep(0.05)
        assert len(failed) >= 3
        with pytest.raises(LeaseLostError, match="could not be renewed within its ttl"):
            holding.check()
        monkeypatch.undo()
