#!/usr/bin/env python3
"""The floor: the cheapest publish + claim + ack any SQLite transport could do.

Issue 12 asks for 1.5x huey's ``SqliteStorage`` per message with single
calls and 10x with batches of 64.  The contract makes publish, claim and
ack each commit before returning (a publish survives a process crash; a
claim is visible to every other process before it returns; so is an ack).
Through Python's ``sqlite3`` with WAL and ``synchronous=NORMAL``, the least
any design obeying that can do per message is three committed write
transactions, each one autocommit statement on a table with an integer
primary key and nothing else:

* publish: ``INSERT INTO m (data) VALUES (?)`` (the pickled event);
* claim: ``UPDATE m SET holder = ?, expires_at = ? WHERE id = ?`` of a row
  whose key the claimer already knows (no search for the next message, no
  per-group state, no index but the primary key);
* ack: ``DELETE FROM m WHERE id = ?``.

``floor-returning`` reads the event back in the claim (``UPDATE ...
RETURNING data``, as a claim must).  With batches of k = 64: one
``executemany`` INSERT in one transaction, one UPDATE of the 64 rows (a key
range), one DELETE of the 64 rows.  huey is measured in the same run: its
enqueue (one write transaction) + dequeue (a read, then a write transaction
that selects and deletes): two commits per message, no ack, no claim state.

    python3 benchmarks/sqlite_floor.py            # callgrind, then wall clock, same run
    python3 benchmarks/sqlite_floor.py --no-wall  # instructions only
    python3 benchmarks/sqlite_floor.py --no-callgrind

Instructions: each workload under ``valgrind --tool=callgrind`` twice (K1
and K2 messages after the same set-up); ``(Ir(K2) - Ir(K1)) / (K2 - K1)``.
Wall clock: each workload in its own process, the workloads taking turns,
median seconds per message over the repeats.  Every file: 1,000 messages
held, WAL, ``synchronous=NORMAL``; the floor files use leasequeue's page
size and checkpoint size (1 KiB pages, 4 MiB WAL) unless ``--page-size``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from sqlite_callgrind import PEERS, SETUP, counts, env, per_cycle  # noqa: E402

WORKLOAD = r"""
import os, pickle, sqlite3, sys, tempfile, time
which, k, page_size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
timed = len(sys.argv) > 4
""" + SETUP + r"""P = pickle.HIGHEST_PROTOCOL
if which.startswith("floor"):
    conn = sqlite3.connect(os.path.join(d, "floor.db"), isolation_level=None, check_same_thread=False)
    conn.execute(f"PRAGMA page_size = {page_size}")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute(f"PRAGMA wal_autocheckpoint = {4 * 1024 * 1024 // page_size}")
    conn.execute("CREATE TABLE m (id INTEGER PRIMARY KEY, holder TEXT, expires_at REAL, data BLOB)")
    cur = conn.cursor()
    INSERT = "INSERT INTO m (data) VALUES (?)"
    CLAIM = "UPDATE m SET holder = ?, expires_at = ? WHERE id = ?"
    CLAIM_RET = "UPDATE m SET holder = ?, expires_at = ? WHERE id = ? RETURNING data"
    ACK = "DELETE FROM m WHERE id = ?"
    CLAIM_RANGE = "UPDATE m SET holder = ?, expires_at = ? WHERE id BETWEEN ? AND ?"
    CLAIM_RANGE_RET = "UPDATE m SET holder = ?, expires_at = ? WHERE id BETWEEN ? AND ? RETURNING data"
    ACK_RANGE = "DELETE FROM m WHERE id BETWEEN ? AND ?"
    cur.execute("BEGIN")
    cur.executemany(INSERT, [(pickle.dumps(event, P),)] * held)
    cur.execute("COMMIT")
    head = 1  # the oldest message: FIFO, as a queue claims
    clock = time.time
    if which == "floor":
        def cycle(i):
            global head
            cur.execute(INSERT, (pickle.dumps(event, P),))
            cur.execute(CLAIM, ("w", clock() + 30.0, head))
            cur.execute(ACK, (head,))
            head += 1
    elif which == "floor-returning":
        def cycle(i):
            global head
            cur.execute(INSERT, (pickle.dumps(event, P),))
            pickle.loads(cur.execute(CLAIM_RET, ("w", clock() + 30.0, head)).fetchone()[0])
            cur.execute(ACK, (head,))
            head += 1
    elif which in ("floor-k64", "floor-k64-returning"):
        returning = which.endswith("returning")
        def cycle(i):
            global head
            if i % 64:
                return
            cur.execute("BEGIN")
            cur.executemany(INSERT, [(pickle.dumps(event, P),) for _ in range(64)])
            cur.execute("COMMIT")
            last = head + 63
            if returning:
                for (data,) in cur.execute(CLAIM_RANGE_RET, ("w", clock() + 30.0, head, last)).fetchall():
                    pickle.loads(data)
            else:
                cur.execute(CLAIM_RANGE, ("w", clock() + 30.0, head, last))
            cur.execute(ACK_RANGE, (head, last))
            head += 64
    else:
        raise SystemExit(f"unknown workload {which}")
