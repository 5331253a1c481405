"""Exceptions shared by both transport implementations.

Defined once, in pure Python, so ``except leasequeue.LeaseLost`` catches the
error whichever implementation raised it.
"""

from __future__ import annotations

__all__ = ["LeaseLost", "LeaseQueueError", "QueueNotFound"]


class LeaseQueueError(Exception):
    """Base class of every error specific to leasequeue."""


class LeaseLost(LeaseQueueError):
    """The lease is not current: its message was acked, nacked, re-delivered
    to another claim, or the lease came from another transport.

    The call that raised it changed nothing.
    """


class QueueNotFound(LeaseQueueError, LookupError):
    """The named queue does not exist (PostgreSQL): it was never created, or
    it was dropped.  Only ``PostgresTransport.install(conninfo, queues=...)``
    and ``PostgresTransport.create_queue(conninfo, name)`` create a queue;
    opening, reading or working on a missing one raises this.

    The call that raised it changed nothing.
    """
