"""The worker runtime: :class:`Worker`, :class:`Retry` and the :class:`Job` a handler gets.

What every user otherwise writes around a transport (the contract, docs/contract.md, Part 4, "The
worker"): a claim loop that waits instead of polling, one heartbeat for all
the leases a worker holds, a retry policy that keeps a group's order, crash
loop detection, graceful shutdown, outcome hooks, logging and optional
Prometheus metrics.

How it runs (both runners share the job, retry and outcome code below):

- ``run()`` (plain functions, threads): ``concurrency`` slot threads run the
  handlers.  A slot that finishes a job claims the next one itself without
  waiting (no hand-off while there is work); a slot that finds nothing goes
  idle.  While a slot is idle, one claimer waits in ``aclaim`` on a private
  asyncio loop in the thread that called ``run()``; a cancelled ``aclaim``
  leaves nothing leased, so ``stop()`` takes effect at once and charges no
  attempt.  One heartbeat thread extends every held lease.
- ``arun()`` (``async def`` handlers): the same on the running loop, one task
  per job up to ``concurrency``, and a heartbeat task.  Transport calls of a
  durable backend (which do I/O) run on a small thread pool so they do not
  block the loop; the in-memory transport's are called directly.

The worker is typed against the transport's operations only (``Any`` until
``leasequeue.Transport`` lands), so it works over every backend.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import math
import os
import queue as _queue
import random
import signal
import socket
import threading
import time
import warnings
from typing import Any, Callable, Dict, List, Optional, Set, Tuple, Type, Union

from ._errors import LeaseLost
from ._protocol import Transport
from ._serializers import EventDecodeError

__all__ = ["OUTCOMES", "CrashLoop", "Job", "Retry", "RetryLater", "Worker"]

#: Every outcome a hook can be registered for (``Worker(hooks={...})``, ``Worker.on``).
OUTCOMES = ("started", "succeeded", "retried", "buried", "skipped", "lost", "handed_back")

_INDEX = {o: i for i, o in enumerate(OUTCOMES)}

#: A bury reason is kept with the group: bounded.
_MAX_REASON = 500

#: What a runner's waiting claim returns to leave its claim loop.
_STOP = object()

# The actions a finished run of a handler leads to.  _DEFER: RetryLater,
# ``release(lease, delay)``; _HANDBACK: a message handed back at shutdown,
# ``release(lease, delay)`` (both ``nack`` on a transport without ``release``);
# _RETURN: a handler that raised SystemExit or KeyboardInterrupt, ``nack(lease)``
# (it ran: its delivery counts).
_ACK, _RETRY, _DEFER, _BURY, _SKIP, _HANDBACK, _RETURN = range(7)

# Job._acked: the handler acked (it stands), or acked on its own connection
# (it stands if the application's transaction commits).
_ACKED, _ACKED_IN_TX = 1, 2

# Transports whose calls never block beyond a lock (the in-memory twins,
# leasequeue._backends.inmemory.*): called directly from the event loop.


def _is_inline(transport: Any) -> bool:
    module = getattr(type(transport), "__module__", "") or ""
    return module.startswith("leasequeue._backends.inmemory.")



def _check_number(value: Any, name: str, *, minimum: float = 0.0, finite: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, not {type(value).__name__}")
    value = float(value)
    if math.isnan(value) or value < minimum:
        raise ValueError(f"{name} must be >= {minimum:g}, not {value!r}")
    if finite and math.isinf(value):
        raise ValueError(f"{name} must be finite, not {value!r}")
    return value


def _check_positive(value: Any, name: str) -> float:
    """A finite number > 0 (one message for 0, a negative number, NaN and inf)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, not {type(value).__name__}")
    value = float(value)
    if not (0.0 < value < math.inf):
        raise ValueError(f"{name} must be > 0 and finite, not {value!r}")
    return value


