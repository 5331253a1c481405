"""The operations of the differential test, as data.

An operation is a small tuple, so that a run can be recorded, replayed from
scratch on fresh transports (to shrink a failure) and printed as Python:

* ``("call", method, args, kwargs)``: ``transport.method(*args, **kwargs)``;
  ``kwargs`` is a tuple of ``(name, value)`` pairs.  Among the values,
  ``LeaseRef`` names a lease an earlier operation returned, ``Forged`` a
  hand-built copy of one, ``FOREIGN`` a lease of another transport instance
  and ``Batch`` a list/tuple/iterator built fresh for each side (its
  elements may be any of those).  Everything else is passed as it is, to
  every side: an event is the very same object on each side.
* ``("attr", name)``: read ``transport.name`` (``closed``).
* ``("len",)``: ``len(transport)``.
* ``("advance", seconds)`` / ``("set", t)``: move every side's clock.
* ``("fault", outcome, inner)``: run the ``call`` operation ``inner`` while
  each side's clock misbehaves (``ManualClock.misbehave``): it raises
  ``ClockFault`` when ``outcome`` is ``ClockFault``, else returns ``outcome``.
"""

from __future__ import annotations

import math
from typing import Any, Iterator, NamedTuple, Tuple

__all__ = ["FOREIGN", "OMIT", "Batch", "ClockFault", "Forged", "LeaseRef", "Name", "Op", "Seconds"]

Op = Tuple[Any, ...]


class _Marker:
    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name


#: "leave this optional argument out"
OMIT: Any = _Marker("OMIT")
#: "a lease issued by another instance of the same transport"
FOREIGN: Any = _Marker("FOREIGN")


class LeaseRef(NamedTuple):
    """The lease returned by operation ``uid`` (``k``-th of a ``claim_many``)."""

    uid: int
    k: int = -1


class Forged(NamedTuple):
    """A lease built by hand with the same six fields as ``ref``: never current."""

    ref: LeaseRef


class Batch(NamedTuple):
    """An argument built fresh per side: ``form`` is list, tuple or iter."""

    form: str
    items: Tuple[Any, ...]


class Name(str):
    """A ``str`` subclass: a transport must store and return an exact ``str``."""

    __slots__ = ()


class Seconds(float):
    """A ``float`` subclass a clock may return: it must become an exact float."""

    __slots__ = ()


class ClockFault(Exception):
    """What a misbehaving clock raises; it must propagate unchanged."""


def refs_in(value: Any) -> Iterator[LeaseRef]:
    """Every ``LeaseRef`` an argument needs (directly, forged, in a batch)."""
    if isinstance(value, LeaseRef):
        yield value
    elif isinstance(value, Forged):
        yield value.ref
    elif isinstance(value, Batch):
        for item in value.items:
            yield from refs_in(item)


def op_refs(op: Op) -> Iterator[LeaseRef]:
    if op[0] == "fault":
        yield from op_refs(op[2])
    elif op[0] == "call":
        for value in op[2]:
            yield from refs_in(value)
        for _, value in op[3]:
            yield from refs_in(value)


def uses(op: Op, marker: Any) -> bool:
    """Does the operation involve ``marker`` (FOREIGN, Forged, Name, Seconds, ClockFault)?"""
    if op[0] == "fault":
        return _has(op[1], marker) or uses(op[2], marker)
    if op[0] == "call":
        return any(_has(v, marker) for v in op[2]) or any(_has(v, marker) for _, v in op[3])
    return False


def _has(value: Any, marker: Any) -> bool:
    if value is marker:
        return True
    if isinstance(marker, type) and (isinstance(value, marker) or value is marker):
        return True
    if isinstance(value, Batch):
        return any(_has(v, marker) for v in value.items)
    if isinstance(value, (tuple, list)) and not isinstance(value, (LeaseRef, Forged)):
        return any(_has(v, marker) for v in value)
    return False


# -- printing -----------------------------------------------------------------


def render(value: Any) -> str:
    """A Python expression that rebuilds ``value`` in a printed script."""
    if value is FOREIGN:
        return "foreign"
    if value is ClockFault:
        return "ClockFault('clock broke')"
    if isinstance(value, LeaseRef):
        return f"l{value.uid}" if value.k < 0 else f"l{value.uid}[{value.k}]"
    if isinstance(value, Forged):
        return f"forge({render(value.ref)})"
    if isinstance(value, Batch):
        inner = ", ".join(render(v) for v in value.items)
        if value.form == "tuple":
            return f"({inner}{',' if len(value.items) == 1 else ''})"
        return f"iter([{inner}])" if value.form == "iter" else f"[{inner}]"
    if isinstance(value, Name):
        return f"Name({str.__repr__(value)})"
    if isinstance(value, Seconds):
        return f"Seconds({float.__repr__(value)})"
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "math.nan"
        if math.isinf(value):
            return "math.inf" if value > 0 else "-math.inf"
        return repr(value)
    if isinstance(value, int):
        return _render_int(value)
    if isinstance(value, tuple):
        inner = ", ".join(render(v) for v in value)
        return f"({inner}{',' if len(value) == 1 else ''})"
    if isinstance(value, list):
        return "[" + ", ".join(render(v) for v in value) + "]"
    if isinstance(value, BaseException):
        return f"{type(value).__name__}({', '.join(render(a) for a in value.args)})"
    return repr(value)


def _render_int(value: int) -> str:
    if abs(value) < 2**40:
        return repr(value)
    sign = "-" if value < 0 else ""
    magnitude = abs(value)
    for base in (2, 10):
        power = round(math.log(magnitude, base)) if magnitude > 0 else 0
        for p in (power - 1, power, power + 1):
            for delta in (0, -1, 1):
                if base**p + delta == magnitude:
                    expr = f"{base}**{p}" + ("" if delta == 0 else f" {'-' if delta < 0 else '+'} 1")
                    return f"-({expr})" if sign else expr
    return repr(value)


def render_call(op: Op) -> str:
    """``t.method(args)`` for a call, ``len(t)``, ``t.closed``, ``clock...``."""
    kind = op[0]
    if kind == "call":
        _, method, args, kwargs = op
        parts = [render(a) for a in args if a is not OMIT]
        parts += [f"{name}={render(v)}" for name, v in kwargs if v is not OMIT]
        return f"t.{method}({', '.join(parts)})"
    if kind == "attr":
        return f"t.{op[1]}"
    if kind == "len":
        return "len(t)"
    if kind == "advance":
        return f"clock.advance({render(op[1])})"
    if kind == "set":
        return f"clock.set({render(op[1])})"
    if kind == "fault":
        return f"with clock.misbehave({render(op[1])}): {render_call(op[2])}"
    raise ValueError(f"unknown operation {op!r}")
