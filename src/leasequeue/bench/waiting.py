"""Waiting for work, measured: wake-up latency and worker throughput.

Three measurements, each with every implementation in one process,
interleaved (the order rotates with the repeat):

``wake_thread``
    from a ``publish`` in one thread to a waiting ``claim(timeout=None)``
    returning in another (then ``ack``, not timed); against ``queue.Queue``
    ``put`` -> ``get()``, janus (sync side) and culsans (sync side).
``wake_async``
    from a ``publish`` in a thread to a waiting ``aclaim`` returning in an
    event loop; against ``asyncio.Queue`` fed through
    ``loop.call_soon_threadsafe(q.put_nowait, x)``, janus (sync ``put``,
    async ``get``) and culsans (``sync_put``, ``async_get``).
``throughput``
    one producer thread publishes M messages over 1k groups while K worker
    threads (1, 2, 4, 8) loop ``claim(timeout=None)`` -> ``ack`` until
    ``close()``; against ``queue.Queue`` with the same threads (``put``;
    ``get()`` until a sentinel).  Messages per second, producer included.

A wake-up sample: the consumer sets a flag just before its blocking call,
the producer sees it, waits ``GAP`` seconds more (the consumer is asleep by
then), reads ``time.perf_counter_ns()`` and publishes; the consumer reads
the same clock when its call returns.  Each repeat gives a p50 and a p99 per
implementation; the report shows the median over repeats of each, and
ratios are medians of the per-repeat ratios (paired: measured in the same
repeat).  janus and culsans are optional (the ``bench`` extra installs them);
a missing one is noted and skipped.
"""

from __future__ import annotations

import itertools
import statistics
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from .impls import load

__all__ = ["ASYNC_IMPLS", "THREAD_IMPLS", "THROUGHPUT_IMPLS", "WAKE_LABELS", "run_waiting", "waiting_goals"]

#: Seconds the producer waits after the consumer said it is about to block.
GAP = 0.0003
VISIBILITY = 30.0
GROUPS = 1000

#: Implementations of each measurement, in column order (the reference first
#: after leasequeue's own: ratios are taken against it).
THREAD_IMPLS = ("cython", "pure", "queue", "janus", "culsans")
ASYNC_IMPLS = ("cython", "pure", "asyncio", "janus", "culsans")
THROUGHPUT_IMPLS = ("cython", "pure", "queue")
WAKE_LABELS = {
    "cython": "Cython",
    "pure": "pure Python",
    "queue": "queue.Queue",
    "asyncio": "asyncio.Queue (call_soon_threadsafe)",
    "janus": "janus",
    "culsans": "culsans",
}
#: The baseline each measurement's ratios are taken against.
REFERENCE = {"wake_thread": "queue", "wake_async": "asyncio", "throughput": "queue"}


# ----------------------------------------------------------- the contenders


def _lq(impl: str) -> Callable[..., Any]:
    return load(impl)


_ThreadPair = Tuple[Callable[[int], None], Callable[[], Any], Callable[[Any], None], Callable[[], None]]


def _thread_pair(impl: str) -> _ThreadPair:
    """(put(i), get() -> item, done(item), close()) for one thread-to-thread pair."""
    if impl in ("cython", "pure"):
        t = _lq(impl)()
        return (lambda i: t.publish("g", i)), (lambda: t.claim("c", VISIBILITY, timeout=None)), t.ack, t.close
    if impl == "queue":
        import queue

        q: Any = queue.Queue()
        return q.put, q.get, _nothing, _nothing
    if impl == "janus":
        import janus

        jq: Any = janus.Queue()
        return jq.sync_q.put, jq.sync_q.get, _nothing, _nothing
    if impl == "culsans":
        import culsans

        cq: Any = culsans.Queue()
        return cq.sync_put, cq.sync_get, _nothing, _nothing
    raise ValueError(f"unknown implementation {impl!r}")


def _async_pair(impl: str, loop: Any) -> Tuple[Callable[[int], None], Callable[[], Any], Callable[[Any], None]]:
    """(put(i) from another thread, async get() -> item, done(item)); made in ``loop``."""
    if impl in ("cython", "pure"):
        t = _lq(impl)()

        async def claim() -> Any:
            return await t.aclaim("c", VISIBILITY)

        return (lambda i: t.publish("g", i)), claim, t.ack
    if impl == "asyncio":
        import asyncio

        q: Any = asyncio.Queue()
        return (lambda i: loop.call_soon_threadsafe(q.put_nowait, i)), q.get, _nothing
    if impl == "janus":
        import janus

        jq: Any = janus.Queue()
        return jq.sync_q.put, jq.async_q.get, _nothing
    if impl == "culsans":
        import culsans

        cq: Any = culsans.Queue()
        return cq.sync_put, cq.async_get, _nothing
    raise ValueError(f"unknown implementation {impl!r}")


