#!/usr/bin/env python3
"""Instructions per message for the SQLite queues, under callgrind.

Wall-clock time on a shared machine drifts by several times; instruction
counts do not.  Each measurement runs a workload twice under
``valgrind --tool=callgrind`` (K1 and K2 cycles after the same set-up) and
reports ``(Ir(K2) - Ir(K1)) / (K2 - K1)``: start-up, imports and prefill
cancel out.

    python3 benchmarks/sqlite_callgrind.py cycle        # leasequeue (single, k=64) vs huey, persist-queue, litequeue
    python3 benchmarks/sqlite_callgrind.py flat         # leasequeue's cycle at 10k, 100k, 1M queued
    python3 benchmarks/sqlite_callgrind.py ops          # leasequeue's publish, claim, ack apart (single, k=64)
    python3 benchmarks/sqlite_callgrind.py compare OTHER_SRC   # leasequeue's cycle: this tree vs another's src/

``compare`` measures the same cycle on this tree and on another checkout
(say the previous release: ``git worktree add ../old v0.3`` then
``compare ../old/src``), twice each, alternately, in one run: a schema
change shows as the difference.  Set ``LEASEQUEUE_NO_EXTENSIONS=1`` when the
other tree has no compiled extension (the SQLite backend needs none).

Needs valgrind, and the ``bench-sqlite`` extra for the other libraries.  The
``flat`` run prefills its files natively first (1M messages: about a minute).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")
COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")

#: Defines ``cycle(i)`` (one message published, claimed and acked; huey:
#: enqueued and dequeued) for the store ``which`` names, in a fresh directory
#: ``d`` holding ``held`` messages over ``groups`` groups.  Expects ``which``,
#: ``d``, ``held``, ``groups``, ``event`` and ``P`` (huey's pickle protocol).
#: ``sqlite_floor.py`` runs the same code for its leasequeue and huey rows.
PEERS = r"""
if which in ("leasequeue", "leasequeue-k64"):
    from leasequeue import SQLiteTransport
    t = SQLiteTransport(os.path.join(d, "q.db"))
    t.publish_many([(f"g{i % groups}", event) for i in range(held)])
    if which == "leasequeue":
        def cycle(i):
            t.publish(f"g{i % groups}", event)
            t.ack(t.claim("w", 30.0))
    else:
        def cycle(i):
            if i % 64 == 0:
                t.publish_many([(f"g{(i + j) % groups}", event) for j in range(64)])
                t.ack_many(t.claim_many("w", 30.0, 64))
elif which == "huey":
    from huey.storage import SqliteStorage
    s = SqliteStorage(name="q", filename=os.path.join(d, "huey.db"))
    s.conn.execute("PRAGMA synchronous=NORMAL")
    for i in range(held):
        s.enqueue(pickle.dumps(event, P))
    def cycle(i):
        s.enqueue(pickle.dumps(event, P))
        pickle.loads(s.dequeue())
elif which == "persist-queue":
    import persistqueue
    q = persistqueue.SQLiteAckQueue(os.path.join(d, "pq"), multithreading=True)
    for c in (q._conn, q._putter):
        c.execute("PRAGMA synchronous=NORMAL")
    for i in range(held):
        q.put(event)
    def cycle(i):
        q.put(event)
        q.ack(q.get(block=False))
elif which == "litequeue":
    import litequeue
    lq = litequeue.LiteQueue(os.path.join(d, "lq.db"))
    for i in range(held):
        lq.put(pickle.dumps(event).hex())
    def cycle(i):
        lq.put(pickle.dumps(event).hex())
        m = lq.pop()
        lq.done(m.message_id)
else:
    raise SystemExit(f"unknown workload {which}")
"""

#: What every cycle workload starts from (this file's and ``sqlite_floor.py``'s):
#: ``held`` messages over ``groups`` groups, of ``event``, in a fresh directory ``d``.
SETUP = r"""
held, groups = 1000, 100
event = {"step": "charge", "order": 17, "amount": 12.5}
d = tempfile.mkdtemp()
"""

CYCLE = r"""
import os, pickle, sys, tempfile
which, k = sys.argv[1], int(sys.argv[2])
""" + SETUP + r"""P = pickle.DEFAULT_PROTOCOL
""" + PEERS + r"""for i in range(k):
    cycle(i)
"""

OPS = r"""
import os, sys, tempfile
which, k = sys.argv[1], int(sys.argv[2])
event = {"step": "charge", "order": 17, "amount": 12.5}
from leasequeue import SQLiteTransport
t = SQLiteTransport(os.path.join(tempfile.mkdtemp(), "q.db"))
# The same set-up whatever k: 4,000 groups of two messages (so that a claim
# finds a new ready group and an ack moves a head on, as in the cycle), or
# for publish 1,000 messages in 100 groups.
if which.startswith("publish"):
    t.publish_many([(f"g{i % 100}", event) for i in range(1000)])
