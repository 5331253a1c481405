"""Dogfood: the conformance kit's ``TransportContract`` on both in-memory
transports, every test on each.

The flags are read from the transports themselves, so the waiting,
control-plane, batch, ... tests switch on by themselves when a transport
gains those methods (Part 5's ``delay``, ``key`` and ``dedup_window`` by
trying them on a throwaway transport).
"""

from __future__ import annotations

import importlib
import os
from typing import Any, Callable, Optional

import pytest

from leasequeue.testing import TransportContract


def _load(name: str) -> Optional[Any]:
    try:
        return importlib.import_module(f"leasequeue._backends.inmemory.transport_{name}").InMemoryTransport
    except ImportError:
        return None


PURE = _load("py")
COMPILED = _load("c")


def _has(cls: Optional[Any], *names: str) -> bool:
    return cls is not None and all(hasattr(cls, name) for name in names)


def _publishes_with(cls: Optional[Any], keyword: str, **options: Any) -> bool:
    """Whether ``cls(**options).publish(..., keyword=<its no-op value>)`` is
    accepted (a ``delay`` of 0 and a ``key`` of None read no clock)."""
    if cls is None:
        return False
    try:
        cls(**options).publish("probe", None, **{keyword: 0.0 if keyword == "delay" else None})
    except TypeError:
        return False
    return True


class TestPureTransport(TransportContract):
    supports_waiting = _has(PURE, "aclaim")
    supports_control_plane = _has(PURE, "pause")
    supports_batches = _has(PURE, "publish_many")
    supports_quarantine = _has(PURE, "bury")
    supports_ack_and_claim = _has(PURE, "ack_and_claim")
    supports_later = _publishes_with(PURE, "delay")
    supports_once = _publishes_with(PURE, "key", dedup_window=0.0)
    supports_release = _has(PURE, "release", "retry")

    def make_transport(self, clock: Callable[[], float], **options: Any) -> Any:
        assert PURE is not None
        return PURE(clock=clock, **options)


class TestCythonTransport(TransportContract):
    supports_waiting = _has(COMPILED, "aclaim")
    supports_control_plane = _has(COMPILED, "pause")
    supports_batches = _has(COMPILED, "publish_many")
    supports_quarantine = _has(COMPILED, "bury")
    supports_ack_and_claim = _has(COMPILED, "ack_and_claim")
    supports_later = _publishes_with(COMPILED, "delay")
    supports_once = _publishes_with(COMPILED, "key", dedup_window=0.0)
    supports_release = _has(COMPILED, "release", "retry")

    def make_transport(self, clock: Callable[[], float], **options: Any) -> Any:
        if COMPILED is None:
            if os.environ.get("LEASEQUEUE_NO_EXTENSIONS"):
                pytest.skip("Cython transport disabled by LEASEQUEUE_NO_EXTENSIONS")
            importlib.import_module("leasequeue._backends.inmemory.transport_c")  # fails the test with the import error
        return COMPILED(clock=clock, **options)