def _nothing(*_args: Any) -> None:
    return None


def available(impls: Tuple[str, ...], wanted: List[str]) -> Tuple[List[str], Dict[str, str]]:
    """The contenders that import (leasequeue's own only if in ``wanted``)."""
    ok: List[str] = []
    missing: Dict[str, str] = {}
    for impl in impls:
        if impl in ("cython", "pure") and impl not in wanted:
            continue
        try:
            if impl in ("cython", "pure"):
                _lq(impl)
            elif impl in ("janus", "culsans"):
                __import__(impl)
        except ImportError as exc:
            missing[impl] = f"{type(exc).__name__}: {exc}"
        else:
            ok.append(impl)
    return ok, missing


# ------------------------------------------------------------ wake latency


def _producer(put: Callable[[int], None], samples: int, waiting: List[int], done: List[int],
              alive: Callable[[], bool]) -> List[int]:
    """Publish ``samples`` items, each when the consumer is asleep; the send times."""
    sent = [0] * samples
    perf = time.perf_counter_ns
    sleep = time.sleep
    for i in range(samples):
        while waiting[0] != i:
            if not alive():
                raise RuntimeError("the consumer died")
            sleep(0.00005)
        sleep(GAP)
        sent[i] = perf()
        put(i)
        while not done[i]:
            if not alive():
                raise RuntimeError("the consumer died")
            sleep(0.00005)
    return sent


def thread_wake(impl: str, samples: int) -> List[int]:
    """Wake-up latencies (ns) from a put in this thread to a get returning in another."""
    put, get, finish, close = _thread_pair(impl)
    waiting = [-1]
    done = [0] * samples
    errors: List[BaseException] = []

    def consumer() -> None:
        perf = time.perf_counter_ns
        try:
            for i in range(samples):
                waiting[0] = i
                item = get()
                done[i] = perf()
                finish(item)
        except BaseException as exc:  # noqa: BLE001 - reported by the producer
            errors.append(exc)

    th = threading.Thread(target=consumer, daemon=True)
    th.start()
    try:
        sent = _producer(put, samples, waiting, done, th.is_alive)
    finally:
        close()
    th.join(30)
    if errors:
        raise errors[0]
    return [d - s for d, s in zip(done, sent)]


def async_wake(impl: str, samples: int) -> List[int]:
    """Wake-up latencies (ns) from a put in this thread to an await returning in an event loop."""
    import asyncio

    waiting = [-1]
    done = [0] * samples
    ready = threading.Event()
    made: Dict[str, Any] = {}
    errors: List[BaseException] = []

    async def consumer() -> None:
        loop = asyncio.get_running_loop()
        put, get, finish = _async_pair(impl, loop)
        made["put"] = put
        ready.set()
        perf = time.perf_counter_ns
        for i in range(samples):
            waiting[0] = i
            item = await get()
            done[i] = perf()
            finish(item)

    def run() -> None:
        try:
            asyncio.run(consumer())
        except BaseException as exc:  # noqa: BLE001 - reported by the producer
            errors.append(exc)
        finally:
            ready.set()

    th = threading.Thread(target=run, daemon=True)
    th.start()
    ready.wait(30)
    if errors:
        raise errors[0]
    sent = _producer(made["put"], samples, waiting, done, th.is_alive)
    th.join(30)
    if errors:
        raise errors[0]
    return [d - s for d, s in zip(done, sent)]


def _percentile(values: List[int], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


# --------------------------------------------------------------- throughput


def throughput(impl: str, threads: int, messages: int) -> float:
    """Messages per second through one producer and ``threads`` workers."""
    counter = itertools.count(1)
    finished = threading.Event()
    if impl in ("cython", "pure"):
        t = _lq(impl)()

        def work(i: int) -> None:
            wid = f"w{i}"
            claim, ack = t.claim, t.ack
            while (lease := claim(wid, VISIBILITY, timeout=None)) is not None:
                ack(lease)
                if next(counter) == messages:
                    finished.set()

        def produce() -> None:
            pub = t.publish
            for j in range(messages):
                pub(names[j % GROUPS], j)

        def stop() -> None:
            t.close()
    elif impl == "queue":
        import queue

        q: Any = queue.Queue()

        def work(i: int) -> None:
            get = q.get
            while get() is not None:
                if next(counter) == messages:
                    finished.set()

        def produce() -> None:
            put = q.put
            for j in range(messages):
                put(j)

        def stop() -> None:
            for _ in range(threads):
                q.put(None)
    else:
        raise ValueError(f"unknown implementation {impl!r}")
    names = [f"g{j}" for j in range(GROUPS)]
    workers = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(threads)]
    for w in workers:
        w.start()
    time.sleep(0.01)  # let them reach their first wait
    start = time.perf_counter()
    produce()
    if not finished.wait(300):
        raise RuntimeError(f"{impl}: throughput run did not finish")
    elapsed = time.perf_counter() - start
    stop()
    for w in workers:
        w.join(30)
    return messages / elapsed