else:
    t.publish_many([(f"g{i % 4000}", event) for i in range(8000)])
if which.startswith("ack"):
    leases = t.claim_many("w", 3600.0, 4000)
if which == "publish":
    for i in range(k):
        t.publish(f"g{i % 100}", event)
elif which == "claim":
    for i in range(k):
        t.claim("w", 3600.0)
elif which == "ack":
    for i in range(k):
        t.ack(leases[i])
elif which == "publish-k64":
    for i in range(0, k, 64):
        t.publish_many([(f"g{(i + j) % 100}", event) for j in range(64)])
elif which == "claim-k64":
    for i in range(0, k, 64):
        t.claim_many("w", 3600.0, 64)
elif which == "ack-k64":
    for i in range(0, k, 64):
        t.ack_many(leases[i:i + 64])
"""

PREFILL = r"""
import sys
from leasequeue import SQLiteTransport
n, path = int(sys.argv[1]), sys.argv[2]
groups = max(1, n // 10)
event = {"step": "charge", "order": 17, "amount": 12.5}
with SQLiteTransport(path) as t:
    for s in range(0, n, 10000):
        t.publish_many([(f"g{i % groups}", event) for i in range(s, min(n, s + 10000))])
"""

FLAT = r"""
import shutil, sys
from leasequeue import SQLiteTransport
src, k, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
groups = max(1, n // 10)
shutil.copy(src, src + ".run")
event = {"step": "charge", "order": 17, "amount": 12.5}
t = SQLiteTransport(src + ".run")
for i in range(k):
    t.publish(f"g{i % groups}", event)
    t.ack(t.claim("w", 30.0))
t.close()
"""


def env() -> dict:
    e = dict(os.environ, PYTHONHASHSEED="0")
    if os.path.isdir(os.path.join(SRC, "leasequeue")):
        e["PYTHONPATH"] = SRC + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    return e


def instructions(script: str, *args: str) -> int:
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-c", script, *args],
        capture_output=True, text=True, env=env(), check=True,
    )
    match = COLLECTED.search(out.stderr)
    if not match:
        raise RuntimeError(out.stderr[-2000:])
    return int(match.group(1))


def counts(name: str) -> tuple:
    """K1 and K2 for a workload: more for the batched ones (k = 64 a call)."""
    return (640, 3200) if "k64" in name else (200, 1200)


def per_cycle(script: str, k1: int, k2: int, *args: str, per: int = 1) -> float:
    low = instructions(script, args[0], str(k1), *args[1:])
    high = instructions(script, args[0], str(k2), *args[1:])
    return (high - low) / ((k2 - k1) * per)


def main() -> int:
    what = sys.argv[1] if len(sys.argv) > 1 else "cycle"
    if what == "cycle":
        print("| implementation | instructions per message (publish + claim + ack) |")
        print("| --- | ---: |")
        for name in ("leasequeue", "leasequeue-k64", "huey", "persist-queue", "litequeue"):
            try:
                print(f"| {name} | {per_cycle(CYCLE, *counts(name), name):,.0f} |", flush=True)
            except subprocess.CalledProcessError as exc:
                print(f"| {name} | failed: {exc.stderr.strip().splitlines()[-1]} |")
    elif what == "ops":
        print("| operation | instructions per message |")
        print("| --- | ---: |")
        for name in ("publish", "claim", "ack", "publish-k64", "claim-k64", "ack-k64"):
            print(f"| {name} | {per_cycle(OPS, *counts(name), name):,.0f} |", flush=True)
    elif what == "compare" and len(sys.argv) > 2:
        global SRC
        trees = [("this tree", SRC), ("other", os.path.abspath(sys.argv[2]))]
        print("| tree | instructions per message (publish + claim + ack) |")
        print("| --- | ---: |")
        for label, src in trees + trees:
            SRC = src
            print(f"| {label} ({src}) | {per_cycle(CYCLE, *counts('leasequeue'), 'leasequeue'):,.0f} |", flush=True)
    elif what == "flat":
        print("| messages queued (G = N/10) | instructions per publish + claim + ack |")
        print("| ---: | ---: |")
        with tempfile.TemporaryDirectory() as tmp:
            for n in (10_000, 100_000, 1_000_000):
                path = os.path.join(tmp, f"q{n}.db")
                subprocess.run([sys.executable, "-c", PREFILL, str(n), path], env=env(), check=True)
                print(f"| {n:,} | {per_cycle(FLAT, 100, 600, path, str(n)):,.0f} |", flush=True)
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
