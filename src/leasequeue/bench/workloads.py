"""The workloads: what one timed *op* is, and the state it runs on.

A workload is a loop of ``k`` ops on a prefilled transport (a :class:`State`)
that returns the elapsed nanoseconds.  Each is one entry of ``REGISTRY``;
the report shows them in registry order.  To add one:

1. write its loop, ``def _my_loop(state: State, k: int) -> int``, in the
   style of the ones below (bind methods to locals, read
   ``time.perf_counter_ns`` right before and after the loop, nothing else
   inside it);
2. add ``Workload("my_name", "what one op is", "main", {"transport": _my_loop})``
   to ``REGISTRY`` (``"main"`` is the state it runs on: a key of
   ``STATES``; add a state kind there if none fits);
3. if it can run on ``queue.Queue`` too, add a ``"queue"`` loop.

That is all: the runner, the ``--workloads`` option, the JSON and the
Markdown tables pick it up.  A measurement of another shape (latency
percentiles, throughput with several threads) is a module of its own: see
``benchmarks/README.md``, "Adding to the benchmark".
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .impls import IMPLS, load

__all__ = [
    "EVENT",
    "EXPIRY_VISIBILITY",
    "PAIRED",
    "REGISTRY",
    "STATES",
    "VISIBILITY",
    "WORKER",
    "WORKLOADS",
    "State",
    "StateKind",
    "Workload",
    "count_clock",
    "run_order",
]

VISIBILITY = 30.0
EXPIRY_VISIBILITY = 0.5  # with a clock that advances 1 s per read: expired at the next claim
WORKER = "worker-1"
EVENT = object()  # one shared event, so memory figures count only the transport


def count_clock() -> Callable[[], float]:
    """A C-level clock that advances one second at every read."""
    return itertools.count(1_000_000.0, 1.0).__next__


# ------------------------------------------------------------ prefilled states


@dataclass(frozen=True)
class StateKind:
    """A way to prefill a transport for a configuration (N, G)."""

    name: str
    clock: Callable[[], Callable[[], float]]  #: makes the transport's clock
    wanted: Callable[[str, int], bool]  #: build it for this (G spec, G)?
    priority_of: Optional[Callable[[int], int]] = None  #: group index -> priority (None: all 0)


#: The state kinds, in the order they are built for each configuration.
STATES: Dict[str, StateKind] = {
    s.name: s
    for s in (
        StateKind("main", lambda: time.time, lambda spec, g: True),
        # Every claim sees the previous leases expired.
        StateKind("expiry", count_clock, lambda spec, g: True),
        # G = N/10 groups over 4 priority levels (0-3).
        StateKind("priority", lambda: time.time, lambda spec, g: g >= 4 and spec.upper() == "N/10", lambda j: j % 4),
    )
}


class State:
    """One implementation's prefilled transport for one configuration: N
    messages published round-robin over G groups (``g0``, ``g1``, ...)."""

    def __init__(self, impl: str, n: int, g: int, kind: str, groups: Optional[List[str]] = None) -> None:
        self.impl = impl
        self.n = n
        self.g = g
        self.kind = kind
        spec = STATES[kind]
        self.t = load(impl)(clock=spec.clock())
        self.groups = groups if groups is not None else [f"g{i}" for i in range(g)]
        self.prio: Optional[List[int]] = None
        if spec.priority_of is not None:
            self.prio = [spec.priority_of(i) for i in range(g)]
        self.pos = 0  # rotating start index into the groups, for publishes
        self._fill()

    def _fill(self) -> None:
        groups, g = self.groups, self.g
        if IMPLS[self.impl].kind == "queue":
            put = self.t.put
            for _ in range(self.n):
                put(EVENT)
            return
        pub = self.t.publish
        if self.prio is not None:
            prio = self.prio
            for i in range(self.n):
                j = i % g
                pub(groups[j], EVENT, prio[j])
        else:
            for i in range(self.n):
                pub(groups[i % g], EVENT)

    def group_seq(self, k: int, high_only: bool = False) -> List[Any]:
        """The next ``k`` publish targets, rotating over the groups
        (``high_only``: ``(group, priority)`` of the groups with priority >= 2)."""
        pool: Sequence[Any]
        if high_only:
            assert self.prio is not None
            pool = [(gid, p) for gid, p in zip(self.groups, self.prio) if p >= 2]
        else:
            pool = self.groups
        out = [pool[(self.pos + i) % len(pool)] for i in range(k)]
        self.pos = (self.pos + k) % len(pool)
        return out


# ------------------------------------------------------------ the loops

# Each returns the elapsed ns of k ops.  Locals are bound before the clock
# starts, so the loop holds only the calls being measured.


def _publish(state: State, k: int) -> int:
    pub, ev, pc = state.t.publish, EVENT, time.perf_counter_ns
    seq = state.group_seq(k)
    t0 = pc()
    for gid in seq:
        pub(gid, ev)
    return pc() - t0


def _claim_ack(state: State, k: int) -> int:
    cl, ack, w, vis, pc = state.t.claim, state.t.ack, WORKER, VISIBILITY, time.perf_counter_ns
    rep = itertools.repeat(None, k)
    t0 = pc()
    for _ in rep:
        ack(cl(w, vis))
    return pc() - t0


def _cycle(state: State, k: int) -> int:
    t, ev, w, vis, pc = state.t, EVENT, WORKER, VISIBILITY, time.perf_counter_ns
    pub, cl, ack = t.publish, t.claim, t.ack
    seq = state.group_seq(k)
    t0 = pc()
    for gid in seq:
        pub(gid, ev)
        ack(cl(w, vis))
    return pc() - t0


def _nack(state: State, k: int) -> int:
    cl, nack, w, vis, pc = state.t.claim, state.t.nack, WORKER, VISIBILITY, time.perf_counter_ns
    rep = itertools.repeat(None, k)
    t0 = pc()
    for _ in rep:
        nack(cl(w, vis), 0.0)
    return pc() - t0


def _expiry(state: State, k: int) -> int:
    cl, w, evis, pc = state.t.claim, WORKER, EXPIRY_VISIBILITY, time.perf_counter_ns
    rep = itertools.repeat(None, k)
    t0 = pc()
    for _ in rep:
        if cl(w, evis) is None:
            raise RuntimeError(f"{state.impl}: expiry workload found nothing to claim")
    return pc() - t0


def _priority(state: State, k: int) -> int:
    t, ev, w, vis, pc = state.t, EVENT, WORKER, VISIBILITY, time.perf_counter_ns
    pub, cl, ack = t.publish, t.claim, t.ack
    seq = state.group_seq(k, high_only=True)
    t0 = pc()
    for gid, p in seq:
        pub(gid, ev, p)
        ack(cl(w, vis, 2))
    return pc() - t0


def _queue_put(state: State, k: int) -> int:
    put, ev, pc = state.t.put, EVENT, time.perf_counter_ns
    rep = itertools.repeat(None, k)
    t0 = pc()
    for _ in rep:
        put(ev)
    return pc() - t0


def _queue_get(state: State, k: int) -> int:
    get, pc = state.t.get, time.perf_counter_ns
    rep = itertools.repeat(None, k)
    t0 = pc()
    for _ in rep:
        get()
    return pc() - t0


def _queue_put_get(state: State, k: int) -> int:
    put, get, ev, pc = state.t.put, state.t.get, EVENT, time.perf_counter_ns
    rep = itertools.repeat(None, k)
    t0 = pc()
    for _ in rep:
        put(ev)
        get()
    return pc() - t0


# ------------------------------------------------------------ the registry


@dataclass(frozen=True)
class Workload:
    """One workload: a name, what one op is, its state kind, and its loops
    by implementation kind (``"transport"``, ``"queue"``)."""

    name: str
    op: str  #: what one op is (the heading of its table)
    state: str  #: the state kind it runs on: a key of ``STATES``
    loops: Dict[str, Callable[[State, int], int]]

    def supports(self, impl: str) -> bool:
        """Can ``impl`` run this workload?"""
        return IMPLS[impl].kind in self.loops


#: Every workload, in report order.
REGISTRY: Dict[str, Workload] = {
    w.name: w
    for w in (
        Workload("cycle", "publish + claim + ack, queue held at N", "main",
                 {"transport": _cycle, "queue": _queue_put_get}),
        Workload("publish", "publish onto a queue holding N", "main",
                 {"transport": _publish, "queue": _queue_put}),
        Workload("claim_ack", "claim + ack from a queue holding N", "main",
                 {"transport": _claim_ack, "queue": _queue_get}),
        Workload("nack", "claim + nack(0) (immediate retry)", "main", {"transport": _nack}),
        Workload("expiry", "claim after the previous leases expired (crash recovery)", "expiry",
                 {"transport": _expiry}),
        Workload("priority", "publish + claim(min_priority=2) + ack; 4 priority levels, half eligible", "priority",
                 {"transport": _priority}),
    )
}

#: Workload keys, in report order, with what one *op* of each is.
WORKLOADS: Dict[str, str] = {w.name: w.op for w in REGISTRY.values()}

#: Measured together, in rounds: each round publishes k messages, then claims
#: and acks k, so the queue swings between N and N + k and ends at N.
PAIRED: Tuple[str, str] = ("publish", "claim_ack")


def run_order(kind: str, selected: Sequence[str]) -> List[str]:
    """The selected workloads of one state kind, in the order they are run in
    each repeat: the publish / claim+ack pair first, then registry order (the
    order the suite has always used, so runs stay comparable)."""
    wls = [w for w in REGISTRY if REGISTRY[w].state == kind and w in selected]
    return sorted(wls, key=lambda w: w not in PAIRED)