# --------------------------------------------------------------------- run


def run_waiting(cfg: Any, progress: Any) -> Dict[str, Any]:
    """All three measurements for ``cfg`` (``wake_samples``, ``repeats``,
    ``throughput_messages``, ``throughput_threads``): the ``waiting`` part of
    the JSON report."""
    out: Dict[str, Any] = {
        "gap_s": GAP,
        "samples_per_repeat": cfg.wake_samples,
        "repeats": cfg.repeats,
        "throughput_messages": cfg.throughput_messages,
        "groups": GROUPS,
        "missing": {},
    }
    for kind, impls, measure in (("wake_thread", THREAD_IMPLS, thread_wake), ("wake_async", ASYNC_IMPLS, async_wake)):
        ok, missing = available(impls, cfg.impls)
        out["missing"].update(missing)
        p50: Dict[str, List[float]] = {i: [] for i in ok}
        p99: Dict[str, List[float]] = {i: [] for i in ok}
        for r in range(cfg.repeats):
            order = ok[r % len(ok):] + ok[: r % len(ok)] if ok else []
            for impl in order:
                progress.step(f"waiting: {kind}", f"repeat {r + 1}/{cfg.repeats} {impl}")
                lat = measure(impl, cfg.wake_samples)
                p50[impl].append(_percentile(lat, 0.50))
                p99[impl].append(_percentile(lat, 0.99))
        out[kind] = [
            {"impl": i, "p50_ns": p50[i], "p99_ns": p99[i],
             "median_p50_ns": statistics.median(p50[i]), "median_p99_ns": statistics.median(p99[i])}
            for i in ok
        ]
        out[kind + "_ratios"] = _ratios(out[kind], REFERENCE[kind], ("p50_ns", "p99_ns"))
    ok, missing = available(THROUGHPUT_IMPLS, cfg.impls)
    rows: List[Dict[str, Any]] = []
    for k in cfg.throughput_threads:
        per: Dict[str, List[float]] = {i: [] for i in ok}
        for r in range(cfg.repeats):
            order = ok[r % len(ok):] + ok[: r % len(ok)] if ok else []
            for impl in order:
                progress.step("waiting: throughput", f"{k} threads repeat {r + 1}/{cfg.repeats} {impl}")
                per[impl].append(throughput(impl, k, cfg.throughput_messages))
        for impl in ok:
            rows.append({"impl": impl, "threads": k, "ops_per_s": per[impl],
                         "median_ops_per_s": statistics.median(per[impl])})
    out["throughput"] = rows
    out["throughput_ratios"] = [
        dict(ratio, threads=k)
        for k in cfg.throughput_threads
        for ratio in _ratios([r for r in rows if r["threads"] == k], REFERENCE["throughput"], ("ops_per_s",))
    ]
    return out


def steps(cfg: Any) -> int:
    """Progress steps of ``run_waiting``."""
    n = 0
    for impls in (THREAD_IMPLS, ASYNC_IMPLS):
        n += len(available(impls, cfg.impls)[0]) * cfg.repeats
    n += len(available(THROUGHPUT_IMPLS, cfg.impls)[0]) * cfg.repeats * len(cfg.throughput_threads)
    return n


def _ratios(rows: List[Dict[str, Any]], ref: str, fields: Tuple[str, ...]) -> List[Dict[str, Any]]:
    """impl / ref for each field: the median of the per-repeat ratios."""
    base = next((r for r in rows if r["impl"] == ref), None)
    if base is None:
        return []
    out = []
    for r in rows:
        if r["impl"] == ref:
            continue
        ratio = {"impl": r["impl"], "ref": ref}
        for f in fields:
            ratio[f.replace("_ns", "").replace("ops_per_s", "ops")] = statistics.median(
                a / b for a, b in zip(r[f], base[f])
            )
        out.append(ratio)
    return out


# -------------------------------------------------------------------- goals

#: Why each waiting goal is set.
WHY = {
    "wake_thread": "a worker blocked in claim(timeout=...) should wake as fast as one blocked in "
    "queue.Queue.get(), the queue Python programmers already use",
    "wake_async": "an aclaim should wake as fast as an asyncio.Queue fed from a thread the usual way "
    "(call_soon_threadsafe)",
    "bridges": "janus and culsans are the queues people use between threads and asyncio: waking "
    "across that boundary is what leasequeue must do better",
    "pure": "the pure-Python twin is what PyPy and platforms without a wheel get: its worker should "
    "not wake much later than one blocked in queue.Queue.get()",
}


