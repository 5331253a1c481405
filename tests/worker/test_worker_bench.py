"""``leasequeue bench --worker`` runs end to end (smoke size, no PostgreSQL):
every runner measured, the table and the goals rendered, the JSON saved."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

from leasequeue.__main__ import main
from leasequeue.worker.runners import fastpath


def test_the_worker_benchmark_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "worker.json"
    md = tmp_path / "worker.md"
    assert main(["bench", "--worker", "--smoke", "--jobs", "400", "--samples", "5", "--json", str(out),
                 "--markdown", str(md)]) == 0
    report = json.loads(out.read_text())
    memory = report["results"]["memory"]
    names = ["bare claim/ack loop", "Worker, 1 thread", "Worker, 16 threads", "Worker, asyncio x16"]
    # The peers are the bench extra's: measured when installed, named as missing when not.
    has_dramatiq = importlib.util.find_spec("dramatiq") is not None
    has_huey = importlib.util.find_spec("huey") is not None
    if has_dramatiq:
        names.append("dramatiq StubBroker + Worker (8 threads)")
    else:
        assert "dramatiq" in report["missing"]
    if has_huey:
        names.append("huey MemoryHuey + consumer (1 thread)")
    else:
        assert "huey" in report["missing"]
    for name in names:
        assert memory[name]["jobs_per_s"] > 0 and math.isfinite(memory[name]["jobs_per_s"]), name
    assert memory["Worker, 1 thread"]["latency"]["n"] == 5
    # Where the fast path was compiled, its pure-Python twin is measured beside it (the same run).
    pure = memory.get("Worker, 1 thread, pure-Python fast path")
    assert (pure is not None) == (fastpath.COMPILED is not None)
    if pure is not None:
        assert pure["jobs_per_s"] > 0 and math.isfinite(pure["jobs_per_s"])
    sqlite = report["results"]["sqlite"]
    if has_huey:
        assert sqlite["huey SqliteHuey + consumer (1 thread)"]["jobs_per_s"] > 0
    assert sqlite["Worker on SQLiteTransport, 1 thread"]["latency"]["n"] == 5
    text = md.read_text()
    assert "| Worker, 1 thread |" in text and "## Goals" in text and "bare claim+ack loop" in text
    assert text in capsys.readouterr().out


def test_before_runs_an_earlier_worker_module_interleaved(tmp_path: Path) -> None:
    """``--before FILE`` loads a worker module (an earlier release's
    ``_worker.py``; here a stand-in with the same relative imports) and
    measures it beside this one."""
    before = tmp_path / "worker_before.py"
    before.write_text("from .worker import Worker\n")
    out = tmp_path / "worker.json"
    assert main(["bench", "--worker", "--smoke", "--jobs", "300", "--samples", "3", "--before", str(before),
                 "--json", str(out)]) == 0
    memory = json.loads(out.read_text())["results"]["memory"]
    for name in ("before: Worker, 1 thread", "before: Worker, asyncio x1"):
        assert memory[name]["jobs_per_s"] > 0 and math.isfinite(memory[name]["jobs_per_s"]), name
