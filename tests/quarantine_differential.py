"""A differential of the quarantine operations against the referee, for the
durable backends' tests (``test_sqlite_quarantine_differential.py``,
``postgres/test_pg_quarantine_differential.py``).

The same random stream of operations -- ``bury`` (with good and bad
reasons), ``skip``, ``peek`` (with good and bad counts), mixed with publish,
claim, ack, nack, park, extend, pause, resume, purge, the inspections and a
manual clock that lets leases and parks run out -- goes to the backend and
to ``leasequeue.testing.ReferenceTransport``; every answer and every error
type must be the same.  On a difference it raises ``AssertionError`` with
the seed and the last operations.
"""

from __future__ import annotations

import math
import random
from typing import Any, Callable, List, Tuple

from leasequeue.testing import ManualClock, ReferenceTransport

GROUPS = ["a", "b", "c", "d"]


def _norm(value: Any) -> Any:
    if hasattr(value, "worker_id") and hasattr(value, "seq") and hasattr(value, "expires_at") \
            and not isinstance(value, tuple):
        return ("lease", value.seq, value.group_id, value.worker_id, value.expires_at, value.attempt, value.event)
    if isinstance(value, list):
        return [_norm(v) for v in value]
    if isinstance(value, tuple):
        return tuple(value)
    return value


def _call(fn: Callable[[], Any]) -> Tuple[Any, Any]:
    """(what to compare, the raw result or None)."""
    try:
        raw = fn()
    except Exception as exc:  # compared by type
        return ("error", type(exc).__name__), None
    return ("ok", _norm(raw)), raw


def run(make: Callable[[ManualClock], Any], seed: int, ops: int = 600) -> None:
    rng = random.Random(seed)
    clock = ManualClock(1000.0)
    ref = ReferenceTransport(clock, accepts_rebuilt_leases=True, usable_after_close=False)
    real = make(clock)
    leases: List[Tuple[Any, Any]] = []  # (the referee's lease, the backend's) of one delivery
    log: List[str] = []
    n_events = 0
    try:
        for step in range(ops):
            op = rng.choice(["publish"] * 4 + ["claim"] * 4 + ["ack", "nack", "park", "extend"] +
                            ["bury"] * 3 + ["skip"] * 2 + ["peek"] * 2 +
                            ["pause", "resume", "resume", "purge", "stats", "groups", "group", "tick", "bad"])
            group = rng.choice(GROUPS)
            pair = rng.choice(leases) if leases else None
            if op == "publish":
                n_events += 1
                args: Tuple[Any, ...] = (group, n_events, rng.choice([-1, 0, 0, 1, 2]))
                call = lambda t, i: t.publish(*args)  # noqa: E731
            elif op == "claim":
                args = (f"w{rng.randrange(3)}", rng.choice([1.0, 5.0, 30.0, math.inf]), rng.choice([-1, 0, 0, 1]))
                call = lambda t, i: t.claim(*args)  # noqa: E731
            elif op in ("ack", "nack", "park", "extend", "bury") and pair is not None:
                extra: Any = {
                    "ack": (), "nack": (0.0,), "park": (rng.choice([1.0, 4.0]),),
                    "extend": (rng.choice([1.0, 10.0]),),
                    "bury": (rng.choice(["", "poison", "x" * 3]),),
                }[op]
                method = "nack" if op == "park" else op
                args = (method, extra)
                call = lambda t, i: getattr(t, args[0])(pair[i], *args[1])  # noqa: E731
            elif op == "skip":
                args = (group,)
                call = lambda t, i: t.skip(*args)  # noqa: E731
            elif op == "peek":
                args = (group, rng.choice([0, 1, 2, 5, 2**70]))
                call = lambda t, i: t.peek(*args)  # noqa: E731
            elif op in ("pause", "resume", "purge", "group"):
                args = (op, group)
                call = lambda t, i: getattr(t, args[0])(args[1])  # noqa: E731
            elif op in ("stats", "groups"):
                args = (op,)
                call = lambda t, i: getattr(t, args[0])()  # noqa: E731
            elif op == "tick":
                seconds = rng.choice([0.5, 2.0, 6.0])
                clock.advance(seconds)
                log.append(f"tick {seconds}")
                continue
            elif op == "bad":
                which = rng.randrange(5)
                args = (which,)
                if which == 0 and pair is not None:
                    call = lambda t, i: t.bury(pair[i], 5)  # noqa: E731
                elif which == 1:
                    call = lambda t, i: t.peek(group, -1)  # noqa: E731
                elif which == 2:
                    call = lambda t, i: t.peek(group, True)  # noqa: E731
                elif which == 3:
                    call = lambda t, i: t.skip(None)  # noqa: E731
                else:
                    call = lambda t, i: t.bury("not a lease")  # noqa: E731
            else:
                continue
            want, ref_raw = _call(lambda: call(ref, 0))
            got, real_raw = _call(lambda: call(real, 1))
            log.append(f"{op}{args!r} -> {want!r}")
            if want != got:
                raise AssertionError(
                    f"seed {seed}, step {step}: {op}{args!r}: the referee says {want!r}, the backend {got!r}\n"
                    + "\n".join(log[-25:])
                )
            if op in ("claim", "extend") and ref_raw is not None:
                leases.append((ref_raw, real_raw))  # the two leases of one delivery
                del leases[:-12]
        # a last look at everything
        assert _norm(ref.groups()) == _norm(real.groups()), f"seed {seed}: groups differ at the end"
        assert _norm(ref.stats()) == _norm(real.stats()), f"seed {seed}: stats differ at the end"
    finally:
        real.close()



