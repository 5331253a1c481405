"""PostgresTransport benchmarks, side by side with PGQueuer and procrastinate.

Everything runs against one PostgreSQL server in one run (a throwaway
server unless ``--conninfo`` names one), each system in its own database
queue/schema, one system at a time, each run the way its users run it:

* **consume only** (``--workload consume``): a queue filled up front
  (``--consume-jobs`` over ``--groups`` groups), emptied by W worker
  processes: leasequeue ``claim(timeout=0.2)`` -> ``ack`` and
  ``claim_many`` -> ``ack_many`` (k = ``--batch``); PGQueuer's own worker
  (``QueueManager.run``, drain mode) with its default batch size, with k
  and with 1; procrastinate's own worker with one ``lock`` per group (its
  per-group exclusivity).  Medians of ``--repeats`` interleaved rounds, CPU
  per job of the workers and (local server) of the server.
* **cycle**: jobs/s for publish -> claim -> ack with 1, 2, 4 and 8 worker
  processes (each process loops over the three calls).  procrastinate:
  defer -> fetch -> finish (delete); PGQueuer's ``Queries`` API: enqueue ->
  dequeue -> log (a ping-pong of single calls: not how PGQueuer's users run
  it; see the consume table for that).  leasequeue gives each job its own
  group here (the group rows are created and removed per job).
* **batch**: the same with k = 64 messages per call (publish_many /
  claim_many / ack_many; PGQueuer's list enqueue, dequeue(batch_size=64),
  log_jobs); procrastinate has no batch fetch.
* **latency**: claim + ack latency (p50/p99) with 10k, 100k and 1M
  messages queued in N/10 groups (filled with SQL, not through publish).
* **wake**: publish -> claim wake latency across processes (p50/p99): one
  process waits in ``claim(timeout=None)``, another publishes a timestamp.

What the peers do not guarantee: PGQueuer has no groups (no per-group
exclusivity, no FIFO within a group); procrastinate's locks give
exclusivity but no round robin between them.

Run: ``leasequeue bench --postgres [--quick | --smoke] [--conninfo DSN
[--pg-data DIR]] [--workload all|cycle|consume] [--consume-jobs N]
[--slow-jobs N] [--groups G] [--consume-workers 1,4,8] [--repeats R]
[--batch K] [--variants V,...] [--sync on|off|both] [--seconds S]
[--json FILE] [--markdown FILE]`` (also ``python -m
leasequeue.bench.postgres`` and ``benchmarks/postgres_bench.py``).
psycopg is needed (the ``postgres`` extra); procrastinate and PGQueuer (the
``bench`` extra) are measured when installed, and named as missing when
not.  Without ``--conninfo`` a throwaway server is started (PostgreSQL's
``initdb`` / ``pg_ctl`` must be installed), with ``fsync=on``.
``--smoke`` only checks that everything runs (seconds, numbers meaningless).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import sys
import time
import uuid
from datetime import timedelta
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

WORKER_COUNTS = (1, 2, 4, 8)
BATCH = 64


# ---------------------------------------------------------------- worker bodies
# Each runs in its own process: wait for ``start``, loop until ``stop_at``
# (time.time()), put the number of jobs done in ``out``.


def _open(conninfo: str, queue: str) -> Any:
    """A transport on ``queue``, made first if need be (only made queues open)."""
    from leasequeue import PostgresTransport

    PostgresTransport.create_queue(conninfo, queue)
    return PostgresTransport(conninfo, queue=queue)


def _lq_cycle(conninfo: str, queue: str, wid: int, batch: int, start: Any, stop_at: Any, out: Any) -> None:
    from leasequeue import PostgresTransport

    t = _open(conninfo, queue)
    worker = f"w{wid}"
    n = 0
    out.put("ready")
    start.wait()
    end = stop_at.value
    if batch == 1:
        while time.time() < end:
            t.publish(f"{wid}-{n}", {"n": n})
            lease = t.claim(worker, 30)
            if lease is not None:
                t.ack(lease)
                n += 1
    else:
        while time.time() < end:
            t.publish_many([(f"{wid}-{n}-{i}", {"n": i}) for i in range(batch)])
            leases = t.claim_many(worker, 30, batch)
            t.ack_many(leases)
            n += len(leases)
    out.put(n)
    t.close()


def _procrastinate_cycle(conninfo: str, queue: str, wid: int, batch: int, start: Any, stop_at: Any, out: Any) -> None:
    from procrastinate import App, PsycopgConnector, jobs

    async def run() -> int:
        app = App(connector=PsycopgConnector(conninfo=conninfo, min_size=1, max_size=2))
        n = 0
        async with app.open_async():
            manager = app.job_manager
            worker_id = await manager.register_worker()
            out.put("ready")
            start.wait()
            end = stop_at.value
            while time.time() < end:
                job = jobs.Job(queue=queue, lock=None, queueing_lock=None, task_name="bench", task_kwargs={"n": n})
                await manager.defer_job_async(job)
                fetched = await manager.fetch_job(queues=[queue], worker_id=worker_id)
                if fetched is not None:
                    await manager.finish_job(fetched, status=jobs.Status.SUCCEEDED, delete_job=True)
                    n += 1
            await manager.unregister_worker(worker_id)
        return n

    out.put(asyncio.run(run()))


def _pgqueuer_cycle(conninfo: str, queue: str, wid: int, batch: int, start: Any, stop_at: Any, out: Any) -> None:
    import psycopg
    from pgqueuer.queries import EntrypointExecutionParameter, Queries

    async def run() -> int:
        conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
        q: Any = Queries.from_psycopg_connection(conn)  # its id and entrypoint types vary by release
        manager_id = uuid.uuid4()
        entry = {queue: EntrypointExecutionParameter(concurrency_limit=0)}
        n = 0
        out.put("ready")
        start.wait()
        end = stop_at.value
        while time.time() < end:
            if batch == 1:
                await q.enqueue(queue, json.dumps({"n": n}).encode())
            else:
                await q.enqueue([queue] * batch, [json.dumps({"n": i}).encode() for i in range(batch)], [0] * batch)
            got = await q.dequeue(batch_size=batch, entrypoints=entry, queue_manager_id=manager_id,
                                  global_concurrency_limit=None, heartbeat_timeout=timedelta(seconds=30))
            if got:
                await q.log_jobs([(job, "successful", None) for job in got])
                n += len(got)
        await conn.close()
        return n

    out.put(asyncio.run(run()))


SYSTEMS: Dict[str, Callable[..., None]] = {
    "leasequeue": _lq_cycle,
    "procrastinate": _procrastinate_cycle,
    "pgqueuer": _pgqueuer_cycle,
}
#: The systems left out of this run, and why.
MISSING: Dict[str, str] = {}


# ---------------------------------------------------------------- consume only
# A queue filled up front (``jobs`` messages over ``groups`` groups, not
# timed), then W worker processes that only consume, each peer through the
# loop or worker its users run.  Each process reports (jobs done, time.time()
# of its last job done); the rate is all jobs over start -> the last one.

#: The consume-only variants, in the order they run at each point.
CONSUME_VARIANTS = ("leasequeue", "leasequeue-aac", "leasequeue-worker", "leasequeue-worker4", "leasequeue-batch",
                    "pgqueuer", "pgqueuer-batch", "pgqueuer-1", "procrastinate")
#: Variants that empty a smaller queue (``--slow-jobs``): they run at tens of jobs/s here.
SLOW_VARIANTS = ("pgqueuer-1", "procrastinate")
#: What each variant is, for the report.
CONSUME_LABELS = {
    "leasequeue": "leasequeue claim(timeout=0.2) / ack",
    "leasequeue-aac": "leasequeue ack_and_claim (claim(timeout=0.2) when it finds nothing)",
    "leasequeue-worker": "leasequeue Worker, 1 slot per process (as `leasequeue worker`)",
    "leasequeue-worker4": "leasequeue Worker, 4 slots per process (`--concurrency 4`)",
    "leasequeue-batch": "leasequeue claim_many / ack_many (k)",
    "pgqueuer": "PGQueuer QueueManager, defaults (batch_size=10)",
    "pgqueuer-batch": "PGQueuer QueueManager, batch_size=k",
    "pgqueuer-1": "PGQueuer QueueManager, batch_size=1",
    "procrastinate": "procrastinate worker, lock per group",
}


def _consume_batch(variant: str, batch: int) -> int:
    """The batch size a variant runs with (PGQueuer's QueueManager default is 10)."""
    if variant in ("leasequeue", "leasequeue-aac"):
        return 1
    if variant == "leasequeue-worker":
        return 1  # Worker(concurrency=1)
    if variant == "leasequeue-worker4":
        return 4  # Worker(concurrency=4)
    if variant == "pgqueuer":
        return 10
    if variant == "pgqueuer-1":
        return 1
    if variant == "procrastinate":
        return 1
    return batch


def _lq_consume(conninfo: str, queue: str, wid: int, batch: int, start: Any, out: Any) -> None:
    """claim(timeout=0.2) -> ack (batch 1), or claim_many -> ack_many, as a
    worker loop does: a worker with nothing to take waits in claim."""
    from leasequeue import PostgresTransport

    t = _open(conninfo, queue)
    worker = f"w{wid}"
    n, last = 0, 0.0
    out.put("ready")
    start.wait()
    cpu = time.process_time()
    while True:
        if batch == 1:
            lease = t.claim(worker, 30.0, timeout=0.2)
            if lease is None:
                break
            t.ack(lease)
            n += 1
        else:
            leases = t.claim_many(worker, 30.0, batch)
            if not leases:
                lease = t.claim(worker, 30.0, timeout=0.2)
                if lease is None:
                    break
                leases = [lease]
            t.ack_many(leases)
            n += len(leases)
        last = time.time()
    cpu = time.process_time() - cpu
    t.close()
    out.put((n, last, cpu))


def _lq_consume_aac(conninfo: str, queue: str, wid: int, batch: int, start: Any, out: Any) -> None:
    """Single calls, one transaction per job: ``ack_and_claim`` acks the
    job done and claims the next; a worker it finds nothing for waits in
    ``claim(timeout=0.2)``."""
    from leasequeue import PostgresTransport

    t = _open(conninfo, queue)
    worker = f"w{wid}"
    n, last = 0, 0.0
    out.put("ready")
    start.wait()
    cpu = time.process_time()
    lease = t.claim(worker, 30.0, timeout=0.2)
    while lease is not None:
        n += 1  # the job (a no-op) is done: ack it, take the next
        lease = t.ack_and_claim(lease, worker, 30.0)
        last = time.time()
        if lease is None:
            lease = t.claim(worker, 30.0, timeout=0.2)
    cpu = time.process_time() - cpu
    t.close()
    out.put((n, last, cpu))


def _lq_consume_worker(conninfo: str, queue: str, wid: int, concurrency: int, start: Any, out: Any,
                       done_by: Any = None, jobs: int = 0) -> None:
    """The project's ``Worker`` (what ``leasequeue worker`` runs), with
    ``concurrency`` slots and every other option at its default, around a
    no-op handler.  It stops once every process's succeeded jobs add up to
    ``jobs`` (each process writes its own count into ``done_by``, read every
    2 ms by a watcher thread): the last job is done when its ack is."""
    import threading

    from leasequeue import Worker

    t = _open(conninfo, queue)
    w = Worker(t, lambda job: None, concurrency=concurrency, worker_id=f"w{wid}", signals=False)
    finished = [0.0]

    def watch() -> None:
        while True:
            done_by[wid] = w.counts["succeeded"]
            if sum(done_by[:]) >= jobs:
                finished[0] = time.time()
                w.stop()
                return
            time.sleep(0.002)

    out.put("ready")
    start.wait()
    cpu = time.process_time()
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    w.run()
    watcher.join()
    cpu = time.process_time() - cpu
    n = w.counts["succeeded"]
    t.close()
    out.put((n, finished[0], cpu))


def _pgqueuer_consume(conninfo: str, queue: str, wid: int, batch: int, start: Any, out: Any) -> None:
    """PGQueuer's own worker, ``QueueManager.run`` in drain mode (it returns
    once the queue is empty), with ``batch_size=batch`` and every other
    setting at its default.

    Its end is the commit of its last completion, not the return of
    ``run()``: drain mode returns seconds after the last job (its shutdown
    waits on timers; measured 4.0 s after the last handler with 8,000 jobs
    at W=1), which would count against PGQueuer time it spends on nothing.
    A job is done when its status log entry is written (``log_jobs``, called
    by its log buffer with up to ``batch_size`` jobs, at most about 0.1 s
    after the handler): the time each such call returns is read, the
    latest is the end."""
    import psycopg
    from pgqueuer.qm import QueueManager
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    async def run() -> Tuple[int, float, float]:
        conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
        queries = Queries.from_psycopg_connection(conn)
        done: List[Any] = [0, 0.0]  # jobs done, time.time() of the last completion's commit
        log_jobs = queries.log_jobs

        async def timed_log_jobs(*args: Any, **kwargs: Any) -> Any:
            result = await log_jobs(*args, **kwargs)
            done[1] = time.time()
            return result

        queries.log_jobs = timed_log_jobs  # type: ignore[method-assign]
        qm = QueueManager(queries)

        @qm.entrypoint(queue)
        async def handle(job: Any) -> None:
            done[0] += 1

        out.put("ready")
        await asyncio.get_running_loop().run_in_executor(None, start.wait)
        cpu = time.process_time()
        await qm.run(batch_size=batch, mode=QueueExecutionMode.drain)
        cpu = time.process_time() - cpu
        # The CPU of its drain-mode shutdown counts (it is small: it waits);
        # the time does not (above).
        return done[0], done[1], cpu

    out.put(asyncio.run(run()))


def _procrastinate_consume(conninfo: str, queue: str, wid: int, batch: int, start: Any, out: Any) -> None:
    """procrastinate's own worker (``run_worker_async``, concurrency 1, its
    defaults; ``wait=False``: it returns once nothing is left to fetch)."""
    from procrastinate import App, PsycopgConnector

    async def run() -> Tuple[int, float, float]:
        app = App(connector=PsycopgConnector(conninfo=conninfo, min_size=1, max_size=2))
        done: List[Any] = [0, 0.0]  # jobs done, time.time() of the last

        @app.task(name="bench", queue=queue)
        async def bench(n: int) -> None:
            done[0] += 1
            done[1] = time.time()

        async with app.open_async():
            out.put("ready")
            await asyncio.get_running_loop().run_in_executor(None, start.wait)
            cpu = time.process_time()
            await app.run_worker_async(queues=[queue], wait=False, install_signal_handlers=False)
            cpu = time.process_time() - cpu
        return done[0], done[1], cpu

    out.put(asyncio.run(run()))


CONSUMERS: Dict[str, Callable[..., None]] = {
    "leasequeue": _lq_consume,
    "leasequeue-aac": _lq_consume_aac,
    "leasequeue-worker": _lq_consume_worker,
    "leasequeue-worker4": _lq_consume_worker,
    "pgqueuer": _pgqueuer_consume,
    "procrastinate": _procrastinate_consume,
}


def _get(out: Any, procs: Sequence[Any], timeout: float) -> Any:
    """The next report of a worker process; an error if one died without one."""
    import queue as queues

    deadline = time.time() + timeout
    while True:
        try:
            return out.get(timeout=1.0)
        except queues.Empty:
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"a worker process failed (exit code {dead[0].exitcode})") from None
            if time.time() > deadline:
                raise RuntimeError("no report from the worker processes in time") from None


