"""The differential harness: one operation applied to every side, compared.

A *side* is a transport (or the reference) with its own ``ManualClock``;
every side gets the same operations, the same times and the very same event
objects.  ``Harness.apply`` performs an operation on each side, turns each
result into comparable data (``normalize``) and raises ``Disagreement`` (an
``AssertionError``) when the sides differ.  It is strict on purpose:

* only the errors the contract names may pass as results: ``TypeError``,
  ``ValueError``, ``OverflowError``, ``LeaseLost``, and ``ClockFault`` while
  the clock is made to raise it.  Anything else -- a ``KeyError`` in a
  backend, an ``AttributeError`` from a missing method, a bug of the
  harness itself -- fails the run even when every side raises it;
* an error is compared by its kind (the first of those classes it is an
  instance of), so every side must fail the same way;
* a lease is compared field by field with each field's exact type, and its
  event by identity (``preserves_identity``) or by ``==`` (a serialising
  backend returns equal copies).

Operations whose leases are not there (their producer was removed while
shrinking, or returned ``None``) are skipped on every side alike, and so is a
claim that would block: a ``timeout`` above ``MAX_WAIT`` seconds (or
``None``) before the harness has seen ``close()``.
"""

from __future__ import annotations

import math
import traceback
from collections import Counter
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .._errors import LeaseLost, LeaseQueueError
from ._clock import ManualClock
from ._ops import FOREIGN, OMIT, Batch, ClockFault, Forged, LeaseRef, Op, op_refs, render_call

__all__ = ["LEASE_MAKERS", "MAX_WAIT", "SKIPPED", "Disagreement", "Harness", "Side", "normalize"]

#: the longest real-time wait a driven ``claim(timeout=...)`` may cost
MAX_WAIT = 0.05

#: what ``Harness.apply`` returns for an operation it did not run
SKIPPED: Any = ("skipped",)

#: the errors a transport may raise as an answer, in classification order
#: (``LeaseQueueError``: a call on a closed transport that is not usable after
#: ``close()``; ``LeaseLost`` is one too, and is matched first)
EXPECTED_ERRORS: Tuple[type, ...] = (LeaseLost, OverflowError, TypeError, ValueError, LeaseQueueError)

#: the event of the lease issued by another transport instance
FOREIGN_EVENT = ["foreign"]

STATS_FIELDS = ("messages", "groups", "leased", "parked", "paused", "buried", "scheduled")
GROUP_FIELDS = ("group_id", "priority", "messages", "state", "paused", "head_seq", "worker_id", "expires_at",
                "attempt", "last_claimed_at", "reason", "due_at")
LEASE_FIELDS = ("seq", "group_id", "worker_id", "expires_at", "attempt")
MESSAGE_FIELDS = ("seq", "event", "attempt", "due_at", "key")
#: the methods whose results later operations name (``LeaseRef``): a lease
#: (``claim``, ``extend``, ``ack_and_claim``) or a list of them (``claim_many``)
LEASE_MAKERS = ("claim", "extend", "claim_many", "ack_and_claim")


class Disagreement(AssertionError):
    """The sides answered one operation differently (or an error no rule
    allows was raised).  ``uid`` names the operation, ``op`` is it."""

    def __init__(self, uid: int, op: Op, message: str) -> None:
        super().__init__(message)
        self.uid = uid
        self.op = op


_PLAIN = frozenset({str, int, float, list, bool, type(None)})


def forge_lease(lease: Any) -> Any:
    """A hand-made lease with ``lease``'s six fields (of the same class)."""
    return type(lease)(lease.seq, lease.group_id, lease.event, lease.worker_id, lease.expires_at, lease.attempt)


class Side:
    """One transport of the comparison, with its clock and a foreign lease."""

    def __init__(self, name: str, factory: Callable[[ManualClock], Any], *, foreign: bool = True) -> None:
        self.name = name
        self.clock = ManualClock()
        self.transport = factory(self.clock)
        self.foreign: Any = None
        self._other: Any = None
        if foreign:  # another instance: its lease is foreign to ``transport``
            self._other = factory(ManualClock())
            self._other.publish("a", FOREIGN_EVENT)
            self.foreign = self._other.claim("w1", math.inf)
            if self.foreign is None:
                raise AssertionError(f"{name}: could not claim a lease from a fresh transport")


