"""Side-by-side benchmarks: ``python -m leasequeue bench``.

Runs identical workloads, in one process and interleaved, on

* ``cython`` -- ``leasequeue._inmemory_c.InMemoryTransport`` (the extension),
* ``floor``  -- ``leasequeue._floor.FloorTransport``: a compiled stub with the
  same call shape that only takes a lock, reads the clock and allocates one
  lease (the cost of the calls themselves),
* ``pure``   -- ``leasequeue._inmemory_py.InMemoryTransport`` (pure Python),
* ``queue``  -- ``queue.Queue`` ``put`` + ``get`` (the familiar baseline; no
  groups, leases or priorities),
* ``seed``   -- the design note's literal algorithm (:class:`SeedTransport`:
  a list of dicts, sorted on every claim), only at sizes where it finishes
  in reasonable time; larger sizes are *extrapolated* and marked so.

Interleaving: for each configuration (N queued messages, G groups) every
implementation gets its own prefilled transport; then, for each repeat, each
workload is timed on every implementation back to back, the order rotating
with the repeat, so slow drift of the machine hits all alike.  Ratios are the
median over repeats of the per-repeat ratio (paired measurements).

Timed loops run with the cyclic garbage collector disabled (as ``timeit``
does); the collector's own cost with N messages queued is measured
separately (``gc.collect()`` time, objects tracked), in a fresh subprocess per
implementation, together with memory per queued message (tracemalloc and
RSS).

This module is importable from an installed wheel (no repository needed).
"""

from __future__ import annotations

import gc
import itertools
import json
import math
import os
import platform
import queue as _queue_mod
import statistics
import subprocess
import sys
import threading
import time
from collections import namedtuple
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

__all__ = [
    "ALL_IMPLS",
    "BenchConfig",
    "SeedTransport",
    "available_impls",
    "evaluate_targets",
    "render_markdown",
    "run",
    "write_plot",
]

#: Implementation keys, in the column order of the report.
ALL_IMPLS: Tuple[str, ...] = ("cython", "floor", "pure", "queue", "seed", "floor_pymutex")
#: Run by default (``floor_pymutex`` only on request: ``--impls``).
DEFAULT_IMPLS: Tuple[str, ...] = ("cython", "floor", "pure", "queue", "seed")

LABELS: Dict[str, str] = {
    "cython": "Cython",
    "floor": "floor stub",
    "pure": "pure Python",
    "queue": "queue.Queue",
    "seed": "seed algorithm",
    "floor_pymutex": "floor (pymutex)",
}

#: Workload keys, in report order, with what one *op* of each is.
WORKLOADS: Dict[str, str] = {
    "cycle": "publish + claim + ack, queue held at N",
    "publish": "publish onto a queue holding N",
    "claim_ack": "claim + ack from a queue holding N",
    "nack": "claim + nack(0) (immediate retry)",
    "expiry": "claim after the previous leases expired (crash recovery)",
    "priority": "publish + claim(min_priority=2) + ack; 4 priority levels, half eligible",
}

#: Which implementations can run which workload (queue.Queue has no leases).
SUPPORTS: Dict[str, Tuple[str, ...]] = {
    "cycle": ALL_IMPLS,
    "publish": ALL_IMPLS,
    "claim_ack": ALL_IMPLS,
    "nack": ("cython", "floor", "pure", "seed", "floor_pymutex"),
    "expiry": ("cython", "floor", "pure", "seed", "floor_pymutex"),
    "priority": ("cython", "floor", "pure", "seed", "floor_pymutex"),
}

#: The seed's claim sorts every message: cap on the ops timed per measurement,
#: and the largest N it is run at (beyond: extrapolated as N log N).
SEED_OPS = {1_000: 50, 10_000: 8, 100_000: 2}
SEED_MAX_N_QUICK = 100_000
SEED_MAX_N_FULL = 100_000

VISIBILITY = 30.0
EXPIRY_VISIBILITY = 0.5  # with a clock that advances 1 s per read: expired at the next claim
WORKER = "worker-1"
EVENT = object()  # one shared event, so memory figures count only the transport


# ------------------------------------------------------------ the seed algorithm

SeedLease = namedtuple("SeedLease", ["seq", "group_id", "event"])


