"""The README's "Operating a transport" example runs, on both implementations.

Every call of the control plane and the batches is in it, with the results
it states (``assert``s): a README that drifted from the code fails here.
"""

from __future__ import annotations

import re
import types
from pathlib import Path
from typing import Any

README = Path(__file__).resolve().parent.parent / "README.md"


def example() -> str:
    text = README.read_text(encoding="utf-8")
    section = text.split("## Operating a transport", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1, "the section has one Python example"
    return blocks[0]


def test_operating_example_runs(impl: Any) -> None:
    code = example()
    for call in ("pause", "resume", "purge", "set_priority", "group(", "groups(", "stats()",
                 "publish_many", "claim_many", "ack_many", "bury(", "skip(", "peek(", ".buried", ".reason"):
        assert call in code, f"the example does not show {call}"
    assert "import leasequeue\n" in code
    # run it against this implementation
    namespace = {"leasequeue": types.SimpleNamespace(InMemoryTransport=impl.InMemoryTransport)}
    exec(compile(code.replace("import leasequeue\n", ""), str(README), "exec"), namespace)
    assert namespace["t"].groups()  # it ran to the end