def fill(system: str, conninfo: str, queue: str, jobs: int, groups: int) -> None:
    """Publish ``jobs`` jobs (job i in group i % groups) through each system's
    own batch API; PGQueuer has no groups (it ignores them)."""
    chunk = 1000
    if system == "leasequeue":
        from leasequeue import PostgresTransport

        with _open(conninfo, queue) as t:
            for base in range(0, jobs, chunk):
                t.publish_many([(f"g{i % groups}", {"n": i}) for i in range(base, min(base + chunk, jobs))])
    elif system == "pgqueuer":
        import psycopg
        from pgqueuer.queries import Queries

        async def run() -> None:
            conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
            q = Queries.from_psycopg_connection(conn)
            for base in range(0, jobs, chunk):
                k = min(chunk, jobs - base)
                await q.enqueue([queue] * k, [json.dumps({"n": base + i}).encode() for i in range(k)], [0] * k)
            await conn.close()

        asyncio.run(run())
    else:
        from procrastinate import App, PsycopgConnector
        from procrastinate import jobs as pjobs

        async def run() -> None:
            app = App(connector=PsycopgConnector(conninfo=conninfo, min_size=1, max_size=2))
            async with app.open_async():
                for base in range(0, jobs, chunk):
                    await app.job_manager.batch_defer_jobs_async([
                        pjobs.Job(queue=queue, lock=f"g{i % groups}", queueing_lock=None, task_name="bench",
                                  task_kwargs={"n": i})
                        for i in range(base, min(base + chunk, jobs))])

        asyncio.run(run())


