"""The :class:`Job` a handler gets: one delivery of one message.

The per-delivery context only: the lease (the heartbeat replaces it as it
extends it), whether it was lost, whether the handler acked it itself.  The
runners keep their own bookkeeping elsewhere.
"""

from __future__ import annotations

import asyncio
import functools
import sys
from typing import TYPE_CHECKING, Any, Callable, Optional

if TYPE_CHECKING:
    from ._worker import Worker

__all__ = ["ACKED", "ACKED_IN_TX", "REFCOUNT", "Job"]

# Job._acked: the handler acked (it stands), or acked on its own connection
# (it stands if the application's transaction commits).
ACKED, ACKED_IN_TX = 1, 2


def _refcount() -> Optional[Callable[[Any], int]]:
    """``sys.getrefcount`` where it counts every reference (CPython 3.9 to
    3.13 with the GIL), else ``None``.  The runners' fast paths reuse a
    ``Job`` that nobody kept (its handler, a hook, a middleware: each would
    hold a reference) for the next delivery instead of making a new one:
    making and freeing one is a third of the fast path's cost in memory.
    Elsewhere (PyPy, free-threaded builds, 3.14's borrowed stack
    references) they make a new one each time."""
    if sys.implementation.name != "cpython" or not ((3, 9) <= sys.version_info[:2] <= (3, 13)):
        return None
    gil = getattr(sys, "_is_gil_enabled", None)
    if gil is not None and not gil():
        return None
    return sys.getrefcount


#: ``sys.getrefcount`` where a runner may reuse a ``Job`` nobody kept, else ``None``.
REFCOUNT = _refcount()


class Job:
    """What a handler gets: one delivery of one message.

    ``event``, ``group_id``, ``seq``, ``attempt`` (1 on the first delivery)
    come from the lease; ``lease`` is the current lease (the heartbeat
    replaces it as it extends it); ``lost`` becomes ``True`` when the lease
    was lost (the group was purged, or the lease ran out and another worker
    took the message): stop work, the outcome will not be recorded.
    ``worker`` is the :class:`Worker`; ``transport`` its transport.

    A handler may settle its delivery itself with :meth:`ack` (``conn=``:
    inside its own database transaction, with its work); the worker then
    records ``succeeded`` and leaves that ack alone.
    """

    __slots__ = ("lease", "lost", "worker", "_finished", "_task", "_acked")

    def __init__(self, worker: "Worker", lease: Any) -> None:
        self.worker = worker
        self.lease = lease
        self.lost = False
        self._finished = False
        self._task: Optional["asyncio.Task[Any]"] = None
        #: 0: not acked by the handler; _ACKED: acked (it stands); ACKED_IN_TX:
        #: acked on the application's connection (it stands if that transaction commits).
        self._acked = 0

    def ack(self, conn: Any = None) -> None:
        """Ack this delivery now, from the handler: ``transport.ack(lease)``,
        or ``transport.ack(lease, conn=conn)`` on the application's own
        database connection (a durable transport; the ack is then part of the
        transaction the application holds on ``conn``, and takes effect when
        it commits).  The worker records the job as ``succeeded`` and does not
        ack it again.

        Raises what the transport's ``ack`` raises (``LeaseLost``: the lease
        is not current; nothing is recorded, the job is not marked acked),
        ``RuntimeError`` if this job was already acked or its outcome was
        already recorded.  If the handler raises after a plain ``ack()``, the
        ack stands: the worker logs the error and records ``succeeded``
        (the ``succeeded`` hooks get the error).  After ``ack(conn=...)``, the
        worker cannot know whether that transaction committed: it records the
        failure as usual (retry, bury, ...) and, when the transport answers
        ``LeaseLost`` because the ack did commit, ``succeeded`` as above.
        """
        self._check_ackable()
        lease = self.lease
        t: Any = self.worker.transport  # ack(conn=) is the durable transports' (Part 5)
        if conn is None:
            t.ack(lease)
            self._acked = ACKED
        else:
            t.ack(lease, conn=conn)
            self._acked = ACKED_IN_TX

    async def aack(self, conn: Any = None) -> None:
        """:meth:`ack` for an ``async def`` handler: ``transport.aack(lease,
        conn=conn)`` when the transport has ``aack`` (PostgreSQL: ``conn`` an
        ``AsyncConnection``), else ``ack`` off the event loop (in memory: a
        plain call)."""
        self._check_ackable()
        t: Any = self.worker.transport
        lease = self.lease
        aack = getattr(t, "aack", None)
        if aack is not None:
            await (aack(lease) if conn is None else aack(lease, conn=conn))
        elif conn is None:
            await self.worker._acall(t.ack, lease)
        else:
            await self.worker._acall(functools.partial(t.ack, lease, conn=conn))
        self._acked = ACKED if conn is None else ACKED_IN_TX

    def _check_ackable(self) -> None:
        if self._acked:
            raise RuntimeError(f"{self!r} was already acked")
        if self._finished:
            raise RuntimeError(f"{self!r}: the worker has already recorded its outcome")

    @property
    def acked(self) -> bool:
        """True once the handler acked this delivery itself (:meth:`ack`)."""
        return self._acked != 0

    @property
    def event(self) -> Any:
        return self.lease.event

    @property
    def group_id(self) -> str:
        return self.lease.group_id

    @property
    def seq(self) -> int:
        return self.lease.seq

    @property
    def attempt(self) -> int:
        """1 on a message's first delivery, +1 at each later one."""
        return self.lease.attempt

    @property
    def transport(self) -> Any:
        return self.worker.transport

    @property
    def worker_id(self) -> str:
        return str(self.lease.worker_id)

    def __repr__(self) -> str:
        lost = " lost" if self.lost else ""
        return f"<Job group_id={self.group_id!r} seq={self.seq} attempt={self.attempt}{lost}>"
