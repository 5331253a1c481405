"""A web dashboard for a durable queue (issue 33): ``leasequeue dashboard``.

``leasequeue.dashboard.app(transport, read_only=False, auth=None)`` is an
ASGI application showing a SQLite or PostgreSQL queue (any ``Transport``
works): counts, groups by state and id prefix a page at a time, a group with
its first messages, and the operator's actions (pause, resume, retry, skip,
purge) behind a CSRF token and a confirmation.  It needs the ``dashboard``
extra (``pip install 'leasequeue[dashboard]'``: Starlette, Jinja2 and
uvicorn).  docs/dashboard.md says how to run it, mount it and keep it safe.
"""

from __future__ import annotations

from .app import ACTIONS, app
from .queries import STATES, GroupPage, groups_page

__all__ = ["ACTIONS", "STATES", "GroupPage", "app", "groups_page"]
