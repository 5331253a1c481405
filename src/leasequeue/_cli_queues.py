"""``leasequeue queue --postgres CONNINFO`` queue administration:

* ``install [--queue Q ...]``: create the leasequeue schema or bring it up to
  date, and make the named queues (default: ``default``); idempotent;
* ``create-queue Q``: make one queue (exit 0 whether it was made or was
  there; the output says which);
* ``queues``: every queue with its counts (a table; ``--json``);
* ``drop-queue Q``: remove a queue and every message in it, for good: asks
  for confirmation on a terminal; ``--yes`` skips the question, and without
  a terminal (a script, a pipe) it refuses unless ``--yes``.

Queues are made, not typos: only ``install`` and ``create-queue`` make one,
and every other command on a queue that does not exist fails with one line.
``_cli.py`` registers these with ``add_queue_admin_parsers(cmds, common)``
and runs them with ``run_queue_admin(args, stdin)`` (None: not one of them).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, List, Optional

__all__ = ["ADMIN_COMMANDS", "add_queue_admin_parsers", "run_queue_admin"]

#: The subcommands of ``leasequeue queue`` this module runs.
ADMIN_COMMANDS = ("install", "create-queue", "queues", "drop-queue")

_STATS = ("messages", "groups", "leased", "parked", "paused", "buried", "scheduled")


def add_queue_admin_parsers(cmds: Any, common: argparse.ArgumentParser) -> None:
    """Add the PostgreSQL queue administration subcommands to ``leasequeue
    queue``'s subparsers ``cmds`` (``common``: the ``--json`` parent)."""
    i = cmds.add_parser("install", parents=[common],
                        help="PostgreSQL: create or upgrade the schema, and make queues (default: 'default')")
    i.add_argument("--queue", dest="install_queues", action="append", metavar="Q",
                   help="a queue to make if it does not exist (repeat for several; default: 'default')")
    c = cmds.add_parser("create-queue", parents=[common], help="PostgreSQL: make a queue")
    c.add_argument("queue_name", metavar="Q", help="the queue's name: letters, digits, _ . - (at most 63)")
    cmds.add_parser("queues", parents=[common], help="PostgreSQL: every queue, with its counts")
    d = cmds.add_parser("drop-queue", parents=[common],
                        help="PostgreSQL: remove a queue and all its messages, for good (confirmed)")
    d.add_argument("queue_name", metavar="Q", help="the queue's name")
    d.add_argument("--yes", action="store_true", help="do not ask for confirmation (needed without a terminal)")


def run_queue_admin(args: argparse.Namespace, stdin: Any = None) -> Optional[int]:
    """Run a queue administration command; its exit status, or None when
    ``args`` is another ``leasequeue queue`` command.  Errors raise
    ``_cli.CliError`` (or a ``LeaseQueueError``), which ``main_queue``
    prints as one line."""
    cmd = getattr(args, "queue_command", None)
    if cmd not in ADMIN_COMMANDS:
        return None
    from ._cli import CliError

    if getattr(args, "postgres", None) is None:
        raise CliError(f"{cmd} is a PostgreSQL command: use it with --postgres CONNINFO", 2)
    try:
        from . import PostgresTransport
    except ImportError as exc:
        raise CliError(f"--postgres needs psycopg: pip install 'leasequeue[postgres]' ({exc})") from exc
    conninfo = args.postgres
    if cmd == "install":
        return _install(PostgresTransport, conninfo, args)
    if cmd == "create-queue":
        from ._backends.postgres.queues import check_queue_name

        made = PostgresTransport.create_queue(conninfo, check_queue_name(args.queue_name))
        _say(args, {"queue": args.queue_name, "created": made},
             f"created queue {args.queue_name}" if made else f"queue {args.queue_name} exists already")
        return 0
    if cmd == "queues":
        listed = PostgresTransport.list_queues(conninfo)
        data = [dict(queue=name, **stats._asdict()) for name, stats in listed]
        if not data:
            text = "(no queues: make one with `create-queue Q` or `install --queue Q`)"
        else:
            from ._cli import _table

            text = _table(("queue",) + _STATS, [[d["queue"]] + [d[k] for k in _STATS] for d in data])
        _say(args, data, text)
        return 0
    return _drop(PostgresTransport, conninfo, args, stdin if stdin is not None else sys.stdin)


def _install(transport: Any, conninfo: str, args: argparse.Namespace) -> int:
    from ._backends.postgres.queues import check_queue_name

    names: List[str] = []
    if getattr(args, "queue", None):
        names.append(args.queue)
    names.extend(args.install_queues or [])
    if not names:
        names = ["default"]
    for name in names:  # every name checked before anything is done
        check_queue_name(name)
    transport.install(conninfo, queues=())
    made = {name: transport.create_queue(conninfo, name) for name in dict.fromkeys(names)}
    from ._backends.postgres.transport import SCHEMA_VERSION

    lines = [f"leasequeue schema version {SCHEMA_VERSION} installed"]
    lines += [f"created queue {name}" if new else f"queue {name} exists already" for name, new in made.items()]
    _say(args, {"schema_version": SCHEMA_VERSION, "queues": [{"queue": n, "created": new} for n, new in made.items()]},
         "\n".join(lines))
    return 0


def _drop(transport: Any, conninfo: str, args: argparse.Namespace, stdin: Any) -> int:
    from ._backends.postgres.queues import check_queue_name, missing
    from ._cli import CliError

    name = check_queue_name(args.queue_name)
    counts = dict(transport.list_queues(conninfo)).get(name)
    if counts is None:
        raise missing(name)
    if not args.yes:
        isatty = getattr(stdin, "isatty", None)
        if isatty is None or not isatty():
            raise CliError(f"not dropped: drop-queue asks on a terminal, and stdin is not one (pass --yes to drop "
                           f"queue {name!r} and its {counts.messages} message(s))")
        sys.stderr.write(f"drop queue {name!r}: remove it and its {counts.messages} message(s) in "
                         f"{counts.groups} group(s), for good? [y/N] ")
        sys.stderr.flush()
        if stdin.readline().strip().lower() not in ("y", "yes"):
            raise CliError("not dropped (answer y, or pass --yes)")
    if not transport.drop_queue(conninfo, name):  # dropped meanwhile by someone else
        raise missing(name)
    _say(args, {"queue": name, "dropped": True, "messages": counts.messages},
         f"dropped queue {name}: {counts.messages} message(s) removed")
    return 0


def _say(args: argparse.Namespace, data: Any, text: str) -> None:
    from ._cli import _print

    _print(args, data, text)
