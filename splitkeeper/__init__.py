"""splitkeeper: Flink-style split ownership, recovery and regional checkpoints for Spark ingestion.

``from splitkeeper import transform`` (and ``vectorized``, ``batch_transform``, ``spark_transform``,
``notification``, ``checkpoint_action``): the decorators that mark a function as one a pipeline
config may name (:mod:`splitkeeper.transforms`, :mod:`splitkeeper.callables`). They are imported on
first use, so ``import splitkeeper`` stays free of pyarrow.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from splitkeeper.callables import checkpoint_action, notification, spark_transform
    from splitkeeper.transforms import batch_transform, transform, vectorized

__version__ = "0.1.0"
__all__ = [
    "__version__",
    "batch_transform",
    "checkpoint_action",
    "notification",
    "spark_transform",
    "transform",
    "vectorized",
]


def __getattr__(name: str) -> Any:
    if name in ("transform", "vectorized", "batch_transform"):
        from splitkeeper import transforms

        return getattr(transforms, name)
    if name in ("spark_transform", "notification", "checkpoint_action"):
        from splitkeeper import callables

        return getattr(callables, name)
    raise AttributeError(f"module 'splitkeeper' has no attribute {name!r}")