def run_consume(variant: str, conninfo: str, workers: int, jobs: int, groups: int, batch: int,
                server_cpu: Optional[Callable[[], float]] = None) -> Dict[str, float]:
    """``workers`` processes emptying a pre-filled queue: jobs/s, and the CPU
    per job (ms) of the worker processes (from the start signal to their last
    job) and, when ``server_cpu`` reads it, of the server (its backends' and
    background processes' from the start signal until the workers exited)."""
    system = variant.split("-")[0]
    size = _consume_batch(variant, batch)
    queue = f"c{uuid.uuid4().hex[:10]}"
    _vacuum(conninfo)
    fill(system, conninfo, queue, jobs, groups)
    _vacuum(conninfo)
    ctx = mp.get_context("spawn")
    start = ctx.Event()
    out = ctx.Queue()
    consumer = CONSUMERS.get(variant, CONSUMERS[system])
    extra: Tuple[Any, ...] = ()
    if consumer is _lq_consume_worker:
        extra = (ctx.Array("q", workers, lock=False), jobs)
    procs = [ctx.Process(target=consumer, args=(conninfo, queue, w, size, start, out) + extra)
             for w in range(workers)]
    for p in procs:
        p.start()
    for _ in procs:
        assert _get(out, procs, 300) == "ready"
    server_before = server_cpu() if server_cpu is not None else 0.0
    began = time.time()
    start.set()
    done = [_get(out, procs, 1800) for _ in procs]
    for p in procs:
        p.join(60)
    time.sleep(0.2)  # their backends have exited (and been counted)
    server_after = server_cpu() if server_cpu is not None else 0.0
    total = sum(n for n, _, _ in done)
    if total != jobs:
        raise RuntimeError(f"{variant}: {workers} workers did {total} of {jobs} jobs")
    result = {"jobs_per_s": total / (max(last for _, last, _ in done) - began),
              "client_cpu_ms": 1e3 * sum(cpu for _, _, cpu in done) / total}
    if server_cpu is not None:
        result["server_cpu_ms"] = 1e3 * (server_after - server_before) / total
    return result


