"""``check_differential``: your transport and the reference, same random
operations, every answer compared.

An engine author who writes a backend (SQLite, PostgreSQL, Redis...) calls::

    from leasequeue.testing import check_differential

    def test_my_backend_matches_the_reference():
        for seed in range(20):
            check_differential(lambda clock: MyTransport(clock=clock), seed=seed, ops=2000)

``make_transport(clock)`` must build a fresh, empty transport that reads time
from ``clock`` (a ``ManualClock``); to be checked with a ``dedup_window`` too,
let it take the keyword: ``lambda clock, dedup_window=0.0:
MyTransport(clock=clock, dedup_window=dedup_window)``.  It is called many times -- a second
instance for foreign leases, and fresh ones for every replay while a failure
is shrunk -- so keep it cheap (a new temporary database file each call, say)
and deterministic: the same operations must give the same answers.  The check drives that transport and a
``ReferenceTransport`` with the same seeded random operations -- publish,
claim, ack, nack, extend, stats, len, close, Part 2's control plane and
batches, Part 4's bury / skip / peek, ``ack_and_claim``, Part 5's
delayed and keyed publishes, ``release`` and ``retry``, bad input of
every kind, stale, forged and foreign leases, a clock that jumps, goes
back, raises or returns garbage -- and compares every result and every
error.  At the first difference it *shrinks* the run
(delta debugging, replaying subsets from scratch) to a 1-minimal list of
operations and raises ``DifferentialFailure`` (an ``AssertionError``) whose
message is that list as a Python script you can paste and run.  The
exception also carries the list (``failure.ops``), which ``replay`` runs
again, e.g. in a regression test.

Flags say what a backend does not promise:

* ``preserves_identity=False``: events come back as equal copies (the
  backend serialises them), so they are compared with ``==``, not ``is``.
  The events the check publishes are small lists (``["e", 17]``): pickle and
  JSON both carry them.
* ``waiting``, ``control_plane``, ``batches``, ``quarantine``,
  ``ack_and_claim``: ``None`` (the default) drives each Part 2 and Part 4
  feature the transport has (``claim(timeout=)`` with ``closed``;
  ``pause``/``resume``/``purge``/``set_priority``/``group``/``groups``;
  ``publish_many``/``claim_many``/``ack_many``; ``bury``/``skip``/``peek``;
  ``ack_and_claim``); ``True`` requires it
  (``ValueError`` if missing); ``False`` leaves it out.  A transport without
  a feature gets exactly the operations it got before the feature existed.
* ``forged_leases`` / ``foreign_leases``: hand-built leases and leases of
  another instance, which the contract says are never current.
* ``accepts_rebuilt_leases=True``: the backend names a delivery by the
  lease's fields (a durable backend, whose leases any process may rebuild
  from ``seq``, ``group_id``, ``worker_id`` and ``attempt``), so a
  hand-built or foreign lease is current wherever those fields name the
  open delivery.  The default reference is then built with the same rule
  (``ReferenceTransport(clock, accepts_rebuilt_leases=True)``), and forged
  and foreign leases are still driven: the two sides must agree on which
  are current.
* ``usable_after_close=False``: the backend's ``close()`` releases its
  connection (docs/decisions.md, "Part 3"): ``close()`` is then driven only
  among the last operations of a run, and after it a claim with a non-zero
  timeout must return ``None`` and every other call raise
  ``LeaseQueueError`` (the default reference is built with that rule).
* ``clock_faults``: a clock that raises or returns garbage.
* ``later``, ``once``, ``release`` (Part 5): ``None`` (the default) drives
  each one both sides have -- ``publish(..., delay=)`` and
  ``publish_many(..., delay=)``; ``publish(..., key=)`` and 4-tuple
  ``publish_many`` items; ``release`` and ``retry`` -- ``True`` requires
  it, ``False`` leaves it out.  With ``once``, the run's ``dedup_window``
  is drawn from the seed among 0.0, 7.5 and ``math.inf`` (or given as
  ``dedup_window=``): both sides are then built with
  ``make_transport(clock, dedup_window=w)`` (with ``make_transport(clock)``
  when ``w`` is 0.0).  A factory that takes no ``dedup_window`` keyword
  (by its signature) gets 0.0 only.

The reference never waits, and neither does the check: a claim with a
timeout above ``MAX_WAIT`` (50 ms) is only driven once the transport is
closed, when it must return ``None`` at once.
"""

