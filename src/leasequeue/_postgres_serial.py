"""Event serializers of the durable backends: a ``(dumps, loads)`` pair.

A durable transport stores each event as bytes, so ``lease.event`` is an
equal copy of the published object, not the object itself.  The default is
``pickle`` at its highest protocol (any picklable object); ``"json"`` is
offered for events other languages or tools must read.  Any pair of
callables works: ``dumps(event) -> bytes | str`` and ``loads(bytes) -> event``.
"""

from __future__ import annotations

import json
import pickle
from typing import Any, Callable, Tuple

__all__ = ["JSON", "PICKLE", "Serializer", "dump", "resolve_serializer"]

Serializer = Tuple[Callable[[Any], Any], Callable[[bytes], Any]]


def _pickle_dumps(event: Any) -> bytes:
    return pickle.dumps(event, protocol=pickle.HIGHEST_PROTOCOL)


def _json_dumps(event: Any) -> bytes:
    return json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


PICKLE: Serializer = (_pickle_dumps, pickle.loads)
JSON: Serializer = (_json_dumps, json.loads)


def resolve_serializer(serializer: Any) -> Serializer:
    """``None``/``"pickle"`` -> PICKLE, ``"json"`` -> JSON, or a checked pair."""
    if serializer is None or serializer == "pickle":
        return PICKLE
    if serializer == "json":
        return JSON
    if isinstance(serializer, str):
        raise ValueError(f"serializer must be 'pickle', 'json' or a (dumps, loads) pair, not {serializer!r}")
    try:
        dumps, loads = serializer
    except (TypeError, ValueError):
        raise TypeError(
            f"serializer must be 'pickle', 'json' or a (dumps, loads) pair, not {type(serializer).__name__}"
        ) from None
    if not callable(dumps) or not callable(loads):
        raise TypeError("serializer must be a pair of callables (dumps, loads)")
    return dumps, loads


def dump(dumps: Callable[[Any], Any], event: Any) -> bytes:
    """Serialize one event to ``bytes`` (a ``str`` result is UTF-8 encoded)."""
    data = dumps(event)
    if isinstance(data, bytes):
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    if isinstance(data, str):
        return data.encode("utf-8")
    raise TypeError(f"the serializer's dumps() must return bytes or str, not {type(data).__name__}")
