"""``leasequeue bench --sqlite --smoke`` runs, as a user would, and writes a
report of the expected shape.  No timing is asserted (a unit test must not
depend on machine speed); the competitors appear where they are installed
(the ``bench`` extras), leasequeue always."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any


def test_bench_sqlite_smoke(tmp_path: Any) -> None:
    out_json, out_md = tmp_path / "sqlite.json", tmp_path / "sqlite.md"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    done = subprocess.run(
        [sys.executable, "-m", "leasequeue", "bench", "--sqlite", "--smoke",
         "--json", str(out_json), "--markdown", str(out_md)],
        capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out_json.read_text())
    [cycle] = report["cycle"]
    per_message = cycle["seconds_per_message"]
    for name in ("leasequeue", "leasequeue k=64", "leasequeue durable=True"):
        assert per_message[name] > 0, name
    assert report["workers"]["1"] and report["workers_batch"]["1"]
    assert report["claim_cost"][0]["claim"] > 0 and report["bytes"]["leasequeue"] > 0
    assert report["wake"]["p50"] > 0 and report["wake"]["samples"] == 5
    text = out_md.read_text()
    assert "wake latency across processes" in text and text.strip() in done.stdout
