"""``leasequeue bench --postgres --smoke`` runs, as a user would, against the
session's server, and writes a report of the expected shape.  No timing is
asserted (a unit test must not depend on machine speed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any


def test_bench_postgres_smoke(conninfo: str, tmp_path: Any) -> None:
    out_json, out_md = tmp_path / "pg.json", tmp_path / "pg.md"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    done = subprocess.run(
        [sys.executable, "-m", "leasequeue", "bench", "--postgres", "--smoke", "--seconds", "0.3",
         "--conninfo", conninfo, "--json", str(out_json), "--markdown", str(out_md)],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out_json.read_text())
    [run] = report["runs"]
    assert run["sync"] == "off" and run["server"].startswith("PostgreSQL")
    measured = set(run["cycle"])
    assert "leasequeue" in measured
    assert measured | set(report["missing"]) == {"leasequeue", "procrastinate", "pgqueuer"}
    assert run["cycle"]["leasequeue"]["1"] > 0 and run["batch"]["leasequeue"]["1"] > 0
    assert report["wake"]["n"] == 20 and report["wake"]["p50"] > 0
    assert set(report["latency"]) == {"1000"} and report["latency"]["1000"]["claim_p50"] > 0
    consume = report["consume"]
    ours = {"leasequeue", "leasequeue-aac", "leasequeue-batch", "leasequeue-worker", "leasequeue-worker4"}
    expected = ours | {"pgqueuer", "pgqueuer-batch", "pgqueuer-1", "procrastinate"}
    measured_consume = set(consume["median"])
    assert ours <= measured_consume <= expected
    for variant in measured_consume:
        point = consume["median"][variant]["1"]
        assert point["jobs_per_s"] > 0 and point["client_cpu_ms"] > 0
        slow = variant in ("pgqueuer-1", "procrastinate")
        assert point["jobs"] == (consume["slow_jobs"] if slow else consume["jobs"])
    assert report["load"] is None or len(report["load"]) == 3
    text = out_md.read_text()
    assert "publish -> claim -> ack" in text and "wake latency" in text and text in done.stdout
    assert "Consume only" in text and "no per-group exclusivity" in text
    assert "ack_and_claim / PGQueuer defaults" in text or "pgqueuer" not in measured_consume
