"""Concurrency stress (issue 6): the harness, and its short in-suite runs.

``tools/soak.py`` imports this module and runs the same harness for minutes.

Worker threads claim, ack, nack (now or with a delay), extend, ack late or
"crash" (drop the lease so it expires) while publisher threads publish into
thousands of groups.  An independent log, under its own lock, records every
operation; after the run (and at quiescent checkpoints during it) the log is
checked against the transport's guarantees.

How the checks stay *conservative* (they never flag a correct transport,
whatever the thread interleaving or the real clock does):

* The transport's ``now`` is ``max(clock(), the latest now it used)``
  (docs/decisions.md): the clock is read outside the lock, so a thread may
  act after another one already used a later time.  The clock is wrapped in
  a recorder that notes, per thread, the value it returned (a lower bound of
  that call's ``now``); a lease gives its claim's or extend's ``now`` back as
  ``expires_at - visibility`` (exact with the fake clock's binary fractions,
  within an ulp with the real clock: comparisons then allow ``slack``); a
  park's end is at least reading + delay; and at a quiescent checkpoint the
  transport's time is the maximum of every successful reading so far.
* Operations are ordered by *log indices*: an index taken just before a call
  (``inv``) is a lower bound of the moment it took effect, one taken just
  after it returned (``ret``) an upper bound.  A violation is reported only
  when the bounds prove it: e.g. "delivery N was claimed (``N.ret``) before
  the worker holding delivery O even started its ack (``O.end_inv``), and
  N's claim time was not past O's expiry".
* A delivery's window ends at its ack/nack, or at its ``expires_at`` (the
  latest one an ``extend`` that certainly happened before set), whichever
  comes first; a park's window ends at the nack's ``now + delay``.

The workers use one visibility per run, so an ``extend`` never moves an
expiry earlier (the clock is monotonic), which the lower bounds rely on.

Waiting workers (Part 2): ``waiting_workers`` of the worker threads claim
with a ``timeout`` (so messages are handed off to them by publish, ack,
nack, expiry and the expiry timer), and ``async_workers`` asyncio tasks in
one event-loop thread ``aclaim``.  A waiting claim's lease may be granted at
another operation's ``now`` (the hand-off), which is never earlier than the
claim's own clock reading; publish, ack and nack(0) read the clock once
when someone waits.  The asyncio tasks share one thread, so their claims'
clock readings are not attributed (their other operations are).  At a
checkpoint the tasks are parked outside any claim, so the queue of waiting
claims is empty and nothing can be handed off while the log is compared.

With ``operator=True`` an operator thread pauses, resumes, purges and
re-prioritises random groups while the others run (the control plane,
SPEC Part 2).  The checks then allow exactly what those calls may do, and
only when the log's bounds say the call could have come in between: a
purge may remove messages (they must add up to what the purges returned,
and each must have been published before a purge of its group returned),
end a lease early, and justify a ``LeaseLost``; a resume may end a park
early.  On top: no claim lands wholly inside a pause of its group, and at
the checkpoints ``len``, ``stats()`` and ``groups()`` agree, with each
other and with the operator's own record of which groups are paused.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import subprocess
import sys
import sysconfig
import threading
import time
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable, Dict, Iterable, List, NamedTuple, Optional, Tuple

from leasequeue.testing import ManualClock

import pytest

from leasequeue import LeaseLost

__all__ = ["RecordingClock", "StressConfig", "StressResult", "run_stress"]


class RecordingClock:
    """Wraps a clock; remembers, per thread, how often it was read and the last value."""

    def __init__(self, base: Callable[[], float]) -> None:
        self.base = base
        self._local = threading.local()

    def __call__(self) -> float:
        value = self.base()
        local = self._local
        local.calls = getattr(local, "calls", 0) + 1
        local.value = value
        return value

    def reset(self) -> None:
        """Forget this thread's reads (call before each transport operation)."""
        self._local.calls = 0
        self._local.value = None

    def last(self) -> Tuple[int, Optional[float]]:
        """(reads since ``reset``, last value read) for this thread."""
        return getattr(self._local, "calls", 0), getattr(self._local, "value", None)


@dataclass
class StressConfig:
    """What one stress run does."""

    impl: ModuleType
    clock: str = "fake"  # "fake" (advanced by a ticker thread) or "real" (time.monotonic)
    workers: int = 8
    publishers: int = 3
    groups: int = 3000
    messages: Optional[int] = 6000  # stop publishing after this many...
    duration: Optional[float] = None  # ...or after this many (real) seconds
    max_backlog: int = 4000  # publishers wait while more messages than this are unacked
    checkpoints: int = 2  # quiescent mid-run comparisons of stats()/len() with the log
    seed: int = 0
    hang_timeout: float = 60.0  # no ack for this long: stuck (fail instead of hanging; not a perf bound)
    switch_interval: float = 0.0002  # more thread switches, more interleavings
    waiting_workers: int = 0  # of ``workers``, how many claim with a timeout (Part 2)
    async_workers: int = 0  # asyncio tasks claiming with ``aclaim``, in one extra thread
    wait_timeout: float = 0.02  # their timeout: short, so that they see checkpoints and the end
    operator: bool = False  # a thread pausing, resuming, purging and re-prioritising groups


