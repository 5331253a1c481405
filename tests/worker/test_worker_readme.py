"""The README's "Running workers" section runs as written: the thread worker
and the asyncio worker on both in-memory twins, the poison message on a real
SQLite file, and the operator command lines of its console block against
that file."""

from __future__ import annotations

import io
import re
import shlex
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any, Dict, List

import pytest

import leasequeue
from leasequeue.__main__ import build_parser, main

README = Path(__file__).resolve().parents[2] / "README.md"


def _section() -> str:
    text = README.read_text(encoding="utf-8")
    return text.split("## Running workers", 1)[1].split("\n## ", 1)[0]


def _blocks(kind: str = "python") -> List[str]:
    return re.findall(rf"```{kind}\n(.*?)```", _section(), re.S)


def _run(code: str) -> Dict[str, Any]:
    namespace: Dict[str, Any] = {"__name__": "readme"}
    errors: List[BaseException] = []

    def target() -> None:
        try:
            exec(compile(code, str(README), "exec"), namespace)  # noqa: S102 - the README's own example
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    th = threading.Thread(target=target, daemon=True)
    th.start()
    th.join(60)
    assert not th.is_alive(), "the README example did not end"
    if errors:
        raise errors[0]
    return namespace


def test_the_section_shows_what_the_issue_asks_for() -> None:
    blocks = _blocks()
    assert len(blocks) == 3
    assert "worker.run()" in blocks[0] and "Retry(" in blocks[0]
    assert "await worker.arun()" not in blocks[1] and "worker.arun()" in blocks[1]
    assert "SQLiteTransport" in blocks[2] and '"buried"' in blocks[2]
    console = _blocks("console")[0]
    assert "leasequeue worker " in console and " skip " in console and "--metrics-port" in console
    assert "metrics=True" in _section()


@pytest.mark.parametrize("index", [0, 1])
def test_the_in_memory_examples_run(impl: ModuleType, monkeypatch: pytest.MonkeyPatch, index: int) -> None:
    monkeypatch.setattr(leasequeue, "InMemoryTransport", impl.InMemoryTransport)
    made: List[Any] = []

    class Recorded(leasequeue.Worker):  # type: ignore[misc, name-defined]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(leasequeue, "Worker", Recorded)
    _run(_blocks()[index])
    assert len(made) == 1 and made[0].stopping
    assert made[0].counts["succeeded"] == 1 and type(made[0].transport) is impl.InMemoryTransport


def test_the_poison_example_and_the_operator_command_lines(capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    ns = _run(_blocks()[2])
    path = ns["path"]
    lines = [line[2:] for line in _blocks("console")[0].splitlines() if line.startswith("$ ")]
    worker_line = shlex.split(lines[0])
    assert worker_line[:2] == ["leasequeue", "worker"]
    args = build_parser().parse_args(worker_line[1:])  # the worker line parses as written
    assert args.target == "billing:charge" and args.concurrency == 8 and args.metrics_port == 9100
    outputs = []
    for line in lines[1:]:
        argv = [path if a == "queue.db" else a for a in shlex.split(line)]
        assert argv[0] == "leasequeue"
        monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))  # skip asks first: the operator answers y
        capsys.readouterr()
        assert main(argv[1:]) == 0, line
        captured = capsys.readouterr()
        outputs.append(captured.out)
        if " skip " in line and "--yes" not in argv:
            assert "[y/N]" in captured.err
    assert "order-17" in outputs[0] and "buried" in outputs[0]  # groups --state buried
    assert "'12,50'" in outputs[1] and "'3.00'" in outputs[1]   # peek -n 2, head first
    assert "skipped seq 1 of order-17" in outputs[2]
    t = leasequeue.SQLiteTransport(path)
    try:
        assert t.group("order-17").state == "ready" and [m.event for m in t.peek("order-17")] == [{"amount": "3.00"}]
    finally:
        t.close()
