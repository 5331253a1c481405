"""The asyncio runner's ack buffer: :class:`~.acks.AckBuffer` with a
flusher *task* on the running loop instead of a thread (the same rules:
see :mod:`.acks`).

A task whose handler returned leaves its job here (on the loop) and moves
on; the flusher task sends everything buffered with one ``ack_many`` on
the worker's I/O pool as soon as something is buffered; jobs finishing
during that flush go together into the next one (no timer).  A buffered
job stays in ``Heartbeat.held``, its lease extended, until its ack is
sent; a refused ack makes it ``lost``, a failed ``ack_many`` every job in
it (``AckBuffer.flush``, which runs on the pool).  ``close()`` then
awaiting ``run_task()`` sends what is left: the runner does so before
``arun()`` returns.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from .._job import Job
from .acks import AckBuffer

if TYPE_CHECKING:
    from .._worker import Worker

__all__ = ["AsyncAckBuffer"]


class AsyncAckBuffer(AckBuffer):
    """Jobs whose handler returned, waiting for their ack (the loop's tasks
    add, the flusher task takes)."""

    __slots__ = ("_wake", "_flushed")

    def __init__(self, worker: "Worker") -> None:
        super().__init__(worker)
        self._wake = asyncio.Event()
        self._flushed = asyncio.Event()  # set after each flush (sync waits for it)

    async def sync(self) -> None:  # type: ignore[override]
        """Wait until every job buffered so far is acked (or refused): the
        buffer is empty and no flush is under way; at once when closing."""
        while (self._jobs or self._flushing) and not self._closing:
            self._flushed.clear()
            self._wake.set()
            await self._flushed.wait()

    def add(self, job: Job) -> None:
        """Leave ``job`` (its handler returned; unfinished, no longer tied to
        its task) for the next flush; on the loop."""
        super().add(job)
        self._wake.set()

    def close(self) -> None:
        """Let the flusher end once the buffer is empty (after the last job task ended)."""
        self._closing = True
        self._wake.set()

    async def run_task(self) -> None:
        """The flusher: ack what is buffered, as soon as it is, one
        ``ack_many`` at a time, until ``close()`` and the buffer is empty."""
        w = self.worker
        wake = self._wake
        while True:
            if not self._jobs:
                if self._closing:
                    return
                wake.clear()
                await wake.wait()
                continue
            jobs = self.take()  # on the loop: the jobs added from now on go into the next flush
            self._flushing = True
            try:
                await w._acall(self.flush, jobs)
            except asyncio.CancelledError:
                raise  # a forced stop: the flush in progress ends on the pool; what is left expires
            except Exception:  # pragma: no cover - flush records the transport's errors itself
                w.logger.exception("acking the buffered jobs failed")
            finally:
                self._flushing = False
                self._flushed.set()