@dataclass
class Delivery:
    """One claim of one message, and what happened to it afterwards."""

    seq: int
    attempt: int
    group: str
    worker: str
    event: Any
    claim_now: float
    claim_inv: int
    claim_ret: int
    # (ret index, expires_at) of the claim and of every successful extend
    expiries: List[Tuple[int, float]] = field(default_factory=list)
    end: Optional[str] = None  # "ack" | "nack0" | "park" when closed by a successful call
    end_inv: int = -1
    end_ret: int = -1
    park_end: float = 0.0
    lost: List[Tuple[str, int, int]] = field(default_factory=list)  # (op, inv, ret) raising LeaseLost


@dataclass
class StressResult:
    """Figures and discrepancies of one run."""

    impl: str
    clock: str
    threads: int
    groups: int
    published: int = 0
    deliveries: int = 0
    acks: int = 0
    ops: int = 0
    extends: int = 0
    nacks: int = 0
    parks: int = 0
    crashes: int = 0
    late_acks: int = 0
    lease_lost: int = 0
    stale_probes: int = 0
    checkpoints: int = 0
    waited: int = 0  # deliveries to waiting claims (threads and asyncio tasks)
    async_deliveries: int = 0
    max_group_concurrency: int = 0
    pauses: int = 0
    resumes: int = 0
    purges: int = 0
    purged: int = 0  # messages the purges removed (the sum of what they returned)
    priority_changes: int = 0
    seconds: float = 0.0
    problems: List[str] = field(default_factory=list)

    def summary(self) -> str:
        operator = (
            f"{self.pauses} pauses, {self.resumes} resumes, {self.purges} purges removing "
            f"{self.purged} messages, {self.priority_changes} priority changes, "
            if self.pauses or self.resumes or self.purges
            else ""
        )
        return (
            f"{self.impl}/{self.clock}: {self.threads} threads, {self.groups} groups, "
            f"{self.published} messages, {self.ops} ops, {self.deliveries} deliveries, "
            f"{self.acks} acks, {self.nacks} nack(0), {self.parks} parks, {self.extends} extends, "
            f"{self.crashes} crashes, {self.late_acks} late acks, {self.lease_lost} LeaseLost, "
            f"{self.stale_probes} stale probes, {operator}{self.checkpoints} checkpoints, "
            f"{self.waited} to waiting claims ({self.async_deliveries} asyncio), "
            f"max group concurrency {self.max_group_concurrency}, {self.seconds:.1f}s, "
            f"{len(self.problems)} problems"
        )


class Control(NamedTuple):
    """One call of the operator thread: ``op`` on a group, its result and
    log indices (the operator is one thread: its calls are in order)."""

    op: str  # "pause" | "resume" | "purge" | "set_priority"
    result: Any
    inv: int
    ret: int