class SeedTransport:
    """The design note's in-memory transport, literally (for comparison only).

    A list of message dicts and a dict of group dicts under one
    ``threading.Lock``; ``claim`` sorts *every* message by
    ``(group.last_claimed_at, seq)`` and takes the first available one:
    O(N log N) per claim.  ``ack`` and ``nack`` find the message by a linear
    scan.  No validation, no fencing: this is the reference for *what* is
    chosen and the baseline for *how fast*, not a usable transport.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._messages: List[Dict[str, Any]] = []
        self._groups: Dict[str, Dict[str, Any]] = {}
        self._seq = 0
        self._lock = threading.Lock()

    def publish(self, group_id: str, event: Any, priority: int = 0) -> int:
        """Append a message; create the group on its first publish."""
        with self._lock:
            self._seq += 1
            self._messages.append(
                {"seq": self._seq, "group_id": group_id, "event": event, "locked_by": None, "lock_expiry": 0.0}
            )
            self._groups.setdefault(group_id, {"last_claimed_at": 0.0, "priority": priority})
            return self._seq

    def claim(self, worker_id: str, visibility: float, min_priority: int = 0) -> Optional[SeedLease]:
        """Sort all messages, lease the first available one of a free group."""
        now = self._clock()
        with self._lock:
            messages = self._messages
            groups = self._groups
            in_flight = {
                m["group_id"] for m in messages if m["locked_by"] is not None and m["lock_expiry"] >= now
            }
            for m in sorted(messages, key=lambda m: (groups[m["group_id"]]["last_claimed_at"], m["seq"])):
                available = m["locked_by"] is None or m["lock_expiry"] < now
                if not available or m["group_id"] in in_flight:
                    continue
                if groups[m["group_id"]]["priority"] < min_priority:
                    continue
                m["locked_by"] = worker_id
                m["lock_expiry"] = now + visibility
                groups[m["group_id"]]["last_claimed_at"] = now
                return SeedLease(m["seq"], m["group_id"], m["event"])
            return None

    def ack(self, lease: SeedLease) -> None:
        """Remove the message by seq; forget its group when it is empty."""
        with self._lock:
            messages = self._messages
            for i, m in enumerate(messages):
                if m["seq"] == lease.seq:
                    del messages[i]
                    break
            gid = lease.group_id
            if not any(m["group_id"] == gid for m in messages):
                self._groups.pop(gid, None)

    def nack(self, lease: SeedLease, delay: float = 0.0) -> None:
        """Free the message for retry (delay 0) or park it for ``delay`` s."""
        now = self._clock() if delay > 0 else 0.0
        with self._lock:
            for m in self._messages:
                if m["seq"] == lease.seq:
                    if delay > 0:
                        m["locked_by"] = "__parked__"
                        m["lock_expiry"] = now + delay
                    else:
                        m["locked_by"] = None
                        m["lock_expiry"] = 0.0
                    break

    def __len__(self) -> int:
        return len(self._messages)

    def close(self) -> None:
        """No-op."""


# ------------------------------------------------------------ implementations


def _load(impl: str) -> Callable[..., Any]:
    """The factory ``make(clock)`` of one implementation (ImportError if absent)."""
    if impl == "cython":
        from ._inmemory_c import InMemoryTransport as C

        return C
    if impl == "pure":
        from ._inmemory_py import InMemoryTransport as P

        return P
    if impl == "floor":
        from ._floor import FloorTransport

        return FloorTransport
    if impl == "floor_pymutex":
        from ._floor import FloorPymutexTransport

        return FloorPymutexTransport
    if impl == "seed":
        return SeedTransport
    if impl == "queue":
        return lambda clock=None: _queue_mod.Queue()
    raise ValueError(f"unknown implementation {impl!r}")


def available_impls(wanted: Iterable[str] = DEFAULT_IMPLS) -> Tuple[List[str], Dict[str, str]]:
    """Split ``wanted`` into the importable implementations and the missing
    ones (with the reason)."""
    ok: List[str] = []
    missing: Dict[str, str] = {}
    for impl in wanted:
        try:
            _load(impl)
        except ImportError as exc:
            missing[impl] = f"{type(exc).__name__}: {exc}"
        else:
            ok.append(impl)
    return ok, missing


def _count_clock() -> Callable[[], float]:
    """A C-level clock that advances one second at every read."""
    return itertools.count(1_000_000.0, 1.0).__next__


# ------------------------------------------------------------ states & workloads


class _State:
    """One implementation's prefilled transport for one configuration."""

    def __init__(self, impl: str, n: int, g: int, kind: str, groups: Optional[List[str]] = None) -> None:
        self.impl = impl
        self.n = n
        self.g = g
        self.kind = kind  # "main", "expiry", "priority"
        clock = _count_clock() if kind == "expiry" else time.time
        self.t = _load(impl)(clock=clock)
        self.groups = groups if groups is not None else [f"g{i}" for i in range(g)]
        if kind == "priority":
            self.prio = [i % 4 for i in range(g)]
        self.pos = 0  # rotating start index into the groups, for publishes
        self._fill()

    def _fill(self) -> None:
        groups, g = self.groups, self.g
        if self.impl == "queue":
            put = self.t.put
            for _ in range(self.n):
                put(EVENT)
            return
        pub = self.t.publish
        if self.kind == "priority":
            prio = self.prio
            for i in range(self.n):
                j = i % g
                pub(groups[j], EVENT, prio[j])
        else:
            for i in range(self.n):
                pub(groups[i % g], EVENT)

    def group_seq(self, k: int, high_only: bool = False) -> List[Any]:
        """The next ``k`` publish targets, rotating over the groups."""
        pool: Sequence[Any]
        if high_only:
            pool = [(gid, p) for gid, p in zip(self.groups, self.prio) if p >= 2]
        else:
            pool = self.groups
        out = [pool[(self.pos + i) % len(pool)] for i in range(k)]
        self.pos = (self.pos + k) % len(pool)
        return out


def _time_transport(state: _State, workload: str, k: int) -> int:
    """Run ``k`` ops of ``workload`` on a transport state; elapsed ns."""
    t = state.t
    w = WORKER
    vis = VISIBILITY
    ev = EVENT
    pc = time.perf_counter_ns
    if workload == "publish":
        pub = t.publish
        seq = state.group_seq(k)
        t0 = pc()
        for gid in seq:
            pub(gid, ev)
        return pc() - t0
    if workload == "claim_ack":
        cl, ack = t.claim, t.ack
        rep = itertools.repeat(None, k)
        t0 = pc()
        for _ in rep:
            ack(cl(w, vis))
        return pc() - t0
    if workload == "cycle":
        pub, cl, ack = t.publish, t.claim, t.ack
        seq = state.group_seq(k)
        t0 = pc()
        for gid in seq:
            pub(gid, ev)
            ack(cl(w, vis))
        return pc() - t0
    if workload == "nack":
        cl, nack = t.claim, t.nack
        rep = itertools.repeat(None, k)
        t0 = pc()
        for _ in rep:
            nack(cl(w, vis), 0.0)
        return pc() - t0
    if workload == "expiry":
        cl = t.claim
        evis = EXPIRY_VISIBILITY
        rep = itertools.repeat(None, k)
        t0 = pc()
        for _ in rep:
            if cl(w, evis) is None:
                raise RuntimeError(f"{state.impl}: expiry workload found nothing to claim")
        return pc() - t0
    if workload == "priority":
        pub, cl, ack = t.publish, t.claim, t.ack
        seq = state.group_seq(k, high_only=True)
        t0 = pc()
        for gid, p in seq:
            pub(gid, ev, p)
            ack(cl(w, vis, 2))
        return pc() - t0
    raise ValueError(workload)