else:
""" + textwrap.indent(PEERS, "    ") + r"""for i in range(64):  # warm: statement caches, the WAL's first frames
    cycle(i)
began = time.perf_counter()
for i in range(64, 64 + k):
    cycle(i)
if timed:
    print(time.perf_counter() - began)
"""

SINGLE = ("floor", "floor-returning", "huey", "leasequeue")
BATCHED = ("floor-k64", "floor-k64-returning", "leasequeue-k64")


def per_message_instructions(which: str, page_size: int) -> float:
    return per_cycle(WORKLOAD, *counts(which), which, str(page_size))


def wall(which: str, page_size: int, messages: int) -> float:
    out = subprocess.run(
        [sys.executable, "-c", WORKLOAD, which, str(messages), str(page_size), "time"],
        capture_output=True, text=True, env=env(), check=True,
    )
    return float(out.stdout.strip().splitlines()[-1]) / messages


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-callgrind", action="store_true")
    parser.add_argument("--no-wall", action="store_true")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--messages", type=int, default=3200, help="messages per wall-clock sample")
    parser.add_argument("--page-size", type=int, default=1024, help="page size of the floor files")
    parser.add_argument("--only", default="", help="comma-separated workloads (default: all)")
    args = parser.parse_args()
    names = [n for n in SINGLE + BATCHED if not args.only or n in args.only.split(",")]
    results = {}
    if not args.no_callgrind:
        for name in names:
            results[name] = per_message_instructions(name, args.page_size)
            print(f"  callgrind {name}: {results[name]:,.0f}", file=sys.stderr, flush=True)
    times: dict = {name: [] for name in names}
    if not args.no_wall:
        for r in range(args.repeats):
            order = names if r % 2 == 0 else names[::-1]
            for name in order:
                times[name].append(wall(name, args.page_size, args.messages))
            print(f"  wall repeat {r + 1}/{args.repeats} done", file=sys.stderr, flush=True)
    huey_ir = results.get("huey")
    huey_s = statistics.median(times["huey"]) if times.get("huey") else None
    print(f"Per message (publish + claim + ack; huey: enqueue + dequeue); floor page size {args.page_size}")
    print()
    print("| workload | instructions | vs huey (instr.) | wall µs (median) | vs huey (wall) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name in names:
        ir = results.get(name)
        s = statistics.median(times[name]) if times[name] else None
        cells = [
            f"{ir:,.0f}" if ir is not None else "-",
            f"{huey_ir / ir:.2f}x" if ir and huey_ir else "-",
            f"{s * 1e6:,.1f}" if s is not None else "-",
            f"{huey_s / s:.2f}x" if s and huey_s else "-",
        ]
        print(f"| {name} | " + " | ".join(cells) + " |")
    if any(times.values()):
        print()
        print("wall samples (µs per message):")
        for name in names:
            print(f"  {name}: " + ", ".join(f"{t * 1e6:.1f}" for t in times[name]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
