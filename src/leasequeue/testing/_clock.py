"""``ManualClock``: a clock to inject into a transport, moved by hand.

Every transport takes ``clock=``, a zero-argument callable returning seconds.
Tests inject a ``ManualClock`` so that leases and parks expire exactly when
the test says, whatever the real time: ``advance(30)`` moves 30 seconds on.
"""

from __future__ import annotations

import threading

__all__ = ["ManualClock"]


class ManualClock:
    """A clock that only moves when told to; thread-safe.

    ``clock()`` returns the current reading (a float, 1000.0 by default:
    far from 0 so that an accidental ``0`` expiry shows).  ``advance(s)``
    moves it by ``s`` seconds (negative moves it back, to test clocks that
    jump), ``set(t)`` sets it.
    """

    def __init__(self, start: float = 1000.0) -> None:
        self._now = float(start)
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        """Move the clock by ``seconds``; return the new reading."""
        with self._lock:
            self._now += float(seconds)
            return self._now

    def set(self, now: float) -> None:
        """Set the reading to ``now``."""
        with self._lock:
            self._now = float(now)

    def __repr__(self) -> str:
        return f"ManualClock({self()!r})"