class _Log:
    """The independent record of everything the threads did (own lock)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.index = 0
        self.published: Dict[int, Tuple[str, Any, int, int]] = {}  # seq -> (group, event, ret, inv)
        self.control: Dict[str, List[Control]] = {}  # group -> the operator's calls on it, in order
        self.purged = 0  # messages removed by purges (what they returned)
        self.deliveries: Dict[Tuple[int, int], Delivery] = {}
        self.acked: Dict[int, List[Tuple[int, int]]] = {}  # seq -> [(inv, ret)] of successful acks
        self.problems: List[str] = []
        self.counts: Dict[str, int] = {}
        self.latest = -math.inf  # max clock reading of all successful clock-reading calls

    def tick(self) -> int:
        with self.lock:
            self.index += 1
            return self.index

    def count(self, name: str, n: int = 1) -> None:
        with self.lock:
            self.counts[name] = self.counts.get(name, 0) + n

    def problem(self, text: str) -> None:
        with self.lock:
            self.problems.append(text)


# The switch interval is process-global and runs may overlap (pytest-run-parallel
# in CI): the first run in sets it, the last one out restores it.
_switch_lock = threading.Lock()
_switch_users = 0
_switch_saved = 0.005


def _switch_interval_enter(interval: float) -> None:
    global _switch_users, _switch_saved
    with _switch_lock:
        if _switch_users == 0:
            _switch_saved = sys.getswitchinterval()
            sys.setswitchinterval(interval)
        _switch_users += 1


def _switch_interval_exit() -> None:
    global _switch_users
    with _switch_lock:
        _switch_users -= 1
        if _switch_users == 0:
            sys.setswitchinterval(_switch_saved)


class _Run:
    def __init__(self, cfg: StressConfig) -> None:
        self.cfg = cfg
        self.log = _Log()
        if cfg.clock == "fake":
            self.fake: Optional[ManualClock] = ManualClock(1000.0)
            self.clock = RecordingClock(self.fake)
            self.visibility = 4.0
            self.delays = (0.5, 1.0, 2.0)
            self.tick_step = 0.25
            self.slack = 0.0
        elif cfg.clock == "real":
            self.fake = None
            self.clock = RecordingClock(time.monotonic)
            self.visibility = 0.03
            self.delays = (0.001, 0.004, 0.01)
            self.tick_step = 0.0
            self.slack = 1e-9  # rounding of expires_at - visibility
        else:
            raise ValueError(f"clock must be 'fake' or 'real', not {cfg.clock!r}")
        self.transport = cfg.impl.InMemoryTransport(clock=self.clock)
        self.group_names = [f"group-{i:05d}" for i in range(cfg.groups)]
        self.to_publish = cfg.messages
        self.publish_lock = threading.Lock()
        self.publishing = True
        self.in_flight = 0  # publishes that took a quota and are not in the log yet
        self.done = False
        self.pause = False
        self.barrier = threading.Barrier(cfg.workers + cfg.publishers + 1 + (cfg.async_workers > 0) + cfg.operator)
        self.operator_done = not cfg.operator  # every pause lifted, nothing more to do
        self.paused: set[str] = set()  # the operator's record of the groups it paused
        self.deadline = None if cfg.duration is None else time.monotonic() + cfg.duration
        # with waiting claims, publish/ack/nack(0) read the clock (once) to hand a message off
        self.waiting = cfg.waiting_workers > 0 or cfg.async_workers > 0

    # -------------------------------------------------------------- helpers

    def _reads(self, op: str, expected: int) -> Optional[float]:
        calls, value = self.clock.last()
        if calls != expected and not (self.waiting and expected == 0 and calls == 1):
            self.log.problem(f"{op} read the clock {calls} times, expected {expected}")
        return value

    def _maybe_pause(self) -> None:
        if self.pause:
            self.barrier.wait()  # everyone is quiescent: the checkpoint runs
            self.barrier.wait()  # the checkpoint is over

    def _idle(self) -> None:
        time.sleep(0.0002)

    # -------------------------------------------------------------- threads

    def publisher(self, index: int) -> None:
        rng = random.Random(self.cfg.seed * 1000 + index)
        t = self.transport
        log = self.log
        names = self.group_names
        while not self.done:
            self._maybe_pause()
            if not self.publishing or len(log.published) - len(log.acked) - log.purged > self.cfg.max_backlog:
                self._idle()
                continue
            with self.publish_lock:
                if self.to_publish is not None:
                    if self.to_publish <= 0:
                        self.publishing = False
                        continue
                    self.to_publish -= 1
                if self.deadline is not None and time.monotonic() >= self.deadline:
                    self.publishing = False
                    continue
                self.in_flight += 1
            group = rng.choice(names)
            event = object()
            self.clock.reset()
            inv = log.tick()
            seq = t.publish(group, event, rng.choice((-1, 0, 0, 1, 2)))
            self._reads("publish", 0)
            with log.lock:
                log.index += 1
                if seq in log.published:
                    log.problems.append(f"publish returned seq {seq} twice")
                log.published[seq] = (group, event, log.index, inv)
                log.counts["ops"] = log.counts.get("ops", 0) + 1
            with self.publish_lock:
                self.in_flight -= 1

    def operator(self) -> None:
        """Pause, resume, purge and re-prioritise random groups while the
        others run; once publishing is over and the backlog is down to a
        tenth of what was published, lift every pause and stop."""
        rng = random.Random(self.cfg.seed * 1000 + 999)
        t = self.transport
        names = self.group_names
        purge = 0.9 + (0.03 if len(names) >= 200 else 0.01)  # a purge of a hot group removes a lot
        log = self.log
        while not self.done:
            self._maybe_pause()
            if self.operator_done:
                self._idle()
                continue
            with log.lock:
                left = len(log.published) - len(log.acked) - log.purged
                winding_down = not self.publishing and left * 10 <= len(log.published)
            if winding_down:
                for group in sorted(self.paused):
                    self._control(t.resume, "resume", group)
                self.paused.clear()
                self.operator_done = True
                self._idle()
                continue
            group = rng.choice(names)
            roll = rng.random()
            if roll < 0.45:
                self._control(t.pause, "pause", group)
                self.paused.add(group)
            elif roll < 0.9:
                self._control(t.resume, "resume", group)
                self.paused.discard(group)
            elif roll < purge:
                self._control(t.purge, "purge", group)
                self.paused.discard(group)
            else:
                self._control(t.set_priority, "set_priority", group, rng.choice((-1, 0, 1, 2)))
            time.sleep(0.0002)

    def _control(self, call: Callable[..., Any], op: str, group: str, *args: Any) -> None:
        log = self.log
        self.clock.reset()
        inv = log.tick()
        try:
            result = call(group, *args)
        except Exception as exc:  # noqa: BLE001 - recorded
            log.problem(f"operator: {op}({group!r}) raised {exc!r}")
            return
        self._reads(op, 0)
        with log.lock:
            log.index += 1
            log.control.setdefault(group, []).append(Control(op, result, inv, log.index))
            log.counts[op] = log.counts.get(op, 0) + 1
            log.counts["ops"] = log.counts.get("ops", 0) + 1
            if op == "purge":
                log.purged += result

    def ticker(self) -> None:
        assert self.fake is not None
        while not self.done:
            self.fake.advance(self.tick_step)
            time.sleep(0.0005)

    def worker(self, index: int) -> None:
        rng = random.Random(self.cfg.seed * 1000 + 500 + index)
        wid = f"worker-{index}"
        timeout = self.cfg.wait_timeout if index < self.cfg.waiting_workers else 0.0
        while not self.done:
            self._maybe_pause()
            try:
                if not self._work_once(rng, wid, timeout) and not timeout:
                    self._idle()
            except threading.BrokenBarrierError:
                return
            except Exception as exc:  # noqa: BLE001 - recorded; the lease it held is "crashed"
                self.log.problem(f"{wid}: unexpected {exc!r}")

    def _work_once(self, rng: random.Random, wid: str, timeout: float = 0.0) -> bool:
        t = self.transport
        vis = self.visibility
        min_priority = 1 if rng.random() < 0.1 else -1  # -1: every group (priorities are -1..2)
        inv = self.log.tick()
        self.clock.reset()
        if timeout:
            lease = t.claim(wid, vis, min_priority, timeout=timeout)
        else:
            lease = t.claim(wid, vis, min_priority)
        reading = self._reads("claim", 1)
        assert reading is not None
        d = self._claimed(wid, lease, inv, reading, bool(timeout))
        if d is None:
            return False
        assert lease is not None
        self._finish(rng, wid, lease, d)
        return True

    def _claimed(self, wid: str, lease: Any, inv: int, reading: Optional[float], waited: bool) -> Optional[Delivery]:
        """Log a claim's result (``reading``: its clock reading, if known)."""
        log = self.log
        vis = self.visibility
        now = reading if lease is None else lease.expires_at - vis  # the transport's now
        with log.lock:
            log.index += 1
            ret = log.index
            log.counts["ops"] = log.counts.get("ops", 0) + 1
            if reading is not None:
                log.latest = max(log.latest, reading)
            if lease is None:
                return None
            key = (lease.seq, lease.attempt)
            if key in log.deliveries:
                log.problems.append(f"delivery {key} issued twice")
            d = log.deliveries[key] = Delivery(
                lease.seq, lease.attempt, lease.group_id, lease.worker_id, lease.event, now, inv, ret
            )
            d.expiries.append((ret, lease.expires_at))
            if waited:
                log.counts["waited"] = log.counts.get("waited", 0) + 1
        if lease.worker_id != wid or (reading is not None and now < reading - self.slack):
            log.problem(f"claim returned {lease!r} to {wid}: its now {now} is before the clock's {reading}")
        return d

    def _finish(self, rng: random.Random, wid: str, lease: Any, d: Delivery) -> None:
        """What the worker does with a claimed lease: heartbeats, then ack,
        nack, park, a late ack or a crash; all logged."""
        t = self.transport
        log = self.log
        vis = self.visibility

        # heartbeats: both the old and the new lease name the same delivery
        for _ in range(rng.choice((0, 0, 0, 1, 2))):
            inv = log.tick()
            self.clock.reset()
            try:
                new = t.extend(lease, vis)
            except LeaseLost:
                ret = log.tick()
                with log.lock:
                    d.lost.append(("extend", inv, ret))
                    log.counts["ops"] = log.counts.get("ops", 0) + 1
                    log.counts["lease_lost"] = log.counts.get("lease_lost", 0) + 1
                return
            reading = self._reads("extend", 1)
            assert reading is not None
            now = new.expires_at - vis
            with log.lock:
                log.index += 1
                log.latest = max(log.latest, reading)
                d.expiries.append((log.index, new.expires_at))
                log.counts["ops"] = log.counts.get("ops", 0) + 1
                log.counts["extends"] = log.counts.get("extends", 0) + 1
            if (new.seq, new.attempt, new.worker_id) != (lease.seq, lease.attempt, wid) or now < reading - self.slack:
                log.problem(f"extend of {lease!r} returned {new!r}: its now {now}, the clock's {reading}")
            if rng.random() < 0.5:
                lease = new

        roll = rng.random()
        if roll < 0.10:
            log.count("crashes")  # drop the lease: it must expire and come back
            return
        if roll < 0.16:
            # ack late: after the lease ran out (accepted unless re-claimed)
            log.count("late_acks")
            while self.clock() <= lease.expires_at and not self.done:
                time.sleep(0.0005)
            kind, delay = "ack", 0.0
        elif roll < 0.28:
            kind, delay = "nack0", 0.0
        elif roll < 0.40:
            kind, delay = "park", rng.choice(self.delays)
        else:
            kind, delay = "ack", 0.0
        inv = log.tick()
        self.clock.reset()
        try:
            if kind == "ack":
                t.ack(lease)
            else:
                t.nack(lease, delay)
        except LeaseLost:
            ret = log.tick()
            with log.lock:
                d.lost.append((kind, inv, ret))
                log.counts["ops"] = log.counts.get("ops", 0) + 1
                log.counts["lease_lost"] = log.counts.get("lease_lost", 0) + 1
            return
        now = self._reads(kind, 1 if kind == "park" else 0)
        with log.lock:
            log.index += 1
            d.end, d.end_inv, d.end_ret = kind, inv, log.index
            log.counts["ops"] = log.counts.get("ops", 0) + 1
            if kind == "ack":
                log.acked.setdefault(lease.seq, []).append((inv, log.index))
                log.counts["acks"] = log.counts.get("acks", 0) + 1
            elif kind == "park":
                assert now is not None
                log.latest = max(log.latest, now)
                d.park_end = now + delay  # a lower bound: the transport's now may be later
                log.counts["parks"] = log.counts.get("parks", 0) + 1
            else:
                log.counts["nacks"] = log.counts.get("nacks", 0) + 1

        if rng.random() < 0.1:
            # the delivery is closed: every further use of the lease is refused
            log.count("stale_probes")
            probe = rng.choice(("ack", "nack", "extend"))
            self.clock.reset()
            try:
                if probe == "ack":
                    t.ack(lease)
                elif probe == "nack":
                    t.nack(lease, 0.0)
                else:
                    t.extend(lease, vis)
            except LeaseLost:
                log.count("ops")
            else:
                log.problem(f"{probe} of closed delivery {lease!r} (closed by {kind}) was accepted")

    # ------------------------------------------------------ asyncio workers

    def async_thread(self) -> None:
        asyncio.run(self._async_main())

    async def _async_main(self) -> None:
        """The tasks, and the checkpoint gate: when a pause is asked for, every
        task parks outside the transport, then this thread joins the barrier
        (blocking the loop, so nothing of it runs during the checkpoint)."""
        self.parked = 0
        self.checkpointing = False
        tasks = [asyncio.ensure_future(self._async_worker(i)) for i in range(self.cfg.async_workers)]
        try:
            while not self.done:
                if self.pause:
                    self.checkpointing = True
                    while self.parked < sum(not task.done() for task in tasks) and not self.done:
                        await asyncio.sleep(0.001)
                    try:
                        self.barrier.wait()  # everyone is quiescent: the checkpoint runs
                        self.barrier.wait()  # the checkpoint is over
                    except threading.BrokenBarrierError:
                        return
                    finally:
                        self.checkpointing = False
                await asyncio.sleep(0.002)
        finally:
            self.checkpointing = False
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _async_worker(self, index: int) -> None:
        rng = random.Random(self.cfg.seed * 1000 + 900 + index)
        wid = f"task-{index}"
        t = self.transport
        while not self.done:
            if self.pause or self.checkpointing:
                self.parked += 1
                while (self.pause or self.checkpointing) and not self.done:
                    await asyncio.sleep(0.001)
                self.parked -= 1
                continue
            min_priority = 1 if rng.random() < 0.1 else -1
            inv = self.log.tick()
            try:
                lease = await t.aclaim(wid, self.visibility, min_priority, timeout=self.cfg.wait_timeout)
                d = self._claimed(wid, lease, inv, None, True)
                if d is not None:
                    self.log.count("async")
                    self._finish(rng, wid, lease, d)
            except Exception as exc:  # noqa: BLE001 - recorded; the lease it held is "crashed"
                self.log.problem(f"{wid}: unexpected {exc!r}")

    # ---------------------------------------------------------- checkpoints

    def checkpoint(self) -> None:
        """All threads are parked at the barrier: compare stats()/len() with the log."""
        if self.cfg.operator:
            self.checkpoint_with_operator()
            return
        t = self.transport
        log = self.log
        n = len(t)
        self.clock.reset()
        stats = t.stats()
        reading = self._reads("stats", 1)
        assert reading is not None
        log.latest = now = max(log.latest, reading)  # quiescent: exactly the transport's time
        unacked = [s for s in log.published if s not in log.acked]
        latest: Dict[int, Delivery] = {}
        for d in log.deliveries.values():
            if d.seq not in log.acked and (d.seq not in latest or d.attempt > latest[d.seq].attempt):
                latest[d.seq] = d
        leased = parked = maybe_parked = 0
        for d in latest.values():
            if d.end == "park":
                # park_end >= reading + delay; it is exactly that unless the nack's now was later
                parked += d.park_end >= now
                maybe_parked += d.park_end < now
            elif d.end is None:
                leased += max(e for _, e in d.expiries) >= now
        expected = (len(unacked), len({log.published[s][0] for s in unacked}), leased)
        if n != expected[0] or tuple(stats)[:3] != expected or not parked <= stats.parked <= parked + maybe_parked:
            log.problem(
                f"checkpoint at now={now}: len={n} stats={tuple(stats)}, the log says {expected} "
                f"and {parked}..{parked + maybe_parked} parked"
            )
        log.counts["checkpoints"] = log.counts.get("checkpoints", 0) + 1

    def checkpoint_with_operator(self) -> None:
        """Quiescent, with purges about: ``len``, ``stats()`` and ``groups()``
        agree with each other, with the counts of the log and with the
        operator's record of the pauses.  ``stats()`` comes after
        ``groups()`` (the clock may tick in between), so its leases and parks
        may only be fewer: later expiries, and nobody claims meanwhile."""
        t = self.transport
        log = self.log
        n = len(t)
        self.clock.reset()
        listed = t.groups()
        self._reads("groups", 1)
        self.clock.reset()
        stats = t.stats()
        self._reads("stats", 1)
        held = sum(g.messages for g in listed)
        leased = sum(1 for g in listed if g.state == "leased")
        parked = sum(1 for g in listed if g.state == "parked")
        paused = {g.group_id for g in listed if g.paused}
        expected = len(log.published) - len(log.acked) - log.purged
        if not (
            n == stats.messages == held == expected
            and stats.groups == sum(1 for g in listed if g.messages)
            and stats.paused == len(paused)
            and paused == self.paused
            and stats.leased <= leased
            and stats.parked <= parked
            and all(g.paused for g in listed if not g.messages)
        ):
            log.problem(
                f"checkpoint: len={n} stats={tuple(stats)}, groups() holds {held} in "
                f"{sum(1 for g in listed if g.messages)} groups, {leased} leased, {parked} parked, "
                f"{len(paused)} paused; the log expects {expected} messages and "
                f"{len(self.paused)} paused groups ({sorted(paused ^ self.paused)[:5]} differ)"
            )
        log.counts["checkpoints"] = log.counts.get("checkpoints", 0) + 1

    # ------------------------------------------------------------------ run

    def run(self) -> StressResult:
        cfg = self.cfg
        _switch_interval_enter(cfg.switch_interval)
        started = time.monotonic()
        threads = [threading.Thread(target=self.worker, args=(i,), daemon=True) for i in range(cfg.workers)]
        threads += [threading.Thread(target=self.publisher, args=(i,), daemon=True) for i in range(cfg.publishers)]
        if cfg.async_workers:
            threads.append(threading.Thread(target=self.async_thread, daemon=True))
        if cfg.operator:
            threads.append(threading.Thread(target=self.operator, daemon=True))
        if self.fake is not None:
            threads.append(threading.Thread(target=self.ticker, daemon=True))
        for th in threads:
            th.start()
        last_acked, last_progress = -1, started
        try:
            done_checkpoints = 0
            while True:
                time.sleep(0.005)
                with self.log.lock:
                    published = len(self.log.published)
                    acked = len(self.log.acked) + self.log.purged  # each message acked or purged
                    problems = len(self.log.problems)
                if acked != last_acked:
                    last_acked, last_progress = acked, time.monotonic()
                if problems > 1000:
                    self.log.problem("too many problems: stopped early")
                    break
                if not self.publishing and acked == published and self._publishers_idle() and self.operator_done:
                    break
                if done_checkpoints < cfg.checkpoints and self._progress(acked) > (
                    done_checkpoints + 1
                ) / (cfg.checkpoints + 1):
                    self.pause = True
                    self.barrier.wait(timeout=cfg.hang_timeout)
                    self.pause = False
                    try:
                        self.checkpoint()
                    finally:
                        self.barrier.wait(timeout=cfg.hang_timeout)
                    done_checkpoints += 1
                if time.monotonic() - last_progress > cfg.hang_timeout:
                    self.log.problem(
                        f"no ack for {cfg.hang_timeout}s: stuck with {published - acked} messages unacked"
                    )
                    break
        finally:
            self.done = True
            if self.pause:
                self.barrier.abort()
            for th in threads:
                th.join(30)
            _switch_interval_exit()
        seconds = time.monotonic() - started
        return self.analyse(seconds, len(threads))

    def _publishers_idle(self) -> bool:
        # publishing is over and no publish is in flight: every message is in the log
        with self.publish_lock:
            return not self.publishing and self.in_flight == 0

    def _progress(self, acked: int) -> float:
        cfg = self.cfg
        if cfg.messages is not None:
            return acked / cfg.messages
        assert cfg.duration is not None and self.deadline is not None
        return 1.0 - (self.deadline - time.monotonic()) / cfg.duration

    # ------------------------------------------------------------- analysis

    def analyse(self, seconds: float, threads: int) -> StressResult:
        log = self.log
        t = self.transport
        c = log.counts
        res = StressResult(
            impl=self.cfg.impl.__name__.rsplit(".", 1)[-1],
            clock=self.cfg.clock,
            threads=threads,
            groups=self.cfg.groups,
            published=len(log.published),
            deliveries=len(log.deliveries),
            acks=c.get("acks", 0),
            ops=c.get("ops", 0),
            extends=c.get("extends", 0),
            nacks=c.get("nacks", 0),
            parks=c.get("parks", 0),
            crashes=c.get("crashes", 0),
            late_acks=c.get("late_acks", 0),
            lease_lost=c.get("lease_lost", 0),
            stale_probes=c.get("stale_probes", 0),
            checkpoints=c.get("checkpoints", 0),
            waited=c.get("waited", 0),
            async_deliveries=c.get("async", 0),
            pauses=c.get("pause", 0),
            resumes=c.get("resume", 0),
            purges=c.get("purge", 0),
            purged=log.purged,
            priority_changes=c.get("set_priority", 0),
            seconds=seconds,
        )
        problems = res.problems
        problems.extend(log.problems)
        control = log.control

        def between(group: str, ops: Iterable[str], after: int, before: int) -> bool:
            """Could an operator call ``ops`` on ``group`` have taken effect after
            something that started at index ``after`` and before something that
            returned at index ``before``?"""
            return any(c.op in ops and c.ret > after and c.inv < before for c in control.get(group, ()))

        # every published message acked exactly once, nothing else acked --
        # or removed by a purge of its group that came after its publish
        unacked = 0
        for seq, pub in log.published.items():
            n = len(log.acked.get(seq, ()))
            if n == 0 and between(pub[0], ("purge",), pub[3], log.index + 1):
                unacked += 1
            elif n != 1:
                problems.append(f"message {seq} acked {n} times")
        if unacked != log.purged:
            problems.append(f"{unacked} messages never acked, but the purges removed {log.purged}")
        for seq in log.acked:
            if seq not in log.published:
                problems.append(f"ack of message {seq}, which was never published")

        by_seq: Dict[int, List[Delivery]] = {}
        for d in log.deliveries.values():
            by_seq.setdefault(d.seq, []).append(d)
            pub = log.published.get(d.seq)
            if pub is None:
                problems.append(f"delivery {d.seq}/{d.attempt} of a message never published")
                continue
            if d.group != pub[0] or d.event is not pub[1]:
                problems.append(f"delivery {d.seq}/{d.attempt} carries the wrong group or event")

        # attempt counts: 1..k, one delivery each
        for seq, ds in by_seq.items():
            ds.sort(key=lambda d: d.attempt)
            if [d.attempt for d in ds] != list(range(1, len(ds) + 1)):
                problems.append(f"message {seq}: attempts {[d.attempt for d in ds]}")
            for d in ds[:-1]:
                if d.end == "ack":
                    problems.append(f"message {seq} delivered again after a successful ack (attempt {d.attempt})")
            for d in ds:
                # LeaseLost must be justified by a re-delivery that started before the
                # call returned, or by a purge of the group after the claim
                for op, _inv, ret in d.lost:
                    if not any(n.attempt > d.attempt and n.claim_inv < ret for n in ds) and not between(
                        d.group, ("purge",), d.claim_inv, ret
                    ):
                        problems.append(f"{op} of {seq}/{d.attempt} raised LeaseLost with no re-delivery before it")
                # a successful call on a delivery already superseded is a stale call accepted
                if d.end is not None:
                    for n in ds:
                        if n.attempt > d.attempt and n.claim_ret < d.end_inv:
                            problems.append(
                                f"{d.end} of {seq}/{d.attempt} accepted although attempt {n.attempt} was claimed before"
                            )

        # per group: consecutive deliveries in (seq, attempt) order must not overlap
        by_group: Dict[str, List[Delivery]] = {}
        for d in log.deliveries.values():
            by_group.setdefault(d.group, []).append(d)
        max_conc = 1 if log.deliveries else 0
        for group, ds in by_group.items():
            ds.sort(key=lambda d: (d.seq, d.attempt))
            run = 1
            for old, new in zip(ds, ds[1:]):
                why = _overlap(old, new, self.slack)
                if why and between(group, ("purge",), old.claim_inv, new.claim_ret):
                    why = ""  # a purge may have ended the old lease or park
                if why and old.end == "park" and between(group, ("resume",), old.end_inv, new.claim_ret):
                    why = ""  # a resume may have ended the park
                if why:
                    problems.append(f"group {group}: {why}")
                    run += 1
                    max_conc = max(max_conc, run)
                else:
                    run = 1
        res.max_group_concurrency = max_conc

        # FIFO: a group's message is first delivered only after the previous one was acked
        seqs_by_group: Dict[str, List[int]] = {}
        for seq, pub in log.published.items():
            seqs_by_group.setdefault(pub[0], []).append(seq)
        for group, seqs in seqs_by_group.items():
            seqs.sort()
            for s1, s2 in zip(seqs, seqs[1:]):
                first = log.deliveries.get((s2, 1))
                acks = log.acked.get(s1)
                if first is not None and acks and first.claim_ret < acks[0][0]:
                    problems.append(f"group {group}: message {s2} delivered before message {s1} was acked")
                if (
                    first is not None
                    and not acks
                    and not between(group, ("purge",), log.published[s1][3], first.claim_ret)
                ):
                    problems.append(f"group {group}: message {s2} delivered, earlier {s1} never acked")

        # a paused group is never served: no claim lies wholly inside a pause
        for d in log.deliveries.values():
            calls = control.get(d.group, ())
            before = [i for i, c in enumerate(calls) if c.ret < d.claim_inv]
            if before and calls[before[-1]].op == "pause":
                following = calls[before[-1] + 1] if before[-1] + 1 < len(calls) else None
                if following is None or following.inv > d.claim_ret:
                    problems.append(f"delivery {d.seq}/{d.attempt} of paused group {d.group} (claimed while paused)")

        # the transport agrees with the log at the end: everything acked
        self.clock.reset()
        stats = tuple(t.stats())
        if len(t) != 0 or stats != (0, 0, 0, 0, 0, 0, 0):
            problems.append(f"after the run: len={len(t)} stats={stats}, expected empty")
        if len(log.deliveries) < len(log.published) - log.purged:
            problems.append("fewer deliveries than messages")
        return res


