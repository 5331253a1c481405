"""``leasequeue worker``: load the target, build the :class:`~leasequeue.Worker`, run it.

The target ``MODULE:OBJECT`` is a handler function or a configured
``leasequeue.Task`` (``leasequeue.task(...)``: a handler with its ``Retry``,
hooks, middleware and ``min_priority``); the worker gets it as it is.  Only
the options given on the command line are passed to ``Worker``: a Task's own
settings are not overridden by a command-line default, and the documented
defaults (``--max-attempts 5``, ``--backoff 1``, ...) are the ``Worker``'s
and ``Retry``'s own.  ``--max-attempts`` / ``--backoff`` given with a Task
that carries a ``Retry`` replace those two fields of it and keep the rest.

The Prometheus server (``--metrics-port``, ``--metrics-host``) is started
here, before the queue is opened, on a registry of its own that the worker
then fills (``Worker(metrics=registry)``): a port in use is a one-line
error before anything else happens.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any, Dict, Optional

from ._cli import CliError, import_object, open_transport, resolve_serializer

__all__ = ["build_worker_options", "load_target", "run_worker"]


def _task_class() -> Optional[type]:
    """``leasequeue.Task`` if this build has it (the worker package), else None."""
    try:
        from .worker import Task  # type: ignore[attr-defined,import-not-found,unused-ignore]
    except ImportError:
        return None
    return Task  # type: ignore[no-any-return,unused-ignore]


def is_task(obj: Any) -> bool:
    """Whether ``obj`` is a ``leasequeue.Task`` (a configured handler)."""
    cls = _task_class()
    return cls is not None and isinstance(obj, cls)


def load_target(target: str) -> Any:
    """``MODULE:OBJECT`` -> a handler function or a ``leasequeue.Task`` (``CliError`` otherwise)."""
    obj = import_object(target, "MODULE:OBJECT", "the handler")
    if is_task(obj):
        return obj
    if not callable(obj):
        raise CliError(f"{target} is {type(obj).__name__}, not a handler function or a leasequeue.Task", 2)
    return obj


def _retry_with(base: Any, args: argparse.Namespace) -> Any:
    """``base`` (a ``Retry`` or None) with the ``--max-attempts`` / ``--backoff``
    given on the command line (the other fields kept)."""
    from . import Retry

    if base is None:
        base = Retry()
    return Retry(
        args.max_attempts if args.max_attempts is not None else base.max_attempts,
        args.backoff if args.backoff is not None else base.backoff,
        base.factor,
        base.max_delay,
        base.jitter,
        retry_on=base.retry_on,
        give_up_on=base.give_up_on,
        exhausted=base.exhausted,
        dead_letter=base.dead_letter,
    )


def build_worker_options(target: Any, args: argparse.Namespace) -> Dict[str, Any]:
    """The ``Worker`` keywords the command line gives: only the options the
    user typed (argparse defaults are None), so a Task's settings stand."""
    options: Dict[str, Any] = {}
    for name in ("concurrency", "visibility", "drain_timeout", "min_priority", "prefetch"):
        value = getattr(args, name, None)
        if value is not None:
            options[name] = value
    if args.max_attempts is not None or args.backoff is not None:
        base = getattr(target, "retry", None) if is_task(target) else None
        options["retry"] = _retry_with(base, args)
    return options


def _serve_metrics(port: int, host: str) -> Any:
    """Start ``/metrics`` on ``host:port`` (a daemon thread); returns its registry."""
    try:
        import prometheus_client as prom
    except ImportError:
        raise CliError("--metrics-port needs prometheus_client: pip install 'leasequeue[metrics]'", 2) from None
    registry = prom.CollectorRegistry()
    try:
        prom.start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        why = exc.strerror or str(exc) or type(exc).__name__
        raise CliError(f"cannot serve metrics on {host}:{port}: {why}") from exc
    return registry


def run_worker(args: argparse.Namespace) -> int:
    """``leasequeue worker``: 0 after a clean stop, 1 after a forced one."""
    from . import Worker

    logging.basicConfig(level=getattr(logging, args.log_level), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.metrics_host is not None and args.metrics_port is None:
        raise CliError("--metrics-host needs --metrics-port", 2)
    serializer = resolve_serializer(args.serializer)  # one that does not import: before anything runs
    target = load_target(args.target)
    options = build_worker_options(target, args)
    registry = None
    host = args.metrics_host if args.metrics_host is not None else "0.0.0.0"
    if args.metrics_port is not None:
        registry = _serve_metrics(args.metrics_port, host)
    transport = open_transport(args, serializer, create=True)
    try:
        try:
            worker = Worker(transport, target, metrics=registry, name="cli", **options)
        except (TypeError, ValueError) as exc:
            raise CliError(f"{args.target}: {exc}", 2) from exc
        if registry is not None:
            worker.logger.info("metrics on http://%s:%d/metrics", host, args.metrics_port)
        worker.run()
    finally:
        try:
            transport.close()
        except Exception:
            pass
    return 1 if worker.forced else 0
