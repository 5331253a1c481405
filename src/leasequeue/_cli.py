"""The ``leasequeue worker`` and ``leasequeue queue`` command lines.

``leasequeue worker MODULE:OBJECT`` imports a handler function or a
configured ``leasequeue.Task`` (as ``uvicorn app:app`` does: the current
directory is on ``sys.path``) and runs a :class:`~leasequeue.Worker` on a
SQLite file or a PostgreSQL queue until SIGTERM/SIGINT; it exits 0 after a
clean stop (``leasequeue._cli_worker``).  ``leasequeue queue`` is the
operator's view of a durable queue: counts, groups, a group, its head
messages, and pause / resume / retry / skip / purge (skip and purge ask for
confirmation unless ``--yes``); tables for people, ``--json`` for scripts, a
one-line message and a non-zero exit for an unknown group or a refused
action.  Plain standard-library output.

Every error the command lines anticipate (bad arguments, a handler module
that does not import, an unknown serializer, a database that cannot be
opened, a queue that does not exist, a port in use, a transport error) is
one line on stderr, ``leasequeue worker: error: ...`` (the form argparse
uses for bad arguments), and a non-zero exit: 2 for bad arguments, 1 for
the rest.  ``leasequeue worker --log-level DEBUG`` also prints the
traceback.
"""

from __future__ import annotations

import argparse
import base64
import importlib
import json
import math
import os
import sys
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Sequence

__all__ = ["CliError", "add_parsers", "import_object", "main_queue", "main_worker", "open_transport",
           "resolve_serializer", "run_queue"]

STATES = ("ready", "leased", "parked", "paused", "buried", "scheduled")

WORKER_EPILOG = """\
examples:
  leasequeue worker myapp.jobs:handle --sqlite /var/lib/app/queue.db --concurrency 8
  leasequeue worker myapp.jobs:handle --postgres "dbname=app" --queue emails --metrics-port 9100
  leasequeue worker myapp.jobs:send_email --sqlite queue.db --serializer json --min-priority 5

MODULE:OBJECT names a handler function, or a leasequeue.Task (made with
leasequeue.task(handler, retry=..., hooks=..., middleware=...,
min_priority=...)) that carries its own settings: the options given here
override them, the ones left out do not.  The handler gets a leasequeue.Job (job.event, job.group_id, job.seq,
job.attempt, job.lost); an `async def` handler runs on asyncio.  A handler
that raises is retried with backoff (parked at its group's head) and, after
--max-attempts, its group is buried: `leasequeue queue ... groups --state
buried` lists them, `leasequeue queue ... retry G` runs the head again with
a fresh budget.  A handler raising leasequeue.RetryLater(S) waits S seconds
without counting an attempt.  SIGTERM or SIGINT: stop claiming, let running
handlers finish (up to --drain-timeout), hand back the rest uncounted (a
restart spends no attempt), exit 0; a second signal exits at once (status 1)
and leaves running handlers' leases to expire.

Exit status: 0 after a clean stop, 1 after a forced stop or an error (a
database that cannot be opened, a metrics port in use: one line on stderr),
2 bad arguments (a target that does not import, an unknown serializer).
"""