def server_cpu_reader(data_dir: str) -> Optional[Callable[[], float]]:
    """A reader of a local server's CPU seconds so far (the postmaster, its
    exited children and its live ones, from /proc), or None where /proc
    cannot tell (not Linux, or not allowed)."""
    import os

    try:
        with open(os.path.join(data_dir, "postmaster.pid")) as f:
            pid = int(f.readline())
        tick = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return None

    def stat(p: int) -> List[str]:
        with open(f"/proc/{p}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()

    def read() -> float:
        fields = stat(pid)  # fields[11:15]: utime stime cutime cstime
        total = sum(int(x) for x in fields[11:15])
        for name in os.listdir("/proc"):
            if name.isdigit() and int(name) != pid:
                try:
                    child = stat(int(name))
                except OSError:
                    continue
                if int(child[1]) == pid:  # ppid
                    total += int(child[11]) + int(child[12])
        return total / tick

    try:
        read()
    except OSError:
        return None
    return read


# ---------------------------------------------------------------- set-up per system


def _install(conninfo: str) -> None:
    import psycopg
    from leasequeue import PostgresTransport

    PostgresTransport.install(conninfo)
    try:
        from procrastinate import App, PsycopgConnector

        app = App(connector=PsycopgConnector(conninfo=conninfo))
        with app.open():
            with psycopg.connect(conninfo, autocommit=True) as conn:
                present = _value(conn, "SELECT to_regclass('procrastinate_jobs')")
            if present is None:
                app.schema_manager.apply_schema()
    except ImportError as exc:
        SYSTEMS.pop("procrastinate", None)
        MISSING["procrastinate"] = f"not installed ({exc}): pip install 'leasequeue[bench]'"
    try:
        from pgqueuer.queries import Queries

        async def pgq() -> None:
            conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
            q = Queries.from_psycopg_connection(conn)
            if not await q.schema_is_installed():
                await q.install()
            await conn.close()

        asyncio.run(pgq())
    except ImportError as exc:
        SYSTEMS.pop("pgqueuer", None)
        MISSING["pgqueuer"] = f"not installed ({exc}): pip install 'leasequeue[bench]'"


def _value(conn: Any, sql: str) -> Any:
    """The one value a statement returns."""
    row = conn.execute(sql).fetchone()
    assert row is not None, sql
    return row[0]


def _vacuum(conninfo: str) -> None:
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")


def run_workers(system: str, conninfo: str, workers: int, seconds: float, batch: int = 1) -> float:
    """Jobs per second of ``workers`` processes running ``system``'s cycle."""
    ctx = mp.get_context("spawn")
    start = ctx.Event()
    stop_at = ctx.Value("d", 0.0)
    out = ctx.Queue()
    queue = f"b{uuid.uuid4().hex[:10]}"
    procs = [ctx.Process(target=SYSTEMS[system], args=(conninfo, queue, w, batch, start, stop_at, out))
             for w in range(workers)]
    for p in procs:
        p.start()
    for _ in procs:  # every process imported, connected and ready
        assert out.get(timeout=300) == "ready"
    stop_at.value = time.time() + 0.2 + seconds
    time.sleep(0.2)
    start.set()
    done = [out.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join(60)
    return sum(done) / seconds


# ---------------------------------------------------------------- latency


def claim_latency(conninfo: str, queued: int, samples: int = 300) -> Dict[str, float]:
    """claim + ack latency (ms) with ``queued`` messages in queued/10 groups."""
    import pickle

    import psycopg
    from leasequeue import PostgresTransport

    t = _open(conninfo, f"lat{uuid.uuid4().hex[:8]}")
    groups = max(queued // 10, 1)
    payload = pickle.dumps({"n": 0}, protocol=pickle.HIGHEST_PROTOCOL)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO leasequeue.groups (queue, group_id, priority, rr_key) "
            "SELECT %s, 'g' || i, 0, i - 4611686018427387904 FROM generate_series(1, %s) i", (t._queue, groups))
        conn.execute(
            "INSERT INTO leasequeue.messages (queue, group_id, seq, payload) "
            "SELECT %s, 'g' || (i %% %s + 1), i, %s FROM generate_series(1, %s) i",
            (t._queue, groups, payload, queued))
        conn.execute(f"SELECT setval({t._seq_oid}::regclass, %s)", (queued,))
        conn.execute("VACUUM ANALYZE leasequeue.groups")
        conn.execute("VACUUM ANALYZE leasequeue.messages")
    claims, acks = [], []
    for _ in range(samples):
        a = time.perf_counter()
        lease = t.claim("w", 30)
        b = time.perf_counter()
        t.ack(lease)
        c = time.perf_counter()
        claims.append((b - a) * 1e3)
        acks.append((c - b) * 1e3)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("DELETE FROM leasequeue.messages WHERE queue = %s", (t._queue,))
        conn.execute("DELETE FROM leasequeue.groups WHERE queue = %s", (t._queue,))
    t.close()
    return {"claim_p50": _pct(claims, 50), "claim_p99": _pct(claims, 99),
            "ack_p50": _pct(acks, 50), "ack_p99": _pct(acks, 99)}


def _waiter(conninfo: str, queue: str, count: int, ready: Any, out: Any) -> None:
    from leasequeue import PostgresTransport

    t = _open(conninfo, queue)
    lat = []
    ready.set()
    for _ in range(count):
        lease = t.claim("waiter", 30, timeout=30)
        got = time.time()
        if lease is None:
            break
        lat.append((got - lease.event) * 1e3)
        t.ack(lease)
    out.put(lat)
    t.close()


def wake_latency(conninfo: str, count: int = 200) -> Dict[str, float]:
    """publish -> claim latency (ms) to a claim waiting in another process."""
    import random

    from leasequeue import PostgresTransport

    queue = f"wake{uuid.uuid4().hex[:8]}"
    ctx = mp.get_context("spawn")
    ready, out = ctx.Event(), ctx.Queue()
    p = ctx.Process(target=_waiter, args=(conninfo, queue, count, ready, out))
    p.start()
    ready.wait(60)
    t = _open(conninfo, queue)
    time.sleep(1.0)
    rng = random.Random(7)
    for i in range(count):
        time.sleep(rng.uniform(0.005, 0.02))
        t.publish(f"g{i}", time.time())
    lat = out.get(timeout=120)
    p.join(30)
    t.close()
    return {"p50": _pct(lat, 50), "p99": _pct(lat, 99), "n": float(len(lat))}


def _load() -> Optional[List[float]]:
    """The machine's load averages (1, 5, 15 min), where the OS tells."""
    import os

    try:
        return list(os.getloadavg())
    except (AttributeError, OSError):
        return None


def _pct(values: List[float], pct: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(pct / 100 * (len(ordered) - 1))))]


