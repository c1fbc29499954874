"""The CheckpointStore contract (tests/core/test_checkpoint_store.py) on the Delta state store.

:class:`~splitkeeper.delta.checkpoints.DeltaStateStore` subclasses the core's
``CheckpointStore``; here it passes the same tests as the in-memory store. No Spark.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from core.test_checkpoint_store import CheckpointStoreContract  # tests/ is on sys.path (no __init__.py)

from splitkeeper.core.checkpoint import CheckpointStore
from splitkeeper.delta.checkpoints import DeltaStateStore


class TestDeltaCheckpointStore(CheckpointStoreContract):
    @pytest.fixture(autouse=True)
    def _root(self, tmp_path: Path) -> None:
        self.root = tmp_path / "state"

    def make_store(self) -> CheckpointStore:
        return DeltaStateStore(self.root, "contract", "source-fingerprint")