def waiting_goals(waiting: Optional[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The waiting goals of the Cython transport (and the pure twin's thread
    wake-up), judged on a run's ``waiting`` part."""
    if not waiting:
        return []
    out: List[Dict[str, Any]] = []

    def ratio(kind: str, impl: str, ref: str) -> Optional[float]:
        rows = {r["impl"]: r for r in waiting.get(kind, [])}
        if impl not in rows or ref not in rows:
            return None
        return statistics.median(a / b for a, b in zip(rows[impl]["p50_ns"], rows[ref]["p50_ns"]))

    for kind, ref, label in (("wake_thread", "queue", "thread"), ("wake_async", "asyncio", "asyncio")):
        v = ratio(kind, "cython", ref)
        out.append({"target": f"{label} wake p50: Cython / {WAKE_LABELS[ref]}", "goal": "<= 1.2", "value": v,
                    "met": None if v is None else v <= 1.2, "at": kind, "note": "" if v is not None else
                    "not measured", "why": WHY[kind]})
        for other in ("janus", "culsans"):
            v = ratio(kind, "cython", other)
            out.append({"target": f"{label} wake p50: Cython / {other}", "goal": "< 1", "value": v,
                        "met": None if v is None else v < 1.0, "at": kind,
                        "note": "" if v is not None else "not measured", "why": WHY["bridges"]})
    v = ratio("wake_thread", "pure", "queue")
    out.append({"target": "thread wake p50: pure Python / queue.Queue", "goal": "<= 1.3", "value": v,
                "met": None if v is None else v <= 1.3, "at": "wake_thread",
                "note": "" if v is not None else "not measured", "why": WHY["pure"]})
    return out


# ------------------------------------------------------------------ report


def render(report: Dict[str, Any]) -> List[str]:
    """The report's section for the ``waiting`` part (empty if not measured)."""
    waiting = report.get("waiting")
    if not waiting:
        return []
    from .fmt import fmt_ns, fmt_ratio

    lines = [
        "",
        "## Waiting for work: wake-up latency",
        "",
        f"From a publish/put in one thread to the waiting claim/get returning; {waiting['samples_per_repeat']} "
        f"samples per repeat, {waiting['repeats']} repeats, interleaved. Cells: median over repeats of each "
        "repeat's p50 / p99. Ratios: median of the per-repeat p50 (p99) ratios to the reference.",
    ]
    for kind, title in (("wake_thread", "thread → thread"), ("wake_async", "thread → asyncio")):
        rows = waiting.get(kind) or []
        if not rows:
            continue
        ref = REFERENCE[kind]
        ratios = {r["impl"]: r for r in waiting.get(kind + "_ratios", [])}
        lines += ["", f"### {title}", "",
                  f"| implementation | p50 | p99 | p50 / {WAKE_LABELS[ref]} | p99 / {WAKE_LABELS[ref]} |",
                  "|---|---:|---:|---:|---:|"]
        for r in rows:
            rr = ratios.get(r["impl"])
            cells = ["1.00×" if r["impl"] == ref else (fmt_ratio(rr[q]) if rr else "-") for q in ("p50", "p99")]
            lines.append(f"| {WAKE_LABELS[r['impl']]} | {fmt_ns(r['median_p50_ns'])} | {fmt_ns(r['median_p99_ns'])}"
                         f" | {cells[0]} | {cells[1]} |")
    rows = waiting.get("throughput") or []
    if rows:
        threads = sorted({r["threads"] for r in rows})
        impls = [i for i in THROUGHPUT_IMPLS if any(r["impl"] == i for r in rows)]
        ratios = {(r["impl"], r["threads"]): r for r in waiting.get("throughput_ratios", [])}
        lines += ["", "## Waiting for work: throughput", "",
                  f"One producer thread publishes {waiting['throughput_messages']} messages over "
                  f"{waiting['groups']} groups; K workers loop claim(timeout=None) → ack until close() "
                  "(queue.Queue: put; get() until a sentinel). Messages per second, median over repeats; "
                  "the ratio is to queue.Queue with the same threads.", "",
                  "| workers | " + " | ".join(WAKE_LABELS[i] for i in impls) + " | Cython / queue.Queue |",
                  "|---:|" + "---:|" * (len(impls) + 1)]
        for k in threads:
            cells = []
            for i in impls:
                r = next((x for x in rows if x["impl"] == i and x["threads"] == k), None)
                cells.append("-" if r is None else f"{r['median_ops_per_s'] / 1e3:.0f}k/s")
            rr = ratios.get(("cython", k))
            lines.append(f"| {k} | " + " | ".join(cells) + f" | {fmt_ratio(rr['ops']) if rr else '-'} |")
    if waiting.get("missing"):
        lines += ["", "Not available: " + "; ".join(f"{k} ({v})" for k, v in waiting["missing"].items())]
    return lines
