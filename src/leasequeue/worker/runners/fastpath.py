"""Which fast path the thread runner runs: the compiled one or ``ThreadRunner.fast``.

``COMPILED`` is ``_fastpath.run`` (Cython: the fast path's loop in C) when
that extension was built and imports, else ``None``: the thread runner then
runs ``ThreadRunner.fast``, the pure-Python loop with the same behaviour.
``LEASEQUEUE_NO_EXTENSIONS=1`` forces ``None``, as it forces the pure
in-memory twin.  An extension that is there but fails to import falls back
with a ``RuntimeWarning`` (as the transport's selector does); a pure install
falls back quietly.

A slot reads ``COMPILED`` when it starts: the tests set it to ``None`` to
run the pure loop in a build that has both.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

__all__ = ["COMPILED"]

#: ``_fastpath.run(runner, lease, index)``, or ``None``: the pure ``ThreadRunner.fast``.
COMPILED: Optional[Callable[[Any, Any, int], Any]] = None

if not os.environ.get("LEASEQUEUE_NO_EXTENSIONS"):
    try:
        from ._fastpath import run as _run
    except ImportError as exc:
        if not (isinstance(exc, ModuleNotFoundError) and exc.name == f"{__package__}._fastpath"):
            import warnings

            warnings.warn(
                f"leasequeue: the compiled fast path failed to import ({exc}); "
                "using the slower pure-Python one",
                RuntimeWarning,
                stacklevel=2,
            )
    else:
        COMPILED = _run