def _check_int(value: Any, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, not {value!r}")
    return value


def _check_exceptions(value: Any, name: str) -> Tuple[Type[BaseException], ...]:
    if isinstance(value, type):
        value = (value,)
    try:
        types = tuple(value)
    except TypeError:
        raise TypeError(f"{name} must be an exception class or a tuple of them, not {value!r}") from None
    for t in types:
        if not (isinstance(t, type) and issubclass(t, BaseException)):
            raise TypeError(f"{name} must hold exception classes, not {t!r}")
    return types


class RetryLater(Exception):
    """Raise from a handler to run it again after ``delay`` seconds, without
    counting a failure (a rate limit, a resource not ready yet).

    The worker hands the message back with ``transport.release(lease,
    delay)``: it is parked at its group's head for ``delay`` seconds (the
    group's later messages wait behind it, in order; other groups go on),
    the worker's slot is free at once, and the next delivery (to this worker
    or another) carries the same ``attempt``: ``max_attempts`` is not used up.

    On a transport without ``release`` (a backend written before 0.6) the
    worker keeps the lease (its heartbeat extends it) and runs the handler
    again on the same slot after the delay, as before 0.6: a ``nack`` would
    count the wait as a failed attempt.
    """

    def __init__(self, delay: float, reason: str = "") -> None:
        self.delay = _check_number(delay, "delay")
        self.reason = reason
        super().__init__(delay, reason)

    def __str__(self) -> str:
        return f"retry in {self.delay:g} s" + (f": {self.reason}" if self.reason else "")


class CrashLoop(Exception):
    """The error reported with a message buried unrun because it was claimed
    with ``attempt > max_attempts``: its attempt is beyond the retry budget.

    What the worker knows is only that number: its earlier deliveries
    failed, were buried (and the group resumed), or ended without an
    outcome (a crash, a hang past the lease, a lost connection).  Hand-backs
    at a graceful shutdown and ``RetryLater`` use ``release`` and do not
    count.  ``leasequeue queue retry G`` (``transport.retry``) gives the
    message a fresh budget; ``resume`` does not (the worker buries it again).
    """


class Retry:
    """The retry policy: when a handler raises, retry or give up, and how.

    - ``max_attempts``: deliveries a message gets (>= 1).  A handler that
      raises on attempt ``max_attempts`` exhausts it; a message claimed with
      ``attempt > max_attempts`` (its earlier deliveries failed, were buried,
      or ended without an outcome: a crash, a hang past the lease, a lost
      connection) is buried without running (the bury reason is a ``CrashLoop``).
    - ``backoff``, ``factor``, ``max_delay``, ``jitter``: the delay before the
      next delivery after failed attempt ``n`` is ``backoff * factor ** (n - 1)``,
      capped at ``max_delay``, times a random factor in ``[1 - jitter, 1 + jitter]``
      (and capped again).  The message is parked at its group's head
      (``nack(delay)``), so the rest of the group waits behind it, in order,
      and other groups go on.
    - ``retry_on``: the exception classes that are retried (default:
      ``Exception``); ``give_up_on``: classes never retried (checked first).
      Any other error exhausts the message at once.
    - ``exhausted``: what happens then.  ``"bury"`` (the default): the group is
      quarantined (``bury``) with a reason naming the error and the attempt;
      an operator retries it (``retry``: a fresh budget) or skips it.
      ``"skip"``: the message is handed to ``dead_letter(job, error)`` and
      then acked; the group goes on.  A
      callable ``f(job, error)``: its return value decides: ``"bury"``,
      ``"skip"`` (or ``None``: acked), or a number: retry after that many
      seconds.  A callable that raises buries the group.
    """

    __slots__ = ("max_attempts", "backoff", "factor", "max_delay", "jitter", "retry_on", "give_up_on",
                 "exhausted", "dead_letter", "_random")

    def __init__(
        self,
        max_attempts: int = 5,
        backoff: float = 1.0,
        factor: float = 2.0,
        max_delay: float = 300.0,
        jitter: float = 0.1,
        *,
        retry_on: Any = (Exception,),
        give_up_on: Any = (),
        exhausted: Union[str, Callable[["Job", BaseException], Any]] = "bury",
        dead_letter: Optional[Callable[["Job", BaseException], Any]] = None,
    ) -> None:
        self.max_attempts = _check_int(max_attempts, "max_attempts", 1)
        self.backoff = _check_number(backoff, "backoff")
        self.factor = _check_number(factor, "factor", minimum=1.0)
        self.max_delay = _check_number(max_delay, "max_delay")
        self.jitter = _check_number(jitter, "jitter")
        if self.jitter > 1.0:
            raise ValueError(f"jitter must be between 0 and 1, not {jitter!r}")
        self.retry_on = _check_exceptions(retry_on, "retry_on")
        self.give_up_on = _check_exceptions(give_up_on, "give_up_on")
        if not callable(exhausted) and exhausted not in ("bury", "skip"):
            raise ValueError(f"exhausted must be 'bury', 'skip' or a callable, not {exhausted!r}")
        if dead_letter is not None and not callable(dead_letter):
            raise TypeError(f"dead_letter must be callable, not {type(dead_letter).__name__}")
        if dead_letter is not None and exhausted != "skip":
            raise ValueError("dead_letter is called only with exhausted='skip'")
        if exhausted == "skip" and dead_letter is None:
            warnings.warn("Retry(exhausted='skip') without dead_letter drops exhausted messages (acked, with "
                          "only a log line); pass dead_letter=f to keep them", UserWarning, stacklevel=2)
        self.exhausted = exhausted
        self.dead_letter = dead_letter
        self._random = random.Random()

    def delay(self, attempt: int) -> float:
        """Seconds to park a message after its failed attempt ``attempt``."""
        try:
            base = self.backoff * self.factor ** (max(attempt, 1) - 1)
        except OverflowError:
            base = math.inf
        base = min(base, self.max_delay)
        if self.jitter:
            base *= 1.0 + self.jitter * (2.0 * self._random.random() - 1.0)
        return min(max(base, 0.0), self.max_delay)

    def retryable(self, error: BaseException) -> bool:
        """Whether ``error`` may be retried at all (before counting attempts)."""
        if self.give_up_on and isinstance(error, self.give_up_on):
            return False
        return isinstance(error, self.retry_on)

    def __repr__(self) -> str:
        return (f"Retry(max_attempts={self.max_attempts}, backoff={self.backoff:g}, factor={self.factor:g}, "
                f"max_delay={self.max_delay:g}, jitter={self.jitter:g}, exhausted={self.exhausted!r})")


class Job:
    """What a handler gets: one delivery of one message.

    ``event``, ``group_id``, ``seq``, ``attempt`` (1 on the first delivery)
    come from the lease; ``lease`` is the current lease (the heartbeat
    replaces it as it extends it); ``lost`` becomes ``True`` when the lease
    was lost (the group was purged, or the lease ran out and another worker
    took the message): stop work, the outcome will not be recorded.
    ``worker`` is the :class:`Worker`; ``transport`` its transport.

    A handler may settle its delivery itself with :meth:`ack` (``conn=``:
    inside its own database transaction, with its work); the worker then
    records ``succeeded`` and leaves that ack alone.
    """

    __slots__ = ("lease", "lost", "worker", "_finished", "_task", "_acked")

    def __init__(self, worker: "Worker", lease: Any) -> None:
        self.worker = worker
        self.lease = lease
        self.lost = False
        self._finished = False
        self._task: Optional["asyncio.Task[Any]"] = None
        #: 0: not acked by the handler; _ACKED: acked (it stands); _ACKED_IN_TX:
        #: acked on the application's connection (it stands if that transaction commits).
        self._acked = 0

    def ack(self, conn: Any = None) -> None:
        """Ack this delivery now, from the handler: ``transport.ack(lease)``,
        or ``transport.ack(lease, conn=conn)`` on the application's own
        database connection (a durable transport; the ack is then part of the
        transaction the application holds on ``conn``, and takes effect when
        it commits).  The worker records the job as ``succeeded`` and does not
        ack it again.

        Raises what the transport's ``ack`` raises (``LeaseLost``: the lease
        is not current; nothing is recorded, the job is not marked acked),
        ``RuntimeError`` if this job was already acked or its outcome was
        already recorded.  If the handler raises after a plain ``ack()``, the
        ack stands: the worker logs the error and records ``succeeded``
        (the ``succeeded`` hooks get the error).  After ``ack(conn=...)``, the
        worker cannot know whether that transaction committed: it records the
        failure as usual (retry, bury, ...) and, when the transport answers
        ``LeaseLost`` because the ack did commit, ``succeeded`` as above.
        """
        self._check_ackable()
        lease = self.lease
        if conn is None:
            self.worker.transport.ack(lease)
            self._acked = _ACKED
        else:
            self.worker.transport.ack(lease, conn=conn)
            self._acked = _ACKED_IN_TX

    async def aack(self, conn: Any = None) -> None:
        """:meth:`ack` for an ``async def`` handler: ``transport.aack(lease,
        conn=conn)`` when the transport has ``aack`` (PostgreSQL: ``conn`` an
        ``AsyncConnection``), else ``ack`` off the event loop (in memory: a
        plain call)."""
        self._check_ackable()
        t = self.worker.transport
        lease = self.lease
        aack = getattr(t, "aack", None)
        if aack is not None:
            await (aack(lease) if conn is None else aack(lease, conn=conn))
        elif conn is None:
            await self.worker._acall(t.ack, lease)
        else:
            await self.worker._acall(functools.partial(t.ack, lease, conn=conn))
        self._acked = _ACKED if conn is None else _ACKED_IN_TX

    def _check_ackable(self) -> None:
        if self._acked:
            raise RuntimeError(f"{self!r} was already acked")
        if self._finished:
            raise RuntimeError(f"{self!r}: the worker has already recorded its outcome")

    @property
    def acked(self) -> bool:
        """True once the handler acked this delivery itself (:meth:`ack`)."""
        return self._acked != 0

    @property
    def event(self) -> Any:
        return self.lease.event

    @property
    def group_id(self) -> str:
        return self.lease.group_id

    @property
    def seq(self) -> int:
        return self.lease.seq

    @property
    def attempt(self) -> int:
        """1 on a message's first delivery, +1 at each later one."""
        return self.lease.attempt

    @property
    def transport(self) -> Any:
        return self.worker.transport

    @property
    def worker_id(self) -> str:
        return str(self.lease.worker_id)

    def __repr__(self) -> str:
        lost = " lost" if self.lost else ""
        return f"<Job group_id={self.group_id!r} seq={self.seq} attempt={self.attempt}{lost}>"


def _is_async(handler: Any) -> bool:
    if inspect.iscoroutinefunction(handler):
        return True
    call = getattr(handler, "__call__", None)  # noqa: B004 - an object with an async __call__
    return call is not None and inspect.iscoroutinefunction(call)


def _error_name(error: BaseException) -> str:
    text = str(error)
    name = type(error).__qualname__
    return f"{name}: {text}" if text else name


def _queue_label(transport: Any) -> str:
    for attr in ("queue", "_name"):
        value = getattr(transport, attr, None)
        if isinstance(value, str):
            return value
    path = getattr(transport, "path", None)
    if isinstance(path, str):
        return os.path.basename(path) or path
    return "memory"


class _Metrics:
    """The Prometheus metrics of one worker (``prometheus_client``, the ``metrics`` extra)."""

    def __init__(self, worker: "Worker", registry: Any) -> None:
        try:
            import prometheus_client as prom
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError(
                "Worker(metrics=...) needs prometheus_client: pip install 'leasequeue[metrics]'"
            ) from exc
        if registry is True:
            registry = prom.CollectorRegistry()
        self.registry = registry
        q = worker.queue
        self.jobs = prom.Counter("leasequeue_worker_jobs", "Job outcomes (started, succeeded, retried, "
                                 "buried, skipped, lost, handed_back)", ["queue", "outcome"], registry=registry)
        self.outcome = {o: self.jobs.labels(queue=q, outcome=o) for o in OUTCOMES}
        self.duration = prom.Histogram("leasequeue_worker_handler_seconds", "Handler run time in seconds",
                                       ["queue"], registry=registry).labels(queue=q)
        self.in_flight = prom.Gauge("leasequeue_worker_jobs_in_flight", "Jobs held by the worker",
                                    ["queue"], registry=registry).labels(queue=q)
        self.in_flight.set_function(lambda: len(worker._held) + sum(j is not None for j in worker._current))
        transport = worker.transport

        def buried() -> float:
            try:
                return float(getattr(transport.stats(), "buried", 0))
            except Exception:
                return math.nan

        self.buried = prom.Gauge("leasequeue_buried_groups", "Groups buried (quarantined) in the queue",
                                 ["queue"], registry=registry).labels(queue=q)
        self.buried.set_function(buried)


class Worker:
    """Runs ``handler(job)`` for every message of ``transport``.

    ``run()`` runs a plain function on ``concurrency`` threads; ``arun()``
    runs an ``async def`` handler as asyncio tasks (``run()`` given an async
    handler runs ``arun()`` on a new event loop).  Both block until
    ``stop()`` (from any thread), SIGTERM/SIGINT (handlers installed only
    when called on the main thread) or ``transport.close()``.

    Options: ``visibility`` (lease seconds; the heartbeat extends held
    leases about every ``visibility / 3``), ``retry`` (a :class:`Retry`),
    ``drain_timeout`` (seconds running handlers get to finish at shutdown),
    ``min_priority`` (the claim floor), ``worker_id`` (the leases' holder name;
    default ``host:pid``), ``name`` (the logger is ``leasequeue.worker.NAME``),
    ``hooks`` (``{outcome: f(job, error)}``, an outcome one of ``started``,
    ``succeeded``, ``retried``, ``buried``, ``skipped``, ``lost``, ``handed_back``),
    ``metrics`` (``True`` or a ``prometheus_client`` registry),
    ``batch`` (claim up to that many messages at once when several slots are
    free; 1 disables), ``signals`` (``None``: on the main thread only).

    Honest attempts (docs/contract.md, Part 5): a failure's backoff is ``nack(lease,
    delay)`` (it counts), a handler's :class:`RetryLater` is
    ``release(lease, delay)`` (it does not); both park the message and free
    the slot at once.  At shutdown, a message claimed but not started and an
    async handler cancelled by the shutdown are handed back with
    ``release(lease)``, so rolling restarts spend no retry budget and never
    trip the crash-loop rule.  A transport without ``release`` (a backend
    written before 0.6) gets ``nack`` for those hand-backs (they count as
    attempts there), and ``RetryLater`` keeps its lease and waits on its slot.
    """

    def __init__(
        self,
        transport: Transport,
        handler: Callable[[Job], Any],
        *,
        concurrency: int = 1,
        visibility: float = 30.0,
        retry: Optional[Retry] = None,
        drain_timeout: float = 30.0,
        min_priority: int = 0,
        worker_id: Optional[str] = None,
        name: Optional[str] = None,
        hooks: Optional[Dict[str, Callable[[Job, Optional[BaseException]], Any]]] = None,
        metrics: Any = None,
        batch: int = 16,
        signals: Optional[bool] = None,
        queue: Optional[str] = None,
    ) -> None:
        for op in ("claim", "aclaim", "ack", "nack", "extend"):
            if not callable(getattr(transport, op, None)):
                raise TypeError(f"transport has no {op}(): a leasequeue transport is needed, not {transport!r}")
        if not callable(handler):
            raise TypeError(f"handler must be callable, not {type(handler).__name__}")
        self.transport = transport
        self.handler = handler
        self.is_async = _is_async(handler)
        self.concurrency = _check_int(concurrency, "concurrency", 1)
        self.visibility = _check_positive(visibility, "visibility")
        if retry is None:
            retry = Retry()
        if not isinstance(retry, Retry):
            raise TypeError(f"retry must be a leasequeue.Retry, not {type(retry).__name__}")
        self.retry = retry
        self.drain_timeout = _check_number(drain_timeout, "drain_timeout", finite=False)
        if isinstance(min_priority, bool) or not isinstance(min_priority, int):
            raise TypeError(f"min_priority must be an int, not {type(min_priority).__name__}")
        self.min_priority = min_priority
        if worker_id is None:
            worker_id = f"{socket.gethostname()}:{os.getpid()}"
        if not isinstance(worker_id, str) or not worker_id:
            raise TypeError("worker_id must be a non-empty str")
        self.worker_id = worker_id
        if name is None:
            name = worker_id
        self.name = str(name)
        self.logger = logging.getLogger(f"leasequeue.worker.{self.name}")
        self.batch = _check_int(batch, "batch", 1)
        if signals is not None and not isinstance(signals, bool):
            raise TypeError("signals must be None, True or False")
        self._signals = signals
        self.queue = queue if queue is not None else _queue_label(transport)
        self._hooks: Dict[str, List[Callable[[Job, Optional[BaseException]], Any]]] = {o: [] for o in OUTCOMES}
        for outcome, fn in (hooks or {}).items():
            self.on(outcome, fn)
        self._held: Set[Job] = set()
        self._stopping = False
        self._forced = False
        self._started_run = False
        self._stop_event = threading.Event()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._wake: Optional[Callable[[], None]] = None  # wakes the runner on its loop
        self._inline = _is_inline(transport)
        # Part 5: hand-backs and RetryLater do not count (a user's older backend: nack, see _give_back).
        release = getattr(transport, "release", None)
        self._release: Optional[Callable[..., None]] = release if callable(release) else None
        self._io: Any = None  # arun(): the thread pool for a durable transport's calls
        self._interval = self.visibility / 3.0
        self.metrics: Optional[_Metrics] = None
        if metrics is not None and metrics is not False:
            self.metrics = _Metrics(self, metrics)
        self._count_lock = threading.Lock()
        self._shared_counts = [0] * len(OUTCOMES)
        self._slot_counts = [[0] * len(OUTCOMES) for _ in range(self.concurrency)]
        self._current: List[Optional[Job]] = [None] * self.concurrency  # the thread slots' jobs

    # ------------------------------------------------------------ public

    def on(self, outcome: str, hook: Callable[[Job, Optional[BaseException]], Any]) -> None:
        """Call ``hook(job, error)`` at each ``outcome`` (``started``, ``succeeded``,
        ``retried``, ``buried``, ``skipped``, ``lost`` or ``handed_back``).

        ``error`` is the handler's exception (``retried``, ``buried``,
        ``skipped``), the ``LeaseLost`` (``lost``), or ``None``.  Hooks run in
        the worker's threads (or on its loop): keep them short; an exception
        in a hook is logged and ignored.
        """
        if outcome not in self._hooks:
            raise ValueError(f"unknown outcome {outcome!r}: one of {', '.join(OUTCOMES)}")
        if not callable(hook):
            raise TypeError(f"hook must be callable, not {type(hook).__name__}")
        self._hooks[outcome].append(hook)

    @property
    def counts(self) -> Dict[str, int]:
        """How many jobs reached each outcome so far (a snapshot; also without metrics)."""
        totals = list(self._shared_counts)
        for counts in self._slot_counts:
            for i, n in enumerate(counts):
                totals[i] += n
        return dict(zip(OUTCOMES, totals))

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
            if self.is_async:
                loop.run_until_complete(self._arun())
            else:
                loop.run_until_complete(self._run_threads())
        finally:
            loop.close()

    async def arun(self) -> None:
        """Run an ``async def`` handler as tasks on the running loop until stopped."""
        if not self.is_async:
            raise TypeError("arun() runs an async def handler; for a plain function call run()")
        self._begin()
        await self._arun()

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

    # ------------------------------------------------------------ shared machinery

    def _begin(self) -> None:
        if self._started_run:
            raise RuntimeError("a Worker runs once; make a new one")
        self._started_run = True
        if self._signals and threading.current_thread() is not threading.main_thread():
            warnings.warn("Worker(signals=True) runs off the main thread, where Python cannot install signal "
                          "handlers: SIGTERM/SIGINT will not stop it; stop it with worker.stop() (see docs/worker.md, "
                          "'A worker inside an application')", RuntimeWarning, stacklevel=3)

    def _emit(self, outcome: str, job: Job, error: Optional[BaseException], slot: int = -1) -> None:
        if slot >= 0:
            self._slot_counts[slot][_INDEX[outcome]] += 1  # only that slot's thread writes it
        else:
            with self._count_lock:
                self._shared_counts[_INDEX[outcome]] += 1
        m = self.metrics
        if m is not None:
            m.outcome[outcome].inc()
        for hook in self._hooks[outcome]:
            try:
                hook(job, error)
            except Exception:
                self.logger.exception("the %s hook raised (ignored)", outcome)

    def _decide(self, job: Job, error: Optional[BaseException]) -> Tuple[int, Any]:
        """The action for a finished run: (action, delay or reason)."""
        if error is None:
            return _ACK, None
        if isinstance(error, RetryLater):
            return _DEFER, error.delay
        retry = self.retry
        if retry.retryable(error) and job.attempt < retry.max_attempts:
            return _RETRY, retry.delay(job.attempt)
        exhausted = retry.exhausted
        if exhausted == "skip":
            return _SKIP, None
        if exhausted == "bury":
            return _BURY, self._reason(job, error)
        try:
            decision = exhausted(job, error)  # type: ignore[operator]
        except Exception as exc:
            self.logger.exception("the exhausted callable raised: burying group %r", job.group_id)
            return _BURY, self._reason(job, error) + f"; exhausted callable raised {_error_name(exc)}"
        if decision is None or decision == "skip":
            return _SKIP, None
        if decision == "bury":
            return _BURY, self._reason(job, error)
        if not isinstance(decision, bool) and isinstance(decision, (int, float)) and decision >= 0:
            return _RETRY, float(decision)
        self.logger.error("the exhausted callable returned %r (not 'bury', 'skip', None or a delay): burying",
                          decision)
        return _BURY, self._reason(job, error)

    def _reason(self, job: Job, error: BaseException) -> str:
        text = f"{_error_name(error)} (attempt {job.attempt} of {self.retry.max_attempts})"
        return text if len(text) <= _MAX_REASON else text[: _MAX_REASON - 1] + "…"

    def _crash_loop(self, job: Job) -> Tuple[str, CrashLoop]:
        error = CrashLoop(
            f"attempt {job.attempt} is beyond the budget of max_attempts {self.retry.max_attempts}: earlier "
            "deliveries failed, were buried, or ended without an outcome (such as a crash, a hang past the lease "
            "or a lost connection)"
        )
        return f"not run: {error}; 'retry' gives it a fresh budget", error

    def _apply(self, job: Job, action: int, arg: Any, error: Optional[BaseException], slot: int = -1) -> None:
        """Record the outcome with the transport (sync: called from a slot
        thread, the loop, or the I/O pool)."""
        acked = job._acked
        if acked:
            if action == _ACK:  # the handler acked: leave that ack alone
                self._emit("succeeded", job, None, slot)
                return
            if acked == _ACKED:
                self._acked_then_failed(job, error, slot)
                return
        t = self.transport
        lease = job.lease
        try:
            if action == _ACK:
                t.ack(lease)
                self._emit("succeeded", job, None, slot)
            elif action == _RETRY:
                t.nack(lease, arg)
                self.logger.info("job %r seq %d attempt %d failed (%s): retry in %.3gs", job.group_id, job.seq,
                                 job.attempt, _error_name(error) if error else "", arg)
                self._emit("retried", job, error, slot)
            elif action == _BURY:
                t.bury(lease, arg)
                self.logger.warning("group %r buried at seq %d: %s", job.group_id, job.seq, arg,
                                    exc_info=error if not isinstance(error, (CrashLoop, EventDecodeError)) else None)
                self._emit("buried", job, error, slot)
            elif action == _SKIP:
                dead_letter = self.retry.dead_letter
                if dead_letter is not None and error is not None:
                    try:
                        dead_letter(job, error)
                    except Exception as exc:
                        reason = self._reason(job, error) + f"; dead_letter raised {_error_name(exc)}"
                        self.logger.exception("dead_letter raised: burying group %r", job.group_id)
                        t.bury(lease, reason[:_MAX_REASON])
                        self._emit("buried", job, error, slot)
                        return
                t.ack(lease)
                self.logger.warning("job %r seq %d skipped after attempt %d (%s)", job.group_id, job.seq,
                                    job.attempt, _error_name(error) if error else "")
                self._emit("skipped", job, error, slot)
            elif action == _DEFER:
                t.release(lease, arg)
                self.logger.info("job %r seq %d attempt %d asked to run again in %.3gs (%s)", job.group_id,
                                 job.seq, job.attempt, arg, error)
                self._emit("retried", job, error, slot)
            elif action == _HANDBACK:
                self._give_back(lease, arg or 0.0)
                self._emit("handed_back", job, None, slot)
            else:  # _RETURN
                t.nack(lease, 0.0)
                self._emit("handed_back", job, None, slot)
        except Exception as exc:
            if acked and isinstance(exc, LeaseLost):
                self._acked_then_failed(job, error, slot)  # the handler's transaction committed its ack
            else:
                self._failed(job, exc)

    def _acked_then_failed(self, job: Job, error: Optional[BaseException], slot: int) -> None:
        """The handler acked its delivery (``job.ack``), then raised: the ack
        stands, so the job succeeded; the error is logged and given to the
        ``succeeded`` hooks."""
        self.logger.error("job %r seq %d attempt %d raised after its handler acked it (%s): the ack stands",
                          job.group_id, job.seq, job.attempt, _error_name(error) if error else "handed back",
                          exc_info=error if isinstance(error, Exception) else None)
        self._emit("succeeded", job, error, slot)

    def _undecodable(self, exc: EventDecodeError, slot: int = -1) -> None:
        """A claim raised ``EventDecodeError``: a poison message like any
        other (docs/contract.md, Part 5, "Operating it").  Its group is buried
        with the decode error as the reason (counted and hooked as
        ``buried``; never run, never claimed again in a loop).  The other
        leases of a ``claim_many`` batch are handed back uncounted
        (``release``): the next claim serves them (any other undecodable one
        is buried then)."""
        bad = exc.lease
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        reason = f"undecodable event: {_error_name(cause)} (attempt {bad.attempt})"
        if len(reason) > _MAX_REASON:
            reason = reason[: _MAX_REASON - 1] + "…"
        job = Job(self, bad)
        job._finished = True
        self._apply(job, _BURY, reason, exc, slot)
        for lease in exc.leases:
            if lease is not bad:
                self._handback(lease)

    def _give_back(self, lease: Any, delay: float) -> None:
        """Hand a delivery back uncounted (``release``), or with ``nack`` on a
        transport without ``release`` (then it counts as an attempt)."""
        release = self._release
        if release is not None:
            release(lease, delay)
        else:
            self.transport.nack(lease, delay)

    def _failed(self, job: Job, exc: Exception) -> None:
        """Recording an outcome raised: the lease was lost, or the transport
        failed (closed, database down) and the lease will expire."""
        if not isinstance(exc, LeaseLost):
            self.logger.error("job %r seq %d: recording the outcome failed (%s); its lease will expire",
                              job.group_id, job.seq, _error_name(exc))
        self._lost(job, exc)

    def _lost(self, job: Job, error: BaseException) -> None:
        if job.lost:
            return
        job.lost = True
        self.logger.warning("job %r seq %d lost its lease (%s): neither acked nor nacked", job.group_id,
                            job.seq, _error_name(error))
        task = job._task
        if task is not None and not job._finished:
            loop = self._loop
            if loop is not None:
                def cancel() -> None:
                    if not job._finished:  # still in that job's handler (or its deferral)
                        task.cancel()

                if self._on_loop():
                    cancel()
                else:
                    loop.call_soon_threadsafe(cancel)
        self._emit("lost", job, error)

    def _on_loop(self) -> bool:
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    def _beat(self) -> None:
        """One heartbeat: extend every held lease (sync)."""
        t, vis = self.transport, self.visibility
        for job in list(self._held) + [j for j in self._current if j is not None]:
            if job._finished or job.lost or job._acked:
                continue
            try:
                lease = t.extend(job.lease, vis)
            except LeaseLost as exc:
                if not job._finished and not job._acked:  # not acked by its handler meanwhile
                    self._lost(job, exc)
            except Exception as exc:
                self.logger.warning("heartbeat: extending job %r seq %d failed (%s); trying again next beat",
                                    job.group_id, job.seq, _error_name(exc))
            else:
                if not job._finished:
                    job.lease = lease

    def _install_signals(self, loop: asyncio.AbstractEventLoop) -> List[Tuple[int, Any]]:
        want = self._signals
        if want is None:
            want = threading.current_thread() is threading.main_thread()
        if not want:
            return []
        installed: List[Tuple[int, Any]] = []

        def on_signal(signum: int) -> None:
            if self._stopping:
                self.logger.warning("second signal %s: exiting", signal.Signals(signum).name)
                self.stop(force=True)
            else:
                self.logger.info("signal %s: stopping", signal.Signals(signum).name)
                self.stop()

        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                old = signal.getsignal(sig)
                loop.add_signal_handler(sig, on_signal, int(sig))
            except (ValueError, RuntimeError, NotImplementedError):  # not the main thread, or Windows
                continue
            installed.append((sig, old))
        return installed

    @staticmethod
    def _remove_signals(loop: asyncio.AbstractEventLoop, installed: List[Tuple[int, Any]]) -> None:
        for sig, old in installed:
            try:
                loop.remove_signal_handler(sig)
                signal.signal(sig, old if old is not None else signal.SIG_DFL)
            except (ValueError, RuntimeError):
                pass

    # ------------------------------------------------------------ threads

    def _run_job(self, job: Job, error: Any = None, slot: int = -1) -> None:
        """Run one delivery on this thread and record its outcome (the general
        path: hooks, metrics, failures, deferrals, crash loops).  ``error``: the
        first run already raised it (the fast path in ``_slot`` ran it)."""
        metrics = self.metrics
        if error is None:
            if job.attempt > self.retry.max_attempts:
                reason, crash = self._crash_loop(job)
                job._finished = True
                self._apply(job, _BURY, reason, crash, slot)
                return
            run = True
        else:
            run = False
        while True:
            if run:
                self._emit("started", job, None, slot)
                error = None
                if metrics is not None:
                    started = time.perf_counter()
                try:
                    self.handler(job)
                except BaseException as exc:
                    error = exc
                if metrics is not None:
                    metrics.duration.observe(time.perf_counter() - started)
            run = True
            if error is not None and not isinstance(error, Exception):
                # SystemExit / KeyboardInterrupt in a handler: hand the job back, stop the worker.
                self.logger.error("handler raised %s: handing the job back and stopping", _error_name(error))
                job._finished = True
                if not job.lost:
                    self._apply(job, _RETURN, 0.0, None, slot)
                self.stop()
                return
            if job.lost:
                job._finished = True
                return
            decision: Tuple[int, Any] = (_ACK, None) if error is None else self._decide(job, error)
            action, arg = decision
            if action == _DEFER and self._release is None and not job._acked:
                # A transport without release: keep the lease and wait on this slot (Part 4).
                self._emit("retried", job, error, slot)
                delay = float(arg)
                due = time.monotonic() + delay
                if self._stop_event.wait(delay):
                    # Shutting down during the wait: hand it back, parked for
                    # what is left of the delay.
                    job._finished = True
                    if not job.lost:
                        self._apply(job, _HANDBACK, max(due - time.monotonic(), 0.0), None, slot)
                    return
                if job.lost:
                    job._finished = True
                    return
                continue
            job._finished = True
            if not job.lost:
                self._apply(job, action, arg, error, slot)
            return

    def _slot(self, index: int, inbox: "_queue.SimpleQueue[Any]", state: "_SlotState") -> None:
        t = self.transport
        wid = f"{self.worker_id}/{index}"
        vis, floor = self.visibility, self.min_priority
        claim, ack, handler = t.claim, t.ack, self.handler
        # A transport written before ack_and_claim (0.5) is served by ack + claim.
        ack_and_claim = getattr(t, "ack_and_claim", None)
        current = self._current
        mine = self._slot_counts[index]
        max_attempts = self.retry.max_attempts
        plain = not (self._hooks["started"] or self._hooks["succeeded"] or self.metrics is not None)
        try:
            while True:
                lease = inbox.get()
                if lease is None:
                    break
                if self._stopping:
                    self._handback(lease)
                    continue
                while lease is not None:
                    job = Job(self, lease)
                    current[index] = job
                    following: Any = _STOP  # the next lease, when the ack already claimed it
                    if plain and lease.attempt <= max_attempts:
                        # The fast path: no hooks, no metrics, the handler returns.
                        mine[0] += 1  # started
                        try:
                            handler(job)
                        except BaseException as exc:
                            self._run_job(job, exc, index)
                        else:
                            job._finished = True
                            if job._acked:
                                mine[1] += 1  # succeeded: the handler acked it itself
                            elif not job.lost:
                                try:
                                    if ack_and_claim is None or self._stopping:
                                        ack(job.lease)
                                    else:
                                        # One call (one commit on PostgreSQL): the ack and the next claim.
                                        following = ack_and_claim(job.lease, wid, vis, floor)
                                except LeaseLost as exc:
                                    self._failed(job, exc)  # nothing acked, nothing claimed
                                except EventDecodeError as exc:
                                    # The ack stood; the claim's message does not decode: bury its group.
                                    mine[1] += 1
                                    self._undecodable(exc, index)
                                except Exception as exc:
                                    self._failed(job, exc)
                                else:
                                    mine[1] += 1  # succeeded
                    else:
                        self._run_job(job, None, index)
                    current[index] = None
                    if self._stopping:
                        if following is not _STOP and following is not None:
                            self._handback(following)  # claimed as the stop came
                        break
                    if following is not _STOP:
                        lease = following
                        continue
                    lease = self._claim_here(claim, wid, index)
                if self._stopping:
                    # Drain what the claimer handed over meanwhile.
                    continue
                state.idle_one()
        except BaseException:  # pragma: no cover - a bug in the worker itself
            self.logger.exception("worker slot %d crashed", index)
            raise
        finally:
            current[index] = None
            state.exited()

    def _claim_here(self, claim: Callable[..., Any], wid: str, slot: int) -> Any:
        """A slot's claim without waiting: the lease or ``None``.  A message
        whose event does not decode is buried and the slot claims again."""
        t = self.transport
        while True:
            try:
                return claim(wid, self.visibility, self.min_priority)
            except EventDecodeError as exc:
                self._undecodable(exc, slot)
                if self._stopping:
                    return None
            except Exception as exc:
                if not self._stopping and not getattr(t, "closed", False):
                    self.logger.error("claim failed (%s)", _error_name(exc))
                return None

    def _handback(self, lease: Any) -> None:
        job = Job(self, lease)
        job._finished = True
        self._apply(job, _HANDBACK, 0.0, None)

    def _heartbeat_thread(self, done: threading.Event) -> None:
        while not done.wait(self._interval):
            try:
                self._beat()
            except Exception:  # pragma: no cover - _beat catches the transport's errors
                self.logger.exception("heartbeat failed")

    async def _run_threads(self) -> None:
        loop = asyncio.get_running_loop()
        t = self.transport
        n = self.concurrency
        inbox: "_queue.SimpleQueue[Any]" = _queue.SimpleQueue()
        wakeup = asyncio.Event()
        state = _SlotState(n, loop, wakeup)
        claim_task: List[Optional["asyncio.Task[Any]"]] = [None]

        def wake() -> None:
            wakeup.set()
            task = claim_task[0]
            if task is not None and self._stopping:
                task.cancel()

        self._loop, self._wake = loop, wake
        installed = self._install_signals(loop)
        hb_done = threading.Event()
        hb = threading.Thread(target=self._heartbeat_thread, args=(hb_done,), name=f"{self.name}-heartbeat",
                              daemon=True)
        slots = [threading.Thread(target=self._slot, args=(i, inbox, state), name=f"{self.name}-{i}", daemon=True)
                 for i in range(n)]
        self.logger.info("worker %s started: %d threads, visibility %gs, %r", self.worker_id, n,
                         self.visibility, self.retry)
        hb.start()
        for th in slots:
            th.start()
        try:
            vis, floor, wid = self.visibility, self.min_priority, self.worker_id
            # The claim waits for a wake-up; the deadline only bounds what a
            # missed one could cost (one idle wake-up per visibility / 3).
            rewait = max(self._interval, 0.5)
            while not self._stopping:
                if state.idle == 0:
                    wakeup.clear()
                    if state.idle == 0 and not self._stopping:
                        await wakeup.wait()
                    continue
                lease = await self._await_claim(loop, claim_task, rewait)
                if lease is _STOP:
                    break
                if lease is None:
                    continue
                if self._stopping:
                    self._handback(lease)
                    break
                state.take()
                inbox.put(lease)
                extra = min(state.idle, self.batch - 1)
                if extra > 0:
                    try:
                        more = t.claim_many(wid, vis, extra, floor)
                    except EventDecodeError as exc:
                        more = []
                        await self._acall(self._undecodable, exc)
                    except Exception:
                        more = []
                    for lease in more:
                        state.take()
                        inbox.put(lease)
            # Draining: wake the idle slots, wait for the busy ones.
            for _ in range(n):
                inbox.put(None)
            deadline = loop.time() + self.drain_timeout
            warned = False
            while state.alive and not self._forced:
                remaining = deadline - loop.time()
                wakeup.clear()
                if not state.alive or self._forced:
                    break
                if remaining <= 0:
                    if not warned:
                        self.logger.warning(
                            "drain_timeout passed with %d handler(s) still running: waiting for them (a thread "
                            "cannot be killed; a second signal exits and leaves their leases to expire)",
                            state.alive)
                        warned = True
                    await wakeup.wait()
                elif remaining == math.inf:
                    await wakeup.wait()
                else:
                    try:
                        await asyncio.wait_for(wakeup.wait(), remaining)
                    except asyncio.TimeoutError:
                        pass
            if not self._forced:
                while True:
                    try:
                        lease = inbox.get_nowait()
                    except _queue.Empty:
                        break
                    if lease is not None:
                        self._handback(lease)
        finally:
            hb_done.set()
            self._remove_signals(loop, installed)
            self._loop = self._wake = None
        self.logger.info("worker %s stopped%s: %s", self.worker_id, " (forced)" if self._forced else "",
                         ", ".join(f"{k} {v}" for k, v in self.counts.items()))

    # ------------------------------------------------------------ asyncio

    async def _await_claim(self, loop: asyncio.AbstractEventLoop, claim_task: List[Optional["asyncio.Task[Any]"]],
                           rewait: float) -> Any:
        """One waiting claim of a runner's claim loop (both runners): the
        lease; ``None`` to claim again (nothing came, a failed claim after a
        pause of 1 s, or the transport closed: then the worker stops); or
        ``_STOP`` to leave the loop (cancelled by ``stop()``, or a failure
        once the transport is closed).  ``claim_task[0]`` is the claim while
        it waits, so that ``stop()`` can cancel it."""
        t = self.transport
        task = loop.create_task(t.aclaim(self.worker_id, self.visibility, self.min_priority, timeout=rewait))
        claim_task[0] = task
        try:
            lease = await task
        except asyncio.CancelledError:
            if self._stopping:
                return _STOP
            raise
        except EventDecodeError as exc:
            # A poison message: bury its group and claim again at once.
            claim_task[0] = None
            await self._acall(self._undecodable, exc)
            return None
        except Exception as exc:
            if getattr(t, "closed", False):
                return _STOP
            self.logger.error("claim failed (%s); trying again in 1s", _error_name(exc))
            await asyncio.sleep(1.0)
            return None
        finally:
            claim_task[0] = None
        if lease is None and getattr(t, "closed", False):
            self.logger.info("the transport was closed: stopping")
            self.stop()
        return lease

    async def _acall(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self._inline:
            return fn(*args)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._io, functools.partial(fn, *args))

    async def _ajob(self, lease: Any) -> None:
        """One task: run the delivery, then claim the next without waiting, and so on."""
        t = self.transport
        wid = f"{self.worker_id}/a"
        while lease is not None:
            await self._arun_job(lease)
            if self._stopping:
                return
            while True:
                try:
                    if self._inline:  # the in-memory transport: a plain call, no coroutine
                        lease = t.claim(wid, self.visibility, self.min_priority)
                    else:
                        lease = await self._acall(t.claim, wid, self.visibility, self.min_priority)
                except EventDecodeError as exc:
                    await self._acall(self._undecodable, exc)  # buried: claim again at once
                    if self._stopping:
                        return
                    continue
                except Exception as exc:
                    if not self._stopping and not getattr(t, "closed", False):
                        self.logger.error("claim failed (%s)", _error_name(exc))
                    return
                break

    async def _arun_job(self, lease: Any) -> None:
        job = Job(self, lease)
        retry = self.retry
        if job.attempt > retry.max_attempts:
            reason, crash = self._crash_loop(job)
            job._finished = True
            await self._acall(self._apply, job, _BURY, reason, crash)
            return
        job._task = asyncio.current_task()
        # In-memory: everything runs on this loop's thread, so it counts
        # like a thread slot (no lock); otherwise _apply runs on the I/O pool.
        slot = 0 if self._inline else -1
        held = self._held
        held.add(job)
        metrics = self.metrics
        try:
            while True:
                self._emit("started", job, None, slot)
                error: Optional[BaseException] = None
                started = time.perf_counter()
                try:
                    await self.handler(job)
                except asyncio.CancelledError:
                    if job.lost:
                        _uncancel()
                        return  # the heartbeat cancelled it: neither ack nor nack
                    job._finished = True
                    # Cancelled by the shutdown: released, uncounted.  A CancelledError
                    # the handler raised itself while the worker runs is an outcome: nack.
                    back = _HANDBACK if self._stopping else _RETURN
                    await asyncio.shield(self._acall(self._apply, job, back, 0.0, None))
                    raise
                except Exception as exc:
                    error = exc
                if metrics is not None:
                    metrics.duration.observe(time.perf_counter() - started)
                if job.lost:
                    return
                decision: Tuple[int, Any] = (_ACK, None) if error is None else self._decide(job, error)
                action, arg = decision
                if action == _DEFER and self._release is None and not job._acked:
                    # A transport without release: keep the lease and wait in this task (Part 4).
                    self._emit("retried", job, error, slot)
                    try:
                        await asyncio.sleep(arg)
                    except asyncio.CancelledError:
                        if job.lost:
                            _uncancel()
                            return
                        job._finished = True
                        await asyncio.shield(self._acall(self._apply, job, _HANDBACK, 0.0, None))
                        raise
                    if job.lost:
                        return
                    continue
                job._finished = True
                if not job.lost:
                    if self._inline:
                        self._apply(job, action, arg, error, slot)
                    else:
                        await self._acall(self._apply, job, action, arg, error)
                return
        finally:
            job._finished = True
            held.discard(job)

    async def _aheartbeat(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self._acall(self._beat)
            except Exception:  # pragma: no cover - _beat catches the transport's errors
                self.logger.exception("heartbeat failed")

    async def _arun(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        loop = asyncio.get_running_loop()
        t = self.transport
        n = self.concurrency
        self._io = None if self._inline else ThreadPoolExecutor(min(n, 4) + 1, thread_name_prefix=f"{self.name}-io")
        tasks: Set["asyncio.Task[Any]"] = set()
        wakeup = asyncio.Event()
        claim_task: List[Optional["asyncio.Task[Any]"]] = [None]

        def wake() -> None:
            wakeup.set()
            task = claim_task[0]
            if task is not None and self._stopping:
                task.cancel()

        def done(task: "asyncio.Task[Any]") -> None:
            tasks.discard(task)
            wakeup.set()
            if not task.cancelled() and task.exception() is not None:
                self.logger.error("job task failed: %r", task.exception())

        self._loop, self._wake = loop, wake
        installed = self._install_signals(loop)
        hb = loop.create_task(self._aheartbeat())
        self.logger.info("worker %s started: %d tasks, visibility %gs, %r", self.worker_id, n, self.visibility,
                         self.retry)
        try:
            vis, floor, wid = self.visibility, self.min_priority, self.worker_id
            # The claim waits for a wake-up; the deadline only bounds what a
            # missed one could cost (one idle wake-up per visibility / 3).
            rewait = max(self._interval, 0.5)
            while not self._stopping:
                if len(tasks) >= n:
                    wakeup.clear()
                    if len(tasks) >= n and not self._stopping:
                        await wakeup.wait()
                    continue
                lease = await self._await_claim(loop, claim_task, rewait)
                if lease is _STOP:
                    break
                if lease is None:
                    continue
                leases = [lease]
                extra = min(n - len(tasks) - 1, self.batch - 1)
                if extra > 0 and not self._stopping:
                    try:
                        leases += await self._acall(t.claim_many, wid, vis, extra, floor)
                    except EventDecodeError as exc:
                        await self._acall(self._undecodable, exc)
                    except Exception:
                        pass
                for lease in leases:
                    if self._stopping:
                        job = Job(self, lease)
                        job._finished = True
                        await self._acall(self._apply, job, _HANDBACK, 0.0, None)
                        continue
                    task = loop.create_task(self._ajob(lease))
                    tasks.add(task)
                    task.add_done_callback(done)
        except asyncio.CancelledError:
            # arun() itself was cancelled: stop, cancel the handlers, hand back.
            self.stop()
            for task in list(tasks):
                task.cancel()
            if tasks:
                await asyncio.wait(list(tasks))
            raise
        finally:
            if tasks:
                await self._adrain(tasks, wakeup)
            hb.cancel()
            self._remove_signals(loop, installed)
            self._loop = self._wake = None
            if self._io is not None:
                self._io.shutdown(wait=False)
        self.logger.info("worker %s stopped%s: %s", self.worker_id, " (forced)" if self._forced else "",
                         ", ".join(f"{k} {v}" for k, v in self.counts.items()))

    async def _adrain(self, tasks: Set["asyncio.Task[Any]"], wakeup: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.drain_timeout
        while tasks and not self._forced:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            wakeup.clear()
            try:
                await asyncio.wait_for(wakeup.wait(), None if remaining == math.inf else remaining)
            except asyncio.TimeoutError:
                break
        if tasks:
            self.logger.warning("cancelling %d handler(s) still running; their messages are handed back", len(tasks))
            for task in list(tasks):
                task.cancel()
            await asyncio.wait(list(tasks))


def _uncancel() -> None:
    """Forget a cancellation the worker asked for itself (Python 3.11+ counts them)."""
    task = asyncio.current_task()
    uncancel = getattr(task, "uncancel", None)
    if uncancel is not None:
        uncancel()


class _SlotState:
    """Idle and live slot counts of the thread runner (slots increment
    ``idle``, only the claimer decrements it)."""

    __slots__ = ("idle", "alive", "_lock", "_loop", "_wakeup")

    def __init__(self, n: int, loop: asyncio.AbstractEventLoop, wakeup: asyncio.Event) -> None:
        self.idle = n
        self.alive = n
        self._lock = threading.Lock()
        self._loop = loop
        self._wakeup = wakeup

    def _notify(self) -> None:
        try:
            self._loop.call_soon_threadsafe(self._wakeup.set)
        except RuntimeError:
            pass  # the loop has closed (a forced stop)

    def idle_one(self) -> None:
        with self._lock:
            self.idle += 1
            first = self.idle == 1
        if first:
            self._notify()

    def take(self) -> None:
        with self._lock:
            self.idle -= 1

    def exited(self) -> None:
        with self._lock:
            self.alive -= 1
        self._notify()