def _time_queue(state: _State, workload: str, k: int) -> int:
    """Run ``k`` ops of ``workload`` on a ``queue.Queue``; elapsed ns."""
    q = state.t
    ev = EVENT
    pc = time.perf_counter_ns
    put, get = q.put, q.get
    rep = itertools.repeat(None, k)
    if workload == "publish":
        t0 = pc()
        for _ in rep:
            put(ev)
        return pc() - t0
    if workload == "claim_ack":
        t0 = pc()
        for _ in rep:
            get()
        return pc() - t0
    if workload == "cycle":
        t0 = pc()
        for _ in rep:
            put(ev)
            get()
        return pc() - t0
    raise ValueError(workload)


def _measure(state: _State, workload: str, k: int) -> float:
    """Nanoseconds per op, with the cyclic GC off during the loop."""
    was = gc.isenabled()
    gc.disable()
    try:
        if state.impl == "queue":
            ns = _time_queue(state, workload, k)
        else:
            ns = _time_transport(state, workload, k)
    finally:
        if was:
            gc.enable()
    return ns / k


def _loop_overhead_ns(k: int = 200_000) -> float:
    """Cost of the bare timing loop (iterate + one no-op C call), ns/op."""
    f = len
    x = ()
    rep = itertools.repeat(None, k)
    t0 = time.perf_counter_ns()
    for _ in rep:
        f(x)
    return (time.perf_counter_ns() - t0) / k


# ------------------------------------------------------------ configuration