def _overlap(old: Delivery, new: Delivery, slack: float) -> str:
    """Why ``new`` (the later delivery of the group) certainly overlapped ``old``; '' if not proven."""
    # old's lock in force when new was claimed ended no earlier than this:
    expiry = max(e for ret, e in old.expiries if ret < new.claim_inv or ret == old.claim_ret)
    not_expired = new.claim_now + slack <= expiry
    tag = f"{new.seq}/{new.attempt} claimed at {new.claim_now}"
    if old.end in ("ack", "nack0", "park"):
        if new.claim_ret < old.end_inv and not_expired:
            return f"{tag} while {old.seq}/{old.attempt} was leased (until {expiry}, closed later by {old.end})"
        if old.end == "park" and new.seq == old.seq and new.claim_now + slack <= old.park_end:
            return f"{tag} while {old.seq} was parked until {old.park_end}"
        return ""
    if not_expired:
        return f"{tag} while {old.seq}/{old.attempt} was leased until {expiry} (never closed)"
    return ""


def run_stress(cfg: StressConfig) -> StressResult:
    """Run one stress round and return its figures and problems (empty when all held)."""
    return _Run(cfg).run()


# ------------------------------------------------------------------ the tests


@pytest.mark.parametrize("clock", ["fake", "real"])
@pytest.mark.parametrize(
    "groups, messages",
    [(3000, 12000), (16, 5000)],
    ids=["3000-groups", "16-hot-groups"],
)
def test_stress(impl: ModuleType, clock: str, groups: int, messages: int) -> None:
    """8 workers and 3 publishers; every guarantee checked against the log.

    3000 groups is the wide case; 16 hot groups make several workers contend
    for each group at once (that is where a double lease would show).
    """
    result = run_stress(StressConfig(impl=impl, clock=clock, groups=groups, messages=messages, seed=groups))
    print(result.summary())
    assert result.published == messages
    assert result.deliveries >= messages and result.crashes > 0 and result.parks > 0
    assert result.checkpoints == 2
    assert not result.problems, "\n".join(result.problems[:30])
    assert result.max_group_concurrency == 1


