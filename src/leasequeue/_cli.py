"""The ``leasequeue worker`` and ``leasequeue queue`` command lines.

``leasequeue worker MODULE:FUNCTION`` imports a handler (as ``uvicorn
app:app`` does: the current directory is on ``sys.path``) and runs a
:class:`~leasequeue.Worker` on a SQLite file or a PostgreSQL queue until
SIGTERM/SIGINT; it exits 0 after a clean stop.  ``leasequeue queue`` is the
operator's view of a durable queue: counts, groups, a group, its head
messages, and pause / resume / retry / skip / purge (skip and purge ask for
confirmation unless ``--yes``); tables for people, ``--json`` for scripts, a
one-line message and a non-zero exit for an unknown group or a refused
action.  Plain standard-library output.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

__all__ = ["add_parsers", "run_queue", "run_worker"]

STATES = ("ready", "leased", "parked", "paused", "buried", "scheduled")

WORKER_EPILOG = """\
examples:
  leasequeue worker myapp.jobs:handle --sqlite /var/lib/app/queue.db --concurrency 8
  leasequeue worker myapp.jobs:handle --postgres "dbname=app" --queue emails --metrics-port 9100

The handler gets a leasequeue.Job (job.event, job.group_id, job.seq,
job.attempt, job.lost); an `async def` handler runs on asyncio.  A handler
that raises is retried with backoff (parked at its group's head) and, after
--max-attempts, its group is buried: `leasequeue queue ... groups --state
buried` lists them, `leasequeue queue ... retry G` runs the head again with
a fresh budget.  A handler raising leasequeue.RetryLater(S) waits S seconds
without counting an attempt.  SIGTERM or SIGINT: stop claiming, let running
handlers finish (up to --drain-timeout), hand back the rest uncounted (a
restart spends no attempt), exit 0; a second signal exits at once (status 1)
and leaves running handlers' leases to expire.
"""

QUEUE_EPILOG = """\
examples:
  leasequeue queue --sqlite queue.db stats
  leasequeue queue --sqlite queue.db groups --state buried
  leasequeue queue --sqlite queue.db peek order-17 -n 5
  leasequeue queue --sqlite queue.db retry order-17          # run a buried head again, from attempt 1
  leasequeue queue --sqlite queue.db skip order-17 --seq 42  # drop the poison head, if it is seq 42
  leasequeue queue --postgres "dbname=app" --queue emails groups --json

`resume` lifts a bury but keeps counting (the next delivery is attempt + 1):
a worker buries the group again at once if that is beyond its
--max-attempts; `retry` gives the head a fresh budget.  `skip` and `purge`
ask for confirmation on stdin (answer y); --yes skips the question, and
without --yes a stdin that gives no answer refuses.

Exit status: 0 done, 1 an unknown group or a refused action (one line on
stderr), 2 bad arguments.
"""


class CliError(Exception):
    """A one-line message for stderr, and the exit status."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def _add_backend(p: argparse.ArgumentParser) -> None:
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--sqlite", metavar="PATH", help="a SQLite database file")
    where.add_argument("--postgres", metavar="CONNINFO", help="a PostgreSQL conninfo or URI")
    p.add_argument("--queue", metavar="Q", help="the PostgreSQL queue name (default: 'default')")


def _int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer ``>= minimum``, else a one-line error."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}: {text!r}")
        return value

    return parse


_positive_int = _int_at_least(1)
_count = _int_at_least(0)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0: {text!r}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}")
    return value


