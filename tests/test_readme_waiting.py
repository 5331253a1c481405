"""The README's two worker loops ("Waiting for work") run as written and end
on ``close()``, on both implementations."""

from __future__ import annotations

import re
import threading
from pathlib import Path
from types import ModuleType
from typing import Any, Dict, List

import pytest

import leasequeue

README = Path(__file__).resolve().parent.parent / "README.md"


def _blocks() -> List[str]:
    text = README.read_text(encoding="utf-8")
    section = text.split("## Waiting for work", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def _run(code: str, namespace: Dict[str, Any]) -> None:
    errors: List[BaseException] = []

    def target() -> None:
        try:
            exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 - the README's own example
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    th = threading.Thread(target=target, daemon=True)
    th.start()
    th.join(60)
    assert not th.is_alive(), "the README example did not end on close()"
    assert not errors, repr(errors[0])


def test_the_readme_has_a_thread_and_an_asyncio_worker_loop() -> None:
    blocks = _blocks()
    assert len(blocks) == 2
    assert "timeout=None" in blocks[0] and "t.close()" in blocks[0]
    assert "await t.aclaim(" in blocks[1] and "t.close()" in blocks[1]


def test_the_thread_worker_loop_ends_on_close(impl: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(leasequeue, "InMemoryTransport", impl.InMemoryTransport)
    handled: List[Any] = []
    code = _blocks()[0].replace("...", "while not handled: __import__('time').sleep(0.001)")
    ns: Dict[str, Any] = {"handle": handled.append, "handled": handled}
    _run(code, ns)
    assert handled == [{"step": "charge"}]
    assert not any(th.is_alive() for th in ns["threads"])
    assert len(ns["t"]) == 0


def test_the_asyncio_worker_loop_ends_on_close(impl: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(leasequeue, "InMemoryTransport", impl.InMemoryTransport)
    handled: List[Any] = []

    async def handle(event: Any) -> None:
        handled.append(event)

    code = _blocks()[1].replace("...", "while not handled: await asyncio.sleep(0.001)")
    _run(code, {"handle": handle, "handled": handled, "__name__": "readme"})
    assert handled == [{"step": "charge"}]
