"""The :class:`Worker` facade: it checks the options, owns ``stop()`` and
the counts, and hands the run to a runner (``runners/threads.py`` for
``run()``, ``runners/asyncio.py`` for ``arun()``)."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

from .._protocol import Transport
from ._checks import check_int, check_number, check_positive
from ._heartbeat import Heartbeat
from ._job import Job
from ._lifecycle import warn_signals_off_main
from ._metrics import PrometheusMiddleware
from ._middleware import Hook, HooksMiddleware, Middleware, acompose, check_middleware, compose, overrides
from ._record import Recorder
from ._retry import Retry
from ._task import Task, check_hooks, check_min_priority, is_async

__all__ = ["Worker"]


def _queue_label(transport: Any) -> str:
    for attr in ("queue", "_name"):
        value = getattr(transport, attr, None)
        if isinstance(value, str):
            return value
    path = getattr(transport, "path", None)
    if isinstance(path, str):
        return os.path.basename(path) or path
    return "memory"


class Worker:
    """Runs ``handler(job)`` for every message of ``transport``.

    ``run()`` runs a plain function on ``concurrency`` threads; ``arun()``
    runs an ``async def`` handler as asyncio tasks (``run()`` given an async
    handler runs ``arun()`` on a new event loop).  Both block until
    ``stop()`` (from any thread), SIGTERM/SIGINT (handlers installed only
    when called on the main thread) or ``transport.close()``.

    ``handler`` may be a :class:`~leasequeue.Task`: its ``retry``, ``hooks``,
    ``middleware`` and ``min_priority`` are the defaults of the options of
    the same names; a keyword given here wins.

    Options: ``visibility`` (lease seconds, > 0; the heartbeat extends held
    leases about every ``visibility / 3``), ``retry`` (a :class:`Retry`),
    ``drain_timeout`` (seconds running handlers get to finish at shutdown;
    ``inf``: wait for them), ``min_priority`` (the claim floor),
    ``worker_id`` (the leases' holder name; default ``host:pid``), ``name``
    (the logger is ``leasequeue.worker.NAME``), ``hooks`` (``{outcome:
    f(job, error)}``, an outcome one of ``started``, ``succeeded``,
    ``retried``, ``buried``, ``skipped``, ``lost``, ``handed_back``),
    ``middleware`` (:class:`~leasequeue.Middleware` instances, the first
    outermost), ``metrics`` (``True`` or a ``prometheus_client`` registry),
    ``batch`` (claim up to that many messages at once when several slots are
    free; with several slots on a durable transport, ``run()`` and
    ``arun()`` also ack finished jobs together, with one ``ack_many``, as
    soon as the last flush returns; 1 disables both), ``prefetch`` (on a
    durable transport: how many messages the worker may claim beyond its
    idle slots, to run as slots free up, held by the heartbeat and handed
    back uncounted at a stop; ``None``, the default, adapts it to the
    handlers: as many as the slots run in about 0.05 s at their average run
    time, up to ``batch``, so a prefetched message waits about that long
    and slow handlers prefetch nothing; ``0``: never, and one slot then
    acks each job with ``ack_and_claim``; ignored in memory), ``signals``
    (``None``: on the main thread only; ``True`` off the main thread warns
    at ``run()``: Python cannot install them there).

    Honest attempts (docs/contract.md, Part 5): a failure's backoff is ``nack(lease,
    delay)`` (it counts), a handler's :class:`RetryLater` is
    ``release(lease, delay)`` (it does not); both park the message and free
    the slot at once.  At shutdown, a message claimed but not started and an
    async handler cancelled by the shutdown are handed back with
    ``release(lease)``, so rolling restarts spend no retry budget and never
    trip the crash-loop rule.  A transport without ``release`` (a backend
    written before 0.6) gets ``nack`` for those hand-backs (they count as
    attempts there), and ``RetryLater`` keeps its lease and waits on its slot.

    A transport whose class says ``blocking = False`` (the in-memory twins)
    is called directly from ``arun()``'s event loop; any other's calls run
    on a small thread pool.
    """

    def __init__(
        self,
        transport: Transport,
        handler: Union[Callable[[Job], Any], Task],
        *,
        concurrency: int = 1,
        visibility: float = 30.0,
        retry: Optional[Retry] = None,
        drain_timeout: float = 30.0,
        min_priority: Optional[int] = None,
        worker_id: Optional[str] = None,
        name: Optional[str] = None,
        hooks: Optional[Dict[str, Hook]] = None,
        middleware: Union[Middleware, Sequence[Middleware], None] = None,
        metrics: Any = None,
        batch: int = 16,
        prefetch: Optional[int] = None,
        signals: Optional[bool] = None,
        queue: Optional[str] = None,
    ) -> None:
        for op in ("claim", "aclaim", "ack", "nack", "extend"):
            if not callable(getattr(transport, op, None)):
                raise TypeError(f"transport has no {op}(): a leasequeue transport is needed, not {transport!r}")
        task: Optional[Task] = handler if isinstance(handler, Task) else None
        if task is not None:
            handler = task.handler
            retry = task.retry if retry is None else retry
            hooks = task.hooks if hooks is None else hooks
            middleware = task.middleware if middleware is None else middleware
            min_priority = task.min_priority if min_priority is None else min_priority
        if not callable(handler):
            raise TypeError(f"handler must be callable, not {type(handler).__name__}")
        self.transport = transport
        self.handler: Callable[[Job], Any] = handler
        self.task = task
        self.is_async = is_async(handler)
        self.concurrency = check_int(concurrency, "concurrency", 1)
        self.visibility = check_positive(visibility, "visibility")
        if retry is None:
            retry = Retry()
        if not isinstance(retry, Retry):
            raise TypeError(f"retry must be a leasequeue.Retry, not {type(retry).__name__}")
        self.retry = retry
        self.drain_timeout = check_number(drain_timeout, "drain_timeout", finite=False)
        self.min_priority = 0 if min_priority is None else check_min_priority(min_priority)
        if worker_id is None:
            worker_id = f"{socket.gethostname()}:{os.getpid()}"
        if not isinstance(worker_id, str) or not worker_id:
            raise TypeError("worker_id must be a non-empty str")
        self.worker_id = worker_id
        if name is None:
            name = worker_id
        self.name = str(name)
        self.logger = logging.getLogger(f"leasequeue.worker.{self.name}")
        self.batch = check_int(batch, "batch", 1)
        if prefetch is not None and (isinstance(prefetch, bool) or not isinstance(prefetch, int)):
            raise TypeError(f"prefetch must be None (adaptive) or an int, not {type(prefetch).__name__}")
        self.prefetch: Optional[int] = None if prefetch is None else check_int(prefetch, "prefetch", 0)
        if signals is not None and not isinstance(signals, bool):
            raise TypeError("signals must be None, True or False")
        self._signals = signals
        self.queue = queue if queue is not None else _queue_label(transport)
        user = check_middleware(middleware if middleware is not None else ())
        self._hooks = HooksMiddleware(self.logger)
        for outcome, fn in check_hooks(hooks if hooks is not None else {}).items():
            self._hooks.add(outcome, fn[0])
        self._stopping = False
        self._forced = False
        self._started_run = False
        self._stop_event = threading.Event()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._wake: Optional[Callable[[], None]] = None  # wakes the runner on its loop
        # A declared capability (the in-memory twins: blocking = False), not a guess.
        self._inline = getattr(transport, "blocking", True) is False
        ack_and_claim = getattr(transport, "ack_and_claim", None)
        self._ack_and_claim: Optional[Callable[..., Any]] = ack_and_claim if callable(ack_and_claim) else None
        self._io: Any = None  # arun(): the thread pool for a blocking transport's calls
        self.heartbeat = Heartbeat(self, self.concurrency)
        self._recorder = Recorder(self, self.concurrency)
        self.metrics: Optional[PrometheusMiddleware] = None
        if metrics is not None and metrics is not False:
            self.metrics = PrometheusMiddleware(self, metrics)
        #: Every middleware, outermost first: metrics, hooks, then the user's.
        self.middleware: List[Middleware] = ([self.metrics] if self.metrics is not None else []) + [self._hooks] + user
        self._compose()

    def _compose(self) -> None:
        self._wrapping = any(overrides(m, "wrap") for m in self.middleware)
        self._awrapping = any(overrides(m, "awrap") for m in self.middleware)
        self._call: Callable[[Job], Any] = compose(self.middleware, self.handler)
        self._acall_handler: Callable[[Job], Any] = acompose(self.middleware, self.handler)
        observers = [m for m in self.middleware if not (m is self._hooks and not self._hooks.has(*self._hooks.hooks))]
        self._recorder.observe(observers)

    # ------------------------------------------------------------ public

    def on(self, outcome: str, hook: Hook) -> None:
        """Call ``hook(job, error)`` at each ``outcome`` (``started``, ``succeeded``,
        ``retried``, ``buried``, ``skipped``, ``lost`` or ``handed_back``).

        ``error`` is the handler's exception (``retried``, ``buried``,
        ``skipped``; ``succeeded`` when the handler raised after acking its
        job itself), the ``LeaseLost`` (``lost``), or ``None``.  Hooks run in
        the worker's threads (or on its loop): keep them short; an exception
        in a hook is logged and ignored.
        """
        self._hooks.add(outcome, hook)
        self._compose()

    @property
    def counts(self) -> Dict[str, int]:
        """How many jobs reached each outcome so far (a snapshot; also without metrics)."""
        return self._recorder.counts()

    @property
    def stopping(self) -> bool:
        """True once ``stop()`` was called, a signal came, or the transport closed."""
        return self._stopping

    def stop(self, force: bool = False) -> None:
        """Stop claiming now and drain (callable from any thread; idempotent).

        ``force=True`` (what a second signal does) returns from ``run()`` at
        once, leaving the leases of handlers still running to expire.
        """
        first = not self._stopping
        self._stopping = True
        self._stop_event.set()
        if force:
            self._forced = True
        if first:
            self.logger.info("stopping: no new claims; draining (up to %gs)", self.drain_timeout)
        elif force:
            self.logger.warning("forced stop: leaving the leases of running handlers to expire")
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            try:
                loop.call_soon_threadsafe(wake)
            except RuntimeError:
                pass  # the loop is closed: the runner has ended

    def run(self) -> None:
        """Run until stopped (threads; an ``async def`` handler runs :meth:`arun` on a new loop)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError("run() blocks its thread: from a running event loop use 'await worker.arun()' "
                               "(an async def handler), or call run() on another thread")
        self._begin()
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._run())
        finally:
            loop.close()

    async def arun(self) -> None:
        """Run an ``async def`` handler as tasks on the running loop until stopped."""
        if not self.is_async:
            raise TypeError("arun() runs an async def handler; for a plain function call run()")
        self._begin()
        await self._run()

    @property
    def forced(self) -> bool:
        """True when the last run ended by a forced stop (handlers may still have been running)."""
        return self._forced

    def serve_metrics(self, port: int, addr: str = "0.0.0.0") -> Any:
        """Serve ``/metrics`` over HTTP on ``port`` (a daemon thread); returns the server."""
        if self.metrics is None:
            raise RuntimeError("this worker has no metrics: Worker(..., metrics=True)")
        import prometheus_client as prom

        return prom.start_http_server(port, addr=addr, registry=self.metrics.registry)

    # ------------------------------------------------------------ machinery

    def _begin(self) -> None:
        if self._started_run:
            raise RuntimeError("a Worker runs once; make a new one")
        self._started_run = True
        warn_signals_off_main(self._signals, stacklevel=3)

    async def _run(self) -> None:
        if self.is_async:
            from .runners.asyncio import AsyncRunner

            runner: Any = AsyncRunner(self)
        else:
            from .runners.threads import ThreadRunner

            runner = ThreadRunner(self)
        started: List[Middleware] = []
        try:
            for m in self.middleware:
                if overrides(m, "on_start"):
                    m.on_start(self)
                started.append(m)
            await runner.run()
        finally:
            for m in reversed(started):
                if overrides(m, "on_stop"):
                    try:
                        m.on_stop(self)
                    except Exception:
                        self.logger.exception("middleware %r raised in on_stop (ignored)", m)
        self.logger.info("worker %s stopped%s: %s", self.worker_id, " (forced)" if self._forced else "",
                         ", ".join(f"{k} {v}" for k, v in self.counts.items()))

    async def _acall(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` where transport calls may block: directly for a
        non-blocking transport, else on the I/O pool (or the loop's default)."""
        if self._inline:
            return fn(*args)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._io, functools.partial(fn, *args))
