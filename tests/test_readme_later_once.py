"""The README's "Later and once" example runs, on both implementations.

It shows a delayed publish, a keyed publish retried after a "crash",
``release`` and ``retry``, with the results it states (``assert``s): a
README that drifted from the code fails here.
"""

from __future__ import annotations

import re
import types
from pathlib import Path
from typing import Any

README = Path(__file__).resolve().parent.parent / "README.md"


def example() -> str:
    text = README.read_text(encoding="utf-8")
    section = text.split("## Later and once", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1, "the section has one Python example"
    return blocks[0]


def test_later_and_once_example_runs(impl: Any) -> None:
    code = example()
    for call in ("delay=", "key=", "dedup_window=", ".scheduled", ".due_at", "release(", "retry("):
        assert call in code, f"the example does not show {call}"
    assert "import leasequeue\n" in code
    namespace = {"leasequeue": types.SimpleNamespace(InMemoryTransport=impl.InMemoryTransport)}
    exec(compile(code.replace("import leasequeue\n", ""), str(README), "exec"), namespace)  # noqa: S102
    t = namespace["t"]
    # it ran to the end: "cancel" is leased again, as attempt 1
    assert [(m.event, m.attempt) for m in t.peek("order-17")] == [({"step": "cancel"}, 1)]
    assert t.group("order-17").state == "leased"


def test_a_drifted_example_fails(impl: Any) -> None:
    """The exec above really checks the README's results."""
    code = example().replace("== (\"scheduled\", 4600.0, 1)", "== (\"ready\", None, 0)")
    assert code != example()
    namespace = {"leasequeue": types.SimpleNamespace(InMemoryTransport=impl.InMemoryTransport)}
    try:
        exec(compile(code.replace("import leasequeue\n", ""), str(README), "exec"), namespace)  # noqa: S102
    except AssertionError:
        return
    raise AssertionError("a wrong result in the README example went unnoticed")