def stress(t: Any, *, workers: int = 3, groups: int = 6, per_group: int = 15, seed: int = 0) -> None:
    """Worker threads claim (waiting), ack, and bury now and then; an operator
    thread skips, resumes and peeks.  Real threads on one transport (a durable
    one: several connections' worth of interleaving through its lock and the
    database's).  At the end: nothing is lost (every message was acked once,
    removed by a counted skip, or is still held), no group was ever leased to
    two workers at once, and every peek was head first, in seq order."""
    import threading

    total = groups * per_group
    t.publish_many([(f"g{i % groups}", i) for i in range(total)])
    holder: dict = {}
    guard = threading.Lock()
    acked: List[Any] = []
    problems: List[str] = []
    skipped = [0]
    buried = [0]
    done = threading.Event()

    def worker(name: str, rng: random.Random) -> None:
        while not done.is_set():
            lease = t.claim(name, 60.0, timeout=0.05)
            if lease is None:
                continue
            with guard:
                if lease.group_id in holder:
                    problems.append(f"{lease.group_id} leased to {holder[lease.group_id]} and {name}")
                holder[lease.group_id] = name
            bury = rng.random() < 0.2
            with guard:
                del holder[lease.group_id]  # before the call: the group may be served once it commits
                if not bury:
                    acked.append(lease.event)
            if bury:
                t.bury(lease, f"{name} gave up")
                with guard:
                    buried[0] += 1
            else:
                t.ack(lease)

    def operator(rng: random.Random) -> None:
        while not done.is_set():
            group = f"g{rng.randrange(groups)}"
            action = rng.random()
            if action < 0.25:
                if t.skip(group):
                    with guard:
                        skipped[0] += 1
            elif action < 0.8:
                t.resume(group)
            else:
                seqs = [m.seq for m in t.peek(group, 4)]
                if seqs != sorted(seqs):
                    problems.append(f"peek {group}: {seqs}")
            if len(t) == 0:
                done.set()

    threads = [threading.Thread(target=worker, args=(f"w{i}", random.Random(seed * 10 + i))) for i in range(workers)]
    threads.append(threading.Thread(target=operator, args=(random.Random(seed),)))
    for th in threads:
        th.start()
    done.wait(120.0)
    done.set()
    for th in threads:
        th.join(30.0)
    assert not any(th.is_alive() for th in threads), "a thread did not stop"
    assert not problems, problems[:5]
    assert len(acked) == len(set(acked)), "a message was acked twice"
    assert len(acked) + skipped[0] + len(t) == total, (len(acked), skipped[0], len(t), total)
    assert len(t) == 0, "the operator's resumes and skips did not drain the buried groups"
    assert skipped[0] > 0 and buried[0] > 0, (skipped, buried)  # the run did quarantine something