def _seconds(value: Any) -> float:
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def normalize(value: Any, identity: bool = True) -> Any:
    """A result as comparable data: kind, value and exact type of each field."""
    if value is None:
        return None
    kind = type(value)
    if kind is bool:
        return ("bool", value)
    if isinstance(value, int):
        return ("int", kind.__name__, value)
    if isinstance(value, list):
        return ("list", kind.__name__, tuple(normalize(v, identity) for v in value))
    if getattr(value, "_fields", None) == MESSAGE_FIELDS:  # peek: before the lease test (it has attempt, event)
        event = ("is", id(value.event)) if identity else ("==", value.event)
        return ("message", kind.__name__, tuple((f, type(getattr(value, f)).__name__, getattr(value, f))
                                                for f in ("seq", "attempt", "due_at", "key")), event)
    if hasattr(value, "head_seq"):
        return ("group", tuple((f, type(getattr(value, f, None)).__name__, getattr(value, f, None))
                               for f in GROUP_FIELDS))
    if hasattr(value, "attempt") and hasattr(value, "event"):
        event = ("is", id(value.event)) if identity else ("==", value.event)
        fields = tuple((f, type(getattr(value, f)).__name__, getattr(value, f)) for f in LEASE_FIELDS)
        return ("lease", fields, event)
    if hasattr(value, "leased") and hasattr(value, "parked"):
        return ("stats", tuple((f, type(getattr(value, f, None)).__name__, getattr(value, f, None))
                               for f in STATS_FIELDS))
    return ("other", kind.__name__, repr(value))


def describe(outcome: Tuple[str, Any]) -> str:
    """``("returns", value)`` / ``("raises", exc)`` for a message or a comment."""
    how, what = outcome
    if how == "returns":
        return f"-> {what!r}"
    return f"raises {type(what).__name__}: {what}"


