"""The worker runtime's benchmark, side by side with the job runners users
would pick instead, each run the way its users run it (its own worker, its
defaults), on the same job stream: N no-op jobs over G groups, published
before the worker starts (throughput), then one job at a time to an idle
worker (latency, publish -> handler start).

* **in memory**: a bare ``claim``/``ack`` loop on ``InMemoryTransport`` (the
  floor), ``leasequeue.Worker`` with 1, 4 and 16 threads and on asyncio
  (with 1 thread also on the pure-Python fast path, where the compiled one
  was built);
  dramatiq's ``StubBroker`` with its ``Worker`` (8 threads, its default);
  huey's ``MemoryHuey`` with its consumer (1 thread, its default).
* **SQLite**: ``Worker`` on ``SQLiteTransport`` against huey's
  ``SqliteHuey`` with its consumer.
* **PostgreSQL** (``--postgres``; a throwaway server unless ``--conninfo``):
  8 worker processes of ``Worker`` on ``PostgresTransport``, procrastinate's
  worker with ``lock=`` per group, and PGQueuer's ``QueueManager`` (which
  cannot keep a group exclusive).

Run: ``leasequeue bench --worker [--quick | --smoke] [--postgres]
[--conninfo DSN] [--markdown FILE] [--json FILE]`` (also ``python -m
leasequeue.bench.worker``).  Rounds are interleaved and the best of each is
kept; the machine is shared, so compare ratios within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from leasequeue.testing._postgres_server import ThrowawayServer

WHO_KEEPS_GROUPS = {
    "leasequeue": "yes (the transport: one lease per group)",
    "dramatiq": "no (no groups)",
    "huey": "no (no groups)",
    "procrastinate": "yes, with lock= per group",
    "pgqueuer": "no (per entrypoint limits only)",
}


class Done:
    """Counts handler calls (atomically: itertools.count) and fires at ``n``;
    ``elapsed`` is the steady state: from the first handler call to the
    last, scaled to ``n`` jobs (the worker's start-up is measured apart)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.counter = itertools.count(1)
        self.event = threading.Event()
        self.first = 0.0
        self.last = 0.0

    def hit(self) -> None:
        c = next(self.counter)
        if c == 1:
            self.first = time.perf_counter()
        elif c == self.n:
            self.last = time.perf_counter()
            self.event.set()

    @property
    def elapsed(self) -> float:
        return (self.last - self.first) * self.n / max(self.n - 1, 1)


def _stream(n: int, groups: int) -> List[Tuple[str, int]]:
    return [(f"g{i % groups}", i) for i in range(n)]


# ------------------------------------------------------------------ leasequeue


def lq_bare(n: int, groups: int) -> float:
    """The floor: a bare claim / handler / ack loop, no worker.  Its handler
    does what the workers' handlers do (count the job), so the ratio
    measures the worker, not the handler."""
    import leasequeue

    t = leasequeue.InMemoryTransport()
    t.publish_many(_stream(n, groups))
    done = Done(n)

    def handler(lease: Any) -> None:
        done.hit()

    claim, ack, nack = t.claim, t.ack, t.nack
    t0 = time.perf_counter()
    lease = claim("w", 30.0)
    while lease is not None:
        try:
            handler(lease)
        except Exception:
            nack(lease, 1.0)
        else:
            ack(lease)
        lease = claim("w", 30.0)
    return time.perf_counter() - t0


def lq_worker(make: Callable[[], Any], n: int, groups: int, concurrency: int, runner: str,
              worker_cls: Any = None, pure_fast_path: bool = False) -> float:
    """``pure_fast_path``: the thread runner runs its pure-Python fast path
    (``ThreadRunner.fast``) even where the compiled one was built."""
    from leasequeue.worker.runners import fastpath

    compiled = fastpath.COMPILED
    if pure_fast_path:
        fastpath.COMPILED = None
    try:
        return _lq_worker(make, n, groups, concurrency, runner, worker_cls)
    finally:
        fastpath.COMPILED = compiled


def _lq_worker(make: Callable[[], Any], n: int, groups: int, concurrency: int, runner: str,
               worker_cls: Any = None) -> float:
    from leasequeue import Worker as this_worker

    Worker: Any = worker_cls if worker_cls is not None else this_worker  # --before: an earlier release's
    t = make()
    t.publish_many(_stream(n, groups))
    done = Done(n)

    if runner == "asyncio":
        async def handler(job: Any) -> None:
            done.hit()
    else:
        def handler(job: Any) -> None:  # type: ignore[misc]
            done.hit()

    w = Worker(t, handler, concurrency=concurrency, visibility=30.0, signals=False)
    th = threading.Thread(target=w.run, daemon=True)
    th.start()
    done.event.wait()
    elapsed = done.elapsed
    w.stop()
    th.join()
    t.close()
    return elapsed


def lq_latency(make: Callable[[], Any], samples: int, runner: str = "threads") -> List[float]:
    from leasequeue import Worker

    t = make()
    lat: List[float] = []
    got = threading.Event()

    def record(job: Any) -> None:
        lat.append(time.perf_counter() - job.event)
        got.set()

    if runner == "asyncio":
        async def handler(job: Any) -> None:
            record(job)
    else:
        handler = record  # type: ignore[assignment]
    w = Worker(t, handler, concurrency=4, visibility=30.0, signals=False)
    th = threading.Thread(target=w.run, daemon=True)
    th.start()
    time.sleep(0.1)
    for i in range(samples):
        got.clear()
        t.publish(f"g{i}", time.perf_counter())
        got.wait(10)
        time.sleep(0.002)
    w.stop()
    th.join()
    t.close()
    return lat


# ------------------------------------------------------------------ dramatiq


def _dramatiq_broker() -> Any:
    import dramatiq
    from dramatiq.brokers.stub import StubBroker

    broker = StubBroker()
    broker.emit_after("process_boot")
    dramatiq.set_broker(broker)
    return broker


def dramatiq_run(n: int, groups: int) -> float:
    import dramatiq

    broker = _dramatiq_broker()
    done = Done(n)

    @dramatiq.actor(broker=broker, queue_name=f"q{uuid.uuid4().hex[:8]}", max_retries=0)
    def job(group: str, i: int) -> None:
        done.hit()

    for group, i in _stream(n, groups):
        job.send(group, i)
    worker = dramatiq.Worker(broker)  # worker_threads=8, its default
    worker.start()
    done.event.wait()
    elapsed = done.elapsed
    worker.stop()
    broker.close()
    return elapsed


def dramatiq_latency(samples: int) -> List[float]:
    import dramatiq

    broker = _dramatiq_broker()
    lat: List[float] = []
    got = threading.Event()

    @dramatiq.actor(broker=broker, queue_name=f"q{uuid.uuid4().hex[:8]}", max_retries=0)
    def job(sent: float) -> None:
        lat.append(time.perf_counter() - sent)
        got.set()

    worker = dramatiq.Worker(broker)
    worker.start()
    time.sleep(0.1)
    for _ in range(samples):
        got.clear()
        job.send(time.perf_counter())
        got.wait(10)
        time.sleep(0.002)
    worker.stop()
    broker.close()
    return lat


# ------------------------------------------------------------------ huey


def _huey(kind: str, path: Optional[str]) -> Any:
    from huey import MemoryHuey, SqliteHuey

    name = f"h{uuid.uuid4().hex[:8]}"
    return MemoryHuey(name) if kind == "memory" else SqliteHuey(name, filename=path)


def _huey_consumer(h: Any) -> Any:
    consumer = h.create_consumer(workers=1, worker_type="thread")  # its defaults
    consumer._set_signal_handlers = lambda: None  # started from a bench thread, not its CLI
    return consumer


def huey_run(kind: str, n: int, groups: int, path: Optional[str] = None) -> float:
    h = _huey(kind, path)
    done = Done(n)

    @h.task()
    def job(group: str, i: int) -> None:
        done.hit()

    for group, i in _stream(n, groups):
        job(group, i)
    consumer = _huey_consumer(h)
    consumer.start()
    done.event.wait()
    elapsed = done.elapsed
    consumer.stop(graceful=True)
    return elapsed


def huey_latency(kind: str, samples: int, path: Optional[str] = None) -> List[float]:
    h = _huey(kind, path)
    lat: List[float] = []
    got = threading.Event()

    @h.task()
    def job(sent: float) -> None:
        lat.append(time.perf_counter() - sent)
        got.set()

    consumer = _huey_consumer(h)
    consumer.start()
    time.sleep(0.1)
    for _ in range(samples):
        got.clear()
        job(time.perf_counter())
        got.wait(30)
        time.sleep(0.002)
    consumer.stop(graceful=True)
    return lat


# ------------------------------------------------------------------ PostgreSQL, 8 processes


def _pg_lq_proc(conninfo: str, queue: str, counter: Any, ready: Any, go: Any, stop: Any, lat: Any,
                concurrency: int = 1) -> None:
    from leasequeue import PostgresTransport, Worker

    PostgresTransport.create_queue(conninfo, queue)  # only made queues open
    t = PostgresTransport(conninfo, queue=queue)

    def handler(job: Any) -> None:
        if lat is not None:
            lat.put(time.time() - job.event[1])
        with counter.get_lock():
            counter.value += 1

    w = Worker(t, handler, concurrency=concurrency, visibility=30.0, signals=False)
    def stopper() -> None:
        stop.wait()
        w.stop()

    threading.Thread(target=stopper, daemon=True).start()
    ready.put(1)
    go.wait()
    w.run()
    t.close()


def _pg_procrastinate_proc(conninfo: str, queue: str, counter: Any, ready: Any, go: Any, stop: Any,
                           lat: Any) -> None:
    from procrastinate import App, PsycopgConnector

    app = App(connector=PsycopgConnector(conninfo=conninfo, min_size=1, max_size=2))

    @app.task(name="bench_job", queue=queue)
    def job(group: str, sent: float) -> None:
        if lat is not None:
            lat.put(time.time() - sent)
        with counter.get_lock():
            counter.value += 1

    async def main() -> None:
        async with app.open_async():
            ready.put(1)
            while not go.is_set():
                await asyncio.sleep(0.001)
            task = asyncio.ensure_future(app.run_worker_async(
                queues=[queue], concurrency=1, install_signal_handlers=False, listen_notify=True))
            while not stop.is_set():
                await asyncio.sleep(0.05)
            task.cancel()
            try:
                await task
            except BaseException:
                pass

    asyncio.run(main())


def _pg_pgqueuer_proc(conninfo: str, queue: str, counter: Any, ready: Any, go: Any, stop: Any, lat: Any) -> None:
    import psycopg
    from pgqueuer import QueueManager
    from pgqueuer.queries import Queries

    async def main() -> None:
        conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
        qm = QueueManager(Queries.from_psycopg_connection(conn))

        @qm.entrypoint(queue)
        async def job(j: Any) -> None:
            if lat is not None:
                lat.put(time.time() - json.loads(j.payload)[1])
            with counter.get_lock():
                counter.value += 1

        async def stopper() -> None:
            while not stop.is_set():
                await asyncio.sleep(0.05)
            qm.shutdown.set()

        ready.put(1)
        while not go.is_set():
            await asyncio.sleep(0.001)
        await asyncio.gather(qm.run(), stopper())
        await conn.close()

    asyncio.run(main())


PG_PROCS = {"leasequeue": _pg_lq_proc, "procrastinate": _pg_procrastinate_proc, "pgqueuer": _pg_pgqueuer_proc}


def _pg_publisher(system: str, conninfo: str, queue: str) -> Tuple[Callable[[List[Tuple[str, float]]], None],
                                                                 Callable[[], None]]:
    """(publish(items), close) on one connection kept open, as a producer would."""
    if system.startswith("leasequeue"):
        from leasequeue import PostgresTransport

        PostgresTransport.create_queue(conninfo, queue)  # only made queues open
        t = PostgresTransport(conninfo, queue=queue)

        def publish(items: List[Tuple[str, float]]) -> None:
            for start in range(0, len(items), 500):
                t.publish_many([(g, (g, s)) for g, s in items[start:start + 500]])

        return publish, t.close
    if system == "procrastinate":
        from procrastinate import App, PsycopgConnector

        app = App(connector=PsycopgConnector(conninfo=conninfo))

        @app.task(name="bench_job", queue=queue)
        def job(group: str, sent: float) -> None:  # pragma: no cover - runs in the workers
            pass

        opened = app.open()
        opened.__enter__()

        def publish_deferred(items: List[Tuple[str, float]]) -> None:
            for g, s in items:
                job.configure(lock=g).defer(group=g, sent=s)

        return publish_deferred, lambda: opened.__exit__(None, None, None)
    import psycopg
    from pgqueuer.db import SyncPsycopgDriver
    from pgqueuer.queries import SyncQueries

    conn = psycopg.connect(conninfo, autocommit=True)
    q = SyncQueries(SyncPsycopgDriver(conn))

    def enqueue(items: List[Tuple[str, float]]) -> None:
        for start in range(0, len(items), 500):
            chunk = items[start:start + 500]
            q.enqueue([queue] * len(chunk), [json.dumps([g, s]).encode() for g, s in chunk], [0] * len(chunk))

    return enqueue, conn.close


def pg_run(system: str, conninfo: str, n: int, groups: int, procs: int, latency_samples: int = 0,
           concurrency: int = 1) -> Dict[str, Any]:
    """Throughput of ``procs`` worker processes over ``n`` pre-published jobs, then idle latency."""
    ctx = mp.get_context("spawn")
    queue = f"b{uuid.uuid4().hex[:10]}"
    publish, close = _pg_publisher(system, conninfo, queue)
    publish([(f"g{i % groups}", 0.0) for i in range(n)])
    counter = ctx.Value("q", 0)
    ready = ctx.Queue()
    stop = ctx.Event()
    go = ctx.Event()
    lat = ctx.Queue() if latency_samples else None
    args = (conninfo, queue, counter, ready, go, stop, lat) + ((concurrency,) if system == "leasequeue" else ())
    workers = [ctx.Process(target=PG_PROCS[system], args=args, daemon=True) for _ in range(procs)]
    t0 = time.perf_counter()
    for p in workers:
        p.start()
    for _ in workers:
        ready.get(timeout=120)
    started = time.perf_counter()
    go.set()
    deadline = started + 300
    while counter.value < n and time.perf_counter() < deadline:
        time.sleep(0.005)
    elapsed = time.perf_counter() - started
    out: Dict[str, Any] = {"jobs_per_s": n / elapsed if counter.value >= n else float("nan"),
                           "startup_s": started - t0}
    lats: List[float] = []
    if latency_samples and lat is not None:
        # drain the throughput phase's (zero-stamped) entries: they are not latencies
        while True:
            try:
                lat.get(timeout=0.2)
            except Exception:
                break
        for i in range(latency_samples):
            publish([(f"l{i}", time.time())])
            try:
                lats.append(lat.get(timeout=30))
            except Exception:
                break
            time.sleep(0.005)
    stop.set()
    for p in workers:
        p.join(30)
        if p.is_alive():
            p.terminate()
    close()
    out["latency"] = _pcts(lats)
    return out


# ------------------------------------------------------------------ the run


def _pcts(values: List[float]) -> Dict[str, float]:
    if not values:
        return {"p50": float("nan"), "p99": float("nan"), "n": 0}
    s = sorted(values)
    return {"p50": statistics.median(s) * 1000, "p99": s[min(len(s) - 1, int(len(s) * 0.99))] * 1000, "n": len(s)}


def load_before(path: str) -> Any:
    """The ``Worker`` of an earlier release's ``_worker.py`` (``--before``:
    ``git show 0.6.0:src/leasequeue/_worker.py > /tmp/worker_before.py``),
    loaded as a module of this package so its relative imports resolve."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("leasequeue._worker_before", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.Worker


def run(n: int, groups: int, rounds: int, samples: int, postgres: Optional[str], pg_n: int,
        progress: Callable[[str], None], before: Optional[str] = None) -> Dict[str, Any]:
    import leasequeue
    from leasequeue import SQLiteTransport

    tmp = tempfile.mkdtemp(prefix="lq-worker-bench-")
    counter = itertools.count()

    def sqlite_path() -> str:
        return os.path.join(tmp, f"lq{next(counter)}.db")

    mem = leasequeue.InMemoryTransport
    cases: Dict[str, Callable[[], float]] = {
        "bare claim/ack loop": lambda: lq_bare(n, groups),
        "Worker, 1 thread": lambda: lq_worker(mem, n, groups, 1, "threads"),
        "Worker, 4 threads": lambda: lq_worker(mem, n, groups, 4, "threads"),
        "Worker, 16 threads": lambda: lq_worker(mem, n, groups, 16, "threads"),
        "Worker, asyncio x1": lambda: lq_worker(mem, n, groups, 1, "asyncio"),
        "Worker, asyncio x16": lambda: lq_worker(mem, n, groups, 16, "asyncio"),
    }
    from leasequeue.worker.runners import fastpath

    if fastpath.COMPILED is not None:
        # The pure fast path beside the compiled one (a pure install runs it).
        cases["Worker, 1 thread, pure-Python fast path"] = lambda: lq_worker(mem, n, groups, 1, "threads",
                                                                             pure_fast_path=True)
    if before is not None:
        old = load_before(before)
        cases["before: Worker, 1 thread"] = lambda: lq_worker(mem, n, groups, 1, "threads", old)
        cases["before: Worker, asyncio x1"] = lambda: lq_worker(mem, n, groups, 1, "asyncio", old)
    missing: Dict[str, str] = {}
    try:
        import dramatiq  # noqa: F401

        cases["dramatiq StubBroker + Worker (8 threads)"] = lambda: dramatiq_run(n, groups)
    except ImportError as exc:
        missing["dramatiq"] = str(exc)
    try:
        import huey  # noqa: F401

        cases["huey MemoryHuey + consumer (1 thread)"] = lambda: huey_run("memory", n, groups)
    except ImportError as exc:
        missing["huey"] = str(exc)
    sq_n = max(n // 10, 100)
    sqlite_cases: Dict[str, Callable[[], float]] = {
        "Worker on SQLiteTransport, 1 thread": lambda: lq_worker(lambda: SQLiteTransport(sqlite_path()), sq_n,
                                                                  groups, 1, "threads"),
        "Worker on SQLiteTransport, 4 threads": lambda: lq_worker(lambda: SQLiteTransport(sqlite_path()), sq_n,
                                                                   groups, 4, "threads"),
    }
    if "huey" not in missing:
        sqlite_cases["huey SqliteHuey + consumer (1 thread)"] = lambda: huey_run("sqlite", sq_n, groups,
                                                                                 sqlite_path())
    best: Dict[str, float] = {}
    for r in range(rounds):
        for name, fn in list(cases.items()) + list(sqlite_cases.items()):
            elapsed = fn()
            best[name] = min(best.get(name, float("inf")), elapsed)
        progress(f"round {r + 1}/{rounds} done")
    results: Dict[str, Any] = {"memory": {}, "sqlite": {}, "postgres": {}}
    for name in cases:
        results["memory"][name] = {"jobs_per_s": n / best[name]}
    for name in sqlite_cases:
        results["sqlite"][name] = {"jobs_per_s": sq_n / best[name]}
    progress("latency")
    results["memory"]["Worker, 1 thread"]["latency"] = _pcts(lq_latency(mem, samples))
    results["memory"]["Worker, asyncio x1"]["latency"] = _pcts(lq_latency(mem, samples, "asyncio"))
    if "dramatiq" not in missing:
        results["memory"]["dramatiq StubBroker + Worker (8 threads)"]["latency"] = _pcts(dramatiq_latency(samples))
    if "huey" not in missing:
        results["memory"]["huey MemoryHuey + consumer (1 thread)"]["latency"] = _pcts(
            huey_latency("memory", min(samples, 30)))
        results["sqlite"]["huey SqliteHuey + consumer (1 thread)"]["latency"] = _pcts(
            huey_latency("sqlite", min(samples, 30), sqlite_path()))
    results["sqlite"]["Worker on SQLiteTransport, 1 thread"]["latency"] = _pcts(
        lq_latency(lambda: SQLiteTransport(sqlite_path()), samples))
    if postgres:
        pg_cases = [("leasequeue Worker, 1 thread each", "leasequeue", 1),
                    ("leasequeue Worker, 4 threads each", "leasequeue", 4),
                    ("procrastinate worker, concurrency 1 (its default)", "procrastinate", 1),
                    ("pgqueuer QueueManager (batch 10, its default)", "pgqueuer", 1)]
        for name, system, conc in pg_cases:
            progress(f"PostgreSQL: {name}, 8 processes")
            try:
                results["postgres"][name] = pg_run(system, postgres, pg_n, groups, 8,
                                                   latency_samples=min(samples, 50), concurrency=conc)
            except ImportError as exc:
                missing[system] = str(exc)
    return {"results": results, "missing": missing,
            "config": {"n": n, "groups": groups, "rounds": rounds, "samples": samples, "sqlite_n": sq_n,
                       "postgres_n": pg_n if postgres else None},
            "meta": {"python": sys.version.split()[0], "implementation": leasequeue.IMPLEMENTATION,
                     "cpus": os.cpu_count()}}


def goals(report: Dict[str, Any]) -> List[Tuple[str, float, float, bool]]:
    """(goal, measured ratio, target, met)."""
    mem, sq, pg = (report["results"][k] for k in ("memory", "sqlite", "postgres"))
    out = []

    def rate(d: Dict[str, Any], name: str) -> Optional[float]:
        return d[name]["jobs_per_s"] if name in d else None

    bare, one = rate(mem, "bare claim/ack loop"), rate(mem, "Worker, 1 thread")
    if bare and one:
        out.append(("Worker (1 thread) / bare claim+ack loop", one / bare, 0.8, one / bare >= 0.8))
    aone = rate(mem, "Worker, asyncio x1")
    if one and aone:
        out.append(("Worker, asyncio x1 / Worker, 1 thread", aone / one, 0.5, aone / one >= 0.5))
    peers = [v["jobs_per_s"] for k, v in mem.items() if k.startswith(("dramatiq", "huey"))]
    ours = max(v["jobs_per_s"] for k, v in mem.items() if k.startswith("Worker"))
    if peers:
        out.append(("best Worker / fastest in-memory peer", ours / max(peers), 5.0, ours / max(peers) >= 5.0))
    hs = rate(sq, "huey SqliteHuey + consumer (1 thread)")
    lq1 = rate(sq, "Worker on SQLiteTransport, 1 thread")
    if hs and lq1:
        out.append(("Worker on SQLite (1 thread) / huey SqliteHuey consumer", lq1 / hs, 1.0, lq1 / hs >= 1.0))
    ours_pg = [v["jobs_per_s"] for k, v in pg.items() if k.startswith("leasequeue")]
    if ours_pg:
        for peer in ("procrastinate", "pgqueuer"):
            rows = [v["jobs_per_s"] for k, v in pg.items() if k.startswith(peer)]
            if rows:
                r = max(ours_pg) / rows[0]
                out.append((f"best Worker on PostgreSQL / {peer} (8 processes each)", r, 2.0, r >= 2.0))
    return out


def to_markdown(report: Dict[str, Any], command: str) -> str:
    cfg = report["config"]
    lines = [f"# Worker benchmark\n\nCommand: `{command}`; Python {report['meta']['python']}, "
             f"{report['meta']['implementation']} transport, {report['meta']['cpus']} CPUs (shared: ratios "
             f"within this run are what counts). No-op handlers; throughput over pre-published jobs, "
             f"steady state: first to last handler call (best of {cfg['rounds']} interleaved rounds; the bare "
             "loop: its whole run); latency = publish -> handler start on an idle "
             "worker.\n"]

    def table(title: str, rows: Dict[str, Any], n: Any) -> None:
        lines.append(f"## {title} ({n} jobs, {cfg['groups']} groups)\n")
        lines.append("| runner | jobs/s | latency p50 ms | latency p99 ms | keeps a group exclusive |")
        lines.append("| --- | ---: | ---: | ---: | --- |")
        for name, r in rows.items():
            lat = r.get("latency")
            p50 = f"{lat['p50']:.2f}" if lat and lat["n"] else "-"
            p99 = f"{lat['p99']:.2f}" if lat and lat["n"] else "-"
            system = name.split()[0].lower().rstrip(",")
            who = WHO_KEEPS_GROUPS.get("leasequeue" if system in ("worker", "bare", "before:") else system, "")
            lines.append(f"| {name} | {r['jobs_per_s']:,.0f} | {p50} | {p99} | {who} |")
        lines.append("")

    table("In memory", report["results"]["memory"], cfg["n"])
    table("SQLite", report["results"]["sqlite"], cfg["sqlite_n"])
    if report["results"]["postgres"]:
        table("PostgreSQL, 8 worker processes", report["results"]["postgres"], cfg["postgres_n"])
    lines.append("## Goals\n")
    lines.append("| goal | measured | target | met |")
    lines.append("| --- | ---: | ---: | --- |")
    for name, ratio, target, met in goals(report):
        lines.append(f"| {name} | {ratio:.2f}x | {target:g}x | {'yes' if met else 'no'} |")
    for name, why in report["missing"].items():
        lines.append(f"\nnote: {name} not measured: {why}")
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="leasequeue bench --worker", description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="the default: 20k jobs in memory, 3 rounds")
    mode.add_argument("--smoke", action="store_true", help="seconds; checks that everything runs")
    parser.add_argument("--jobs", type=int, help="jobs per in-memory run (SQLite: a tenth)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (best kept)")
    parser.add_argument("--samples", type=int, help="latency samples per runner (default 200; --smoke 20)")
    parser.add_argument("--postgres", action="store_true", help="also PostgreSQL with 8 worker processes")
    parser.add_argument("--conninfo", help="the PostgreSQL server (default: a throwaway one)")
    parser.add_argument("--pg-jobs", type=int, default=5000, help="jobs per PostgreSQL run (default 5000)")
    parser.add_argument("--json", help="write the results as JSON")
    parser.add_argument("--markdown", help="write the Markdown report")
    parser.add_argument("--before", metavar="WORKER_PY",
                        help="also run an earlier release's worker module (its _worker.py) in memory, "
                             "interleaved with this one")
    args = parser.parse_args(argv)
    n = args.jobs or (2000 if args.smoke else 20000)
    rounds = args.rounds or (1 if args.smoke else 3)
    samples = args.samples or (20 if args.smoke else 200)
    pg_n = 200 if args.smoke else args.pg_jobs
    server = None
    conninfo = args.conninfo
    if args.postgres and conninfo is None:
        server = ThrowawayServer()
        conninfo = server.start()
    try:
        if conninfo:
            from leasequeue import PostgresTransport

            from .postgres import _install

            PostgresTransport.install(conninfo)
            _install(conninfo)
        report = run(n, max(n // 100, 10), rounds, samples, conninfo if args.postgres or args.conninfo else None,
                     pg_n, lambda msg: print(msg, file=sys.stderr, flush=True), args.before)
    finally:
        if server is not None:
            server.stop()
    command = "leasequeue bench --worker " + " ".join(argv if argv is not None else sys.argv[1:])
    md = to_markdown(report, command.strip())
    print(md)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(md)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
