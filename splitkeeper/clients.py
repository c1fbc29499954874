"""Source clients a long-lived region reader keeps open from one epoch to the next.

A region reader is stateless and picklable: by default each read opens its client (a Kafka
consumer) and closes it when the read ends. A long-lived reader slot
(:mod:`splitkeeper.spark.readers`) serves the regions of many epochs in one Python worker and
runs them inside :func:`kept_clients`; there a reader may :func:`borrow` a client it handed back
(:func:`give_back`) after an earlier read of the same settings, and skip its connection set-up.

Rules:

1. Outside :func:`kept_clients` nothing is kept: :func:`borrow` returns None and :func:`give_back`
   closes the client (a job per epoch, the driver, a test).
2. A borrowed client is the borrower's alone until it gives it back; a read that failed does not
   give it back but closes it (a client in an unknown state is never reused), so a failed
   region's next read starts with a new one.
3. The clients kept are closed when the :func:`kept_clients` block ends (the reader slot stops,
   its connection to the driver dropped, its task killed).
4. One client is kept per key (the reader's settings); a second one given back for the same key
   is closed.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Hashable, Iterator
from typing import Any

__all__ = ["borrow", "give_back", "kept_clients"]

log = logging.getLogger("splitkeeper.clients")

_local = threading.local()


def _kept() -> dict[Hashable, tuple[Any, Callable[[Any], None]]] | None:
    kept: dict[Hashable, tuple[Any, Callable[[Any], None]]] | None = getattr(_local, "kept", None)
    return kept


@contextlib.contextmanager
def kept_clients() -> Iterator[None]:
    """Keep the clients given back in this thread until the block ends (rule 3)."""
    previous = _kept()
    _local.kept = {}
    try:
        yield
    finally:
        kept = _kept() or {}
        _local.kept = previous
        for key, (client, close) in kept.items():
            try:
                close(client)
            except Exception as err:  # noqa: BLE001 - closing is best effort: the slot ends anyway
                log.debug("closing a kept client (%s) failed: %s", key, err)


def borrow(key: Hashable) -> Any:
    """The client kept for ``key``, now the caller's (rule 2); None when there is none."""
    kept = _kept()
    if kept is None or key not in kept:
        return None
    return kept.pop(key)[0]


def give_back(key: Hashable, client: Any, close: Callable[[Any], None]) -> None:
    """Keep ``client`` for the next :func:`borrow` of ``key``, or ``close`` it (rules 1 and 4)."""
    kept = _kept()
    if kept is None or key in kept:
        close(client)
        return
    kept[key] = (client, close)
