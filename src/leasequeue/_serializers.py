"""How the durable backends store events: a ``(dumps, loads)`` pair.

A durable transport (SQLite, PostgreSQL) keeps each event as bytes or text,
so ``lease.event`` is an equal copy of the published object, not the object
itself (``docs/contract.md``, Part 3).  ``serializer=`` of both takes:

* ``None`` or ``"pickle"``: ``PICKLE_SERIALIZER``, pickle at its highest
  protocol (any picklable object; the default);
* ``"json"``: ``JSON_SERIALIZER``, compact JSON text, for events other
  languages or tools must read (JSON values only; ``NaN`` refused; tuples
  come back as lists);
* a ``(dumps, loads)`` tuple of callables: ``dumps(event)`` returns
  ``bytes`` or ``str``, ``loads`` gets back what was stored.

An event whose ``dumps`` raises is not published (the serializer's error
propagates).  One whose ``loads`` raises at claim time raises
``EventDecodeError``: the claim happened, and the error carries its lease.
``peek`` never raises for it: the message's ``event`` is an
``Undecodable`` (the stored form and the error), so an operator can see a
poison message that cannot be decoded.

Standard library only: ``leasequeue.JSON_SERIALIZER``,
``PICKLE_SERIALIZER``, ``EventDecodeError`` and ``Undecodable`` need neither sqlite3 nor
psycopg.
"""

from __future__ import annotations

import json
import pickle
from dataclasses import dataclass
from typing import Any, Callable, List, Tuple, Union

from ._errors import LeaseQueueError

__all__ = [
    "JSON_SERIALIZER",
    "PICKLE_SERIALIZER",
    "EventDecodeError",
    "Serializer",
    "Undecodable",
    "check_serializer",
    "decode_or_undecodable",
    "serialize",
    "serialize_bytes",
]

#: ``(dumps, loads)``: ``dumps(event) -> bytes | str``, ``loads(stored) -> event``.
Serializer = Tuple[Callable[[Any], Union[bytes, str]], Callable[[Any], Any]]


def _pickle_dumps(event: Any) -> bytes:
    return pickle.dumps(event, pickle.HIGHEST_PROTOCOL)


def _json_dumps(event: Any) -> str:
    return json.dumps(event, separators=(",", ":"), allow_nan=False)


#: The default: pickle at the highest protocol (any picklable event).
PICKLE_SERIALIZER: Serializer = (_pickle_dumps, pickle.loads)
#: JSON text (events must be JSON values; tuples come back as lists).
JSON_SERIALIZER: Serializer = (_json_dumps, json.loads)


class EventDecodeError(LeaseQueueError):
    """A claimed message's event could not be deserialized.

    The claim happened: ``lease`` is its lease, with the stored bytes (or
    text) as its ``event``, so the caller may ack or nack it.  Left alone, the
    lease expires and the message is delivered again.  From ``claim_many``,
    ``leases`` holds every lease of the batch.
    """

    def __init__(self, message: str, lease: Any) -> None:
        super().__init__(message)
        self.lease = lease
        #: claim_many: every lease of the batch (the undecodable ones with
        #: their stored bytes as the event), all of them claimed.
        self.leases: List[Any] = [lease]


@dataclass(frozen=True)
class Undecodable:
    """What ``peek`` shows for a stored event that ``loads`` cannot decode.

    ``raw`` is the stored form (``bytes``, or ``str`` for a text-storing
    serializer on SQLite) and ``error`` one line naming the exception, e.g.
    ``"AttributeError: Can't get attribute 'Order' on <module '__main__'>"``.
    ``peek`` returns it as the message's ``event`` instead of raising, so a
    poison message that cannot be decoded can be seen (and skipped); a claim
    of that message still raises ``EventDecodeError`` carrying its lease.
    """

    raw: Union[bytes, str]
    error: str

    # How many characters of raw's repr repr() shows.
    _REPR_RAW = 60

    def __repr__(self) -> str:
        raw = repr(self.raw)
        if len(raw) > self._REPR_RAW:
            unit = "bytes" if isinstance(self.raw, bytes) else "chars"
            raw = f"{raw[: self._REPR_RAW - 3]}... ({len(self.raw)} {unit})"
        return f"Undecodable(error={self.error!r}, raw={raw})"


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def decode_or_undecodable(loads: Callable[[Any], Any], data: Any) -> Any:
    """``loads(data)``, or an ``Undecodable`` of ``data`` if it raises an
    ``Exception`` (a ``BaseException`` propagates): what ``peek`` shows."""
    try:
        return loads(data)
    except Exception as exc:
        return Undecodable(data, _one_line(exc))


def check_serializer(serializer: Any) -> Serializer:
    """The ``(dumps, loads)`` pair that ``serializer=`` names.

    ``ValueError`` for an unknown name, ``TypeError`` for anything that is
    neither a name nor a tuple of two callables.
    """
    if serializer is None:
        return PICKLE_SERIALIZER
    if isinstance(serializer, str):
        if serializer == "pickle":
            return PICKLE_SERIALIZER
        if serializer == "json":
            return JSON_SERIALIZER
        raise ValueError(f"serializer must be 'pickle', 'json' or a (dumps, loads) pair, not {serializer!r}")
    if (
        not isinstance(serializer, tuple)
        or tuple.__len__(serializer) != 2
        or not callable(tuple.__getitem__(serializer, 0))
        or not callable(tuple.__getitem__(serializer, 1))
    ):
        raise TypeError(
            f"serializer must be None, 'pickle', 'json' or a (dumps, loads) pair of callables, "
            f"not {type(serializer).__name__}"
        )
    return (tuple.__getitem__(serializer, 0), tuple.__getitem__(serializer, 1))


def serialize(dumps: Callable[[Any], Any], event: Any) -> Union[bytes, str]:
    """``dumps(event)`` as an exact ``bytes`` or ``str`` (``bytearray`` and
    ``memoryview`` become ``bytes``, a ``str`` subclass an exact ``str``);
    ``TypeError`` for anything else.  The serializer's own errors propagate."""
    data = dumps(event)
    if type(data) is not bytes and type(data) is not str:
        if isinstance(data, (bytes, bytearray, memoryview)):
            return bytes(data)
        if isinstance(data, str):
            return str.__getitem__(data, slice(None))
        raise TypeError(f"the serializer's dumps() must return bytes or str, not {type(data).__name__}")
    return data


def serialize_bytes(dumps: Callable[[Any], Any], event: Any) -> bytes:
    """``serialize``, with a ``str`` encoded as UTF-8: for a store that keeps
    bytes only (PostgreSQL's ``bytea``).  ``loads`` then gets the bytes
    (``json.loads`` and ``pickle.loads`` take them)."""
    data = serialize(dumps, event)
    if isinstance(data, str):
        return data.encode("utf-8")
    return data