from __future__ import annotations

import functools
import inspect
import math
import random
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Set, Tuple

from .._errors import LeaseLost
from ._clock import ManualClock
from ._generator import ACK_AND_CLAIM, BATCHES, CONTROL_PLANE, QUARANTINE, WINDOWS, Capabilities, RandomOps
from ._harness import LEASE_MAKERS, Disagreement, Harness, Side, describe
from ._ops import FOREIGN, ClockFault, Forged, Name, Op, Seconds, render, render_call, uses
from ._reference import ReferenceTransport
from ._shrink import ddmin

__all__ = ["DifferentialFailure", "DifferentialSummary", "accepts_dedup_window", "check_differential",
           "detect_capabilities", "replay"]

Factory = Callable[[ManualClock], Any]
Recorded = List[Tuple[int, Op]]


class DifferentialSummary(NamedTuple):
    """What a passing ``check_differential`` run did (to assert that it did)."""

    #: operations applied to every side (skipped ones not counted)
    operations: int
    #: operations skipped (a claim that would block before ``close()``)
    skipped: int
    #: ``"method outcome"`` -> count, e.g. ``"claim lease"``, ``"ack raise"``
    tally: Dict[str, int]
    single_level: bool
    capabilities: Capabilities


class DifferentialFailure(AssertionError):
    """The transport disagreed with the reference.

    ``ops`` is the shrunk operation list (``(uid, operation)`` pairs, which
    ``replay`` runs again), ``script`` the same as Python, ``expected`` and
    ``actual`` the reference's and the transport's outcome of the last
    operation (``"-> value"`` or ``"raises Type: message"``), and
    ``dedup_window`` the window both sides were built with (pass it to
    ``replay``).
    """

    def __init__(self, message: str, ops: Recorded, script: str, expected: str, actual: str,
                 dedup_window: float = 0.0) -> None:
        super().__init__(message)
        self.ops = ops
        self.script = script
        self.expected = expected
        self.actual = actual
        self.dedup_window = dedup_window


#: Part 5's capabilities, as ``Capabilities`` fields and ``_probe`` names
PART5 = ("later", "once", "release")


def _accepts(call: Callable[[], Any]) -> bool:
    try:
        call()
    except TypeError:
        return False
    return True


def _probe(factory: Factory) -> Tuple[Set[str], bool]:
    """The methods and Part 5 capabilities a fresh transport has (Part 5's
    as the names ``later``, ``once``, ``release``), and waiting."""
    t = factory(ManualClock())
    methods = {m for m in CONTROL_PLANE + BATCHES + QUARANTINE + ACK_AND_CLAIM if callable(getattr(t, m, None))}
    try:
        t.claim("probe", 0.0, 0, timeout=0.0)
    except TypeError:
        waiting = False
    else:
        waiting = hasattr(t, "closed")
    # a delay of 0 and a key of None read no clock and publish as Part 1 does
    if _accepts(lambda: t.publish("probe", ["probe"], delay=0.0)):
        methods.add("later")
    if _accepts(lambda: t.publish("probe", ["probe"], key=None)):
        methods.add("once")
    if callable(getattr(t, "release", None)) and callable(getattr(t, "retry", None)):
        methods.add("release")
    t.close()
    return methods, waiting