def consume_all(conninfo: str, workers: Sequence[int], jobs: int, slow_jobs: int, groups: int, batch: int,
                repeats: int, server_cpu: Optional[Callable[[], float]] = None,
                variants: Sequence[str] = CONSUME_VARIANTS) -> Dict[str, Any]:
    """The consume-only table: every variant at each worker count, ``repeats``
    rounds interleaved (variant by variant within a round), medians kept.
    The slow variants (procrastinate, PGQueuer with batch_size=1) empty a
    queue of ``slow_jobs`` jobs (a rate is a rate; the run stays short)."""
    variants = [v for v in variants if v.split("-")[0] in SYSTEMS]
    runs: Dict[str, Dict[int, List[Dict[str, float]]]] = {v: {w: [] for w in workers} for v in variants}
    for w in workers:
        for rep in range(repeats):
            for v in variants:
                n = slow_jobs if v in SLOW_VARIANTS else jobs
                got = run_consume(v, conninfo, w, n, groups, batch, server_cpu)
                got["jobs"] = float(n)
                runs[v][w].append(got)
                cpu = f", CPU/job client {got['client_cpu_ms']:.2f} ms" + (
                    f" server {got['server_cpu_ms']:.2f} ms" if "server_cpu_ms" in got else "")
                print(f"  consume {v:17} {w} workers, round {rep + 1}: {got['jobs_per_s']:8.0f} jobs/s{cpu}",
                      flush=True)
    medians: Dict[str, Dict[int, Dict[str, float]]] = {}
    for v, by_w in runs.items():
        for w, rounds in by_w.items():
            medians.setdefault(v, {})[w] = {k: _median([r[k] for r in rounds]) for k in rounds[0]}
    return {"jobs": jobs, "slow_jobs": slow_jobs, "groups": groups, "batch": batch, "repeats": repeats,
            "rounds": runs, "median": medians}


