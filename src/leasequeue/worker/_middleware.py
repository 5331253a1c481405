"""Middleware: the seam for what cuts across every job (tracing, a time
limit, a context variable, metrics, the outcome hooks).

A :class:`Middleware` may wrap the handler (``wrap`` for the thread runner,
``awrap`` for asyncio), see every outcome (``on_outcome``), and the start
and stop of a run.  ``Worker(hooks={...})`` / ``worker.on(...)`` are a
:class:`HooksMiddleware`; ``Worker(metrics=...)`` is a
``PrometheusMiddleware`` (``_metrics.py``).
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Dict, List, Optional, Sequence

from ._retry import Outcome

if TYPE_CHECKING:
    from ._job import Job
    from ._worker import Worker

__all__ = ["OUTCOMES", "HooksMiddleware", "Middleware", "compose", "acompose", "check_middleware", "overrides"]

#: Every outcome a hook can be registered for (``Worker(hooks={...})``, ``Worker.on``).
OUTCOMES = tuple(o.value for o in Outcome)

Hook = Callable[["Job", Optional[BaseException]], Any]


class Middleware:
    """Subclass and override what you need; the defaults do nothing.

    - ``wrap(call_next, job)``: runs around the handler in the thread runner
      (``run()`` with a plain function): call ``call_next(job)`` to go on
      (to the next middleware, then the handler) and return its result.
      An exception it raises is the handler's error (the retry policy
      decides).  The first middleware given is the outermost.
    - ``awrap(call_next, job)``: the same for ``async def`` handlers
      (``await call_next(job)``).
    - ``on_outcome(job, outcome, error)``: every outcome of every job
      (``started``, ``succeeded``, ``retried``, ``buried``, ``skipped``,
      ``lost``, ``handed_back``: an :class:`~leasequeue.worker.Outcome`, a ``str``), on the
      thread or loop that reached it; ``error`` as for hooks.  An exception
      here is logged and ignored.
    - ``on_start(worker)`` / ``on_stop(worker)``: when ``run()``/``arun()``
      starts (before the first claim; an exception stops the run) and ends
      (logged and ignored).

    A middleware that overrides ``wrap`` takes the thread runner off its
    fast path (a few tenths of a microsecond per job in memory); one that
    only observes (``on_outcome``) keeps it.
    """

    def wrap(self, call_next: Callable[["Job"], Any], job: "Job") -> Any:
        return call_next(job)

    async def awrap(self, call_next: Callable[["Job"], Awaitable[Any]], job: "Job") -> Any:
        return await call_next(job)

    def on_outcome(self, job: "Job", outcome: Outcome, error: Optional[BaseException]) -> None:
        pass

    def on_start(self, worker: "Worker") -> None:
        pass

    def on_stop(self, worker: "Worker") -> None:
        pass


def overrides(middleware: Middleware, name: str) -> bool:
    """Whether ``middleware``'s class overrides :class:`Middleware`'s ``name``."""
    return getattr(type(middleware), name, None) is not getattr(Middleware, name)


def check_middleware(value: Any) -> List[Middleware]:
    if isinstance(value, Middleware):
        return [value]
    try:
        items = list(value)
    except TypeError:
        raise TypeError(f"middleware must be a Middleware or a sequence of them, not {type(value).__name__}") from None
    for m in items:
        if not isinstance(m, Middleware):
            raise TypeError(f"middleware must hold leasequeue.Middleware instances, not {type(m).__name__}")
    return items


def compose(middleware: Sequence[Middleware], handler: Callable[["Job"], Any]) -> Callable[["Job"], Any]:
    """The handler wrapped by every middleware that overrides ``wrap`` (the first outermost)."""
    call = handler
    for m in reversed(middleware):
        if overrides(m, "wrap"):
            call = functools.partial(m.wrap, call)
    return call


def acompose(middleware: Sequence[Middleware], handler: Callable[["Job"], Any]) -> Callable[["Job"], Any]:
    """The async handler wrapped by every middleware that overrides ``awrap``."""
    call = handler
    for m in reversed(middleware):
        if overrides(m, "awrap"):
            call = functools.partial(m.awrap, call)
    return call


class HooksMiddleware(Middleware):
    """``Worker(hooks={outcome: f})`` and ``worker.on(outcome, f)``: calls
    ``f(job, error)`` at each outcome; a hook that raises is logged and
    ignored (the others still run)."""

    def __init__(self, logger: Optional[logging.Logger] = None) -> None:
        self.logger = logger if logger is not None else logging.getLogger("leasequeue.worker")
        self.hooks: Dict[str, List[Hook]] = {o: [] for o in OUTCOMES}

    def add(self, outcome: str, hook: Hook) -> None:
        if outcome not in self.hooks:
            raise ValueError(f"unknown outcome {outcome!r}: one of {', '.join(OUTCOMES)}")
        if not callable(hook):
            raise TypeError(f"hook must be callable, not {type(hook).__name__}")
        self.hooks[outcome].append(hook)

    def has(self, *outcomes: str) -> bool:
        return any(self.hooks[o] for o in outcomes)

    def on_outcome(self, job: "Job", outcome: Outcome, error: Optional[BaseException]) -> None:
        for hook in self.hooks[outcome.value]:
            try:
                hook(job, error)
            except Exception:
                self.logger.exception("the %s hook raised (ignored)", outcome.value)