def accepts_dedup_window(factory: Callable[..., Any]) -> bool:
    """Can ``factory(clock, dedup_window=w)`` be called?  By its signature
    (a ``dedup_window`` parameter or ``**kwargs``); when the signature cannot
    be read (a compiled class), by building one with ``dedup_window=1.0``
    (a ``TypeError``: no)."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        try:
            built = factory(ManualClock(), dedup_window=1.0)
        except TypeError:
            return False
        close = getattr(built, "close", None)
        if callable(close):
            close()
        return True
    for parameter in signature.parameters.values():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            return True
        if parameter.name == "dedup_window" and parameter.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                                   inspect.Parameter.KEYWORD_ONLY):
            return True
    return False


def _with_window(factory: Factory, window: float) -> Factory:
    """``factory`` building with ``dedup_window=window`` (itself for 0.0)."""
    if window == 0.0:
        return factory
    return lambda clock: factory(clock, dedup_window=window)  # type: ignore[call-arg]


def draw_window(seed: int) -> float:
    """The ``dedup_window`` of a run with keys, from its seed (a stream of
    its own, so the operations' draws do not depend on it)."""
    return random.Random(f"dedup_window:{seed}").choice(WINDOWS)


def detect_capabilities(
    make_transport: Factory,
    reference: Factory = ReferenceTransport,
    *,
    waiting: Optional[bool] = None,
    control_plane: Optional[bool] = None,
    batches: Optional[bool] = None,
    forged_leases: bool = True,
    foreign_leases: bool = True,
    clock_faults: bool = True,
    quarantine: Optional[bool] = None,
    ack_and_claim: Optional[bool] = None,
    later: Optional[bool] = None,
    once: Optional[bool] = None,
    release: Optional[bool] = None,
) -> Capabilities:
    """What both sides have, narrowed or required by the flags (see module doc)."""
    methods, has_waiting = _probe(make_transport)
    ref_methods, ref_waiting = _probe(reference)
    driven = set()
    for names, flag in ((CONTROL_PLANE, control_plane), (BATCHES, batches), (QUARANTINE, quarantine),
                        (ACK_AND_CLAIM, ack_and_claim)):
        if flag is False:
            continue
        missing = [m for m in names if m not in methods]
        if flag and missing:
            raise ValueError(f"the transport has no {', '.join(missing)}")
        driven |= {m for m in names if m in methods and m in ref_methods}
    if waiting and not has_waiting:
        raise ValueError("the transport has no claim(timeout=...) / closed")
    part5 = {}
    for name, flag, what in (("later", later, "publish(delay=)"), ("once", once, "publish(key=)"),
                             ("release", release, "release / retry")):
        if flag and name not in methods:
            raise ValueError(f"the transport has no {what}")
        part5[name] = flag is not False and name in methods and name in ref_methods
    return Capabilities(
        methods=frozenset(driven),
        waiting=bool(has_waiting and ref_waiting and waiting is not False),
        forged=forged_leases,
        foreign=foreign_leases,
        clock_faults=clock_faults,
        **part5,
    )


def _sides(make_transport: Factory, reference: Factory, caps: Capabilities,
           names: Sequence[str]) -> List[Side]:
    window = caps.dedup_window
    return [Side(names[0], _with_window(reference, window), foreign=caps.foreign),
            Side(names[1], _with_window(make_transport, window), foreign=caps.foreign)]


def _reference_for(reference: Factory, accepts_rebuilt_leases: bool, usable_after_close: bool) -> Factory:
    """The default reference, with the backend's rules for rebuilt leases and
    for calls after ``close()``."""
    if reference is ReferenceTransport and (accepts_rebuilt_leases or not usable_after_close):
        return functools.partial(ReferenceTransport, accepts_rebuilt_leases=accepts_rebuilt_leases,
                                 usable_after_close=usable_after_close)
    return reference


def replay(
    make_transport: Factory,
    ops: Recorded,
    *,
    reference: Factory = ReferenceTransport,
    preserves_identity: bool = True,
    foreign_leases: bool = True,
    record: bool = False,
    names: Sequence[str] = ("reference", "transport"),
    accepts_rebuilt_leases: bool = False,
    usable_after_close: bool = True,
    dedup_window: float = 0.0,
) -> Harness:
    """Run recorded operations on fresh sides (built with ``dedup_window``
    when it is not 0.0, as ``DifferentialFailure.dedup_window`` says);
    raises ``Disagreement`` (an ``AssertionError``) at the first difference,
    else returns the harness."""
    reference = _reference_for(reference, accepts_rebuilt_leases, usable_after_close)
    caps = Capabilities(foreign=foreign_leases, dedup_window=dedup_window)
    harness = Harness(_sides(make_transport, reference, caps, names), preserves_identity=preserves_identity,
                      record=record)
    for uid, op in ops:
        harness.apply(op, uid)
    return harness


def check_differential(
    make_transport: Factory,
    *,
    ops: int = 2000,
    seed: int = 0,
    reference: Factory = ReferenceTransport,
    groups: Optional[int] = None,
    single_level: Optional[bool] = None,
    preserves_identity: bool = True,
    waiting: Optional[bool] = None,
    control_plane: Optional[bool] = None,
    batches: Optional[bool] = None,
    forged_leases: bool = True,
    foreign_leases: bool = True,
    clock_faults: bool = True,
    shrink: bool = True,
    shrink_budget: int = 3_000_000,
    names: Sequence[str] = ("reference", "transport"),
    accepts_rebuilt_leases: bool = False,
    usable_after_close: bool = True,
    quarantine: Optional[bool] = None,
    ack_and_claim: Optional[bool] = None,
    later: Optional[bool] = None,
    once: Optional[bool] = None,
    release: Optional[bool] = None,
    dedup_window: Optional[float] = None,
) -> DifferentialSummary:
    """Drive ``make_transport(clock)`` and ``reference(clock)`` with ``ops``
    random operations from ``seed``; raise ``DifferentialFailure`` with a
    shrunk reproduction at the first difference (see the module doc).

    ``groups`` (how many group names) and ``single_level`` (one priority
    level only) are drawn from the seed unless given.  ``reference`` may be
    any other transport factory (leasequeue compares its pure and compiled
    transports this way).  ``shrink_budget`` bounds the operations replayed
    while shrinking; ``names`` label the two sides in messages.
    ``dedup_window``: ``None`` draws it from the seed when keys are driven
    (0.0 when they are not, or when a factory takes no ``dedup_window``);
    a number builds both sides with it (keys driven or not).
    """
    reference = _reference_for(reference, accepts_rebuilt_leases, usable_after_close)
    caps = detect_capabilities(make_transport, reference, waiting=waiting, control_plane=control_plane,
                               batches=batches, forged_leases=forged_leases, foreign_leases=foreign_leases,
                               clock_faults=clock_faults, quarantine=quarantine, ack_and_claim=ack_and_claim,
                               later=later, once=once, release=release)
    takes_window = accepts_dedup_window(make_transport) and accepts_dedup_window(reference)
    if dedup_window is None:
        window = draw_window(seed) if caps.once and takes_window else 0.0
    else:
        window = float(dedup_window)
        if window != 0.0 and not takes_window:
            raise ValueError("dedup_window is given, but a factory takes no dedup_window keyword")
        if math.isnan(window) or window < 0:
            raise ValueError(f"dedup_window must be >= 0, not {dedup_window!r}")
    caps = caps._replace(usable_after_close=usable_after_close, dedup_window=window)
    harness = Harness(_sides(make_transport, reference, caps, names), preserves_identity=preserves_identity)
    generator = RandomOps(harness, seed, ops, caps=caps, groups=groups, single_level=single_level)
    recorded: Recorded = []
    try:
        for op in generator:
            uid = len(recorded)
            recorded.append((uid, op))
            harness.apply(op, uid)
    except Disagreement as first:
        raise _failure(first, recorded, make_transport, reference, caps, preserves_identity, names, seed,
                       shrink, shrink_budget) from None
    return DifferentialSummary(harness.applied, harness.skipped, dict(harness.tally), generator.single_level, caps)


def _failure(first: Disagreement, recorded: Recorded, make_transport: Factory, reference: Factory,
             caps: Capabilities, identity: bool, names: Sequence[str], seed: int, shrink: bool,
             budget: int) -> DifferentialFailure:
    """Shrink the failing run and describe it."""

    def run(candidate: Recorded, record: bool = False) -> Tuple[Harness, Optional[Disagreement]]:
        harness = Harness(_sides(make_transport, reference, caps, names), preserves_identity=identity,
                          record=record)
        try:
            for uid, op in candidate:
                harness.apply(op, uid)
        except Disagreement as failure:
            return harness, failure
        return harness, None

    shrunk, complete = recorded, False
    if shrink:
        shrunk, complete = ddmin(recorded, lambda c: run(c)[1] is not None, budget)
    harness, final = run(shrunk, record=True)
    if final is None:  # the transport did not fail again: not deterministic
        return DifferentialFailure(
            f"check_differential(seed={seed}): the sides disagree, but a replay from scratch did not "
            f"(is the transport deterministic?):\n{first}", recorded, "", "", "", caps.dedup_window)
    assert harness.trace is not None
    script = render_script(harness.trace, shrunk, names, caps.dedup_window)
    raw = harness.trace[-1][2]
    note = "1-minimal: removing any one operation makes it pass" if complete else (
        "the shrinking budget ran out: it may not be minimal" if shrink else "not shrunk")
    window = f", dedup_window={render(caps.dedup_window)}" if caps.dedup_window else ""
    message = (f"check_differential(seed={seed}{window}): {names[1]} disagrees with {names[0]} "
               f"(first seen at operation #{first.uid} of the run)\n{final}\n\n"
               f"Reproduction, {len(harness.trace)} of {len(recorded)} operations ({note}); "
               f"bind make_transport and run it:\n\n{script}")
    return DifferentialFailure(message, shrunk, script, describe(raw[0]), describe(raw[1]), caps.dedup_window)


def _short(text: str, limit: int = 110) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def render_script(trace: Sequence[Tuple[int, Op, List[Tuple[str, Any]]]], ops: Recorded,
                  names: Sequence[str] = ("reference", "transport"), dedup_window: float = 0.0) -> str:
    """The traced operations as a Python script; the last one disagrees.
    The transports are built with ``dedup_window`` unless it is 0.0."""
    window = f", dedup_window={render(dedup_window)}" if dedup_window else ""
    all_ops = [op for _, op in ops]
    lines = [
        "import math",
        "from contextlib import suppress",
        "",
        "from leasequeue import LeaseLost",
        "from leasequeue.testing import ManualClock",
        "",
    ]
    if any(uses(op, Name) for op in all_ops):
        lines.append("class Name(str): pass  # ids must come back as exact str")
    if any(uses(op, Seconds) for op in all_ops):
        lines.append("class Seconds(float): pass  # a clock may return a float subclass")
    if any(uses(op, ClockFault) for op in all_ops):
        lines.append("class ClockFault(Exception): pass  # what the misbehaving clock raises")
    if any(uses(op, Forged) for op in all_ops):
        lines += ["def forge(lease):  # a hand-made lease (never current, unless rebuilt leases are accepted)",
                  "    return type(lease)(lease.seq, lease.group_id, lease.event, lease.worker_id, "
                  "lease.expires_at, lease.attempt)"]
    lines += ["", "clock = ManualClock(1000.0)", f"t = make_transport(clock{window})"]
    if any(uses(op, FOREIGN) for op in all_ops):
        lines += [f"other = make_transport(ManualClock(1000.0){window})  # another instance",
                  "other.publish('a', ['foreign'])",
                  "foreign = other.claim('w1', math.inf)"]
    for position, (uid, op, raw) in enumerate(trace):
        last = position == len(trace) - 1
        outcome = raw[0]
        inner = op[2] if op[0] == "fault" else op
        expr = render_call(inner)
        target = ""
        if last and op[0] in ("call", "attr", "len", "fault"):
            target = "result = "
        elif (op[0] == "call" and op[1] in LEASE_MAKERS
              and outcome[0] == "returns" and outcome[1] is not None):
            target = f"l{uid} = "
        managers = []
        if op[0] == "fault":
            managers.append(f"clock.misbehave({render(op[1])})")
        if outcome[0] == "raises" and not last:
            managers.append(f"suppress({_error_name(outcome[1])})")
        statement = f"{target}{expr}"
        if managers:
            statement = f"with {', '.join(managers)}: {statement}"
        if last:
            lines.append("# <- the sides disagree here:")
            for name, side_outcome in zip(names, raw):
                lines.append(f"#    {name}: {_short(describe(side_outcome), 200)}")
            lines.append(statement)
        elif op[0] in ("advance", "set"):
            lines.append(statement)
        else:
            lines.append(f"{statement}  # {_short(describe(outcome))}")
    return "\n".join(lines)


def _error_name(exc: BaseException) -> str:
    for cls in (ClockFault, LeaseLost, OverflowError, TypeError, ValueError):
        if isinstance(exc, cls):
            return cls.__name__
    return "Exception"
