"""``leasequeue bench --worker`` runs end to end (smoke size, no PostgreSQL):
every runner measured, the table and the goals rendered, the JSON saved."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from leasequeue.__main__ import main


def test_the_worker_benchmark_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "worker.json"
    md = tmp_path / "worker.md"
    assert main(["bench", "--worker", "--smoke", "--jobs", "400", "--samples", "5", "--json", str(out),
                 "--markdown", str(md)]) == 0
    report = json.loads(out.read_text())
    memory = report["results"]["memory"]
    for name in ("bare claim/ack loop", "Worker, 1 thread", "Worker, 16 threads", "Worker, asyncio x16",
                 "dramatiq StubBroker + Worker (8 threads)", "huey MemoryHuey + consumer (1 thread)"):
        assert memory[name]["jobs_per_s"] > 0 and math.isfinite(memory[name]["jobs_per_s"]), name
    assert memory["Worker, 1 thread"]["latency"]["n"] == 5
    sqlite = report["results"]["sqlite"]
    assert sqlite["huey SqliteHuey + consumer (1 thread)"]["jobs_per_s"] > 0
    assert sqlite["Worker on SQLiteTransport, 1 thread"]["latency"]["n"] == 5
    text = md.read_text()
    assert "| Worker, 1 thread |" in text and "## Goals" in text and "bare claim+ack loop" in text
    assert text in capsys.readouterr().out
