"""Pages of groups: the dashboard's one read that must not be O(G).

``groups_page(transport, state, prefix, page, size)`` asks the backend's own
page query when it has one (``leasequeue._backends.sqlite.pages``,
``leasequeue._backends.postgres.pages``: SQL that walks an index in
``group_id`` order and stops after the page) and otherwise, for the
in-memory transport or any other ``Transport``, sorts ``groups()`` (which
is all in memory there anyway).
"""

from __future__ import annotations

from typing import Any, List, NamedTuple, Optional, Tuple

from .._types import GroupInfo

__all__ = ["STATES", "GroupPage", "groups_page"]

#: The states a group can be in (``GroupInfo.state``).
STATES = ("ready", "leased", "parked", "paused", "buried", "scheduled")


class GroupPage(NamedTuple):
    """One page of groups in ``group_id`` order (``groups_page``)."""

    #: The page's groups, as ``group()`` reports each.
    groups: List[GroupInfo]
    #: Its number, from 1.
    page: int
    #: Groups a page holds (the last may hold fewer).
    size: int
    #: Whether a next page holds any group.
    has_next: bool


def _backend_page(transport: Any) -> Any:
    """The backend's page function, or None (a transport with no SQL behind it)."""
    from .._backends.sqlite.transport import SQLiteTransport

    if isinstance(transport, SQLiteTransport):
        from .._backends.sqlite.pages import groups_page as sqlite_page

        return sqlite_page
    try:
        from .._backends.postgres.transport import PostgresTransport
    except ImportError:  # no psycopg: no PostgreSQL transport either
        return None
    if isinstance(transport, PostgresTransport):
        from .._backends.postgres.pages import groups_page as postgres_page

        return postgres_page
    return None


def _memory_page(transport: Any, state: Optional[str], prefix: str, offset: int, limit: int,
                 after: Optional[str] = None) -> Tuple[List[GroupInfo], bool]:
    infos = sorted((i for i in transport.groups()
                    if (state is None or i.state == state) and i.group_id.startswith(prefix)
                    and (after is None or i.group_id > after)),
                   key=lambda i: i.group_id)
    return infos[offset:offset + limit], len(infos) > offset + limit


def groups_page(transport: Any, state: Optional[str] = None, prefix: str = "", page: int = 1,
                size: int = 50, *, after: Optional[str] = None) -> GroupPage:
    """Page ``page`` (from 1) of ``size`` groups of ``transport`` in
    ``group_id`` order: those in ``state`` (every state if None) whose id
    starts with ``prefix``.  ``after`` (the last group id of page
    ``page - 1``): the page starts after that group, a seek in the index
    instead of skipping ``(page - 1) * size`` entries.  ``ValueError`` for an
    unknown state, a page below 1 or a size outside 1..500."""
    if state is not None and state not in STATES:
        raise ValueError(f"unknown state {state!r}: one of {', '.join(STATES)}")
    if type(page) is not int or page < 1:
        raise ValueError(f"page must be an integer >= 1, not {page!r}")
    if type(size) is not int or not 1 <= size <= 500:
        raise ValueError(f"size must be an integer from 1 to 500, not {size!r}")
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, not {type(prefix).__name__}")
    if after is not None and not isinstance(after, str):
        raise TypeError(f"after must be a str or None, not {type(after).__name__}")
    read = _backend_page(transport) or _memory_page
    offset = 0 if after is not None else (page - 1) * size
    groups, has_next = read(transport, state, prefix, offset, size, after)
    return GroupPage(groups, page, size, has_next)
