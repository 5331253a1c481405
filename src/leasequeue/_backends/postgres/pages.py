"""One page of a PostgreSQL queue's groups, for the dashboard (``leasequeue.dashboard``).

``groups()`` reads every group of the queue (O(G + N)); a page reads at most
``offset + limit + 1`` rows of ``leasequeue.groups`` in ``group_id`` order,
walking its primary key ``(queue, group_id)``, and counts the messages of
those rows only.  A prefix is ``starts_with`` on that walk (a range of the
key only under the C collation, so it is not relied on); a state is a
filter on the row's lock as ``group_info`` reads it (a lock whose end has
passed is free).  The locked states (leased, parked, buried, scheduled) can
also be read from the ``groups_locked`` partial index and sorted, which the
planner picks when fewer groups are locked than a walk would pass; paused
groups have no index, so a paused filter may read the queue's every group.
``after``: the page starts after that group id, a seek in the key.  What
it reports is ``group()``'s: the same columns, the same rules (``_info``).
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

from ..._types import GroupInfo
from .transport import _NOW, _info

__all__ = ["groups_page", "page_query"]

# The lock as of now: a lease, park or schedule whose end has passed is free (group_info's rule).
_LOCK = "(CASE WHEN g.lock_state <> 0 AND g.expires_at < t.now THEN 0 ELSE g.lock_state END)"

# "g.lock_state <> 0" (implied, for the locked states) lets the planner read
# them from the groups_locked partial index when that is cheaper than the
# key walk; paused groups have no index of their own.
_STATE_SQL = {
    "ready": f"{_LOCK} = 0 AND NOT g.paused",
    "leased": f"g.lock_state <> 0 AND {_LOCK} = 1",
    "parked": f"g.lock_state <> 0 AND {_LOCK} = 2",
    "buried": "g.lock_state <> 0 AND g.lock_state = 3",
    "paused": f"g.paused AND {_LOCK} IN (0, 4)",
    "scheduled": f"g.lock_state <> 0 AND {_LOCK} = 4 AND NOT g.paused",
}

# The page is chosen from leasequeue.groups alone (the key walk, the filters,
# OFFSET and LIMIT); only its rows then count their messages.
_PAGE = """
SELECT g.*, t.now FROM (SELECT leasequeue.time_now(%s, %s) AS now) t
CROSS JOIN leasequeue.groups g
WHERE g.queue = %s"""

_SELECT = """
SELECT g.group_id, g.priority, coalesce(m.n, 0), g.paused,
       (CASE WHEN g.lock_state <> 0 AND g.expires_at < g.now THEN 0 ELSE g.lock_state END)::smallint, m.head,
       g.lock_worker, g.expires_at, g.attempt, g.last_claimed_at, g.reason,
       CASE WHEN g.lock_state = 4 AND g.expires_at >= g.now THEN g.expires_at END
FROM ({page}) g
LEFT JOIN LATERAL (SELECT count(*) AS n, min(x.seq) AS head FROM leasequeue.messages x
                   WHERE x.queue = g.queue AND x.group_id = g.group_id) m ON true
ORDER BY g.group_id"""


def page_query(queue: int, state: Optional[str], prefix: str, offset: int, limit: int,
               after: Optional[str] = None) -> Tuple[str, List[Any]]:
    """The SQL and parameters of a page of queue ``queue`` (its id):
    ``limit`` rows from ``offset``, of the groups after ``after`` if given
    (a seek in the key, however deep); ``_NOW`` among the parameters stands
    for the transport's clock (``_execute`` reads it)."""
    sql = _PAGE
    params: List[Any] = [queue, _NOW, queue]
    if after is not None:
        sql += " AND g.group_id > %s"
        params.append(after)
    if prefix:
        sql += " AND starts_with(g.group_id, %s)"
        params.append(prefix)
    if state is not None:
        sql += " AND " + _STATE_SQL[state]
    sql += " ORDER BY g.group_id LIMIT %s OFFSET %s"
    return _SELECT.format(page=sql), params + [limit, offset]


def groups_page(transport: Any, state: Optional[str], prefix: str, offset: int, limit: int,
                after: Optional[str] = None) -> Tuple[List[GroupInfo], bool]:
    """Up to ``limit`` groups in ``group_id`` order from ``offset`` (counted
    after the group ``after``, if given), of ``state`` (any if None) and
    whose id starts with ``prefix``; and whether more follow."""
    rows = transport._execute("groups", *page_query(transport._queue, state, prefix, offset, limit + 1, after))
    return [_info(row) for row in rows[:limit]], len(rows) > limit