def _median(values: List[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


# ---------------------------------------------------------------- main


def run_all(conninfo: str, seconds: float, counts: Sequence[int], sync: str) -> Dict[str, Any]:
    import psycopg

    results: Dict[str, Any] = {"sync": sync, "seconds": seconds, "cycle": {}, "batch": {}}
    conninfo = with_sync(conninfo, sync)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        assert _value(conn, "SHOW synchronous_commit") == sync
        results["server"] = _value(conn, "SELECT version()")
    for workers in counts:
        for system in SYSTEMS:
            _vacuum(conninfo)
            rate = run_workers(system, conninfo, workers, seconds)
            results["cycle"].setdefault(system, {})[workers] = rate
            print(f"  [sync={sync}] cycle {system:13} {workers} workers: {rate:9.0f} jobs/s", flush=True)
    for workers in sorted({counts[0], counts[-1]}):
        for system in ("leasequeue", "pgqueuer"):
            if system not in SYSTEMS:
                continue
            _vacuum(conninfo)
            rate = run_workers(system, conninfo, workers, seconds, batch=BATCH)
            results["batch"].setdefault(system, {})[workers] = rate
            print(f"  [sync={sync}] batch k={BATCH} {system:10} {workers} workers: {rate:9.0f} jobs/s", flush=True)
    return results


def with_sync(conninfo: str, sync: str) -> str:
    """The conninfo with synchronous_commit set for its sessions (every
    system's connections: the setting is per session)."""
    return f"{conninfo} options='-c synchronous_commit={sync}'"


def consume_markdown(res: Dict[str, Any]) -> List[str]:
    """The consume-only section: medians, ratios, CPU per job."""
    med = res["median"]
    k = res["batch"]
    variants = list(med)
    workers = sorted({int(w) for v in variants for w in med[v]})

    def get(v: str, w: int, key: str = "jobs_per_s") -> float:
        row = med.get(v, {}).get(w) or med.get(v, {}).get(str(w)) or {}
        return float(row.get(key, float("nan")))

    lines = [f"## Consume only: {res['jobs']:,} jobs queued up front over {res['groups']} groups, W worker processes "
             f"(k = {k}; medians of {res['repeats']} interleaved rounds; "
             f"{', '.join(SLOW_VARIANTS)}: {res['slow_jobs']:,} jobs)", "",
             "jobs/s:", "",
             "| variant | " + " | ".join(f"W={w}" for w in workers) + " |",
             "|---|" + "---:|" * len(workers)]
    for v in variants:
        lines.append(f"| {CONSUME_LABELS.get(v, v).replace('(k)', f'({k})').replace('=k', f'={k}')} | "
                     + " | ".join(f"{get(v, w):,.0f}" for w in workers) + " |")
    lines += ["", "Ratios (medians of the same run):", "",
              "| ratio | " + " | ".join(f"W={w}" for w in workers) + " |", "|---|" + "---:|" * len(workers)]
    pairs = [("leasequeue", "pgqueuer", "single calls / PGQueuer defaults"),
             ("leasequeue-aac", "pgqueuer", "ack_and_claim / PGQueuer defaults"),
             ("leasequeue-aac", "leasequeue", "ack_and_claim / claim + ack"),
             ("leasequeue-worker", "pgqueuer", "Worker, 1 slot / PGQueuer defaults"),
             ("leasequeue-worker4", "pgqueuer", "Worker, 4 slots / PGQueuer defaults"),
             ("leasequeue-worker4", "pgqueuer-batch", f"Worker, 4 slots / PGQueuer batch_size={k}"),
             ("leasequeue", "pgqueuer-1", "single calls / PGQueuer batch_size=1"),
             ("leasequeue-batch", "pgqueuer", f"claim_many({k}) / PGQueuer defaults"),
             ("leasequeue-batch", "pgqueuer-batch", f"claim_many({k}) / PGQueuer batch_size={k}")]
    for a, b, label in pairs:
        if a in med and b in med:
            lines.append(f"| {label} | " + " | ".join(f"{get(a, w) / get(b, w):.2f}x" for w in workers) + " |")
    for v, label in (("leasequeue", "single calls"), ("leasequeue-aac", "ack_and_claim"),
                     ("leasequeue-worker", "Worker, 1 slot")):
        if v in med and workers[0] == 1:
            lines.append(f"| {label}, W / 1 worker | " + " | ".join(
                f"{get(v, w) / get(v, 1):.2f}x" for w in workers) + " |")
    lines += ["", "CPU per job, ms (client: the worker processes, from the start signal to their last job; "
              "server: every server process, from the start signal until the workers exited):", "",
              "| variant | " + " | ".join(f"W={w} client / server" for w in workers) + " |",
              "|---|" + "---:|" * len(workers)]
    for v in variants:
        lines.append(f"| {v} | " + " | ".join(
            f"{get(v, w, 'client_cpu_ms'):.2f} / {get(v, w, 'server_cpu_ms'):.2f}" for w in workers) + " |")
    lines.append("")
    return lines


def to_markdown(all_results: List[Dict[str, Any]], extra: Dict[str, Any]) -> str:
    lines = ["# PostgresTransport benchmarks", ""]
    if all_results:
        lines += [f"Server: {all_results[0]['server']}", ""]
    lines += ["What each peer does not guarantee: PGQueuer has no groups, so no per-group exclusivity and no "
              "FIFO within a group (any worker takes any job); procrastinate gives exclusivity per `lock` "
              "(one job of a lock runs at a time) but no round robin between locks.", ""]
    if "consume" in extra:
        lines += consume_markdown(extra["consume"])
    for res in all_results:
        systems = list(res["cycle"])
        lines += [f"## publish -> claim -> ack, jobs/s (synchronous_commit={res['sync']}, {res['seconds']} s each)", "",
                  "| workers | " + " | ".join(systems) + " | leasequeue / best other |",
                  "|---:|" + "---:|" * (len(systems) + 1)]
        for workers in sorted({w for s in systems for w in res["cycle"][s]}):
            row = [res["cycle"][s].get(workers, float("nan")) for s in systems]
            others = [v for s, v in zip(systems, row) if s != "leasequeue"]
            ratio = f"{row[0] / max(others):.2f}x" if others and max(others) > 0 else "n/a"
            lines.append(f"| {workers} | " + " | ".join(f"{v:,.0f}" for v in row) + f" | {ratio} |")
        lines += ["", f"Batches of k={BATCH} (jobs/s):", "", "| workers | " + " | ".join(res["batch"]) + " |",
                  "|---:|" + "---:|" * len(res["batch"])]
        for workers in sorted({w for s in res["batch"] for w in res["batch"][s]}):
            lines.append(f"| {workers} | " + " | ".join(
                f"{res['batch'][s].get(workers, float('nan')):,.0f}" for s in res["batch"]) + " |")
        lines.append("")
    if "latency" in extra:
        lines += ["## claim / ack latency with N messages queued (N/10 groups), ms (synchronous_commit=off)", "",
                  "| N | claim p50 | claim p99 | ack p50 | ack p99 |", "|---:|---:|---:|---:|---:|"]
        for n, lat in extra["latency"].items():
            lines.append(f"| {int(n):,} | {lat['claim_p50']:.2f} | {lat['claim_p99']:.2f} | "
                         f"{lat['ack_p50']:.2f} | {lat['ack_p99']:.2f} |")
        lines.append("")
    if "wake" in extra:
        w = extra["wake"]
        lines += ["## publish -> claim wake latency across processes (LISTEN/NOTIFY, synchronous_commit=off)", "",
                  f"p50 {w['p50']:.2f} ms, p99 {w['p99']:.2f} ms over {int(w['n'])} messages", ""]
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``leasequeue bench --postgres``: run, print the report, save it if asked."""
    parser = argparse.ArgumentParser(prog="leasequeue bench --postgres", description=__doc__.split("\n\n")[0])
    parser.add_argument("--conninfo", help="a server to use (default: start a throwaway one)")
    parser.add_argument("--seconds", type=float, help="measuring time per point (default 5; --smoke 0.5)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="1 and 8 workers, 10k/100k latency only")
    mode.add_argument("--smoke", action="store_true",
                      help="a few seconds: 1 worker, sync off, 1k latency; checks that everything runs")
    parser.add_argument("--sync", choices=["on", "off", "both"],
                        help="synchronous_commit of the server (default: both, one after the other; --smoke: off)")
    parser.add_argument("--workload", choices=["all", "cycle", "consume"], default="all",
                        help="cycle: publish -> claim -> ack (+ latency, wake); consume: the pre-filled queue; "
                             "all: both (default)")
    parser.add_argument("--consume-jobs", type=int, help="consume only: jobs queued up front (default 20000)")
    parser.add_argument("--slow-jobs", type=int,
                        help="consume only: jobs for procrastinate and PGQueuer batch_size=1 (default 2000)")
    parser.add_argument("--groups", type=int, default=200, help="consume only: groups (default 200)")
    parser.add_argument("--consume-workers", help="consume only: worker counts, e.g. 1,4,8 (the default)")
    parser.add_argument("--repeats", type=int, help="consume only: interleaved rounds, medians kept (default 3)")
    parser.add_argument("--batch", type=int, default=32, help="consume only: k for the batch variants (default 32)")
    parser.add_argument("--variants", help="consume only: the variants to run, comma-separated (default: all of "
                                           + ", ".join(CONSUME_VARIANTS) + ")")
    parser.add_argument("--pg-data", help="the data directory of a local --conninfo server: measure its CPU")
    parser.add_argument("--json", help="write the results as JSON")
    parser.add_argument("--markdown", help="write the results as a Markdown report")
    args = parser.parse_args(argv)
    if args.smoke:
        counts: Sequence[int] = (1,)
        sizes: Sequence[int] = (1_000,)
        wakes, seconds, syncs = 20, args.seconds or 0.5, [args.sync or "off"]
        consume_workers: Sequence[int] = (1,)
        jobs, slow_jobs, repeats = args.consume_jobs or 200, args.slow_jobs or 40, args.repeats or 1
    else:
        counts = (1, 8) if args.quick else WORKER_COUNTS
        sizes = (10_000, 100_000) if args.quick else (10_000, 100_000, 1_000_000)
        wakes, seconds, syncs = 200, args.seconds or 5.0, [args.sync or "both"]
        consume_workers = (1, 4, 8)
        jobs, slow_jobs, repeats = args.consume_jobs or 20_000, args.slow_jobs or 2_000, args.repeats or 3
    variants = CONSUME_VARIANTS
    if args.variants:
        variants = tuple(v.strip() for v in args.variants.split(","))
        unknown = sorted(set(variants) - set(CONSUME_VARIANTS))
        if unknown:
            parser.error(f"unknown --variants {', '.join(unknown)}: choose from {', '.join(CONSUME_VARIANTS)}")
    if args.consume_workers:
        consume_workers = tuple(int(x) for x in args.consume_workers.split(","))
    if min(jobs, slow_jobs, args.groups, args.batch, repeats, *consume_workers) < 1:
        parser.error("--consume-jobs, --slow-jobs, --groups, --batch, --repeats and worker counts must be >= 1")
    if syncs == ["both"]:
        syncs = ["on", "off"]
    server = None
    conninfo = args.conninfo
    if conninfo is None:
        from leasequeue.testing._postgres_server import ThrowawayServer

        server = ThrowawayServer()
        conninfo = server.start()
    data_dir = server.data if server is not None else args.pg_data
    server_cpu = server_cpu_reader(data_dir) if data_dir else None
    try:
        _install(conninfo)
        print(f"systems: {', '.join(SYSTEMS)}; server: {conninfo}", flush=True)
        for name, why in MISSING.items():
            print(f"note: {name} not measured: {why}", flush=True)
        results = []
        extra: Dict[str, Any] = {}
        if args.workload in ("all", "consume"):
            # The server's default synchronous_commit (on unless --sync says
            # otherwise): what users run.
            sync = syncs[0] if args.sync in ("on", "off") else "on"
            extra["consume"] = consume_all(with_sync(conninfo, sync), consume_workers, jobs, slow_jobs,
                                           args.groups, args.batch, repeats, server_cpu, variants)
            extra["consume"]["sync"] = sync
        if args.workload in ("all", "cycle"):
            for sync in syncs:
                results.append(run_all(conninfo, seconds, counts, sync))
            # Latencies with synchronous_commit=off: with it on, every call waits
            # for the WAL flush (~4 ms on this disk), which hides everything else.
            fast = with_sync(conninfo, "off")
            extra["wake"] = wake_latency(fast, wakes)
            print(f"  wake latency: p50 {extra['wake']['p50']:.2f} ms, p99 {extra['wake']['p99']:.2f} ms",
                  flush=True)
            extra["latency"] = {}
            for n in sizes:
                extra["latency"][n] = claim_latency(fast, n)
                lat = extra["latency"][n]
                print(f"  latency at {n:>9,} queued: claim p50 {lat['claim_p50']:.2f} ms "
                      f"p99 {lat['claim_p99']:.2f} ms", flush=True)
        report = to_markdown(results, extra)
        print(report)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"runs": results, "missing": dict(MISSING), "load": _load(), **extra}, f, indent=2,
                      default=str)
        if args.markdown:
            with open(args.markdown, "w") as f:
                f.write(report + "\n")
    finally:
        if server is not None:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