QUEUE_EPILOG = """\
examples:
  leasequeue queue --sqlite queue.db stats
  leasequeue queue --sqlite queue.db groups --state buried
  leasequeue queue --sqlite queue.db peek order-17 -n 5
  leasequeue queue --sqlite queue.db retry order-17          # run a buried head again, from attempt 1
  leasequeue queue --sqlite queue.db skip order-17 --seq 42  # drop the poison head, if it is seq 42
  leasequeue queue --postgres "dbname=app" --queue emails groups --json
  leasequeue queue --sqlite queue.db --serializer json peek order-17   # a queue stored as JSON

`peek` shows an event it cannot decode (a pickle of a class from the
publisher's __main__, JSON read with pickle) as UNDECODABLE with its error
and its stored form, instead of failing; --serializer must be the
publishers' serializer.  `resume` lifts a bury but keeps counting (the next delivery is attempt + 1):
a worker buries the group again at once if that is beyond its
--max-attempts; `retry` gives the head a fresh budget.  `skip` and `purge`
ask for confirmation on stdin (answer y); --yes skips the question, and
without --yes a stdin that gives no answer refuses.

Exit status: 0 done, 1 an unknown group, a refused action, a database
that cannot be opened or a transport error, 2 bad arguments; every error is
one line on stderr.
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
    p.add_argument("--serializer", metavar="NAME", type=_serializer_name, default=None,
                   help="how the events are stored: pickle (the default), json, or MODULE:OBJECT naming a "
                        "(dumps, loads) pair or an object with dumps and loads; as the publishers' serializer=")


def _serializer_name(text: str) -> str:
    """An argparse ``type``: ``pickle``, ``json`` or ``MODULE:OBJECT`` (imported later)."""
    module_name, sep, attr = text.partition(":")
    if text not in ("pickle", "json") and not (sep and module_name and attr):
        raise argparse.ArgumentTypeError(f"unknown serializer {text!r}: pickle, json, or MODULE:OBJECT")
    return text


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
_natural_int = _int_at_least(0)
_count = _int_at_least(0)


def _priority(text: str) -> int:
    """An argparse ``type``: a priority floor (any 64-bit signed integer)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if not -(2**63) <= value < 2**63:
        raise argparse.ArgumentTypeError(f"must be a 64-bit signed integer: {text!r}")
    return value


def _duration(*, positive: bool, infinite: bool) -> Callable[[str], float]:
    """An argparse ``type``: seconds, ``> 0`` if ``positive`` else ``>= 0``;
    ``inf`` accepted only if ``infinite``.  The messages are one phrase each:
    ``must be > 0``, ``must be >= 0``, ``must be finite``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
        if math.isnan(value):
            raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}")
        if positive and not value > 0:
            raise argparse.ArgumentTypeError(f"must be > 0: {text!r}")
        if not value >= 0:
            raise argparse.ArgumentTypeError(f"must be >= 0: {text!r}")
        if value == math.inf and not infinite:
            raise argparse.ArgumentTypeError(f"must be finite: {text!r}")
        return value

    return parse


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"not a port number (0-65535): {text!r}")
    return value


def add_parsers(sub: Any) -> None:
    """Add the ``worker`` and ``queue`` subcommands to ``leasequeue``'s subparsers."""
    w = sub.add_parser(
        "worker",
        help="run a handler for every message of a SQLite or PostgreSQL queue",
        description="Run MODULE:OBJECT (a handler or a leasequeue.Task) for every message of a durable queue, "
        "with heartbeats, retries with backoff, quarantine of poison messages and a graceful shutdown.",
        epilog=WORKER_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    w.add_argument("target", metavar="MODULE:OBJECT",
                   help="the handler function, or a leasequeue.Task carrying its settings: e.g. myapp.jobs:handle")
    _add_backend(w)
    # Defaults are None: only what the user gives is passed to Worker, so a
    # Task's own settings stand; the defaults shown are Worker's and Retry's.
    w.add_argument("--concurrency", type=_positive_int, metavar="N",
                   help="handlers running at once (threads, or asyncio tasks for async def; default 1)")
    w.add_argument("--visibility", type=_duration(positive=True, infinite=False), metavar="S",
                   help="lease seconds; the heartbeat extends them every S/3 (default 30)")
    w.add_argument("--max-attempts", type=_positive_int, metavar="N",
                   help="deliveries before a failing message's group is buried (default 5, or the Task's)")
    w.add_argument("--backoff", type=_duration(positive=False, infinite=False), metavar="S",
                   help="delay before the first retry; doubled at each failure, capped at 300 s "
                        "(default 1, or the Task's)")
    w.add_argument("--drain-timeout", type=_duration(positive=False, infinite=True), metavar="S",
                   help="seconds running handlers get to finish at shutdown; inf waits for them (default 30)")
    w.add_argument("--min-priority", type=_priority, metavar="N",
                   help="serve only groups of priority >= N (default 0, or the Task's)")
    w.add_argument("--prefetch", type=_natural_int, metavar="N",
                   help="durable queues: claim up to N messages beyond the idle slots, run as slots free "
                        "up (default: adaptive, as many as the slots run in about 0.05 s, up to 16; "
                        "0: never)")
    w.add_argument("--metrics-port", type=_port, metavar="P",
                   help="serve Prometheus metrics on http://HOST:P/metrics (needs prometheus_client)")
    w.add_argument("--metrics-host", metavar="HOST",
                   help="the address the metrics server binds (default 0.0.0.0, every interface; "
                        "127.0.0.1 keeps it local)")
    w.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                   help="logging level on stderr (default INFO); DEBUG also prints an error's traceback")

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


