"""A PostgreSQL queue that does not exist, from the command lines: one line
on stderr, status 1, nothing created (the suite's PostgreSQL, real
processes).

Needs ``leasequeue.QueueNotFound`` (PostgreSQL queues are created only by
``install`` / ``create_queue``, issue 30): named so that pytest does not
collect it until the lead renames it ``test_cli_queue_not_found.py`` at the
merge.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

from leasequeue import PostgresTransport


def test_a_queue_that_does_not_exist_is_one_line(tmp_path: Path, worker_pg_conninfo: str) -> None:
    (tmp_path / "lq_nf_jobs.py").write_text("def handle(job):\n    pass\n")
    name = f"nf_{uuid.uuid4().hex[:12]}"
    for args, prog in ((("worker", "lq_nf_jobs:handle"), "leasequeue worker"),
                       (("queue",), "leasequeue queue")):
        tail = ("stats",) if args == ("queue",) else ()
        r = subprocess.run([sys.executable, "-m", "leasequeue", *args, "--postgres", worker_pg_conninfo,
                            "--queue", name, *tail], cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert r.returncode == 1, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
        assert lines[0].startswith(f"{prog}: error: ") and f"queue {name!r} does not exist" in lines[0]
    assert name not in [q for q, _stats in PostgresTransport.list_queues(worker_pg_conninfo)]