@pytest.mark.parametrize("clock", ["fake", "real"])
@pytest.mark.parametrize(
    "groups, messages",
    [(3000, 8000), (16, 4000)],
    ids=["3000-groups", "16-hot-groups"],
)
def test_stress_with_waiting_workers(impl: ModuleType, clock: str, groups: int, messages: int) -> None:
    """Part 2: 3 polling workers, 3 waiting threads (``claim(timeout=)``) and
    24 asyncio tasks (``aclaim``) with crashes, parks and late acks, while 3
    publishers publish: messages are handed off by publish, ack, nack and
    expiry.  The same guarantees, checked against the same log."""
    cfg = StressConfig(impl=impl, clock=clock, groups=groups, messages=messages, seed=groups + 7,
                       workers=6, waiting_workers=3, async_workers=24)
    result = run_stress(cfg)
    print(result.summary())
    assert result.published == messages
    assert result.deliveries >= messages and result.crashes > 0 and result.parks > 0
    assert result.waited > 0 and result.async_deliveries > 0
    assert result.checkpoints == 2
    assert not result.problems, "\n".join(result.problems[:30])
    assert result.max_group_concurrency == 1


def _free_threaded() -> bool:
    return bool(sysconfig.get_config_var("Py_GIL_DISABLED")) and hasattr(sys, "_is_gil_enabled")


