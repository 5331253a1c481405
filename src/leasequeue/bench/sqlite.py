"""``SQLiteTransport`` benchmarks, side by side in one run.

    python -m leasequeue.bench.sqlite                # quick: about a minute
    python -m leasequeue.bench.sqlite --full         # + 1M queued, 4 worker processes; minutes
    python -m leasequeue.bench.sqlite --json out.json

What it measures (each on a fresh file in a temporary directory, WAL mode,
``synchronous=NORMAL`` for every library alike):

* **cycle**: publish + claim + ack per message with N messages held, against
  the SQLite queues people use for the same job -- persist-queue's
  ``SQLiteAckQueue`` (put, get, ack), litequeue (put, pop, done) and huey's
  ``SqliteStorage`` (enqueue, dequeue: it has no ack) -- and leasequeue with
  batches of 64 (``publish_many`` + ``claim_many`` + ``ack_many``).  The
  implementations take turns, repeats interleaved; medians.  The libraries
  that are not installed are skipped (``pip install ".[bench-sqlite]"``).
* **durability**: the leasequeue cycle with ``durable=True`` (FULL).
* **workers**: messages/s with 1, 2 and 4 worker processes claiming and
  acking on one file.
* **claim cost vs N**: claim (and ack) time with 10k, 100k (and 1M) queued.
* **bytes on disk per message**, after a checkpoint.
* **wake latency**: a claim waiting in another process, from the moment
  ``publish`` returns to the moment the claim returns, p50/p99.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from .._backends.sqlite.transport import SQLiteTransport

EVENT = {"step": "charge", "order": 17, "amount": 12.5}


# ---------------------------------------------------------------- the contestants
# Each factory takes a directory and returns (publish(i), take_one() -> done, close, path).


class Contestant:
    """One queue on one file: ``put(i)``, ``cycle(i)`` (put + take + done), ``fill(n, groups)``."""

    name = ""
    per_call = 1  # messages moved by one cycle() call

    def fill(self, n: int, groups: int) -> None:
        for i in range(n):
            self.put(i, groups)

    def put(self, i: int, groups: int) -> None:
        raise NotImplementedError

    def cycle(self, i: int, groups: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def files(self) -> List[str]:
        return []


class LeaseQueue(Contestant):
    name = "leasequeue"

    def __init__(self, directory: str, durable: bool = False) -> None:
        self.path = os.path.join(directory, "leasequeue.db")
        self.t = SQLiteTransport(self.path, durable=durable)
        if durable:
            self.name = "leasequeue durable=True"

    def fill(self, n: int, groups: int) -> None:
        for start in range(0, n, 5000):
            self.t.publish_many([(f"g{i % groups}", EVENT) for i in range(start, min(n, start + 5000))])

    def put(self, i: int, groups: int) -> None:
        self.t.publish(f"g{i % groups}", EVENT)

    def cycle(self, i: int, groups: int) -> None:
        t = self.t
        t.publish(f"g{i % groups}", EVENT)
        t.ack(t.claim("w", 30.0))

    def close(self) -> None:
        self.t.close()

    def files(self) -> List[str]:
        return [self.path]


class LeaseQueueBatch(LeaseQueue):
    name = "leasequeue k=64"
    per_call = 64

    def cycle(self, i: int, groups: int) -> None:
        t = self.t
        t.publish_many([(f"g{(i * 64 + j) % groups}", EVENT) for j in range(64)])
        t.ack_many(t.claim_many("w", 30.0, 64))


class PersistQueue(Contestant):
    name = "persist-queue SQLiteAckQueue"

    def __init__(self, directory: str) -> None:
        import persistqueue

        self.path = os.path.join(directory, "persistqueue")
        self.q = persistqueue.SQLiteAckQueue(self.path, multithreading=True, auto_commit=True)
        connections: List[Any] = [self.q._conn, self.q._putter, self.q._getter]
        for conn in {id(c): c for c in connections if c is not None}.values():
            conn.execute("PRAGMA synchronous=NORMAL")  # its default is FULL

    def put(self, i: int, groups: int) -> None:
        self.q.put(EVENT)

    def cycle(self, i: int, groups: int) -> None:
        self.q.put(EVENT)
        item = self.q.get(block=False)
        self.q.ack(item)

    def close(self) -> None:
        self.q.close()

    def files(self) -> List[str]:
        return [os.path.join(self.path, name) for name in os.listdir(self.path)]


class LiteQueue(Contestant):
    name = "litequeue"

    def __init__(self, directory: str) -> None:
        import litequeue

        self.path = os.path.join(directory, "litequeue.db")
        self.q = litequeue.LiteQueue(self.path)  # sets WAL and synchronous=NORMAL itself

    def put(self, i: int, groups: int) -> None:
        self.q.put(pickle.dumps(EVENT).hex())  # it stores text

    def cycle(self, i: int, groups: int) -> None:
        self.q.put(pickle.dumps(EVENT).hex())
        message = self.q.pop()
        pickle.loads(bytes.fromhex(message.data))
        self.q.done(message.message_id)

    def close(self) -> None:
        self.q.conn.close()

    def files(self) -> List[str]:
        return [self.path]


class Huey(Contestant):
    name = "huey SqliteStorage"

    def __init__(self, directory: str) -> None:
        from huey.storage import SqliteStorage

        self.path = os.path.join(directory, "huey.db")
        self.s = SqliteStorage(name="bench", filename=self.path)  # journal_mode=wal by default
        self.s.conn.execute("PRAGMA synchronous=NORMAL")  # its default (fsync=None) is SQLite's FULL

    def put(self, i: int, groups: int) -> None:
        self.s.enqueue(pickle.dumps(EVENT, pickle.HIGHEST_PROTOCOL))

    def cycle(self, i: int, groups: int) -> None:
        self.s.enqueue(pickle.dumps(EVENT, pickle.HIGHEST_PROTOCOL))
        pickle.loads(self.s.dequeue())

    def close(self) -> None:
        self.s.close()

    def files(self) -> List[str]:
        return [self.path]


COMPETITORS: Dict[str, Callable[[str], Contestant]] = {
    "persist-queue": PersistQueue,
    "litequeue": LiteQueue,
    "huey": Huey,
}


def available_competitors() -> Dict[str, Callable[[str], Contestant]]:
    out = {}
    for name, factory in COMPETITORS.items():
        module = {"persist-queue": "persistqueue", "litequeue": "litequeue", "huey": "huey"}[name]
        try:
            __import__(module)
        except ImportError:
            continue
        out[name] = factory
    return out


# ---------------------------------------------------------------- measurements


def _time_cycles(contestant: Contestant, start: int, calls: int, groups: int) -> float:
    cycle = contestant.cycle
    began = time.perf_counter()
    for i in range(start, start + calls):
        cycle(i, groups)
    return (time.perf_counter() - began) / (calls * contestant.per_call)


def bench_cycle(held: int, messages: int, repeats: int, durable: bool) -> Dict[str, Any]:
    """Seconds per message (publish + claim + ack) for every contestant, interleaved."""
    groups = max(1, held // 10)
    factories: Dict[str, Callable[[str], Contestant]] = {
        "leasequeue": LeaseQueue,
        "leasequeue k=64": LeaseQueueBatch,
        **available_competitors(),
    }
    if durable:
        factories["leasequeue durable=True"] = lambda d: LeaseQueue(d, durable=True)
    with tempfile.TemporaryDirectory() as tmp:
        contestants = {}
        for name, factory in factories.items():
            directory = os.path.join(tmp, name.replace(" ", "_").replace("=", ""))
            os.mkdir(directory)
            contestants[name] = factory(directory)
            contestants[name].fill(held, groups)
            _time_cycles(contestants[name], 0, max(1, 200 // contestants[name].per_call), groups)  # warm up
        samples: Dict[str, List[float]] = {name: [] for name in contestants}
        for r in range(repeats):
            for name, contestant in contestants.items():
                calls = max(1, messages // contestant.per_call)
                samples[name].append(_time_cycles(contestant, (r + 1) * calls, calls, groups))
        for contestant in contestants.values():
            contestant.close()
    medians = {name: statistics.median(values) for name, values in samples.items()}
    return {"held": held, "groups": groups, "seconds_per_message": medians, "samples": samples}


def bench_claim_cost(sizes: Sequence[int], claims: int) -> List[Dict[str, Any]]:
    """Claim (then ack) cost with N messages queued in N/10 groups."""
    out = []
    for n in sizes:
        groups = max(1, n // 10)
        with tempfile.TemporaryDirectory() as tmp:
            lq = LeaseQueue(tmp)
            began = time.perf_counter()
            lq.fill(n, groups)
            fill_seconds = time.perf_counter() - began
            t = lq.t
            lq.cycle(0, groups)
            claim_times, ack_times, cycle_times = [], [], []
            for rep in range(3):
                leases = []
                began = time.perf_counter()
                for _ in range(claims):
                    leases.append(t.claim("w", 30.0))
                claim_times.append((time.perf_counter() - began) / claims)
                began = time.perf_counter()
                for lease in leases:
                    t.ack(lease)
                ack_times.append((time.perf_counter() - began) / claims)
                t.publish_many([(f"g{i % groups}", EVENT) for i in range(claims)])  # back to n
                cycle_times.append(_time_cycles(lq, rep * claims, claims, groups))
            lq.close()
            checkpoint(lq.path)
            size = sum(os.path.getsize(p) for p in (lq.path, lq.path + "-wal") if os.path.exists(p))
        out.append({
            "n": n, "groups": groups,
            "claim": statistics.median(claim_times), "ack": statistics.median(ack_times),
            "cycle": statistics.median(cycle_times),
            "bytes_per_message": size / n, "fill_seconds_per_message": fill_seconds / n,
        })
    return out


def checkpoint(path: str) -> None:
    """Fold the WAL into the database file, so its size is what the data takes."""
    import sqlite3

    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


def bytes_per_message(n: int) -> Dict[str, float]:
    """File size per queued message for every contestant, after a checkpoint."""
    out = {}
    factories = {"leasequeue": LeaseQueue, **available_competitors()}
    groups = max(1, n // 10)
    with tempfile.TemporaryDirectory() as tmp:
        for name, factory in factories.items():
            directory = os.path.join(tmp, name)
            os.mkdir(directory)
            contestant = factory(directory)
            contestant.fill(n, groups)
            contestant.close()
            for path in contestant.files():
                if not path.endswith(("-wal", "-shm")):
                    try:
                        checkpoint(path)
                    except Exception:  # not a database file
                        pass
            size = sum(os.path.getsize(p) for p in contestant.files() if os.path.exists(p))
            size += sum(os.path.getsize(p + "-wal") for p in contestant.files() if os.path.exists(p + "-wal"))
            out[name] = size / n
    return out


# ---------------------------------------------------------------- worker processes


def _worker(path: str, seconds: float, batch: int, ready: Any, go: Any, result: Any) -> None:
    t = SQLiteTransport(path, busy_timeout=60)
    ready.put(1)
    go.wait()
    done = 0
    began = time.time()
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        if batch > 1:
            leases = t.claim_many("w", 30.0, batch)
            if not leases:
                break
            t.ack_many(leases)
            done += len(leases)
        else:
            lease = t.claim("w", 30.0)
            if lease is None:
                break
            t.ack(lease)
            done += 1
    result.put((done, began, time.time()))
    t.close()


def bench_workers(processes: Sequence[int], seconds: float, batch: int = 1) -> Dict[int, float]:
    """Messages/s claimed and acked by P processes on one file (1k groups, prefilled),
    from the moment all have opened the file until the last one stops."""
    out = {}
    ctx = multiprocessing.get_context("spawn")
    for p in processes:
        with tempfile.TemporaryDirectory() as tmp:
            lq = LeaseQueue(tmp)
            path = lq.path
            lq.fill(int(5_000 * p * (20 if batch > 1 else 1) * seconds), 1000)
            lq.close()
            ready, result, go = ctx.Queue(), ctx.Queue(), ctx.Event()
            procs = [ctx.Process(target=_worker, args=(path, seconds, batch, ready, go, result)) for _ in range(p)]
            for proc in procs:
                proc.start()
            for _ in procs:
                ready.get(timeout=120)
            go.set()
            runs = [result.get(timeout=seconds + 120) for _ in procs]
            for proc in procs:
                proc.join()
            total = sum(done for done, _, _ in runs)
            out[p] = total / (max(end for _, _, end in runs) - min(start for _, start, _ in runs))
    return out


# ---------------------------------------------------------------- wake latency

_WAITER = r"""
import sys, time
from leasequeue import SQLiteTransport
t = SQLiteTransport(sys.argv[1])
print("ready", flush=True)
while True:
    lease = t.claim("far", 30, timeout=30)
    if lease is None or lease.event == "stop":
        break
    woke = time.time()
    t.ack(lease)
    print(repr(woke), flush=True)
