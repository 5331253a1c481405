"""How many messages a batching runner (the thread runner's and the
asyncio runner's batched path, :mod:`.acks`) may claim beyond its free
slots: ``Worker(prefetch=N)`` is N; ``prefetch=None`` adapts it to the
handlers, so that a prefetched message waits in the worker about
``PREFETCH_WINDOW`` seconds, not behind a slow job: as many as the slots
finish in that window at the handlers' moving-average run time, up to
``batch``; none before a first job ran (nothing known yet).

One rule for both runners, so a worker prefetches the same whether its
handler is a plain function or an ``async def``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from .._worker import Worker

__all__ = ["AVERAGE_WEIGHT", "PREFETCH_WINDOW", "averaged", "prefetch_now"]

#: ``prefetch=None``: how long, in seconds of the handlers' average run
#: time, a prefetched message may wait in the worker for a slot.
PREFETCH_WINDOW = 0.05
#: The weight of the newest run time in the handlers' moving average.
AVERAGE_WEIGHT = 0.1


def prefetch_now(worker: "Worker", average: Optional[float]) -> int:
    """How many leases ``worker`` may hold beyond its free slots now, its
    handlers' average run time being ``average`` seconds (``None``: no job
    ran yet)."""
    if worker.prefetch is not None:
        return worker.prefetch
    if average is None:
        return 0
    if average <= 0.0:
        return worker.batch
    return min(worker.batch, int(PREFETCH_WINDOW * worker.concurrency / average))


def averaged(average: Optional[float], took: float) -> float:
    """The moving average after a run of ``took`` seconds."""
    return took if average is None else average + (took - average) * AVERAGE_WEIGHT
