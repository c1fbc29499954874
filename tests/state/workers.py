"""Functions the state tests run in child processes (real concurrent writers; spawned, so importable)."""

from __future__ import annotations

import traceback
from typing import Any


def fenced_writer(uri: str, version: int, expected: int | None, tag: str, barrier: Any, results: Any) -> None:
    """Load the table, pass the fence's check, wait for the other writer, then commit ``tag``'s row."""
    import pyarrow as pa
    from deltalake import write_deltalake

    from splitkeeper.delta.fence import fenced_commit
    from splitkeeper.delta.tables import open_table
    from splitkeeper.errors import ConcurrentRunError

    table = open_table(uri)  # with the storage options of an object-store URI
    assert table is not None

    def write(target: Any, properties: Any) -> None:
        barrier.wait(timeout=120)  # both writers have checked the fence on the same version
        write_deltalake(target, pa.table({"writer": [tag]}), mode="append", commit_properties=properties)

    try:
        result = fenced_commit(
            table,
            pipeline="orders",
            table_name="fenced",
            app_id="orders",
            version=version,
            expected=expected,
            write=write,
            attempt=tag,
            what="epoch",
        )
        results.put((tag, "committed", result.replayed))
    except ConcurrentRunError as err:
        results.put((tag, "conflict", dict(err.params)))
    except BaseException:  # noqa: BLE001 - reported to the test
        results.put((tag, "error", traceback.format_exc()))


def claim_state(root: str, pipeline: str, barrier: Any, results: Any) -> None:
    """Open (and so claim) the state directory at the same moment as another process."""
    from splitkeeper.delta.checkpoints import DeltaStateStore
    from splitkeeper.errors import StateError

    barrier.wait(timeout=120)
    try:
        DeltaStateStore(root, pipeline, "files:/in")
        results.put((pipeline, "owner", None))
    except StateError as err:
        results.put((pipeline, "refused", str(err)))
    except BaseException:  # noqa: BLE001
        results.put((pipeline, "error", traceback.format_exc()))


def take_lease(root: str, host: str, barrier: Any, results: Any) -> None:
    """Take the pipeline lease at the same moment as another process."""
    from splitkeeper.delta.lease import LeaseHeldError, LeaseOwner, PipelineLease
    from splitkeeper.delta.tables import StateTables

    lease = PipelineLease(StateTables(root), "orders")
    lease.holder()  # the table exists: both processes start from the same version
    barrier.wait(timeout=120)
    try:
        held = lease.take(LeaseOwner(host, 1, "splitkeeper run"), ttl_s=60)
        results.put((host, "holder", held.token))
    except LeaseHeldError as err:
        results.put((host, "refused", str(err)))
    except BaseException:  # noqa: BLE001
        results.put((host, "error", traceback.format_exc()))


def state_appender(root: str, notes: list[str], results: Any) -> None:
    """Append one control row per note through :meth:`StateTables.append` (its own process: the test's
    fault proxy is a thread of the test process)."""
    from datetime import UTC, datetime

    from splitkeeper.delta.schemas import spec
    from splitkeeper.delta.tables import StateTables

    try:
        store = StateTables(root)
        store.ensure("control")
        for note in notes:
            row = {
                "pipeline": "orders",
                "request": "stop",
                "requested_at": datetime.now(UTC),
                "requested_by": note,
            }
            store.append("control", spec("control").rows([row]))
        results.put(("appended", store.append_app_id))
    except BaseException:  # noqa: BLE001 - reported to the test
        results.put(("error", traceback.format_exc()))
