"""What the dashboard shows: the Jinja2 templates (every value escaped),
and the JSON forms of stats, groups and messages.

Templates live beside this module (``templates/``, package data) and are
rendered with autoescaping on for every template, so an event, a group id
or a bury reason is text on the page, never markup: ``<script>`` in an event
is shown as ``<script>``.  Events are shown as their ``repr`` (cut at
``EVENT_CHARS``); an event the serializer cannot read back
(``leasequeue.Undecodable``) as ``UNDECODABLE``, its error and its stored form.
"""

from __future__ import annotations

import datetime
import math
import time
from typing import Any, Dict, List, Optional
from urllib.parse import quote, urlencode

import jinja2

from .._serializers import Undecodable

__all__ = ["EVENT_CHARS", "event_text", "group_json", "group_url", "message_json", "render", "stats_json"]

#: An event's text is cut at this many characters on the pages (``…`` marks the cut).
EVENT_CHARS = 2000

_env = jinja2.Environment(
    loader=jinja2.PackageLoader("leasequeue.dashboard", "templates"),
    autoescape=True,  # every template, whatever its name
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


def _finite(value: Any) -> Any:
    """A float JSON can hold: ``inf`` (a lock that never ends) as the string ``"inf"``."""
    if isinstance(value, float) and not math.isfinite(value):
        return "inf" if value > 0 else "-inf"
    return value


def stats_json(stats: Any) -> Dict[str, int]:
    return {k: int(v) for k, v in stats._asdict().items()}


def group_json(info: Any) -> Dict[str, Any]:
    return {k: _finite(v) for k, v in info._asdict().items()}


def _jsonable(event: Any) -> Any:
    import json

    try:
        json.dumps(event, allow_nan=False)
    except (TypeError, ValueError):
        return repr(event)
    return event


def message_json(m: Any) -> Dict[str, Any]:
    """A peeked message: ``event`` as JSON if it is JSON-able, else its
    repr; an undecodable one ``"event": null``, ``"undecodable": true``,
    ``"error"`` and ``"raw"`` (its stored form's repr)."""
    d: Dict[str, Any] = {"seq": m.seq, "attempt": m.attempt, "due_at": _finite(m.due_at), "key": m.key,
                         "undecodable": False, "event": None}
    if isinstance(m.event, Undecodable):
        d.update(undecodable=True, error=m.event.error, raw=repr(m.event.raw)[:EVENT_CHARS])
    else:
        d["event"] = _jsonable(m.event)
    return d


def event_text(event: Any) -> str:
    """An event as one text for the page: its repr, cut at ``EVENT_CHARS``."""
    if isinstance(event, Undecodable):
        text = f"UNDECODABLE ({event.error}) raw: {event.raw!r}"
    else:
        try:
            text = repr(event)
        except Exception as exc:  # a user class whose __repr__ fails
            text = f"<{type(event).__name__} whose repr raised {type(exc).__name__}>"
    return text if len(text) <= EVENT_CHARS else text[: EVENT_CHARS - 1] + "…"


def group_url(base: str, group_id: str, *, api: bool = False, action: Optional[str] = None) -> str:
    """The path of a group's page (or its API entry, or action): the id
    percent-encoded whole, ``/`` included."""
    url = f"{base}{'/api' if api else ''}/groups/{quote(group_id, safe='')}"
    return f"{url}/{action}" if action else url


def when(value: Optional[float]) -> str:
    """A clock time for people: UTC, and how far from now."""
    if value is None:
        return "–"
    if math.isinf(value):
        return "never"
    try:
        stamp = datetime.datetime.fromtimestamp(value, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):
        return f"{value:.1f}"
    delta = value - time.time()
    return f"{stamp} ({'in ' if delta >= 0 else ''}{abs(delta):.0f}s{'' if delta >= 0 else ' ago'})"


def render(name: str, *, base: str, **context: Any) -> str:
    """Render template ``name`` with the helpers every page uses."""
    return _env.get_template(name).render(
        base=base, group_url=lambda g, **kw: group_url(base, g, **kw), when=when, event_text=event_text,
        urlencode=urlencode, **context)


def messages_rows(messages: List[Any]) -> List[Dict[str, Any]]:
    return [{"seq": m.seq, "attempt": m.attempt, "due_at": m.due_at, "key": m.key,
             "undecodable": isinstance(m.event, Undecodable), "text": event_text(m.event)} for m in messages]
