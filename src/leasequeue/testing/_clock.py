"""``ManualClock``: a clock a test injects into a transport and moves by hand.

Every transport takes ``clock=``, a zero-argument callable returning seconds.
Tests of leases, parks and expiry need time that stands still until the test
says otherwise, and sometimes a clock that misbehaves (raises, returns NaN or
a string) to check that a transport validates what its clock says and
changes nothing when the clock fails.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Iterator

__all__ = ["ManualClock"]

_BEHAVING: Any = object()


class ManualClock:
    """A clock that moves only when told to.  Thread-safe.

    ``clock()`` returns the current time (``start`` at first, ``1000.0`` by
    default, so that ``now - visibility`` stays positive in tests).
    ``advance(seconds)`` moves it (a negative step turns it back, which a
    transport must survive: its own time never runs backwards),
    ``set(t)`` jumps to ``t``, and ``now`` reads (or assigns) it without
    counting as a read.  ``reads`` counts the calls, so a test can check
    which operations read the clock and how often.

    ``with clock.misbehave(outcome):`` makes every read inside the block
    raise ``outcome`` when it is an exception instance, or return it as it is
    otherwise (``float("nan")``, ``"noon"``, ``None``, ``True``, an ``int``
    beyond float range...): the SPEC's "``clock()`` raising / returning a
    non-number or NaN" rows.  The time itself does not change.
    """

    __slots__ = ("_now", "_lock", "_reads", "_outcome")

    def __init__(self, start: float = 1000.0) -> None:
        self._now = float(start)
        self._lock = threading.Lock()
        self._reads = 0
        self._outcome: Any = _BEHAVING

    def __call__(self) -> float:
        with self._lock:
            self._reads += 1
            outcome = self._outcome
            now = self._now
        if outcome is _BEHAVING:
            return now
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome  # deliberately not (always) a float

    @property
    def now(self) -> float:
        """The current time, read without counting as a ``clock()`` call."""
        with self._lock:
            return self._now

    @now.setter
    def now(self, value: float) -> None:
        self.set(value)

    @property
    def reads(self) -> int:
        """How many times the clock has been called."""
        with self._lock:
            return self._reads

    def advance(self, seconds: float) -> float:
        """Move the clock by ``seconds`` (negative: back); return the new time."""
        with self._lock:
            self._now += float(seconds)
            return self._now

    def set(self, t: float) -> None:
        """Jump to time ``t`` (forwards or backwards)."""
        with self._lock:
            self._now = float(t)

    @contextmanager
    def misbehave(self, outcome: Any) -> Iterator[None]:
        """Within the block, every read raises or returns ``outcome`` (see class doc)."""
        with self._lock:
            previous, self._outcome = self._outcome, outcome
        try:
            yield
        finally:
            with self._lock:
                self._outcome = previous

    def __repr__(self) -> str:
        return f"ManualClock({self.now!r})"
