"""Argument checks shared by the pure-Python transports.

The bad-input table of ``docs/contract.md`` in code: each check converts an accepted value to
its exact type (``str``, ``int``, ``float``) or raises ``TypeError``,
``ValueError`` or ``OverflowError`` with the message every transport uses.
The Cython transport has ``cdef`` twins of these with the same messages
(``tests/inmemory/test_parity.py`` keeps them in step).  They never run user code
beyond the conversions the argument's own type defines, and are called
before any transport takes its lock.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Tuple

from ._types import PARKED

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "check_count",
    "check_duration",
    "check_id",
    "check_item",
    "check_key",
    "check_keyed_item",
    "check_priority",
    "check_reason",
    "check_time",
    "check_timeout",
    "check_worker",
]

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

_INF = math.inf


def check_id(value: Any, name: str) -> str:
    """``group_id`` / ``worker_id``: a ``str``; a subclass becomes an exact ``str``."""
    if type(value) is str:
        return value
    if isinstance(value, str):
        # An exact copy: no user __hash__/__eq__ may run under the lock.
        return str.__getitem__(value, slice(None))
    raise TypeError(f"{name} must be a str, not {type(value).__name__}")


def check_reason(value: Any) -> str:
    """``bury``'s ``reason``: a ``str``; a subclass becomes an exact ``str``."""
    if type(value) is str:
        return value
    if isinstance(value, str):
        return str.__getitem__(value, slice(None))
    raise TypeError(f"reason must be a str, not {type(value).__name__}")


def check_worker(value: Any) -> str:
    """``worker_id``: as ``check_id``, and not the park sentinel."""
    worker_id = check_id(value, "worker_id")
    if worker_id == PARKED:
        raise ValueError(f"worker_id {PARKED!r} is reserved for parked messages")
    return worker_id


def check_priority(value: Any, name: str) -> int:
    """``priority`` / ``min_priority``: an ``int`` (not ``bool``) in the signed 64-bit range."""
    if type(value) is not int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name} must be an int, not {type(value).__name__}")
        value = int(value)
    if value < INT64_MIN or value > INT64_MAX:
        raise OverflowError(f"{name} {value} is outside the signed 64-bit range")
    return value


def check_duration(value: Any, name: str) -> float:
    """``visibility`` / ``delay``: an ``int`` or ``float`` (not ``bool``), ``>= 0``, not NaN.

    ``+inf`` (or an ``int`` too large for a float) means "never expires".
    """
    if type(value) is float:
        seconds = value
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            seconds = float(value)
        except OverflowError:  # an int beyond float range: as good as infinite
            seconds = _INF if value > 0 else -_INF
    else:
        raise TypeError(f"{name} must be an int or float, not {type(value).__name__}")
    if not seconds >= 0.0:  # also catches NaN
        if seconds != seconds:
            raise ValueError(f"{name} must not be NaN")
        raise ValueError(f"{name} must be >= 0, not {value!r}")
    return seconds


def check_timeout(value: Any) -> float:
    """``timeout`` of a waiting claim: ``None`` (no deadline) is ``+inf``;
    otherwise as ``check_duration`` (``-0.0`` is ``0.0``, ``+inf`` is no
    deadline either)."""
    if value is None:
        return _INF
    return check_duration(value, "timeout")


def check_time(value: Any) -> float:
    """A ``clock()`` reading: an ``int`` or ``float`` (not ``bool``), finite."""
    if type(value) is not float:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise TypeError(f"clock() must return an int or float, not {type(value).__name__}")
        try:
            value = float(value)
        except OverflowError:
            raise ValueError(f"clock() returned {value!r}, which is not finite") from None
    if value - value != 0.0:  # NaN or an infinity
        raise ValueError(f"clock() returned {value!r}, which is not finite")
    return value


def check_count(value: Any) -> int:
    """``max_count``: an ``int`` (not ``bool``) ``>= 0``, with no upper bound."""
    if type(value) is not int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"max_count must be an int, not {type(value).__name__}")
        value = int(value)
    if value < 0:
        raise ValueError(f"max_count must be >= 0, not {value!r}")
    return value


def check_item(item: Any) -> Tuple[str, Any, int]:
    """One ``publish_many`` item: ``(group_id, event)`` or ``(group_id, event,
    priority)``, as ``(group_id, event, priority)`` checked as ``publish``
    checks them.

    It must be a ``tuple``; a subclass (a named tuple) is read as the tuple it
    is, without calling its own ``__len__``/``__getitem__``.
    """
    if not issubclass(type(item), tuple):  # the real type: a faked __class__ does not count
        raise TypeError(f"publish_many items must be tuples, not {type(item).__name__}")
    size = tuple.__len__(item)
    if size != 2 and size != 3:
        raise ValueError(f"a publish_many item has 2 or 3 fields, not {size}")
    group_id = check_id(tuple.__getitem__(item, 0), "group_id")
    priority = check_priority(tuple.__getitem__(item, 2), "priority") if size == 3 else 0
    return group_id, tuple.__getitem__(item, 1), priority


def check_key(value: Any) -> Optional[str]:
    """``publish``'s idempotency ``key``: ``None`` or a ``str``; a subclass
    becomes an exact ``str`` (no user ``__hash__``/``__eq__`` under a lock)."""
    if value is None or type(value) is str:
        return value
    if isinstance(value, str):
        return str.__getitem__(value, slice(None))
    raise TypeError(f"key must be a str or None, not {type(value).__name__}")


def check_keyed_item(item: Any) -> Tuple[str, Any, int, Optional[str]]:
    """One ``publish_many`` item of 0.6: ``(group_id, event)``, ``(group_id,
    event, priority)`` or ``(group_id, event, priority, key)``, as
    ``(group_id, event, priority, key)`` checked as ``publish`` checks them
    (fields in order: group_id, priority, key).

    It must be a ``tuple``; a subclass (a named tuple) is read as the tuple it
    is, without calling its own ``__len__``/``__getitem__``.
    """
    if not issubclass(type(item), tuple):  # the real type: a faked __class__ does not count
        raise TypeError(f"publish_many items must be tuples, not {type(item).__name__}")
    size = tuple.__len__(item)
    if size < 2 or size > 4:
        raise ValueError(f"a publish_many item has 2, 3 or 4 fields, not {size}")
    group_id = check_id(tuple.__getitem__(item, 0), "group_id")
    priority = check_priority(tuple.__getitem__(item, 2), "priority") if size >= 3 else 0
    key = check_key(tuple.__getitem__(item, 3)) if size == 4 else None
    return group_id, tuple.__getitem__(item, 1), priority, key
