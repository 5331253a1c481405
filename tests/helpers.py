"""Shared test helpers (imported by the tests; not a test module).

The manual clock and the referee are the public kit's
(``leasequeue.testing.ManualClock`` / ``ReferenceTransport``); what is here
serves this suite only.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import random
import sys
import textwrap
from typing import Any, Callable, Iterable, Iterator, List, Sequence, Tuple, Type

# The referee's int64 ends, not the code under test's: a test's oracle must not
# move with the code it checks.
from leasequeue.testing._reference import INT64_MAX, INT64_MIN

__all__ = [
    "CPYTHON_ONLY_REASON",
    "Event",
    "INT64_MAX",
    "INT64_MIN",
    "IS_CPYTHON",
    "claimed_once",
    "collect_during",
    "collector_restored",
    "finaliser_outcome",
    "fingerprint",
    "fresh",
    "lease_key",
    "publishing_finalisers_during",
    "python_argv",
    "transport_child",
]

#: CPython runs ``__del__`` the moment the last reference goes, and has
#: tracemalloc and ``gc.set_threshold`` semantics the fault tests rely on;
#: PyPy runs finalisers whenever its collector gets to them.
CPYTHON_ONLY_REASON = "relies on CPython's reference counting / gc / tracemalloc semantics"
IS_CPYTHON = sys.implementation.name == "cpython"


class Event:
    """A weak-referenceable event with no reference cycles (the leak tests)."""

    __slots__ = ("n", "__weakref__")

    def __init__(self, n: int = 0) -> None:
        self.n = n


def fresh(text: str) -> str:
    """A str object nobody else holds (not interned, not a constant)."""
    return "".join([text, "-", str(id(object()))])


def lease_key(lease: Any) -> Any:
    """A lease as comparable data: every field, the event by identity, and
    the exact types of the fields (an implementation must not leak a str
    subclass or an int where a float belongs)."""
    if lease is None:
        return None
    return (
        lease.seq,
        lease.group_id,
        id(lease.event),
        lease.worker_id,
        lease.expires_at,
        lease.attempt,
        type(lease.seq).__name__,
        type(lease.group_id).__name__,
        type(lease.worker_id).__name__,
        type(lease.expires_at).__name__,
        type(lease.attempt).__name__,
    )


def fingerprint(transport: Any, clock: Any) -> list[Any]:
    """Everything observable about a transport, found by using it up.

    ``len``/``stats`` now; every claim that succeeds now (which groups are
    eligible, in which order, with which attempt); then, far in the future
    with all those leases acked, the drain order of everything left.
    Two transports with the same history give the same fingerprint.
    """
    out: list[Any] = [len(transport), tuple(transport.stats())]
    held = []
    while (lease := transport.claim("probe", math.inf, INT64_MIN)) is not None:
        out.append(lease_key(lease))
        held.append(lease)
    for lease in held:
        transport.ack(lease)
    out.append(tuple(transport.stats()))
    clock.advance(1e9)
    while (lease := transport.claim("drain", 1.0, INT64_MIN)) is not None:
        out.append(lease_key(lease))
        transport.ack(lease)
    out.append((len(transport), tuple(transport.stats())))
    return out


def package_root(module: Any) -> str:
    """The ``sys.path`` entry ``module`` (a leasequeue module) was imported
    from: ``src/`` after an in-place build, site-packages when installed, a
    sanitizer build's directory.  Subprocesses put it first on their path so
    that they test the very same build (the source tree has no compiled
    extension when the package is installed, as in CI)."""
    top = sys.modules[module.__name__.partition(".")[0]]
    return os.path.dirname(os.path.dirname(os.path.abspath(top.__file__)))


#: Runs first in a child interpreter: when the test run measures coverage
#: (tests/coverage_floor.py sets COVERAGE_PROCESS_START), the child does too.
_CHILD_COVERAGE = """\
import os as _os
if _os.environ.get("COVERAGE_PROCESS_START"):
    import coverage as _coverage
    _coverage.process_startup()
