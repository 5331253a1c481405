"""``Worker(metrics=...)``: Prometheus metrics as a middleware
(``prometheus_client``, the ``metrics`` extra).  Every name starts
``leasequeue_``; the labels are bounded (queue, outcome), never a group id."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Optional

from ._middleware import OUTCOMES, Middleware
from ._retry import Outcome

if TYPE_CHECKING:
    from ._job import Job
    from ._worker import Worker

__all__ = ["PrometheusMiddleware"]


class PrometheusMiddleware(Middleware):
    """A counter per outcome, a handler-duration histogram, jobs in flight,
    and the queue's buried groups (read from ``stats()`` at each scrape).
    ``registry``: ``True`` (a registry of its own) or a ``prometheus_client``
    registry."""

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
        self.in_flight.set_function(lambda: float(worker.heartbeat.in_flight()))
        transport = worker.transport

        def buried() -> float:
            try:
                return float(getattr(transport.stats(), "buried", 0))
            except Exception:
                return math.nan

        self.buried = prom.Gauge("leasequeue_buried_groups", "Groups buried (quarantined) in the queue",
                                 ["queue"], registry=registry).labels(queue=q)
        self.buried.set_function(buried)

    def on_outcome(self, job: "Job", outcome: Outcome, error: Optional[BaseException]) -> None:
        self.outcome[outcome.value].inc()

    def wrap(self, call_next: Callable[["Job"], Any], job: "Job") -> Any:
        started = time.perf_counter()
        try:
            return call_next(job)
        finally:
            self.duration.observe(time.perf_counter() - started)

    async def awrap(self, call_next: Callable[["Job"], Awaitable[Any]], job: "Job") -> Any:
        started = time.perf_counter()
        try:
            return await call_next(job)
        finally:
            self.duration.observe(time.perf_counter() - started)