def resolve_serializer(spec: Optional[str]) -> Any:
    """``--serializer``: ``pickle``, ``json`` or ``MODULE:OBJECT`` -> what
    ``serializer=`` takes (``CliError`` for anything else)."""
    if spec is None or spec in ("pickle", "json"):
        return spec
    obj = import_object(spec, "MODULE:OBJECT", "the serializer")
    if not isinstance(obj, tuple) and callable(getattr(obj, "dumps", None)) and callable(getattr(obj, "loads", None)):
        obj = (obj.dumps, obj.loads)
    from ._serializers import check_serializer

    try:
        check_serializer(obj)
    except (TypeError, ValueError):
        raise CliError(f"the serializer {spec} is {type(obj).__name__}, not a (dumps, loads) pair of callables "
                       "or an object with dumps() and loads()", 2) from None
    return obj


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def open_transport(args: argparse.Namespace, serializer: Any, *, create: bool) -> Any:
    """The transport ``--sqlite`` / ``--postgres`` [``--queue``] name, storing
    events with ``serializer`` (``resolve_serializer(args.serializer)``);
    ``CliError`` with one line if it cannot be opened.  ``create``: a SQLite
    file that does not exist is made (the worker), else refused."""
    if args.queue is not None and args.postgres is None:
        raise CliError("--queue names a PostgreSQL queue: use it with --postgres", 2)
    if args.sqlite is not None:
        from . import SQLiteTransport

        if not create and not os.path.exists(args.sqlite):
            raise CliError(f"no such file: {args.sqlite}")
        try:
            return SQLiteTransport(args.sqlite, serializer=serializer)
        except Exception as exc:
            raise CliError(f"cannot open {args.sqlite}: {_first_line(exc)}") from exc
    try:
        from . import PostgresTransport
    except ImportError as exc:
        raise CliError(f"--postgres needs psycopg: pip install 'leasequeue[postgres]' ({exc})") from exc
    try:
        return PostgresTransport(args.postgres, queue=args.queue or "default", serializer=serializer)
    except Exception as exc:
        raise CliError(f"cannot open the PostgreSQL queue: {_first_line(exc)}") from exc


