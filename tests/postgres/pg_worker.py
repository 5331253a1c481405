"""A worker process of the many-process test (not a test module).

``python pg_worker.py CONNINFO QUEUE LOG SEED VISIBILITY`` claims, logs,
acks until killed or until the file ``LOG.stop`` exists.  Every record is
written and fsync'd before the next step, so a SIGKILL at any instant
leaves a log that tells what this worker had started and finished:

    C seq group attempt claimed_at expires_at event   (after claim returned; server times)
    A seq attempt t                                   (before ack is sent; this host's clock)
    D seq attempt                                     (after ack returned; not fsync'd)
    L seq attempt                                     (ack raised LeaseLost)
"""

from __future__ import annotations

import os
import random
import sys
import time


def main() -> None:
    conninfo, queue, log, seed, visibility = sys.argv[1:6]
    vis = float(visibility)
    rng = random.Random(int(seed))
    from leasequeue import LeaseLost, LeaseQueueError, PostgresTransport

    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def record(line: str, sync: bool = True) -> None:
        os.write(fd, (line + "\n").encode())
        if sync:
            os.fsync(fd)

    t = None
    while not os.path.exists(log + ".stop"):
        try:
            if t is None:
                t = PostgresTransport(conninfo, queue=queue)
            lease = t.claim(f"w{seed}", vis, timeout=0.5)
            if lease is None:
                continue
            record(f"C {lease.seq} {lease.group_id} {lease.attempt} {lease.expires_at - vis!r} "
                   f"{lease.expires_at!r} {lease.event[1]}")
            time.sleep(rng.random() * 0.02)  # some work, so that kills land on leases
            record(f"A {lease.seq} {lease.attempt} {time.time()!r}")
            try:
                t.ack(lease)
            except LeaseLost:
                record(f"L {lease.seq} {lease.attempt}", sync=False)
            else:
                record(f"D {lease.seq} {lease.attempt}", sync=False)
        except LeaseQueueError:
            time.sleep(0.05)  # the server restarts: the next call reconnects
        except Exception as exc:  # anything else is a bug: make it visible
            record(f"X {exc!r}")
            raise


if __name__ == "__main__":
    main()