def _parse_groups(spec: str, n: int) -> int:
    """``"1"``, ``"N/10"``, ``"N"`` or a number -> a group count for ``n``."""
    s = spec.strip().upper()
    if s == "N":
        return n
    if s.startswith("N/"):
        return max(1, n // int(s[2:]))
    return max(1, min(n, int(s)))


@dataclass
class BenchConfig:
    """What to run.  ``quick()``, ``full()`` and ``smoke()`` are the presets."""

    mode: str = "quick"
    sizes: List[int] = field(default_factory=lambda: [1_000, 10_000, 100_000])
    groups: List[str] = field(default_factory=lambda: ["N/10"])
    workloads: List[str] = field(default_factory=lambda: list(WORKLOADS))
    impls: List[str] = field(default_factory=lambda: list(DEFAULT_IMPLS))
    repeats: int = 5
    ops: int = 20_000
    seed_max_n: int = SEED_MAX_N_QUICK
    memory_n: Optional[int] = 100_000
    memory_groups: List[str] = field(default_factory=lambda: ["N/10"])

    @classmethod
    def quick(cls) -> "BenchConfig":
        """Default: N in {1k, 10k, 100k}, G = N/10, 5 repeats (under a minute)."""
        return cls()

    @classmethod
    def full(cls) -> "BenchConfig":
        """Every size and group count of issue 4, 11 repeats (about 5 minutes)."""
        return cls(
            mode="full",
            sizes=[1_000, 10_000, 100_000, 1_000_000],
            groups=["1", "N/10", "N"],
            repeats=11,
            ops=50_000,
            seed_max_n=SEED_MAX_N_FULL,
            memory_n=1_000_000,
            memory_groups=["1", "N/10", "N"],
        )

    @classmethod
    def smoke(cls) -> "BenchConfig":
        """A few seconds: checks that everything runs, measures nothing useful."""
        return cls(
            mode="smoke",
            sizes=[1_000],
            groups=["N/10"],
            repeats=1,
            ops=200,
            seed_max_n=1_000,
            memory_n=1_000,
            memory_groups=["N/10"],
        )


# ------------------------------------------------------------ progress


class Progress:
    """A one-line progress display on stderr (plain lines when not a TTY)."""

    def __init__(self, total: int, enabled: bool = True, stream: Any = None) -> None:
        self.total = max(1, total)
        self.done = 0
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = time.perf_counter()
        self._last_heading = ""

    def step(self, heading: str, detail: str = "", advance: int = 1) -> None:
        """Show what runs now; ``advance`` steps of the total are then done."""
        if self.enabled:
            elapsed = time.perf_counter() - self.start
            pct = 100.0 * self.done / self.total
            line = f"[{pct:3.0f}% {elapsed:5.1f}s] {heading} {detail}"
            if self.tty:
                self.stream.write("\r\x1b[2K" + line[:120])
                self.stream.flush()
            elif heading != self._last_heading:
                self.stream.write(line + "\n")
                self.stream.flush()
            self._last_heading = heading
        self.done += advance

    def finish(self, message: str) -> None:
        """Close the display with a final line."""
        if self.enabled:
            elapsed = time.perf_counter() - self.start
            if self.tty:
                self.stream.write("\r\x1b[2K")
            self.stream.write(f"{message} ({elapsed:.1f}s)\n")
            self.stream.flush()


# ------------------------------------------------------------ timing runs


def _n_label(n: int) -> str:
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n >= 1_000 and n % 1_000 == 0:
        return f"{n // 1_000}k"
    return str(n)


def _g_label(spec: str, n: int) -> str:
    return f"{spec}={_n_label(_parse_groups(spec, n))}" if "N" in spec.upper() else spec


def _ops_for(impl: str, workload: str, n: int, ops: int) -> int:
    """Ops per measurement: publish/claim_ack are paired and must not drain
    the queue; the seed's claim is O(N log N) so it gets few ops."""
    k = ops
    if workload in ("publish", "claim_ack"):
        k = min(k, max(1, n // 2))
    if impl == "seed":
        k = min(k, SEED_OPS.get(n, 2))
    return k


_PAIRED = ("publish", "claim_ack")


def _pair_ops(impl: str, n: int, ops: int) -> Tuple[int, int]:
    """(k, rounds) for the publish / claim+ack pair: each round publishes k
    messages then claims and acks k, so the queue swings between N and N + k
    (k <= N/2) and ends each round at N; ``rounds`` makes up ``ops`` in all."""
    k = _ops_for(impl, "publish", n, ops)
    rounds = 1 if impl == "seed" else max(1, ops // k)
    return k, rounds


def _measure_pair(state: _State, k: int, rounds: int) -> Tuple[float, float]:
    """ns per publish and ns per claim+ack, over ``rounds`` rounds of k each."""
    pub = ca = 0.0
    for _ in range(rounds):
        pub += _measure(state, "publish", k)
        ca += _measure(state, "claim_ack", k)
    return pub / rounds, ca / rounds


def _configs(cfg: BenchConfig) -> List[Tuple[int, str, int, str]]:
    """(N, G spec, G, state kind) for every state group to build."""
    out = []
    for n in cfg.sizes:
        seen = set()
        for spec in cfg.groups:
            g = _parse_groups(spec, n)
            if g in seen:
                continue
            seen.add(g)
            kinds = []
            if any(w in cfg.workloads for w in ("cycle", "publish", "claim_ack", "nack")):
                kinds.append("main")
            if "expiry" in cfg.workloads:
                kinds.append("expiry")
            if "priority" in cfg.workloads and g >= 4 and spec.upper() == "N/10":
                kinds.append("priority")
            for kind in kinds:
                out.append((n, spec, g, kind))
    return out


_KIND_WORKLOADS = {
    "main": ("publish", "claim_ack", "cycle", "nack"),
    "expiry": ("expiry",),
    "priority": ("priority",),
}


def _run_timings(cfg: BenchConfig, impls: List[str], progress: Progress) -> List[Dict[str, Any]]:
    results: List[Dict[str, Any]] = []
    for n, spec, g, kind in _configs(cfg):
        wls = [w for w in _KIND_WORKLOADS[kind] if w in cfg.workloads]
        run_impls = [
            i
            for i in impls
            if any(i in SUPPORTS[w] for w in wls) and not (i == "seed" and n > cfg.seed_max_n)
        ]
        head = f"N={_n_label(n)} G={_g_label(spec, n)} {kind}"
        states: Dict[str, _State] = {}
        for impl in run_impls:
            progress.step(head, f"prefill {impl}", advance=0)
            gc.disable()
            try:
                states[impl] = _State(impl, n, g, kind)
            finally:
                gc.enable()
        samples: Dict[Tuple[str, str], List[float]] = {}
        for r in range(cfg.repeats):
            order = run_impls[r % len(run_impls):] + run_impls[: r % len(run_impls)]
            for w in wls:
                if w == "claim_ack" and "publish" in wls:
                    continue  # measured together with publish, below
                for impl in order:
                    if impl not in SUPPORTS[w]:
                        continue
                    progress.step(head, f"repeat {r + 1}/{cfg.repeats} {w} {impl}")
                    if w in _PAIRED:
                        k, rounds = _pair_ops(impl, n, cfg.ops)
                        pub_ns, ca_ns = _measure_pair(states[impl], k, rounds)
                        for name, v in (("publish", pub_ns), ("claim_ack", ca_ns)):
                            if name in wls:
                                samples.setdefault((name, impl), []).append(v)
                    else:
                        k = _ops_for(impl, w, n, cfg.ops)
                        samples.setdefault((w, impl), []).append(_measure(states[impl], w, k))
        for (w, impl), vals in samples.items():
            results.append(
                {
                    "workload": w,
                    "n": n,
                    "groups_spec": spec,
                    "groups": g,
                    "impl": impl,
                    "ops_per_sample": (
                        _pair_ops(impl, n, cfg.ops)[0] * _pair_ops(impl, n, cfg.ops)[1]
                        if w in _PAIRED
                        else _ops_for(impl, w, n, cfg.ops)
                    ),
                    "median_ns": statistics.median(vals),
                    "min_ns": min(vals),
                    "max_ns": max(vals),
                    "samples_ns": vals,
                    "extrapolated": False,
                }
            )
        del states
        gc.collect()
    return results


def _extrapolate_seed(cfg: BenchConfig, results: List[Dict[str, Any]]) -> None:
    """Add seed figures for sizes it was not run at: N log N from its largest
    measured size (publish is O(1): held constant).  Marked extrapolated."""
    measured = [r for r in results if r["impl"] == "seed" and not r["extrapolated"]]
    by_key: Dict[Tuple[str, str], Dict[str, Any]] = {}
    for r in measured:
        key = (r["workload"], r["groups_spec"])
        if key not in by_key or r["n"] > by_key[key]["n"]:
            by_key[key] = r
    for (w, spec), base in by_key.items():
        for n in cfg.sizes:
            if n <= base["n"]:
                continue
            if not any(r["workload"] == w and r["n"] == n and r["groups_spec"] == spec for r in results):
                continue  # nothing else measured there either
            if w == "publish":
                f = 1.0
            else:
                f = (n * math.log(n)) / (base["n"] * math.log(base["n"]))
            results.append(
                {
                    "workload": w,
                    "n": n,
                    "groups_spec": spec,
                    "groups": _parse_groups(spec, n),
                    "impl": "seed",
                    "ops_per_sample": 0,
                    "median_ns": base["median_ns"] * f,
                    "min_ns": base["min_ns"] * f,
                    "max_ns": base["max_ns"] * f,
                    "samples_ns": [s * f for s in base["samples_ns"]],
                    "extrapolated": True,
                    "extrapolated_from_n": base["n"],
                }
            )


def _ratios(results: List[Dict[str, Any]], ref: str) -> List[Dict[str, Any]]:
    """time(other) / time(ref) per (workload, N, G): the median of the
    per-repeat ratios when both were measured in the same repeats."""
    index = {(r["workload"], r["n"], r["groups_spec"], r["impl"]): r for r in results}
    out = []
    for (w, n, spec, impl), r in index.items():
        if impl == ref:
            continue
        base = index.get((w, n, spec, ref))
        if base is None:
            continue
        a, b = r["samples_ns"], base["samples_ns"]
        if len(a) == len(b) and not r["extrapolated"]:
            ratio = statistics.median(x / y for x, y in zip(a, b))
        else:
            ratio = r["median_ns"] / base["median_ns"]
        out.append(
            {
                "workload": w,
                "n": n,
                "groups_spec": spec,
                "impl": impl,
                "ref": ref,
                "ratio": ratio,
                "extrapolated": r["extrapolated"],
            }
        )
    return out


# ------------------------------------------------------------ memory (subprocess)


def _rss_bytes() -> Optional[int]:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def _memory_child(impl: str, n: int, g: int) -> Dict[str, Any]:
    """In a fresh interpreter: memory, GC objects and ``gc.collect()`` time
    for ``n`` queued messages in ``g`` groups."""
    import tracemalloc

    def fill() -> Any:
        return _State(impl, n, g, "main", groups).t

    groups = [f"g{i}" for i in range(g)]
    gc.collect()
    empty = []
    for _ in range(3):
        t0 = time.perf_counter()
        gc.collect()
        empty.append(time.perf_counter() - t0)
    rss0 = _rss_bytes()
    objs0 = len(gc.get_objects())
    gc.disable()
    t = fill()
    gc.enable()
    gc.collect()
    rss1 = _rss_bytes()
    objs1 = len(gc.get_objects())
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        gc.collect()
        times.append(time.perf_counter() - t0)
    held = len(t) if impl != "queue" else t.qsize()
    del t
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    t = fill()
    traced = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    del t
    return {
        "impl": impl,
        "n": n,
        "groups": g,
        "held": held,
        "tracemalloc_bytes_per_msg": traced / n,
        "rss_bytes_per_msg": (rss1 - rss0) / n if rss0 is not None and rss1 is not None else None,
        "gc_tracked_objects": objs1 - objs0,
        "gc_tracked_per_msg": (objs1 - objs0) / n,
        "gc_collect_s": statistics.median(times),
        "gc_collect_empty_s": statistics.median(empty),
    }


def _run_memory(cfg: BenchConfig, impls: List[str], progress: Progress) -> List[Dict[str, Any]]:
    out: List[Dict[str, Any]] = []
    if not cfg.memory_n:
        return out
    n = cfg.memory_n
    for spec in cfg.memory_groups:
        g = _parse_groups(spec, n)
        for impl in impls:
            progress.step(f"memory N={_n_label(n)} G={_g_label(spec, n)}", impl)
            cmd = [sys.executable, "-m", "leasequeue._bench", "--memory-child", impl, str(n), str(g)]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=_child_env())
            if proc.returncode != 0:
                err = proc.stderr.strip()[-500:]
                out.append({"impl": impl, "n": n, "groups": g, "groups_spec": spec, "error": err})
                continue
            rec = json.loads(proc.stdout.strip().splitlines()[-1])
            rec["groups_spec"] = spec
            out.append(rec)
    return out


def _child_env() -> Dict[str, str]:
    """The environment for child interpreters: the parent's, with this
    package importable the same way (``sys.path`` of the parent)."""
    env = dict(os.environ)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = here + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


# ------------------------------------------------------------ targets


def _find(results: List[Dict[str, Any]], w: str, n: int, spec: str, impl: str) -> Optional[Dict[str, Any]]:
    for r in results:
        if r["workload"] == w and r["n"] == n and r["groups_spec"] == spec and r["impl"] == impl:
            return r
    return None


def _ratio(ratios: List[Dict[str, Any]], w: str, n: int, spec: str, impl: str) -> Optional[Dict[str, Any]]:
    for r in ratios:
        if r["workload"] == w and r["n"] == n and r["groups_spec"] == spec and r["impl"] == impl:
            return r
    return None


def evaluate_targets(cfg: BenchConfig, results: List[Dict[str, Any]], ratios: List[Dict[str, Any]],
             memory: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Issue 4's targets, evaluated on this run (at the largest N measured
    when 1M was not run: the ``at`` field says where)."""
    out: List[Dict[str, Any]] = []
    sizes = sorted(cfg.sizes)
    if not sizes or "cycle" not in cfg.workloads:
        return out
    # Every target is about the Cython transport: without it, nothing to judge.
    ratios = [r for r in ratios if r["ref"] == "cython"]
    big = 1_000_000 if 1_000_000 in sizes else sizes[-1]
    spec = "N/10" if "N/10" in cfg.groups else cfg.groups[0]

    def add(name: str, goal: str, value: Optional[float], ok: Optional[bool], at: str, note: str = "") -> None:
        out.append({"target": name, "goal": goal, "value": value, "met": ok, "at": at, "note": note})

    def best(a: Optional[Dict[str, Any]], b: Optional[Dict[str, Any]]) -> str:
        """Ratio of the fastest samples: what a quiet machine would approach."""
        if not a or not b or a["min_ns"] <= 0 or b["min_ns"] <= 0:
            return ""
        return f"best-of-repeats: {_fmt_ratio(a['min_ns'] / b['min_ns'])}"

    c = _find(results, "cycle", big, spec, "cython")
    fl = _find(results, "cycle", big, spec, "floor")
    r = _ratio(ratios, "cycle", big, spec, "floor")
    at = f"cycle N={_n_label(big)} G={spec}"
    if c and fl and r:
        v = 1.0 / r["ratio"]
        add("Cython / floor", "<= 1.25", v, v <= 1.25, at, best(c, fl))
    else:
        add("Cython / floor", "<= 1.25", None, None, at, "not measured")
    for impl, goal in (("queue", 5.0), ("pure", 6.0)):
        r = _ratio(ratios, "cycle", big, spec, impl)
        name = f"{LABELS[impl]} / Cython"
        if r:
            other = _find(results, "cycle", big, spec, impl)
            add(name, f">= {goal:g}", r["ratio"], r["ratio"] >= goal, at, best(other, c))
        else:
            add(name, f">= {goal:g}", None, None, at, "not measured")
    r = _ratio(ratios, "cycle", 100_000, spec, "seed")
    at100 = f"cycle N=100k G={spec}"
    if r:
        note = "seed extrapolated (N log N)" if r["extrapolated"] else best(
            _find(results, "cycle", 100_000, spec, "seed"), _find(results, "cycle", 100_000, spec, "cython")
        )
        add("seed / Cython", ">= 1e5", r["ratio"], r["ratio"] >= 1e5, at100, note)
    else:
        add("seed / Cython", ">= 1e5", None, None, at100, "not measured at N=100k")
    c10 = _find(results, "cycle", 10_000, spec, "cython")
    if c and c10 and big != 10_000:
        v = c["median_ns"] / c10["median_ns"]
        # The two sizes are timed minutes apart: drift does not cancel.  The
        # floor is stateless (same cost at every N), so Cython/floor at each
        # size, divided, is a drift-corrected estimate of the same figure.
        fb, f10 = _ratio(ratios, "cycle", big, spec, "floor"), _ratio(ratios, "cycle", 10_000, spec, "floor")
        note = f"drift-corrected via the floor: {f10['ratio'] / fb['ratio']:.2f}×; " if fb and f10 else ""
        note += best(c, c10)
        add(f"Cython N={_n_label(big)} / N=10k", "<= 1.3", v, v <= 1.3, f"cycle G={spec}", note)
    else:
        add("Cython N=1M / N=10k", "<= 1.3", None, None, f"cycle G={spec}", "not measured")
    m = [x for x in memory if x.get("impl") == "cython" and x.get("groups_spec") == spec and "error" not in x]
    if m:
        v = m[0]["tracemalloc_bytes_per_msg"]
        rss = m[0].get("rss_bytes_per_msg")
        note = f"RSS {rss:.1f} B/msg" if rss is not None else ""
        where = f"N={_n_label(m[0]['n'])} G={spec}"
        add("Cython bytes per queued message (tracemalloc)", "<= 48", v, v <= 48, where, note)
    else:
        add("Cython bytes per queued message", "<= 48", None, None, "", "not measured")
    return out


# ------------------------------------------------------------ the run


def _machine() -> Dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        import Cython  # noqa: F401

        cython_version: Optional[str] = Cython.__version__
    except ImportError:
        cython_version = None
    from . import __version__

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "python_build": " ".join(platform.python_build()),
        "platform": platform.platform(),
        "gil_enabled": getattr(sys, "_is_gil_enabled", lambda: True)(),
        "cython": cython_version,
        "leasequeue": __version__,
    }


def run(cfg: BenchConfig, progress: bool = True, memory: bool = True) -> Dict[str, Any]:
    """Run the benchmarks described by ``cfg``; return the JSON-able report."""
    impls, missing = available_impls(cfg.impls)
    configs = _configs(cfg)
    steps = 0
    for n, _spec, _g, kind in configs:
        wls = [w for w in _KIND_WORKLOADS[kind] if w in cfg.workloads]
        for w in wls:
            if w == "claim_ack" and "publish" in wls:
                continue
            for impl in impls:
                if impl in SUPPORTS[w] and not (impl == "seed" and n > cfg.seed_max_n):
                    steps += cfg.repeats
    if memory and cfg.memory_n:
        steps += len(impls) * len(cfg.memory_groups)
    prog = Progress(steps, enabled=progress)
    started = time.time()
    loop_ns = _loop_overhead_ns()
    results = _run_timings(cfg, impls, prog)
    _extrapolate_seed(cfg, results)
    ref = "cython" if "cython" in impls else "pure"
    ratios = _ratios(results, ref)
    mem = _run_memory(cfg, impls, prog) if memory else []
    prog.finish("benchmark done")
    report = {
        "meta": {
            "mode": cfg.mode,
            "config": asdict(cfg),
            "machine": _machine(),
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "duration_s": time.time() - started,
            "implementations": impls,
            "missing": missing,
            "ratio_reference": ref,
            "loop_overhead_ns": loop_ns,
            "clock": "time.time (expiry workload: a C counter advancing 1 s per read)",
            "gc_during_timing": "disabled",
            "workloads": WORKLOADS,
        },
        "results": sorted(
            results,
            key=lambda r: (list(WORKLOADS).index(r["workload"]), r["n"], r["groups"], ALL_IMPLS.index(r["impl"])),
        ),
        "ratios": ratios,
        "memory": mem,
    }
    report["targets"] = evaluate_targets(cfg, results, ratios, mem)
    return report


# ------------------------------------------------------------ rendering


def fmt_ns(ns: Optional[float]) -> str:
    """A duration in ns, with a unit that keeps 2-3 significant digits."""
    if ns is None:
        return "-"
    if ns < 1e3:
        return f"{ns:.0f} ns"
    if ns < 1e6:
        return f"{ns / 1e3:.3g} µs"
    if ns < 1e9:
        return f"{ns / 1e6:.3g} ms"
    return f"{ns / 1e9:.3g} s"


def _fmt_ratio(x: Optional[float]) -> str:
    if x is None:
        return "-"
    if x >= 1e4:
        return f"{x:.3g}×".replace("e+0", "e").replace("e+", "e")
    if x >= 100:
        return f"{x:.0f}×"
    return f"{x:.2f}×"


def render_markdown(report: Dict[str, Any]) -> str:
    """The comparison tables, ratios, memory figures and targets as Markdown."""
    meta = report["meta"]
    results = report["results"]
    ratios = report["ratios"]
    ref = meta["ratio_reference"]
    impls = [i for i in ALL_IMPLS if i in meta["implementations"]]
    lines: List[str] = []
    m = meta["machine"]
    lines.append(f"# leasequeue benchmark ({meta['mode']} mode)")
    lines.append("")
    lines.append(
        f"Machine: {m['cpu']}, {m['cores']} cores; {m['python_implementation']} {m['python']}"
        f" ({m['platform']}); Cython {m['cython']}; leasequeue {m['leasequeue']}."
    )
    lines.append(
        f"Run {meta['started_utc']}, {meta['duration_s']:.0f} s; {meta['config']['repeats']} repeats,"
        f" interleaved; GC off in timed loops; bare loop overhead {meta['loop_overhead_ns']:.0f} ns/op"
        " (included in every figure)."
    )
    if meta["missing"]:
        lines.append("")
        lines.append("Not available: " + "; ".join(f"{k} ({v})" for k, v in meta["missing"].items()))
    lines.append("")
    lines.append("Cells: median time per op [min–max over repeats]. `~` = extrapolated (seed only, N log N).")
    lines.append(f"Ratios: time of the other implementation / time of {LABELS[ref]} (median of per-repeat ratios);")
    lines.append(f"`{LABELS[ref]}/floor` is the reverse (how far above the bare call cost).")
    for w, desc in WORKLOADS.items():
        rows = [r for r in results if r["workload"] == w]
        if not rows:
            continue
        cols = [i for i in impls if i in SUPPORTS[w]]
        lines.append("")
        lines.append(f"## {w}: {desc}")
        lines.append("")
        ratio_cols = [i for i in cols if i != ref]
        header = ["N", "G"] + [LABELS[i] for i in cols]
        header += [f"{LABELS[ref]}/{i}" if i.startswith("floor") else f"{i}/{ref}" for i in ratio_cols]
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + "---|" * 2 + "---:|" * (len(header) - 2))
        keys = sorted({(r["n"], r["groups"], r["groups_spec"]) for r in rows})
        for n, g, spec in keys:
            cells = [_n_label(n), f"{_n_label(g)}"]
            for i in cols:
                r = next((x for x in rows if x["n"] == n and x["groups_spec"] == spec and x["impl"] == i), None)
                if r is None:
                    cells.append("-")
                elif r["extrapolated"]:
                    cells.append(f"~{fmt_ns(r['median_ns'])}")
                else:
                    cells.append(f"{fmt_ns(r['median_ns'])} [{fmt_ns(r['min_ns'])}–{fmt_ns(r['max_ns'])}]")
            for i in ratio_cols:
                r = _ratio(ratios, w, n, spec, i)
                if r is None:
                    cells.append("-")
                else:
                    v = 1.0 / r["ratio"] if i.startswith("floor") else r["ratio"]
                    cells.append(("~" if r["extrapolated"] else "") + _fmt_ratio(v))
            lines.append("| " + " | ".join(cells) + " |")
    mem = report.get("memory") or []
    if mem:
        lines.append("")
        lines.append("## Memory and garbage collector, per queued message")
        lines.append("")
        lines.append(
            "Fresh interpreter per row; one shared event object, so only the transport's own memory counts."
        )
        lines.append("")
        lines.append(
            "| impl | N | G | tracemalloc B/msg | RSS B/msg | GC-tracked objects/msg"
            " | gc.collect() with N queued | (empty) |"
        )
        lines.append("|---|---|---|---:|---:|---:|---:|---:|")
        for x in mem:
            if "error" in x:
                lines.append(f"| {LABELS[x['impl']]} | {_n_label(x['n'])} | {_n_label(x['groups'])} | error | | | | |")
                continue
            rss = x["rss_bytes_per_msg"]
            lines.append(
                f"| {LABELS[x['impl']]} | {_n_label(x['n'])} | {_n_label(x['groups'])}"
                f" | {x['tracemalloc_bytes_per_msg']:.1f} | {'-' if rss is None else f'{rss:.1f}'}"
                f" | {x['gc_tracked_per_msg']:.2f} | {fmt_ns(x['gc_collect_s'] * 1e9)}"
                f" | {fmt_ns(x['gc_collect_empty_s'] * 1e9)} |"
            )
    targets = report.get("targets") or []
    if targets:
        lines.append("")
        lines.append("## Targets (issue 4)")
        lines.append("")
        lines.append("| target | goal | this run | met | where | note |")
        lines.append("|---|---|---:|---|---|---|")
        for t in targets:
            v = t["value"]
            if v is None:
                vs = "-"
            elif "bytes" in t["target"]:
                vs = f"{v:.1f}"
            else:
                vs = _fmt_ratio(v)
            met = {True: "yes", False: "**no**", None: "-"}[t["met"]]
            lines.append(f"| {t['target']} | {t['goal']} | {vs} | {met} | {t['at']} | {t['note']} |")
    lines.append("")
    return "\n".join(lines)


def write_plot(report: Dict[str, Any], path: str) -> Optional[str]:
    """Time per cycle vs N (log-log), one line per implementation, one panel
    per group count.  Returns None, or a message when matplotlib is missing
    or there is nothing to plot."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install 'leasequeue[bench]'): plot skipped"
    rows = [r for r in report["results"] if r["workload"] == "cycle"]
    if not rows:
        return "no cycle results: plot skipped"
    specs = [s for s in ("1", "N/10", "N") if any(r["groups_spec"] == s for r in rows)]
    specs += sorted({r["groups_spec"] for r in rows} - set(specs))
    fig, axes = plt.subplots(1, len(specs), figsize=(5.2 * len(specs), 4.4), squeeze=False, sharey=True)
    styles = {"cython": "C0", "floor": "C7", "pure": "C1", "queue": "C2", "seed": "C3", "floor_pymutex": "C5"}
    for ax, spec in zip(axes[0], specs):
        for impl in ALL_IMPLS:
            pts = sorted((r["n"], r) for r in rows if r["impl"] == impl and r["groups_spec"] == spec)
            meas = [r for _, r in pts if not r["extrapolated"]]
            extra = [r for _, r in pts if r["extrapolated"]]
            if not pts:
                continue
            color = styles[impl]
            if meas:
                xs = [r["n"] for r in meas]
                ys = [r["median_ns"] for r in meas]
                yerr = [[r["median_ns"] - r["min_ns"] for r in meas], [r["max_ns"] - r["median_ns"] for r in meas]]
                ax.errorbar(xs, ys, yerr=yerr, marker="o", color=color, label=LABELS[impl], capsize=3)
            if extra:
                link = meas[-1:] + extra
                ax.plot([r["n"] for r in link], [r["median_ns"] for r in link], linestyle="--", marker="x",
                        color=color, label=f"{LABELS[impl]} (extrapolated)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"G = {spec}")
        ax.set_xlabel("N (messages queued)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("time per publish+claim+ack (ns)")
    axes[0][-1].legend(fontsize=8)
    m = report["meta"]["machine"]
    fig.suptitle(f"leasequeue full cycle — {m['cpu']}, Python {m['python']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def render_summary(report: Dict[str, Any]) -> str:
    """A short plain-text headline: the cycle ratios at the largest N."""
    ref = report["meta"]["ratio_reference"]
    cyc = [r for r in report["ratios"] if r["workload"] == "cycle"]
    if not cyc:
        return ""
    big = max(r["n"] for r in cyc)
    specs = sorted({r["groups_spec"] for r in cyc if r["n"] == big})
    spec = "N/10" if "N/10" in specs else specs[0]
    parts = []
    for r in cyc:
        if r["n"] != big or r["groups_spec"] != spec:
            continue
        if r["impl"].startswith("floor"):
            parts.append(f"{1 / r['ratio']:.2f}× the {LABELS[r['impl']]}")
        else:
            x = r["ratio"]
            rel = f"{_fmt_ratio(x)} faster than" if x >= 1 else f"{_fmt_ratio(1 / x)} slower than"
            parts.append(f"{rel} {LABELS[r['impl']]}" + (" (extrapolated)" if r["extrapolated"] else ""))
    return f"{LABELS[ref]} full cycle at N={_n_label(big)}, G={spec}: " + ", ".join(parts)


# ------------------------------------------------------------ child entry points


def _callgrind_child(impl: str, n: int, g: int, k: int, kmax: int) -> None:
    """Prefill, then ``k`` full cycles: run under callgrind by
    ``benchmarks/callgrind.py``.  The list of publish targets is always built
    for ``kmax`` cycles, so its cost cancels in the difference of two runs."""
    gc.disable()
    st = _State(impl, n, g, "main")
    seq = st.group_seq(kmax)[:k]
    t, ev, w, vis = st.t, EVENT, WORKER, VISIBILITY
    if impl == "queue":
        put, get = t.put, t.get
        for _gid in seq:
            put(ev)
            get()
    else:
        pub, cl, ack = t.publish, t.claim, t.ack
        for gid in seq:
            pub(gid, ev)
            ack(cl(w, vis))


def _main(argv: Sequence[str]) -> int:
    if len(argv) == 4 and argv[0] == "--memory-child":
        rec = _memory_child(argv[1], int(argv[2]), int(argv[3]))
        print(json.dumps(rec))
        return 0
    if len(argv) == 6 and argv[0] == "--callgrind-child":
        _callgrind_child(argv[1], int(argv[2]), int(argv[3]), int(argv[4]), int(argv[5]))
        return 0
    sys.stderr.write("internal entry point; use: python -m leasequeue bench\n")
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
