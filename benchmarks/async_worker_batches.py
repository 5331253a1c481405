"""What batching buys ``arun()`` on PostgreSQL (issue #32): an ``async def``
no-op handler, one worker process, ``--jobs`` jobs (default 8000) over
``--groups`` groups (200) filled up front, ``concurrency`` 1 and 4, every
other option at its default; jobs/s from the start of ``arun()`` until the
last job's ack is counted.  One throwaway server (``fsync=on``), the
variants interleaved in ``--rounds`` rounds, each run in its own process on
a fresh queue; the best round of each is reported, and each variant's ratio
to the first.

Variants: ``this`` (this checkout's ``src``), ``this, prefetch=0 batch=1``
(the one-job-at-a-time path, ``ack_and_claim``, still in this checkout) and,
with ``--before SRC`` (the ``src`` folder of an earlier checkout, e.g. from
``git archive``), ``before`` (that code, defaults).

Run: ``python benchmarks/async_worker_batches.py [--before /tmp/old/src]
[--jobs 8000] [--groups 200] [--rounds 2]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from typing import Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")


def child(conninfo: str, queue: str, concurrency: int, jobs: int, options: Dict[str, int]) -> None:
    """One measurement (in its own process): prints jobs/s as JSON."""
    from leasequeue import PostgresTransport, Worker

    t = PostgresTransport(conninfo, queue=queue)

    async def handler(job: object) -> None:
        pass

    w = Worker(t, handler, concurrency=concurrency, signals=False, **options)  # type: ignore[arg-type]

    async def main() -> float:
        began = time.perf_counter()
        task = asyncio.ensure_future(w.arun())
        while w.counts["succeeded"] < jobs:
            await asyncio.sleep(0.002)
        elapsed = time.perf_counter() - began
        w.stop()
        await task
        return elapsed

    elapsed = asyncio.run(main())
    t.close()
    print(json.dumps({"jobs_per_s": jobs / elapsed}))


def measure(conninfo: str, src: str, concurrency: int, jobs: int, groups: int, options: Dict[str, int]) -> float:
    from leasequeue import PostgresTransport

    queue = f"ab_{uuid.uuid4().hex[:10]}"
    PostgresTransport.install(conninfo, queues=[queue])
    with PostgresTransport(conninfo, queue=queue) as t:
        for base in range(0, jobs, 1000):
            t.publish_many([(f"g{i % groups}", {"n": i}) for i in range(base, min(base + 1000, jobs))])
    env = dict(os.environ, PYTHONPATH=src)
    out = subprocess.run([sys.executable, __file__, "--child", conninfo, queue, str(concurrency), str(jobs),
                          json.dumps(options)], env=env, check=True, capture_output=True, text=True, timeout=600)
    with PostgresTransport(conninfo, queue=queue) as t:
        assert len(t) == 0, "the worker left jobs behind"
    return float(json.loads(out.stdout.strip().splitlines()[-1])["jobs_per_s"])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        conninfo, queue, concurrency, jobs, options = sys.argv[2:7]
        child(conninfo, queue, int(concurrency), int(jobs), json.loads(options))
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", metavar="SRC", help="the src folder of an earlier checkout")
    p.add_argument("--jobs", type=int, default=8000)
    p.add_argument("--groups", type=int, default=200)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    sys.path.insert(0, SRC)
    from leasequeue.testing._postgres_server import ThrowawayServer

    variants: List[Tuple[str, str, Dict[str, int]]] = []
    if args.before:
        variants.append(("before", os.path.abspath(args.before), {}))
    variants.append(("this, prefetch=0 batch=1", SRC, {"prefetch": 0, "batch": 1}))
    variants.append(("this", SRC, {}))
    best: Dict[Tuple[str, int], float] = {}
    server = ThrowawayServer()
    conninfo = server.start()
    try:
        for r in range(args.rounds):
            for concurrency in (1, 4):
                for name, src, options in variants:
                    rate = measure(conninfo, src, concurrency, args.jobs, args.groups, options)
                    print(f"round {r + 1}, concurrency {concurrency}, {name}: {rate:,.0f} jobs/s", flush=True)
                    best[(name, concurrency)] = max(best.get((name, concurrency), 0.0), rate)
    finally:
        server.stop()
    print(f"\n{args.jobs} jobs over {args.groups} groups, async no-op handler, 1 process, best of {args.rounds}:")
    for concurrency in (1, 4):
        first: Optional[float] = None
        for name, _, _ in variants:
            rate = best[(name, concurrency)]
            first = rate if first is None else first
            print(f"  concurrency {concurrency}, {name:26s} {rate:9,.0f} jobs/s  x{rate / first:.2f}")


if __name__ == "__main__":
    main()