t.close()
"""


def bench_wake_latency(samples: int) -> Dict[str, float]:
    """Publish in this process -> claim returns in another: seconds, p50/p99."""
    import random

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "q.db")
        t = SQLiteTransport(path)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(os.path.abspath(p) for p in sys.path if p))
        proc = subprocess.Popen([sys.executable, "-c", _WAITER, path], stdout=subprocess.PIPE, text=True, env=env)
        assert proc.stdout is not None
        proc.stdout.readline()
        rng = random.Random(7)
        latencies = []
        for i in range(samples):
            time.sleep(rng.uniform(0.005, 0.03))  # the waiter is asleep in its claim again
            t.publish(f"g{i}", i)
            sent = time.time()
            woke = float(proc.stdout.readline())
            latencies.append(woke - sent)
        t.publish("stop", "stop")
        proc.wait(30)
        t.close()
    latencies.sort()
    return {
        "p50": latencies[len(latencies) // 2],
        "p99": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        "max": latencies[-1],
        "samples": len(latencies),
    }


# ---------------------------------------------------------------- report


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.1f} µs"


def render(results: Dict[str, Any]) -> str:
    lines = ["# leasequeue SQLiteTransport benchmarks", ""]
    lines.append(f"Python {sys.version.split()[0]}, SQLite {results['sqlite_version']}, "
                 f"{os.cpu_count()} CPUs; WAL, synchronous=NORMAL for every library.")
    lines.append("")
    for cycle in results["cycle"]:
        lines.append(f"## publish + claim + ack per message, {cycle['held']:,} held ({cycle['groups']:,} groups)")
        lines.append("")
        lines.append("| implementation | per message | messages/s | vs the fastest other library |")
        lines.append("| --- | ---: | ---: | ---: |")
        per = cycle["seconds_per_message"]
        others = [v for k, v in per.items() if not k.startswith("leasequeue")]
        best = min(others) if others else None
        for name, seconds in sorted(per.items(), key=lambda kv: kv[1]):
            ratio = f"{best / seconds:.2f}x" if best else "-"
            lines.append(f"| {name} | {_us(seconds)} | {1 / seconds:,.0f} | {ratio} |")
        lines.append("")
    if results.get("workers"):
        lines.append("## worker processes on one file (claim + ack, 1k groups)")
        lines.append("")
        lines.append("| processes | messages/s (single calls) | messages/s (k=64) |")
        lines.append("| ---: | ---: | ---: |")
        for p, rate in results["workers"].items():
            batch = results.get("workers_batch", {}).get(p)
            lines.append(f"| {p} | {rate:,.0f} | {batch:,.0f} |" if batch else f"| {p} | {rate:,.0f} | - |")
        lines.append("")
    if results.get("claim_cost"):
        lines.append("## claim cost vs messages queued (G = N/10)")
        lines.append("")
        lines.append("| N | claim | ack | publish+claim+ack | bytes on disk / message |")
        lines.append("| ---: | ---: | ---: | ---: | ---: |")
        for row in results["claim_cost"]:
            lines.append(f"| {row['n']:,} | {_us(row['claim'])} | {_us(row['ack'])} | {_us(row['cycle'])} | "
                         f"{row['bytes_per_message']:.0f} |")
        lines.append("")
    if results.get("bytes"):
        lines.append("## bytes on disk per queued message")
        lines.append("")
        for name, size in results["bytes"].items():
            lines.append(f"- {name}: {size:.0f} B")
        lines.append("")
    if results.get("wake"):
        w = results["wake"]
        lines.append(f"## wake latency across processes ({w['samples']} samples)")
        lines.append("")
        lines.append(f"publish returns -> the claim waiting in another process returns: p50 {w['p50'] * 1e3:.2f} ms, "
                     f"p99 {w['p99'] * 1e3:.2f} ms, max {w['max'] * 1e3:.2f} ms")
        lines.append("")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m leasequeue.bench.sqlite`` (and ``leasequeue bench --sqlite``)."""
    import sqlite3

    parser = argparse.ArgumentParser(prog="leasequeue bench --sqlite", description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="1M queued, 4 processes, more repeats (minutes)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks that everything runs")
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON")
    parser.add_argument("--markdown", metavar="FILE", help="write the report as Markdown")
    args = parser.parse_args(argv)
    if args.smoke:
        held, messages, repeats, sizes, claims, procs, seconds, wake = [100], 64, 1, [1000], 50, [1], 0.3, 5
    elif args.full:
        held, messages, repeats, sizes, claims, procs, seconds, wake = [1000, 10000], 2000, 7, \
            [10_000, 100_000, 1_000_000], 1000, [1, 2, 4], 3.0, 300
    else:
        held, messages, repeats, sizes, claims, procs, seconds, wake = [1000], 1000, 5, [10_000, 100_000], 500, \
            [1, 2, 4], 2.0, 100
    results: Dict[str, Any] = {"sqlite_version": sqlite3.sqlite_version, "python": sys.version.split()[0]}

    def step(what: str) -> None:
        print(f"... {what}", file=sys.stderr, flush=True)

    results["cycle"] = []
    for n in held:
        step(f"cycle, {n} held")
        results["cycle"].append(bench_cycle(n, messages, repeats, durable=True))
    step("worker processes")
    results["workers"] = bench_workers(procs, seconds)
    results["workers_batch"] = bench_workers(procs, seconds, batch=64)
    step("claim cost vs N")
    results["claim_cost"] = bench_claim_cost(sizes, claims)
    step("bytes on disk")
    results["bytes"] = bytes_per_message(sizes[0])
    step("wake latency")
    results["wake"] = bench_wake_latency(wake)
    report = render(results)
    print(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(report + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())