@pytest.mark.parametrize("clock", ["fake", "real"])
@pytest.mark.parametrize(
    "groups, messages",
    [(3000, 8000), (16, 4000)],
    ids=["3000-groups", "16-hot-groups"],
)
def test_stress_with_an_operator(impl: ModuleType, clock: str, groups: int, messages: int) -> None:
    """The same, with an operator thread pausing, resuming, purging and
    re-prioritising groups at random: nothing is lost but what the purges
    removed (counted), no group is double-leased, no paused group served."""
    result = run_stress(
        StressConfig(impl=impl, clock=clock, groups=groups, messages=messages, seed=groups + 1, operator=True)
    )
    print(result.summary())
    assert result.published == messages
    assert result.pauses > 20 and result.resumes > 20 and result.purges > 5 and result.purged > 0
    assert result.acks > 0 and result.crashes > 0 and result.parks > 0
    assert result.checkpoints == 2
    assert not result.problems, "\n".join(result.problems[:30])
    assert result.max_group_concurrency == 1


def test_gil_stays_disabled_after_import(impl: ModuleType) -> None:
    """On free-threaded CPython, importing leasequeue must not re-enable the GIL.

    An extension module not declared free-threading compatible makes the
    interpreter turn the GIL back on at import (with a warning).  Checked in a
    fresh interpreter, so nothing imported earlier by the test run interferes.
    """
    if not _free_threaded():
        pytest.skip("not a free-threaded CPython build (Py_GIL_DISABLED unset): nothing to check here")
    env = dict(os.environ)
    env.pop("PYTHON_GIL", None)  # PYTHON_GIL=1 would force it on
    code = (
        "import sys, leasequeue, " + impl.__name__ + "\n"
        "print(leasequeue.IMPLEMENTATION, sys._is_gil_enabled())"
    )
    out = subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", "-c", code],
        capture_output=True, text=True, env=env, check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "False", out.stdout + out.stderr
