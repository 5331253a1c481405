"""What claiming in batches buys the worker: ``Worker(batch=16)`` against
``batch=1`` on SQLite and PostgreSQL (a throwaway server), 8 threads, a 1 ms
handler, best of 3 interleaved rounds.

Run: ``python benchmarks/worker_batches.py`` (results: the notes of
``benchmarks/results/worker.md``).
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from typing import Any, Callable, Dict, List

from leasequeue import PostgresTransport, SQLiteTransport, Worker
from leasequeue.bench.worker import Done, ThrowawayServer, _stream


def run(make: Callable[[], Any], n: int, concurrency: int, batch: int) -> float:
    """Jobs per second (steady state) of one worker over ``n`` pre-published jobs."""
    t = make()
    items = _stream(n, 100)
    for i in range(0, n, 500):
        t.publish_many(items[i:i + 500])
    done = Done(n)

    def handler(job: Any) -> None:
        time.sleep(0.001)
        done.hit()

    w = Worker(t, handler, concurrency=concurrency, batch=batch, signals=False)
    th = threading.Thread(target=w.run, daemon=True)
    th.start()
    done.event.wait()
    w.stop()
    th.join()
    t.close()
    return n / done.elapsed


def main() -> None:
    tmp = tempfile.mkdtemp()
    made = [0]

    def sqlite() -> Any:
        made[0] += 1
        return SQLiteTransport(os.path.join(tmp, f"{made[0]}.db"))

    server = ThrowawayServer()
    conninfo = server.start()
    PostgresTransport.install(conninfo)

    def postgres() -> Any:
        name = f"q{time.time_ns()}"
        PostgresTransport.create_queue(conninfo, name)  # only made queues open
        return PostgresTransport(conninfo, queue=name)

    try:
        for name, make, n in (("sqlite", sqlite, 1000), ("postgres", postgres, 600)):
            rates: Dict[int, List[float]] = {1: [], 16: []}
            for _ in range(3):
                for batch in (1, 16):
                    rates[batch].append(run(make, n, 8, batch))
            one, many = max(rates[1]), max(rates[16])
            print(f"{name}: 8 threads, 1 ms handler: batch=1 {one:,.0f} jobs/s, batch=16 {many:,.0f} jobs/s, "
                  f"ratio {many / one:.2f}", flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
