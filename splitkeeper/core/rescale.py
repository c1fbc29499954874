"""Operator-state and split redistribution when a job restores at a new parallelism.

Flink's list-style operator state comes in two recovery semantics (protocol rule 2.8,
FLIP-600 rescaling section):

- **even-split**: the whole state is the concatenation of every subtask's
  list, in subtask order; on restore it is cut into ``P`` contiguous sublists
  as evenly as possible (the first ``len % P`` sublists get one element more).
- **union**: every new subtask gets the complete concatenation.

A regional checkpoint stores *pre-merged* region states (a failed region's
list is the one it falls back to), so redistribution runs once per restore,
over the states exactly as the completed checkpoint holds them. Mixing
elements from two checkpoints in one subtask is safe because regions are
independent (protocol rule 2.8, Gen's argument).

Splits are reader state too, but a split is owned exactly once: they are
always redistributed even-split, whatever the operator state's semantics,
and the enumerator then reassigns them (protocol rule 1.2, deferred assignment) or
leaves them where they landed (legacy). Pure functions, no engine imports.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from splitkeeper.core.assignment import validate_parallelism
from splitkeeper.core.types import CompletedCheckpoint, ReaderInfo, Split
from splitkeeper.errors import CheckpointError, InvalidParameterError

T = TypeVar("T")


class Redistribution(enum.Enum):
    """How list-style operator state is spread over subtasks on restore."""

    EVEN_SPLIT = "even_split"
    UNION = "union"


def _check_parallelism(new_parallelism: int) -> None:
    validate_parallelism(new_parallelism, "new_parallelism")


def even_split_sizes(total: int, parallelism: int) -> list[int]:
    """Sizes of the ``parallelism`` contiguous sublists an even split of ``total`` elements yields.

    The first ``total % parallelism`` sublists get one element more; sizes
    never differ by more than one.
    """
    _check_parallelism(parallelism)
    if isinstance(total, bool) or not isinstance(total, int) or total < 0:
        raise InvalidParameterError("total", total, "an integer >= 0")
    base, extra = divmod(total, parallelism)
    return [base + 1 if i < extra else base for i in range(parallelism)]


def redistribute(
    states: Sequence[Sequence[T]],
    new_parallelism: int,
    mode: Redistribution = Redistribution.EVEN_SPLIT,
) -> list[list[T]]:
    """Redistribute per-subtask lists ``states`` (index = old subtask) over ``new_parallelism`` subtasks.

    EVEN_SPLIT: when the parallelism does not change every subtask keeps its
    list unchanged (as Flink's repartitioner does: nothing moves on a restore
    without rescale); otherwise the concatenation is cut into contiguous
    sublists by :func:`even_split_sizes`. UNION: every new subtask gets the
    full concatenation, also at unchanged parallelism. Returns new lists; the
    input is not modified. Order is preserved: subtask order, then list order.
    """
    _check_parallelism(new_parallelism)
    if not isinstance(mode, Redistribution):
        raise InvalidParameterError("mode", mode, "Redistribution.EVEN_SPLIT or Redistribution.UNION")
    concatenated: list[T] = [element for state in states for element in state]
    if mode is Redistribution.UNION:
        return [list(concatenated) for _ in range(new_parallelism)]
    if len(states) == new_parallelism:
        return [list(state) for state in states]
    result: list[list[T]] = []
    start = 0
    for size in even_split_sizes(len(concatenated), new_parallelism):
        result.append(concatenated[start : start + size])
        start += size
    return result


@dataclass(frozen=True, slots=True)
class RestoredRegion:
    """The state one new region (reader) starts from after a restore.

    ``splits`` are the splits the reader reports to the enumerator when it
    registers (``ReaderInfo.reported_splits``); ``operator_state`` is its
    redistributed list state; ``source_regions`` are the regions of the
    restored checkpoint that contributed at least one element to it (used to
    carry the ref-chain depth of mixed states).
    """

    region_id: int
    splits: tuple[Split, ...]
    operator_state: tuple[str, ...]
    source_regions: frozenset[int]


def restore_regions(
    checkpoint: CompletedCheckpoint,
    new_parallelism: int | None = None,
    redistribution: Redistribution = Redistribution.EVEN_SPLIT,
) -> list[RestoredRegion]:
    """The per-region starting state when ``checkpoint`` is restored at ``new_parallelism``.

    ``None`` keeps the checkpoint's parallelism. Operator state follows
    ``redistribution``; splits always follow EVEN_SPLIT (never duplicated).
    Pure: called by :meth:`RegionalCheckpointCoordinator.restore` and by
    anything that wants to preview a rescale; may be called any number of times.
    """
    parallelism = checkpoint.parallelism if new_parallelism is None else new_parallelism
    _check_parallelism(parallelism)
    expected = list(range(checkpoint.parallelism))
    if sorted(checkpoint.regions) != expected:
        raise CheckpointError(
            f"checkpoint {checkpoint.checkpoint_id} has region states for {sorted(checkpoint.regions)}, "
            f"expected one for each of regions 0..{checkpoint.parallelism - 1}; it cannot be restored",
            checkpoint_id=checkpoint.checkpoint_id,
        )
    old = [checkpoint.regions[r] for r in expected]
    tagged_state = redistribute(
        [[(r, element) for element in s.operator_state] for r, s in enumerate(old)],
        parallelism,
        redistribution,
    )
    tagged_splits = redistribute(
        [[(r, split) for split in s.splits] for r, s in enumerate(old)],
        parallelism,
        Redistribution.EVEN_SPLIT,
    )
    restored: list[RestoredRegion] = []
    for region_id in range(parallelism):
        state_part, split_part = tagged_state[region_id], tagged_splits[region_id]
        restored.append(
            RestoredRegion(
                region_id=region_id,
                splits=tuple(split for _, split in split_part),
                operator_state=tuple(element for _, element in state_part),
                source_regions=frozenset(r for r, _ in state_part) | frozenset(r for r, _ in split_part),
            )
        )
    return restored


def reported_splits(restored: Sequence[RestoredRegion]) -> list[ReaderInfo]:
    """The ``ReaderInfo`` each new reader registers with: its restored splits as ``reported_splits``.

    Hand these to the enumerator of a *global restore* (protocol rule 1.3): it
    redistributes them with its assignment strategy (deferred assignment) or
    lets each reader keep them (legacy).
    """
    return [ReaderInfo(reader_id=r.region_id, reported_splits=r.splits) for r in restored]
