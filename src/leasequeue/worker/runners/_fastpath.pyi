"""Type stub of the compiled fast path (``_fastpath.pyx``)."""

from typing import Any

def run(runner: Any, lease: Any, index: int) -> Any: ...