def import_object(target: str, form: str = "MODULE:OBJECT", what: str = "the handler") -> Any:
    """``"package.module:name"`` (or ``module:obj.attr``) -> the object (``CliError`` status 2 otherwise)."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise CliError(f"{what} must be given as {form}, not {target!r}", 2)
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise CliError(f"cannot import {module_name!r}: {_first_line(exc)}", 2) from exc
    except Exception as exc:
        raise CliError(f"importing {module_name!r} raised {type(exc).__name__}: {_first_line(exc)}", 2) from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise CliError(f"{module_name!r} has no attribute {attr!r}", 2) from None
    return obj


# ------------------------------------------------------------------ queue


def _jsonable(event: Any) -> Any:
    try:
        json.dumps(event)
    except (TypeError, ValueError):
        return repr(event)
    return event


def _is_undecodable(event: Any) -> bool:
    from ._serializers import Undecodable

    return type(event) is Undecodable


def _message_dict(m: Any) -> Dict[str, Any]:
    """A peeked message for ``--json``.  An event that cannot be decoded is
    ``"event": null`` with ``"error"`` (one line) and ``"raw"`` (the stored
    form: text as it is, bytes in base64, as ``"raw_encoding"`` says);
    ``"error"`` is null for every other message."""
    d: Dict[str, Any] = {"seq": m.seq, "attempt": m.attempt, "event": None, "error": None,
                         "due_at": getattr(m, "due_at", None), "key": getattr(m, "key", None)}
    if _is_undecodable(m.event):
        raw = m.event.raw
        d["error"] = m.event.error
        if isinstance(raw, str):
            d["raw"], d["raw_encoding"] = raw, "text"
        else:
            d["raw"], d["raw_encoding"] = base64.b64encode(raw).decode("ascii"), "base64"
    else:
        d["event"] = _jsonable(m.event)
    return d


def _event_cell(event: Any, width: int = 100) -> str:
    """A peeked event for the table: its repr, or, for one that cannot be
    decoded, ``UNDECODABLE (error) raw: ...``; cut at ``width`` characters."""
    if _is_undecodable(event):
        raw = repr(event.raw)
        text = f"UNDECODABLE ({event.error}) raw: {raw}"
        width = max(width, len(text) - len(raw) + 40)  # the error in full, and some of the raw form
    else:
        text = repr(event)
    return text if len(text) <= width else text[: width - 1] + "…"


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
    t = open_transport(args, resolve_serializer(args.serializer), create=False)
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
        data = [_message_dict(m) for m in messages]
        rows = [[m.seq, m.attempt, _event_cell(m.event)] for m in messages]
        _print(args, data, _table(("seq", "attempt", "event"), rows) if rows else "(no messages)")
        bad = sum(_is_undecodable(m.event) for m in messages)
        if bad:
            # One line on stderr (stdout stays the result, --json included).
            sys.stderr.write(f"note: {bad} event(s) could not be decoded with the {args.serializer or 'pickle'} "
                             "serializer: if they were published with another, pass it with --serializer "
                             "(pickle, json or MODULE:OBJECT)\n")
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


def _fail(prog: str, exc: BaseException, status: int, debug: bool) -> int:
    """One line on stderr, ``PROG: error: MESSAGE`` (the traceback before it if ``debug``)."""
    if debug:
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    message = str(exc) if isinstance(exc, CliError) else f"{type(exc).__name__}: {_first_line(exc)}"
    sys.stderr.write(f"{prog}: error: {' '.join(message.split()) or type(exc).__name__}\n")
    return status


def main_worker(args: argparse.Namespace) -> int:
    """``leasequeue worker``, every error one line (``--log-level DEBUG``: with its traceback)."""
    from ._cli_worker import run_worker

    debug = args.log_level == "DEBUG"
    try:
        return run_worker(args)
    except CliError as exc:
        return _fail("leasequeue worker", exc, exc.status, debug)
    except KeyboardInterrupt:  # before the worker's own signal handlers (importing, connecting)
        sys.stderr.write("leasequeue worker: interrupted\n")
        return 130
    except Exception as exc:  # a transport error while running: one line, not a traceback
        return _fail("leasequeue worker", exc, 1, debug)


def main_queue(args: argparse.Namespace) -> int:
    """``leasequeue queue``, every error one line."""
    try:
        return run_queue(args)
    except CliError as exc:
        return _fail("leasequeue queue", exc, exc.status, False)
    except KeyboardInterrupt:
        sys.stderr.write("leasequeue queue: interrupted\n")
        return 130
    except Exception as exc:  # a transport error: one line, not a traceback
        return _fail("leasequeue queue", exc, 1, False)
