"""Named queues of a PostgreSQL database: the name rule, and making,
finding, listing and dropping them.

Queues are made, not typos: only ``PostgresTransport.install(conninfo,
queues=...)`` and ``PostgresTransport.create_queue(conninfo, name)`` create
one (docs/decisions.md, "Queue names and queue existence, pinned").  A queue
is a row of ``leasequeue.queues`` (its id, its name, its message sequence),
as it has been since schema version 1: no schema change.
"""

from __future__ import annotations

import re
from typing import Any, List, Optional, Tuple

from ..._errors import QueueNotFound
from ..._types import TransportStats

__all__ = ["MAX_NAME", "check_queue_name", "create", "drop", "find", "list_all", "missing", "no_schema"]

#: The longest queue name (PostgreSQL's identifier length).
MAX_NAME = 63
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*\Z")

# The advisory lock under which queues are made and dropped (the one
# leasequeue.register_queue takes, so that the two never race).
_LOCK = "SELECT pg_advisory_xact_lock(hashtext('leasequeue.register_queue'))"
_FIND = "SELECT id, seq_oid FROM leasequeue.queues WHERE name = %s"


def check_queue_name(value: Any, name: str = "queue") -> str:
    """A queue name: a ``str`` (``TypeError`` otherwise; a subclass becomes
    an exact ``str``) of 1 to 63 characters from ``[A-Za-z0-9_.-]``,
    starting with a letter or a digit (``ValueError`` otherwise)."""
    if type(value) is not str:
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a str, not {type(value).__name__}")
        value = str.__getitem__(value, slice(None))
    if not value:
        raise ValueError(f"{name} must not be empty")
    if len(value) > MAX_NAME:
        raise ValueError(f"{name} is {len(value)} characters long; the longest allowed is {MAX_NAME}")
    if not value.isascii() or _NAME.match(value) is None:
        raise ValueError(
            f"{name} {value!r} is not a queue name: letters, digits, '_', '.' and '-', "
            "starting with a letter or a digit"
        )
    return value


def missing(name: str) -> QueueNotFound:
    """The one-line error for a queue that does not exist."""
    return QueueNotFound(
        f"queue {name!r} does not exist (create it with PostgresTransport.create_queue or "
        f"`leasequeue queue --postgres ... create-queue {name}`)"
    )


def no_schema(name: Optional[str] = None) -> QueueNotFound:
    """The one-line error for a database without the leasequeue schema."""
    what = "the database has no leasequeue schema" if name is None else (
        f"queue {name!r} does not exist: the database has no leasequeue schema")
    return QueueNotFound(
        f"{what} (install it with PostgresTransport.install(conninfo, queues=[...]) or "
        "`leasequeue queue --postgres ... install --queue NAME`)"
    )


def has_schema(conn: Any) -> bool:
    row = conn.execute("SELECT to_regclass('leasequeue.queues')").fetchone()
    return row is not None and row[0] is not None


def find(conn: Any, name: str) -> Optional[Tuple[int, int]]:
    """The queue's ``(id, sequence oid)``, or None."""
    row = conn.execute(_FIND, (name,)).fetchone()
    return None if row is None else (int(row[0]), int(row[1]))


def create(conn: Any, name: str) -> bool:
    """Make the queue in the caller's transaction; True if it did not exist."""
    conn.execute(_LOCK)
    if find(conn, name) is not None:
        return False
    conn.execute("SELECT leasequeue.register_queue(%s)", (name,))
    return True


def drop(conn: Any, name: str) -> bool:
    """Remove the queue and everything it holds, in the caller's transaction;
    False if it did not exist.  Its transports' waiting claims are told
    (``NOTIFY ... 'dropped'``, at the commit)."""
    conn.execute(_LOCK)
    found = find(conn, name)
    if found is None:
        return False
    queue_id, seq_oid = found
    # Every group row first (in a fixed order, as ack_many locks them): a
    # transaction that holds one (an application's, mid-ack) is waited for.
    conn.execute("SELECT 1 FROM leasequeue.groups WHERE queue = %s ORDER BY group_id FOR UPDATE", (queue_id,))
    # Then the message sequence: dropping it waits for every open
    # transaction that drew a seq from it (an application's publish, not
    # committed yet), and any later publish fails.  Only then the rows: each
    # DELETE sees what those transactions committed meanwhile.
    row = conn.execute("SELECT %s::oid::regclass::text", (seq_oid,)).fetchone()
    if row is not None and row[0] is not None and not str(row[0]).isdigit():
        conn.execute(f"DROP SEQUENCE IF EXISTS {row[0]}")
    for table in ("messages", "groups", "keys", "listeners"):
        conn.execute(f"DELETE FROM leasequeue.{table} WHERE queue = %s", (queue_id,))
    conn.execute("DELETE FROM leasequeue.queues WHERE id = %s", (queue_id,))
    conn.execute("SELECT pg_notify(%s, 'dropped')", (f"leasequeue_{queue_id}",))
    return True


_LIST = """
SELECT q.name, m.messages, g.groups, g.leased, g.parked, g.paused, g.buried, m.scheduled
FROM (SELECT id, name,
             CASE WHEN latest = '-Infinity' THEN extract(epoch FROM clock_timestamp())::double precision
                  ELSE latest END AS now
      FROM leasequeue.queues) q
CROSS JOIN LATERAL (SELECT count(*) AS messages, count(*) FILTER (WHERE x.due_at >= q.now) AS scheduled
                    FROM leasequeue.messages x WHERE x.queue = q.id) m
CROSS JOIN LATERAL (SELECT count(*) FILTER (WHERE y.has_messages) AS groups,
                           count(*) FILTER (WHERE y.lock_state = 1 AND y.expires_at >= q.now) AS leased,
                           count(*) FILTER (WHERE y.lock_state = 2 AND y.expires_at >= q.now) AS parked,
                           count(*) FILTER (WHERE y.paused) AS paused,
                           count(*) FILTER (WHERE y.lock_state = 3) AS buried
                    FROM leasequeue.groups y WHERE y.queue = q.id) g
ORDER BY q.name
"""


def list_all(conn: Any) -> List[Tuple[str, TransportStats]]:
    """Every queue's name and counts, by name: ``stats()`` as of now (the
    server's clock; for a queue used with an injected clock, the latest time
    it used), read only (expired locks are counted as neither leased nor
    parked, not freed)."""
    rows = conn.execute(_LIST).fetchall()
    return [(str(row[0]), TransportStats(*(int(x) for x in row[1:]))) for row in rows]
