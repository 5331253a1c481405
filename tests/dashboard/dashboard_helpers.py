"""A dashboard served for real (uvicorn in a thread, on a free loopback
port) and plain-urllib requests to it: no test client, no mock."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Dict, Optional, Tuple

import uvicorn


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Served:
    """An ASGI app served by uvicorn in a thread until ``stop()``."""

    def __init__(self, asgi: Any) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(asgi, host="127.0.0.1", port=self.port, log_level="warning",
                                                    access_log=False))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the dashboard did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(20)

    def request(self, path: str, *, method: str = "GET", data: Optional[bytes] = None,
                headers: Optional[Dict[str, str]] = None) -> Tuple[int, Dict[str, str], str]:
        """(status, headers, body text) without following redirects."""
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers or {})
        opener = urllib.request.build_opener(_NoRedirect)
        try:
            with opener.open(req, timeout=30) as resp:
                return resp.status, dict(resp.headers), resp.read().decode("utf-8")
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read().decode("utf-8")

    def get(self, path: str, **kw: Any) -> Tuple[int, str]:
        status, _, body = self.request(path, **kw)
        return status, body

    def get_json(self, path: str, **kw: Any) -> Tuple[int, Any]:
        status, body = self.get(path, **kw)
        return status, json.loads(body)

    def token(self) -> str:
        """The CSRF token the pages carry (read from the overview, as a browser would)."""
        return self.token_at("/")

    def token_at(self, path: str) -> str:
        status, body = self.get(path)
        assert status == 200
        found = re.search(r'<meta name="csrf-token" content="([^"]+)"', body)
        assert found, "the overview carries no CSRF token"
        return found.group(1)

    def act_json(self, group_id: str, action: str, token: Optional[str], **fields: Any) -> Tuple[int, Any]:
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["X-CSRF-Token"] = token
        status, _, body = self.request(api_path(group_id, action), method="POST",
                                       data=json.dumps(fields).encode(), headers=headers)
        return status, json.loads(body)

    def act_form(self, group_id: str, action: str, **fields: Any) -> Tuple[int, Dict[str, str], str]:
        return self.request(api_path(group_id, action), method="POST",
                            data=urllib.parse.urlencode(fields).encode(),
                            headers={"Content-Type": "application/x-www-form-urlencoded"})


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def page_path(group_id: str) -> str:
    return "/groups/" + urllib.parse.quote(group_id, safe="")


def api_path(group_id: str, action: Optional[str] = None) -> str:
    path = "/api/groups/" + urllib.parse.quote(group_id, safe="")
    return f"{path}/{action}" if action else path


def open_postgres(conninfo: str, queue: str, **kwargs: Any) -> Any:
    """A PostgreSQL queue, made first where queues must be made
    (``PostgresTransport.create_queue``, when this version has it)."""
    from leasequeue import PostgresTransport

    if hasattr(PostgresTransport, "create_queue"):
        PostgresTransport.create_queue(conninfo, queue)
    return PostgresTransport(conninfo, queue=queue, **kwargs)
