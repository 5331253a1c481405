"""Many processes on one PostgreSQL queue, with crashes.

8 worker processes (``pg_worker.py``) claim -> ack over 1,000 groups through
TCP loopback while a killer SIGKILLs a random one every ~0.8 s (and starts a
replacement), and once during the run the server is restarted with
``pg_ctl restart -m immediate``.  Afterwards, from the workers' fsync'd logs
and the database:

* every message was acked exactly once or is still queued (none lost, none
  acked twice);
* no group ever had two live leases: a group's next lease was granted only
  after the previous one ended (expired, by the server's clock) or after its
  worker had started acking it (this host's clock, which the server shares);
* FIFO held per group: a group's messages were first delivered in seq order,
  and a message's attempts increase.

``LEASEQUEUE_PG_SOAK_SECONDS`` sets the run's length (default 30 s).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict
from typing import Any, Dict, List, Tuple

import pytest

from leasequeue import LeaseQueueError, PostgresTransport

SECONDS = float(os.environ.get("LEASEQUEUE_PG_SOAK_SECONDS", "30"))
WORKERS = 8
GROUPS = 1000
PER_GROUP = 3
VISIBILITY = 1.5
WORKER = os.path.join(os.path.dirname(__file__), "pg_worker.py")


@pytest.mark.serial(reason="a soak: worker processes on every core for a fixed time, a server crash half way")
def test_many_processes_killed_and_a_server_crash(own_server: Any, queue_name: str, tmp_path: Any) -> None:
    conninfo = own_server.conninfo  # TCP loopback
    assert "host=127.0.0.1" in conninfo
    t = PostgresTransport(conninfo, queue=queue_name)
    items = [(f"g{g}", (f"g{g}", i)) for i in range(PER_GROUP) for g in range(GROUPS)]
    published = {}
    for start in range(0, len(items), 1000):
        chunk = items[start:start + 1000]
        for seq, (group, event) in zip(t.publish_many(chunk), chunk):
            published[seq] = (group, event[1])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    procs: Dict[int, subprocess.Popen] = {}
    logs: List[str] = []
    rng = random.Random(1234)
    serial = 0

    def spawn() -> None:
        nonlocal serial
        serial += 1
        log = str(tmp_path / f"worker{serial}.log")
        logs.append(log)
        p = subprocess.Popen([sys.executable, WORKER, conninfo, queue_name, log, str(serial), str(VISIBILITY)],
                             env=env)
        procs[serial] = p

    kills = 0
    restarted = False
    try:
        for _ in range(WORKERS):
            spawn()
        start = time.monotonic()
        done = 0  # messages gone from the queue (acked)
        while True:
            elapsed = time.monotonic() - start
            # On a loaded machine workers killed before they got going leave
            # little done: go on (killing) past SECONDS until there is enough
            # to judge, up to four times as long.
            if elapsed >= SECONDS and (done > 600 or elapsed >= 4 * SECONDS):
                break
            time.sleep(rng.uniform(0.4, 1.2))
            victim = rng.choice(sorted(procs))
            procs.pop(victim).send_signal(signal.SIGKILL)
            kills += 1
            spawn()
            if not restarted and time.monotonic() - start > SECONDS * 0.4:
                own_server.owned.restart_immediate()
                restarted = True
            try:
                left = len(t)
                done = len(published) - left
                if restarted and left == 0:
                    break  # all done
            except LeaseQueueError:
                pass  # our own pooled connection died with the server
    finally:
        for log in logs:
            open(log + ".stop", "w").close()
        for p in procs.values():
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    assert restarted and kills >= 5

    claims: Dict[int, List[Tuple[float, float, int, str, int, str]]] = defaultdict(list)  # seq -> leases
    acking: Dict[Tuple[int, int], float] = {}
    acked_ok: Dict[int, int] = defaultdict(int)
    for log in logs:
        if not os.path.exists(log):
            continue
        with open(log) as f:
            lines = f.read().splitlines()
        for n, line in enumerate(lines):
            parts = line.split()
            if not parts or (n == len(lines) - 1 and not line.strip()):
                continue
            kind = parts[0]
            assert kind != "X", f"a worker failed: {line}"
            if kind == "C":
                seq, group, attempt, claimed, expires, index = parts[1:7]
                claims[int(seq)].append((float(claimed), float(expires), int(attempt), group, int(index), log))
            elif kind == "A":
                acking[(int(parts[1]), int(parts[2]))] = float(parts[3])
            elif kind == "D":
                acked_ok[int(parts[1])] += 1

    with __import__("psycopg").connect(conninfo) as conn:
        q = t._queue
        remaining = {int(r[0]) for r in conn.execute("SELECT seq FROM leasequeue.messages WHERE queue = %s", (q,))}

    # Exactly once or still queued.
    assert remaining <= set(published)
    for seq in published:
        assert acked_ok[seq] <= 1, f"message {seq} acked twice"
        if seq in remaining:
            assert acked_ok[seq] == 0, f"message {seq} acked but still queued"
        else:
            started = [a for (s, a) in acking if s == seq]
            assert started, f"message {seq} is gone but nobody acked it"
    assert len(published) - len(remaining) > 500, "too little work was done to judge"

    redelivered = sum(1 for leases in claims.values() for lease in leases if lease[2] > 1)
    print(f"\n{len(published) - len(remaining)} acked, {len(remaining)} still queued, {kills} workers killed, "
          f"{sum(map(len, claims.values()))} leases logged, {redelivered} re-deliveries")

    # No two live leases in a group; FIFO per group.
    by_group: Dict[str, List[Tuple[float, float, int, int, int]]] = defaultdict(list)
    for seq, leases in claims.items():
        group, index = published[seq]
        for claimed, expires, attempt, g, idx, _log in leases:
            assert (g, idx) == (group, index), "a lease carried another message's event"
            by_group[group].append((claimed, expires, seq, attempt, idx))
    for group, leases in by_group.items():
        leases.sort()
        for (_c1, e1, s1, a1, i1), (c2, _e2, s2, a2, i2) in zip(leases, leases[1:]):
            ack_started = acking.get((s1, a1), float("inf"))
            assert c2 > e1 or c2 >= ack_started - 0.001, (
                f"group {group}: lease of {s2} (attempt {a2}) granted at {c2} while {s1} (attempt {a1}) "
                f"was live until {e1}, ack started {ack_started}; the group's leases (granted, ends, seq, "
                f"attempt, ack started): {[(c, e, s, a, acking.get((s, a))) for c, e, s, a, _i in leases]}")
            assert s2 >= s1, f"group {group}: FIFO broken, {s2} delivered after {s1}"
            if s2 == s1:
                assert a2 > a1
            else:
                assert i2 > i1
    t.close()