del _os
"""


class _Garbage:
    """Freed by the cycle collector only (it references itself); its
    ``__del__`` runs the finaliser it was given."""

    def __init__(self, finaliser: Callable[[], None]) -> None:
        self.me = self
        self.finaliser = finaliser

    def __del__(self) -> None:
        self.finaliser()


def collect_during(call: Callable[[], Any], finaliser: Callable[[], None], threshold: int, extra: int) -> None:
    """Run ``call()`` with a garbage collection due inside it, which runs
    ``finaliser()`` (user code the collector starts: an object's ``__del__``).

    The collection starts at the allocation that crosses ``threshold``;
    with ``extra`` allocations already pending, ``threshold - extra`` picks
    which allocation of ``call`` that is.  Looping over both walks the
    collection through the call's allocations (those that count: objects the
    collector tracks, not free-list reuse).  The collector's threshold is
    restored afterwards; a finaliser that did not run yet runs at the next
    collection.
    """
    gc.collect()
    gc.disable()
    _Garbage(finaliser)
    junk = [[] for _ in range(extra)]
    old = gc.get_threshold()
    gc.set_threshold(threshold)
    gc.enable()
    try:
        call()
    finally:
        gc.disable()
        gc.set_threshold(*old)
        del junk
        gc.enable()


@contextlib.contextmanager
def collector_restored() -> Iterator[None]:
    """Around a loop of :func:`collect_during`: the collector's thresholds as
    they were, and the collector enabled, when the loop ends, also when it
    fails or a thread is left stuck inside a collection.

    What is alive when the loop starts (the test run's whole heap) is frozen
    meanwhile (``gc.freeze``): the loop's collections, which it makes by the
    hundred, then examine only the objects made since, instead of taking a
    large process's heap through each of them, and no garbage of an earlier
    test runs its finaliser in the middle.  Where a collection lands is
    unchanged: that counts allocations, not the heap."""
    old = gc.get_threshold()
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.set_threshold(*old)
        gc.unfreeze()
        gc.enable()


def publishing_finalisers_during(t: Any, ops: Sequence[Callable[[int], Any]], thresholds: Iterable[int],
                                 extras: Iterable[int], seconds: float,
                                 after_each: Callable[[], None] = lambda: None) -> int:
    """In a child interpreter: run each of ``ops`` (called with a number
    unique to the run) under :func:`collect_during`, for every threshold and
    amount of pending garbage, with a finaliser that publishes to ``t``;
    ``after_each()`` after each amount's round of ``ops``.  In a thread,
    joined for ``seconds``: still running then, the finaliser deadlocked on
    the transport's lock, and the child prints ``DEADLOCK`` and exits 3 (a
    thread stuck inside a finaliser leaves the collector marked as running,
    which is why this runs in a child).  Returns how many finalisers ran;
    the collector is back at its default threshold and collected."""
    import threading

    finalised: List[Any] = []

    def finaliser() -> None:
        finalised.append(t.publish("from-gc", None))

    def scenario() -> None:
        for threshold in thresholds:
            for extra in extras:
                for i, op in enumerate(ops):
                    collect_during(lambda: op(threshold * 100 + extra * 10 + i), finaliser, threshold, extra)
                after_each()

    thread = threading.Thread(target=scenario, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        print("DEADLOCK after", len(finalised), "finalisers", flush=True)
        os._exit(3)
    gc.set_threshold(700, 10, 10)
    gc.collect()
    return len(finalised)


def transport_child(impl: Any, body: str) -> str:
    """The code of a child interpreter that runs ``body`` (dedented) with
    ``impl``, the implementation module under test (from the same build),
    this suite's helpers importable, and ``t``, a transport on the
    hand-moved clock ``now`` (a one-item list, at 1000.0)."""
    tests = os.path.dirname(os.path.abspath(__file__))
    prelude = (
        f"import sys\n"
        f"sys.path.insert(0, {package_root(impl)!r})\n"
        f"sys.path.insert(0, {tests!r})\n"
        f"import {impl.__name__} as impl\n"
        "from helpers import claimed_once, publishing_finalisers_during\n"
        "now = [1000.0]\n"
        "t = impl.InMemoryTransport(clock=lambda: now[0])\n"
    )
    return prelude + textwrap.dedent(body)


def claimed_once(t: Any) -> int:
    """Claim (with the lowest floor) and ack everything ``t`` serves now,
    checking that no message is served twice; return how many there were."""
    seen = set()
    while (lease := t.claim("d", 10.0, INT64_MIN)) is not None:
        assert lease.seq not in seen, ("served twice", lease.seq)
        seen.add(lease.seq)
        t.ack(lease)
    return len(seen)


def finaliser_outcome(call: Callable[[], Any], ran_on: Tuple[Type[BaseException], ...] = ()) -> str:
    """What ``call()``, made from a finaliser, got: ``"ran"`` (also when it
    raised one of ``ran_on``), ``"refused"`` (the transport's guard against
    user code in the middle of one of its operations) or the ``repr`` of
    whatever else it raised, for the caller to assert on."""
    try:
        call()
    except ran_on:
        return "ran"
    except RuntimeError as exc:
        return "refused" if "middle of another operation" in str(exc) else repr(exc)
    except BaseException as exc:  # noqa: BLE001 - returned: the caller asserts on it
        return repr(exc)
    return "ran"


def python_argv(code: str) -> List[str]:
    """``[sys.executable, "-c", ...]`` running ``code`` in a child interpreter,
    measured by coverage when the test run is."""
    return [sys.executable, "-c", _CHILD_COVERAGE + code]


class ManyInstances:
    """Several instances of a durable transport on one store (a SQLite file,
    a PostgreSQL queue), used as one transport: each call goes to one of them
    (chosen by a seeded generator), and now and then one is closed and a new
    one opened in its place.  A lease issued by one instance is acked, nacked
    or extended through another; nothing may live only in the instance that
    wrote it.  ``open_one()`` opens a new instance on the shared store."""

    def __init__(self, open_one: Callable[[], Any], seed: int, instances: int = 2, reopen: float = 0.01) -> None:
        self._open_one = open_one
        self._rng = random.Random(seed)
        self._reopen = reopen
        self._open = [open_one() for _ in range(instances)]
        self._closed = False

    def _pick(self) -> Any:
        if not self._closed and self._rng.random() < self._reopen:
            i = self._rng.randrange(len(self._open))
            self._open[i].close()
            self._open[i] = self._open_one()
        return self._rng.choice(self._open)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._pick(), name)

    def __len__(self) -> int:
        return len(self._pick())

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        self._closed = True
        for transport in self._open:
            transport.close()