class Harness:
    """Applies each operation to every side and insists that they agree.

    ``sides[0]`` is the oracle (the reference) in messages.  ``window``: a
    lease is kept for the operations that follow its producer by at most
    this many uids (memory stays bounded on long runs; replays of a subset
    keep exactly the same leases, since uids do not change).
    """

    def __init__(self, sides: Sequence[Side], *, preserves_identity: bool = True, window: int = 5000,
                 record: bool = False) -> None:
        if len(sides) < 2:
            raise ValueError("a differential needs at least two sides")
        self.sides = list(sides)
        self.identity = preserves_identity
        self.window = window
        self.results: Dict[int, Tuple[Any, ...]] = {}
        self.closed = False
        self.next_uid = 0
        self.applied = 0
        self.skipped = 0
        self.last: Any = None  # the agreed normalized outcome of the latest operation
        self.tally: Counter[str] = Counter()
        #: with ``record``: (uid, op, [outcome per side]) of every operation run
        self.trace: Optional[List[Tuple[int, Op, List[Tuple[str, Any]]]]] = [] if record else None

    # -- what can run ----------------------------------------------------------

    def has(self, ref: LeaseRef) -> bool:
        result = self.results.get(ref.uid)
        if result is None:
            return False
        if ref.k < 0:
            return not isinstance(result[0], list)
        return isinstance(result[0], list) and ref.k < len(result[0])

    def runnable(self, op: Op) -> bool:
        """False for an operation whose leases are gone or that would block."""
        if op[0] != "call" and op[0] != "fault":
            return True
        return all(self.has(ref) for ref in op_refs(op)) and not self._blocks(op)

    def _blocks(self, op: Op) -> bool:
        if op[0] == "fault":
            return self._blocks(op[2])
        if op[0] != "call" or op[1] != "claim" or self.closed:
            return False
        for name, value in op[3]:
            if name == "timeout" and value is not OMIT:
                if value is None:
                    return True
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    return _seconds(value) > MAX_WAIT
        return False

    # -- performing ------------------------------------------------------------

    def _resolve(self, index: int, side: Side, value: Any) -> Any:
        if type(value) in _PLAIN:
            return value
        if value is FOREIGN:
            return side.foreign
        if isinstance(value, LeaseRef):
            result = self.results[value.uid][index]
            return result if value.k < 0 else result[value.k]
        if isinstance(value, Forged):
            return forge_lease(self._resolve(index, side, value.ref))
        if isinstance(value, Batch):
            items = [self._resolve(index, side, v) for v in value.items]
            return tuple(items) if value.form == "tuple" else iter(items) if value.form == "iter" else items
        return value

    def _perform(self, index: int, side: Side, op: Op) -> Any:
        kind = op[0]
        t = side.transport
        if kind == "call":
            _, method, args, kwargs = op
            positional = [self._resolve(index, side, a) for a in args if a is not OMIT]
            named = {k: self._resolve(index, side, v) for k, v in kwargs if v is not OMIT}
            return getattr(t, method)(*positional, **named)
        if kind == "attr":
            return getattr(t, op[1])
        if kind == "len":
            return len(t)
        if kind == "advance":
            side.clock.advance(op[1])
            return None
        if kind == "set":
            side.clock.set(op[1])
            return None
        if kind == "fault":
            outcome = ClockFault("clock broke") if op[1] is ClockFault else op[1]
            with side.clock.misbehave(outcome):
                return self._perform(index, side, op[2])
        raise ValueError(f"unknown operation {op!r}")

    def apply(self, op: Op, uid: Optional[int] = None) -> Any:
        """Run ``op`` on every side; return the agreed normalized outcome, or
        ``SKIPPED``.  Raises ``Disagreement`` when the sides differ."""
        if uid is None:
            uid = self.next_uid
        self.next_uid = uid + 1
        if not self.runnable(op):
            self.skipped += 1
            return SKIPPED
        self.applied += 1
        in_fault = op[0] == "fault"
        raw: List[Tuple[str, Any]] = []
        keys: List[Any] = []
        unexpected: Optional[BaseException] = None
        for index, side in enumerate(self.sides):
            try:
                result = self._perform(index, side, op)
            except Exception as exc:
                raw.append(("raises", exc))
                kind = _error_kind(exc, in_fault)
                if kind is None and unexpected is None:
                    unexpected = exc
                keys.append(("raise", kind or f"unexpected {type(exc).__name__}"))
            else:
                raw.append(("returns", result))
                keys.append(normalize(result, self.identity))
        if self.trace is not None:
            self.trace.append((uid, op, raw))
        if unexpected is not None or any(k != keys[0] for k in keys):
            raise self._disagreement(uid, op, raw, keys, unexpected)
        self._remember(uid, op, raw)
        key = keys[0]
        self.last = key
        name = op[1] if op[0] == "call" else ("fault:" + op[2][1]) if in_fault else op[0]
        if op[0] == "call" and op[1] in ("publish", "publish_many"):  # Part 5's arguments, tallied apart
            given = [k for k, v in op[3] if k in ("delay", "key") and v is not OMIT]
            if op[1] == "publish_many" and any(isinstance(a, Batch) and any(isinstance(i, tuple) and len(i) == 4
                                                                            for i in a.items) for a in op[2]):
                given.append("key")
            if given:
                name += f"({','.join(sorted(set(given)))})"
        self.tally[f"{name} {key[0] if key is not None else 'None'}"] += 1
        return key

    def _remember(self, uid: int, op: Op, raw: List[Tuple[str, Any]]) -> None:
        if op[0] != "call" or raw[0][0] != "returns":
            return
        method = op[1]
        if method == "close":
            self.closed = True
        if method in LEASE_MAKERS and raw[0][1] is not None:
            self.results[uid] = tuple(result for _, result in raw)
            stale = uid - self.window
            while self.results:
                first = next(iter(self.results))
                if first >= stale:
                    break
                del self.results[first]

    def _disagreement(self, uid: int, op: Op, raw: List[Tuple[str, Any]], keys: List[Any],
                      unexpected: Optional[BaseException]) -> Disagreement:
        width = max(len(s.name) for s in self.sides)
        lines = [f"  {s.name:{width}}: {describe(o)}" for s, o in zip(self.sides, raw)]
        head = "an error no rule allows" if unexpected is not None else "the sides disagree"
        message = f"operation #{uid}: {head}\n  {render_call(op)}\n" + "\n".join(lines)
        if unexpected is not None:
            message += "\n" + "".join(traceback.format_exception(type(unexpected), unexpected,
                                                                 unexpected.__traceback__)).rstrip()
        failure = Disagreement(uid, op, message)
        failure.__cause__ = unexpected
        return failure


def _error_kind(exc: BaseException, in_fault: bool) -> Optional[str]:
    if isinstance(exc, ClockFault):
        return "ClockFault" if in_fault else None
    for cls in EXPECTED_ERRORS:
        if isinstance(exc, cls):
            return cls.__name__
    return None
