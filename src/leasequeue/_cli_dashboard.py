"""The ``leasequeue dashboard`` command line: serve ``leasequeue.dashboard``
over a SQLite file or a PostgreSQL queue with uvicorn.

It binds 127.0.0.1 unless ``--host`` says otherwise, and refuses an
address other machines can reach unless the dashboard is ``--read-only`` or
asks for a password (``LEASEQUEUE_DASHBOARD_AUTH=user:password``).  Errors
are one line on stderr, ``leasequeue dashboard: error: ...``: 2 for bad
arguments, 1 for the rest (a file that does not exist, a queue that does
not exist, a port in use).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
from typing import Any

from ._cli import CliError, _add_backend, _fail, _port, open_transport, resolve_serializer

__all__ = ["add_parser", "main_dashboard"]

EPILOG = """\
examples:
  leasequeue dashboard --sqlite /var/lib/app/queue.db              # http://127.0.0.1:8080/
  leasequeue dashboard --postgres "dbname=app" --queue emails --port 9000
  leasequeue dashboard --sqlite queue.db --host 0.0.0.0 --read-only   # others may look, not act
  LEASEQUEUE_DASHBOARD_AUTH=ops:s3cret leasequeue dashboard --sqlite queue.db --host 0.0.0.0

Actions (pause, resume, retry, skip, purge) ask for confirmation in the page
and carry a CSRF token; --read-only refuses them all.  Binding an address
other than loopback needs --read-only or LEASEQUEUE_DASHBOARD_AUTH (HTTP
basic auth on every page; use it behind TLS).  Needs the dashboard extra:
pip install 'leasequeue[dashboard]'.
"""


def add_parser(sub: Any) -> None:
    """Add the ``dashboard`` subcommand to ``leasequeue``'s subparsers."""
    d = sub.add_parser(
        "dashboard",
        help="a web dashboard for a SQLite or PostgreSQL queue (needs leasequeue[dashboard])",
        description="Serve a web dashboard of a durable queue: counts, groups by state, a group's messages, "
        "and pause / resume / retry / skip / purge with a confirmation.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_backend(d)
    d.add_argument("--host", default="127.0.0.1", help="the address to bind (default 127.0.0.1: this machine only)")
    d.add_argument("--port", type=_port, default=8080, metavar="P", help="the port (default 8080; 0: any free one)")
    d.add_argument("--read-only", action="store_true", help="show, never act: every action is refused (403)")


def _listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` for uvicorn (a port in use is one
    line here, not uvicorn's log and exit status; ``--port 0`` shows the port taken)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)  # connections wait in the backlog until uvicorn serves them
    except OSError as exc:
        sock.close()
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def _exit_cleanly(signum: int, frame: Any) -> None:
    raise SystemExit(0)


def _serve(args: argparse.Namespace) -> int:
    from .dashboard.security import AUTH_ENV, LoopbackHostOnly, is_loopback, parse_credentials

    auth = os.environ.get(AUTH_ENV) or None
    if auth is not None:
        try:
            parse_credentials(auth)
        except ValueError as exc:
            raise CliError(str(exc), 2) from None
    if not is_loopback(args.host) and not args.read_only and auth is None:
        raise CliError(f"refusing to serve actions on {args.host} (not a loopback address) without a password: "
                       f"pass --read-only, or set {AUTH_ENV}=user:password", 2)
    try:
        import uvicorn

        from .dashboard import app
    except ImportError as exc:
        raise CliError(f"the dashboard needs its extra: pip install 'leasequeue[dashboard]' ({exc})") from exc
    transport = open_transport(args, resolve_serializer(args.serializer), create=False)
    sock = None
    try:
        sock = _listen(args.host, args.port)
        port = sock.getsockname()[1]
        asgi = app(transport, read_only=args.read_only, auth=auth)
        if is_loopback(args.host):
            asgi = LoopbackHostOnly(asgi)  # no DNS rebinding onto this machine's dashboard
        server = uvicorn.Server(uvicorn.Config(asgi, host=args.host, port=port, log_level="warning",
                                               access_log=False))
        shown = f"[{args.host}]" if ":" in args.host else args.host
        sys.stderr.write(f"leasequeue dashboard: serving http://{shown}:{port}/ "
                         f"({'read-only' if args.read_only else 'actions allowed'}; Ctrl-C stops)\n")
        sys.stderr.flush()
        # uvicorn stops gracefully on SIGTERM, then raises it again with
        # the handler it found: this one, so the exit is 0 (as after Ctrl-C).
        signal.signal(signal.SIGTERM, _exit_cleanly)
        server.run(sockets=[sock])
    finally:
        if sock is not None:
            sock.close()
        transport.close()
    return 0


def main_dashboard(args: argparse.Namespace) -> int:
    """``leasequeue dashboard``, every error one line."""
    try:
        return _serve(args)
    except CliError as exc:
        return _fail("leasequeue dashboard", exc, exc.status, False)
    except KeyboardInterrupt:
        return 0
    except Exception as exc:
        return _fail("leasequeue dashboard", exc, 1, False)
