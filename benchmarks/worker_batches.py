"""What claiming in batches buys the worker: Worker(batch=16) against
batch=1 on SQLite and PostgreSQL (a throwaway server), 8 threads, a 1 ms
handler, best of 3 interleaved rounds.  Run: python benchmarks/worker_batches.py
(results: benchmarks/results/worker.md, notes)."""

import sys, time, threading, tempfile, os
from leasequeue import Worker, SQLiteTransport, PostgresTransport
from leasequeue.bench.worker import Done, _stream
from leasequeue._postgres_server import ThrowawayServer

def run(make, n, conc, batch):
    t = make(); t.publish_many(_stream(n, 100)) if n <= 500 else [t.publish_many(_stream(n, 100)[i:i+500]) for i in range(0, n, 500)]
    d = Done(n)
    w = Worker(t, lambda job: (time.sleep(0.001), d.hit()), concurrency=conc, batch=batch, signals=False)
    th = threading.Thread(target=w.run, daemon=True); th.start(); d.event.wait(); w.stop(); th.join(); t.close()
    return n / d.elapsed

if __name__ == "__main__":
    tmp = tempfile.mkdtemp(); k = [0]
    def sq():
        k[0] += 1; return SQLiteTransport(os.path.join(tmp, f"{k[0]}.db"))
    s = ThrowawayServer(); c = s.start(); PostgresTransport.install(c)
    try:
        pg = lambda: PostgresTransport(c, queue=f"q{time.time_ns()}")
        for name, make, n in (("sqlite", sq, 1000), ("postgres", pg, 600)):
            res = {1: [], 16: []}
            for _ in range(3):
                for b in (1, 16):
                    res[b].append(run(make, n, 8, b))
            print(name, "8 threads, 1 ms handler: batch=1", round(max(res[1])), "batch=16", round(max(res[16])), "ratio", round(max(res[16]) / max(res[1]), 2), flush=True)
    finally:
        s.stop()