def add_parsers(sub: Any) -> None:
    """Add the ``worker`` and ``queue`` subcommands to ``leasequeue``'s subparsers."""
    w = sub.add_parser(
        "worker",
        help="run a handler for every message of a SQLite or PostgreSQL queue",
        description="Run MODULE:FUNCTION for every message of a durable queue, with heartbeats, "
        "retries with backoff, quarantine of poison messages and a graceful shutdown.",
        epilog=WORKER_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    w.add_argument("target", metavar="MODULE:FUNCTION", help="the handler, e.g. myapp.jobs:handle")
    _add_backend(w)
    w.add_argument("--concurrency", type=_positive_int, default=1, metavar="N",
                   help="handlers running at once (threads, or asyncio tasks for async def; default 1)")
    w.add_argument("--visibility", type=_seconds, default=30.0, metavar="S",
                   help="lease seconds; the heartbeat extends them every S/3 (default 30)")
    w.add_argument("--max-attempts", type=_positive_int, default=5, metavar="N",
                   help="deliveries before a failing message's group is buried (default 5)")
    w.add_argument("--backoff", type=_seconds, default=1.0, metavar="S",
                   help="delay before the first retry; doubled at each failure, capped at 300 s (default 1)")
    w.add_argument("--drain-timeout", type=_seconds, default=30.0, metavar="S",
                   help="seconds running handlers get to finish at shutdown (default 30)")
    w.add_argument("--metrics-port", type=_port, metavar="P",
                   help="serve Prometheus metrics on http://0.0.0.0:P/metrics (needs prometheus_client)")
    w.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                   help="logging level on stderr (default INFO)")

    q = sub.add_parser(
        "queue",
        help="inspect and operate a SQLite or PostgreSQL queue (stats, groups, skip, purge ...)",
        description="The operator's view of a durable queue: tables for people, --json for scripts.",
        epilog=QUEUE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_backend(q)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print JSON instead of a table")
    cmds = q.add_subparsers(dest="queue_command", metavar="COMMAND")
    cmds.required = True
    cmds.add_parser("stats", parents=[common], help="message and group counts")
    g = cmds.add_parser("groups", parents=[common], help="every group (or those in one state)")
    g.add_argument("--state", choices=STATES, help="only the groups in this state")
    for name, text in (("group", "one group's state"),
                       ("pause", "stop serving a group (a running message stays leased)"),
                       ("resume", "lift a pause, a park or a bury (the attempt count goes on: a worker "
                                  "re-buries a head beyond its budget; see retry)"),
                       ("retry", "run a group's head again from scratch: attempt back to 1, a bury lifted, "
                                 "a park ended (a pause stays)"),
                       ("skip", "remove a group's head message (a poison message) and lift a bury (confirmed)"),
                       ("purge", "remove every message of a group, and the group (confirmed)")):
        c = cmds.add_parser(name, parents=[common], help=text)
        c.add_argument("group_id", metavar="G", help="the group id")
        if name == "skip":
            c.add_argument("--seq", type=_count, metavar="N",
                           help="skip only if the head is seq N (as `peek G` shows it)")
        if name in ("skip", "purge"):
            c.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p = cmds.add_parser("peek", parents=[common], help="a group's oldest messages, head first")
    p.add_argument("group_id", metavar="G", help="the group id")
    p.add_argument("-n", type=_count, default=1, metavar="K", dest="count", help="how many (default 1)")
    from ._cli_queues import add_queue_admin_parsers  # PostgreSQL: install, create-queue, queues, drop-queue

    add_queue_admin_parsers(cmds, common)


# ------------------------------------------------------------------ shared


def _open(args: argparse.Namespace, *, create: bool) -> Any:
    if args.queue is not None and args.postgres is None:
        raise CliError("--queue names a PostgreSQL queue: use it with --postgres", 2)
    if args.sqlite is not None:
        from . import SQLiteTransport

        if not create and not os.path.exists(args.sqlite):
            raise CliError(f"no such file: {args.sqlite}")
        try:
            return SQLiteTransport(args.sqlite)
        except Exception as exc:
            raise CliError(f"cannot open {args.sqlite}: {exc}") from exc
    try:
        from . import PostgresTransport
    except ImportError as exc:
        raise CliError(f"--postgres needs psycopg: pip install 'leasequeue[postgres]' ({exc})") from exc
    try:
        return PostgresTransport(args.postgres, queue=args.queue or "default")
    except Exception as exc:
        raise CliError(f"cannot open the PostgreSQL queue: {str(exc).strip().splitlines()[0]}") from exc


def load_handler(target: str) -> Callable[..., Any]:
    """``"package.module:function"`` (or ``module:obj.attr``) -> the callable."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise CliError(f"the handler must be given as MODULE:FUNCTION, not {target!r}", 2)
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise CliError(f"cannot import {module_name!r}: {exc}", 2) from exc
    except Exception as exc:
        raise CliError(f"importing {module_name!r} raised {type(exc).__name__}: {exc}", 2) from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise CliError(f"{module_name!r} has no attribute {attr!r}", 2) from None
    if not callable(obj):
        raise CliError(f"{target} is not callable", 2)
    return obj  # type: ignore[no-any-return,unused-ignore]


# ------------------------------------------------------------------ worker


def run_worker(args: argparse.Namespace) -> int:
    """``leasequeue worker``: 0 after a clean stop, 1 after a forced one."""
    from ._worker import Retry, Worker

    logging.basicConfig(level=getattr(logging, args.log_level), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.visibility <= 0:
        raise CliError("--visibility must be > 0", 2)
    handler = load_handler(args.target)
    metrics = None
    if args.metrics_port is not None:
        try:
            import prometheus_client  # noqa: F401
        except ImportError:
            raise CliError("--metrics-port needs prometheus_client: pip install 'leasequeue[metrics]'", 2) from None
        metrics = True
    transport = _open(args, create=True)
    try:
        worker = Worker(transport, handler, concurrency=args.concurrency, visibility=args.visibility,
                        retry=Retry(max_attempts=args.max_attempts, backoff=args.backoff),
                        drain_timeout=args.drain_timeout,
                        metrics=metrics, name="cli")
        if args.metrics_port is not None:
            worker.serve_metrics(args.metrics_port)
            worker.logger.info("metrics on http://0.0.0.0:%d/metrics", args.metrics_port)
        worker.run()
    finally:
        try:
            transport.close()
        except Exception:
            pass
    return 1 if worker.forced else 0


# ------------------------------------------------------------------ queue


def _jsonable(event: Any) -> Any:
    try:
        json.dumps(event)
    except (TypeError, ValueError):
        return repr(event)
    return event


def _when(value: Optional[float]) -> str:
    if value is None:
        return "-"
    if value == float("inf"):
        return "never"
    delta = value - time.time()
    return f"{delta:+.1f}s" if abs(delta) < 86400 * 365 else f"{value:.1f}"


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [["-" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _group_dict(info: Any) -> Dict[str, Any]:
    d = dict(info._asdict())
    d.setdefault("reason", None)
    return d


_GROUP_COLUMNS = ("group_id", "state", "messages", "priority", "head_seq", "attempt", "worker_id", "expires",
                  "reason")


def _group_row(d: Dict[str, Any]) -> List[Any]:
    reason = d.get("reason")
    if reason and len(reason) > 60:
        reason = reason[:59] + "…"
    state = d["state"] + ("+paused" if d["paused"] and d["state"] != "paused" else "")
    return [d["group_id"], state, d["messages"], d["priority"], d["head_seq"], d["attempt"], d["worker_id"],
            _when(d["expires_at"]), reason]


def _print(args: argparse.Namespace, data: Any, text: str) -> None:
    if args.json:
        sys.stdout.write(json.dumps(data, indent=None if isinstance(data, dict) else 1) + "\n")
    else:
        sys.stdout.write(text + "\n")


def _confirm(question: str, stdin: Any, refusal: str) -> None:
    """Ask ``question [y/N]`` on stderr; anything but y/yes (an empty or
    closed stdin included) raises ``CliError(refusal)``."""
    sys.stderr.write(f"{question} [y/N] ")
    sys.stderr.flush()
    answer = stdin.readline().strip().lower()
    if answer not in ("y", "yes"):
        raise CliError(refusal)


def _refused_head(info: Any, group_id: str) -> CliError:
    """Why an action on the head of a known group was refused (``skip``, ``retry``)."""
    if info is None:
        return CliError(f"no group {group_id!r}")
    if info.head_seq is None:
        return CliError(f"refused: group {group_id!r} holds no message")
    return CliError(f"refused: the head of group {group_id!r} (seq {info.head_seq}) is under a lease that has not "
                    "expired: a worker is running it")


def _known(t: Any, group_id: str) -> Any:
    info = t.group(group_id)
    if info is None:
        raise CliError(f"no group {group_id!r}")
    return info


def run_queue(args: argparse.Namespace, stdin: Any = None) -> int:
    """``leasequeue queue``: 0 done, 1 unknown group or refused action."""
    from ._cli_queues import run_queue_admin

    status = run_queue_admin(args, stdin)
    if status is not None:
        return status
    t = _open(args, create=False)
    try:
        return _queue_command(t, args, stdin or sys.stdin)
    finally:
        t.close()


def _queue_command(t: Any, args: argparse.Namespace, stdin: Any) -> int:
    cmd = args.queue_command
    if cmd == "stats":
        s = dict(t.stats()._asdict())
        _print(args, s, _table(list(s), [list(s.values())]))
    elif cmd == "groups":
        infos = [_group_dict(i) for i in t.groups()]
        if args.state:
            infos = [d for d in infos if d["state"] == args.state]
        infos.sort(key=lambda d: (d["head_seq"] is None, d["head_seq"] or 0, d["group_id"]))
        text = _table(_GROUP_COLUMNS, [_group_row(d) for d in infos]) if infos else "(no groups)"
        _print(args, infos, text)
    elif cmd == "group":
        d = _group_dict(_known(t, args.group_id))
        _print(args, d, "\n".join(f"{k:16} {'-' if v is None else v}" for k, v in d.items()))
    elif cmd == "peek":
        _known(t, args.group_id)
        messages = t.peek(args.group_id, args.count)
        data = [{"seq": m.seq, "attempt": m.attempt, "event": _jsonable(m.event),
                 "due_at": getattr(m, "due_at", None), "key": getattr(m, "key", None)} for m in messages]
        rows = []
        for m in messages:
            text = repr(m.event)
            rows.append([m.seq, m.attempt, text if len(text) <= 100 else text[:99] + "…"])
        _print(args, data, _table(("seq", "attempt", "event"), rows) if rows else "(no messages)")
    elif cmd == "pause":
        if not t.pause(args.group_id):
            raise CliError(f"group {args.group_id!r} is already paused")
        _print(args, {"group_id": args.group_id, "paused": True}, f"paused {args.group_id}")
    elif cmd == "resume":
        before = t.group(args.group_id)
        if not t.resume(args.group_id):
            if t.group(args.group_id) is None:
                raise CliError(f"no group {args.group_id!r}")
            raise CliError(f"nothing to resume: group {args.group_id!r} is not paused, parked or buried")
        if before is not None and before.state == "buried":
            # One line on stderr (stdout stays the result, --json included).
            sys.stderr.write(f"note: the bury is lifted but the attempts go on counting (next delivery: attempt "
                             f"{(before.attempt or 0) + 1}); a worker buries it again at once if that is beyond "
                             f"its max_attempts: `retry {args.group_id}` gives it a fresh budget\n")
        _print(args, {"group_id": args.group_id, "resumed": True}, f"resumed {args.group_id}")
    elif cmd == "retry":
        if not t.retry(args.group_id):
            raise _refused_head(t.group(args.group_id), args.group_id)
        _print(args, {"group_id": args.group_id, "retried": True},
               f"retried {args.group_id}: its head runs again from attempt 1")
    elif cmd == "skip":
        _skip(t, args, stdin)
    elif cmd == "purge":
        info = _known(t, args.group_id)
        if not args.yes:
            _confirm(f"purge group {args.group_id!r}: remove its {info.messages} message(s)?", stdin,
                     "not purged (answer y, or pass --yes)")
        removed = t.purge(args.group_id)
        _print(args, {"group_id": args.group_id, "removed": removed},
               f"purged {args.group_id}: {removed} message(s) removed")
    return 0


def _head(t: Any, group_id: str, want: Optional[int]) -> Any:
    """The group's head message, checked against ``--seq`` (a ``CliError`` if it is not that seq)."""
    info = _known(t, group_id)
    head = t.peek(group_id, 1)
    if not head:
        raise _refused_head(info, group_id)
    if want is not None and head[0].seq != want:
        raise CliError(f"refused: the head of group {group_id!r} is seq {head[0].seq}, not {want}: nothing skipped")
    return head[0]


def _skip(t: Any, args: argparse.Namespace, stdin: Any) -> None:
    """``skip G [--seq N] [--yes]``.

    With ``--seq`` the head is checked (``peek``) before the question and
    again after it, then skipped: the check and the skip are two calls, so
    if, in the moment between them, a worker acks the head and the next
    message is not yet claimed, ``skip`` removes that next message.  A head
    that a worker holds under a live lease is never skipped.
    """
    head = _head(t, args.group_id, args.seq)
    if not args.yes:
        _confirm(f"skip group {args.group_id!r}: remove its head message seq {head.seq} (attempt {head.attempt})?",
                 stdin, "not skipped (answer y, or pass --yes)")
        head = _head(t, args.group_id, args.seq if args.seq is not None else head.seq)
    if not t.skip(args.group_id):
        raise _refused_head(t.group(args.group_id), args.group_id)
    _print(args, {"group_id": args.group_id, "skipped_seq": head.seq}, f"skipped seq {head.seq} of {args.group_id}")


def main_worker(args: argparse.Namespace) -> int:
    try:
        return run_worker(args)
    except CliError as exc:
        sys.stderr.write(f"leasequeue worker: {exc}\n")
        return exc.status


def main_queue(args: argparse.Namespace) -> int:
    try:
        return run_queue(args)
    except CliError as exc:
        sys.stderr.write(f"leasequeue queue: {exc}\n")
        return exc.status
    except Exception as exc:  # a transport error: one line, not a traceback
        sys.stderr.write(f"leasequeue queue: {type(exc).__name__}: {str(exc).strip().splitlines()[0]}\n")
        return 1
