"""One page of a SQLite queue's groups, for the dashboard (``leasequeue.dashboard``).

``groups()`` reads every group (O(G)); a page reads at most ``offset + limit
+ 1`` rows of ``lq_groups`` in ``group_id`` order, walking the table's
``UNIQUE (group_id)`` index: a prefix is a range of that index, and the
state a filter on the rows the walk meets (the lock column ``_info`` reads).
So a page of a state that many groups are in, or of a prefix, costs
O(offset + limit); a state that few groups are in may walk the whole index
(no index of ``lq_groups`` is keyed by the lock: one would cost every claim
and ack an index update).  The read is the transport's own inspection
(``_inspect``: its lock, its time, expiry applied), so the states it reports
are ``group()``'s.  ``after``: the page starts after that group id, a
seek in the index, however deep.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

from ..._types import GroupInfo
from .transport import _info

__all__ = ["groups_page", "page_query", "prefix_bound"]

_COLUMNS = ("SELECT group_id, priority, messages, lock, paused, head_seq, holder, expires_at, attempt, "
            "last_claimed_at, reason FROM lq_groups")

#: The SQL condition on lq_groups' columns that each state is (``_info``'s rules).
_STATE_SQL = {
    "ready": "lock = 0 AND paused = 0",
    "leased": "lock = 1",
    "parked": "lock = 2",
    "buried": "lock = 3",
    "paused": "paused = 1 AND lock IN (0, 4)",
    "scheduled": "lock = 4 AND paused = 0",
}


def prefix_bound(prefix: str) -> Optional[str]:
    """The least string greater than every string starting with ``prefix``
    in code point order (SQLite's BINARY order of UTF-8 text), or None if
    there is none (an empty prefix, or one of U+10FFFF only)."""
    chars = list(prefix)
    while chars:
        last = ord(chars.pop()) + 1
        if last == 0xD800:  # surrogates cannot be stored: the next code point is U+E000
            last = 0xE000
        if last <= 0x10FFFF:
            return "".join(chars) + chr(last)
    return None


def page_query(state: Optional[str], prefix: str, offset: int, limit: int,
               after: Optional[str] = None) -> Tuple[str, Tuple[Any, ...]]:
    """The SQL and parameters of a page: ``limit`` rows from ``offset`` (the
    caller asks one more, to know whether a next page holds any), of the
    groups after ``after`` if given (a seek in the index, however deep)."""
    where: List[str] = []
    params: List[Any] = []
    if after is not None:
        where.append("group_id > ?")
        params.append(after)
    if prefix:
        where.append("group_id >= ?")
        params.append(prefix)
        bound = prefix_bound(prefix)
        if bound is not None:
            where.append("group_id < ?")
            params.append(bound)
    if state is not None:
        where.append(_STATE_SQL[state])
    sql = _COLUMNS + (" WHERE " + " AND ".join(where) if where else "")
    sql += " ORDER BY group_id LIMIT ? OFFSET ?"
    return sql, tuple(params + [limit, offset])


def groups_page(transport: Any, state: Optional[str], prefix: str, offset: int, limit: int,
                after: Optional[str] = None) -> Tuple[List[GroupInfo], bool]:
    """Up to ``limit`` groups in ``group_id`` order from ``offset`` (counted
    after the group ``after``, if given), of ``state`` (any if None) and
    whose id starts with ``prefix``; and whether more follow."""
    rows = transport._inspect(*page_query(state, prefix, offset, limit + 1, after))
    return [_info(row) for row in rows[:limit]], len(rows) > limit
