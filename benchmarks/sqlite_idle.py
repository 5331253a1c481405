"""Idle cost and cross-process wake latency of SQLiteTransport's waiting claims.

    python3 benchmarks/sqlite_idle.py                    # both, kernel watch (or what the platform has)
    python3 benchmarks/sqlite_idle.py --mechanism poll   # the bounded fallback poll, forced
    python3 benchmarks/sqlite_idle.py --samples 300 --idle-seconds 2 --threads 32

* **idle CPU**: ``--threads`` claims wait (``claim(..., timeout=None)``) on
  one transport and nothing happens; the process CPU time
  (``time.process_time()``, every thread) over ``--idle-seconds`` of wall
  time, in ms of CPU per second.  Measured in a fresh child process.
* **wake latency**: a claim waits in a child process; this process
  publishes (after a random 5-30 ms pause, so that the waiter is asleep)
  and the child reports when its claim returned (``time.time()`` in both:
  one machine, one clock).  p50 / p99 / max over ``--samples``.  With
  ``--checkpoint`` this process runs ``PRAGMA wal_checkpoint(TRUNCATE)``
  before every publish, so that every wake-up comes through a WAL that a
  checkpoint has just reset to zero bytes.

``--mechanism poll`` sets ``LEASEQUEUE_SQLITE_WATCH=poll`` in the children
(the documented switch that forces the fallback).  Figures are wall-clock and
depend on the machine's load: run ``uptime`` alongside.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List

_IDLE = r"""
import sys, threading, time
from leasequeue import SQLiteTransport
path, threads, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
t = SQLiteTransport(path)
ws = [threading.Thread(target=t.claim, args=(f"w{i}", 30), kwargs={"timeout": None}, daemon=True)
      for i in range(threads)]
for w in ws:
    w.start()
while len(t._queue.waiters) < threads:
    time.sleep(0.01)
time.sleep(1.0)  # settle: every thread asleep, the watcher armed, its re-checks after the last write done (0.78 s)
c0, w0 = time.process_time(), time.monotonic()
time.sleep(seconds)
c1, w1 = time.process_time(), time.monotonic()
mech = getattr(t._watcher, "mechanism", "poll (3 ms)")
print(repr((c1 - c0) / (w1 - w0) * 1e3), mech, flush=True)
t.close()
"""

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


def _env(mechanism: str) -> Dict[str, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(os.path.abspath(p) for p in sys.path if p))
    if mechanism == "poll":
        env["LEASEQUEUE_SQLITE_WATCH"] = "poll"
    else:
        env.pop("LEASEQUEUE_SQLITE_WATCH", None)
    return env


def idle_cpu(threads: int, seconds: float, mechanism: str) -> Dict[str, Any]:
    """ms of CPU per second of a process whose ``threads`` claims wait on one transport."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "q.db")
        out = subprocess.run([sys.executable, "-c", _IDLE, path, str(threads), str(seconds)], env=_env(mechanism),
                             capture_output=True, text=True, timeout=60 + seconds, check=True).stdout.split(None, 1)
    return {"ms_per_s": float(out[0]), "mechanism": out[1].strip(), "threads": threads, "seconds": seconds}


def wake_latency(samples: int, mechanism: str, checkpoint: bool) -> Dict[str, Any]:
    """Publish here -> a claim waiting in a child process returns: seconds, p50/p99/max."""
    from leasequeue import SQLiteTransport

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "q.db")
        t = SQLiteTransport(path)
        side = sqlite3.connect(path, isolation_level=None) if checkpoint else None
        proc = subprocess.Popen([sys.executable, "-c", _WAITER, path], stdout=subprocess.PIPE, text=True,
                                env=_env(mechanism))
        assert proc.stdout is not None
        proc.stdout.readline()
        rng = random.Random(7)
        latencies: List[float] = []
        try:
            for i in range(samples):
                time.sleep(rng.uniform(0.005, 0.03))  # the waiter is asleep in its claim again
                if side is not None:
                    side.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
                t.publish(f"g{i}", i)
                sent = time.time()
                woke = float(proc.stdout.readline())
                latencies.append(woke - sent)
            t.publish("stop", "stop")
            proc.wait(30)
        finally:
            proc.kill()
            if side is not None:
                side.close()
            t.close()
    latencies.sort()
    return {
        "p50": latencies[len(latencies) // 2],
        "p99": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        "max": latencies[-1],
        "samples": len(latencies),
        "mechanism": mechanism,
        "checkpoint": checkpoint,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mechanism", choices=("auto", "poll"), default="auto",
                        help="auto: what the platform has (inotify, kqueue); poll: force the fallback")
    parser.add_argument("--threads", type=int, default=32)
    parser.add_argument("--idle-seconds", type=float, default=2.0)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--checkpoint", action="store_true", help="TRUNCATE-checkpoint the WAL before each publish")
    parser.add_argument("--no-idle", action="store_true")
    parser.add_argument("--no-wake", action="store_true")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    results: Dict[str, Any] = {"load": os.getloadavg()}
    if not args.no_idle:
        results["idle"] = idle_cpu(args.threads, args.idle_seconds, args.mechanism)
    if not args.no_wake:
        results["wake"] = wake_latency(args.samples, args.mechanism, args.checkpoint)
    if args.json:
        print(json.dumps(results))
        return 0
    print(f"load average {results['load'][0]:.2f}")
    if "idle" in results:
        i = results["idle"]
        print(f"idle: {i['threads']} waiting claims, {i['mechanism']}: {i['ms_per_s']:.2f} ms CPU per second")
    if "wake" in results:
        w = results["wake"]
        extra = ", WAL TRUNCATE-checkpointed before each publish" if w["checkpoint"] else ""
        print(f"wake across processes ({args.mechanism}{extra}, {w['samples']} samples): p50 {w['p50'] * 1e3:.2f} ms,"
              f" p99 {w['p99'] * 1e3:.2f} ms, max {w['max'] * 1e3:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
