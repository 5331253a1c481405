"""The dashboard's guards: the CSRF token its pages carry, HTTP basic auth,
and what counts as a loopback address.

Every action (``POST /api/groups/{group_id}/{action}``) must carry the
token of the running application (a random 256-bit value made when the
application is made) in an ``X-CSRF-Token`` header or a ``csrf_token``
form field: a page of another site can make a browser send a request, but
cannot read the dashboard's pages to learn the token.  Basic auth
(``LEASEQUEUE_DASHBOARD_AUTH=user:password``) guards every route; the
comparison takes the same time whatever the guess.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import secrets
import urllib.parse
from typing import Any, Awaitable, Callable, MutableMapping, Optional, Tuple

__all__ = ["AUTH_ENV", "BasicAuth", "CsrfToken", "LoopbackHostOnly", "is_loopback", "parse_credentials"]

#: The environment variable that holds ``user:password`` for basic auth.
AUTH_ENV = "LEASEQUEUE_DASHBOARD_AUTH"

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class CsrfToken:
    """One random token; ``check(value)`` compares in constant time."""

    def __init__(self) -> None:
        self.value = secrets.token_urlsafe(32)

    def check(self, value: Optional[str]) -> bool:
        return value is not None and hmac.compare_digest(value.encode("utf-8"), self.value.encode("utf-8"))


def parse_credentials(text: str) -> Tuple[str, str]:
    """``"user:password"`` -> ``(user, password)``; ``ValueError`` if either is empty."""
    user, sep, password = text.partition(":")
    if not sep or not user or not password:
        raise ValueError(f"{AUTH_ENV} must be user:password (both non-empty)")
    return user, password


class BasicAuth:
    """ASGI middleware: every HTTP request needs ``Authorization: Basic``
    with these credentials, else 401 with a ``WWW-Authenticate`` challenge."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], user: str, password: str) -> None:
        self.app = app
        self._expected = f"{user}:{password}".encode("utf-8")

    def _allowed(self, scope: Scope) -> bool:
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                kind, _, encoded = value.partition(b" ")
                if kind.lower() != b"basic":
                    return False
                try:
                    given = base64.b64decode(encoded.strip(), validate=True)
                except (binascii.Error, ValueError):
                    return False
                return hmac.compare_digest(given, self._expected)
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self._allowed(scope):
            await self.app(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"www-authenticate", b'Basic realm="leasequeue dashboard", charset="UTF-8"'),
                                (b"content-type", b"text/plain; charset=utf-8")]})
        await send({"type": "http.response.body", "body": b"authentication required\n"})


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` serves this machine only (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class LoopbackHostOnly:
    """ASGI middleware for a dashboard bound to loopback: a request whose
    ``Host`` is not a loopback name or address is refused (400).  A page of
    another site whose name an attacker points at 127.0.0.1 (DNS rebinding)
    sends its own name as ``Host``, so it can neither read the pages (and
    their CSRF token) nor act."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.app = app

    @staticmethod
    def _allowed(scope: Scope) -> bool:
        for name, value in scope.get("headers", ()):
            if name == b"host":
                try:
                    host = urllib.parse.urlsplit("//" + value.decode("latin-1")).hostname
                except ValueError:
                    return False
                return host is not None and is_loopback(host)
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self._allowed(scope):
            await self.app(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 400,
                    "headers": [(b"content-type", b"text/plain; charset=utf-8")]})
        await send({"type": "http.response.body", "body": b"this dashboard answers only to a loopback Host\n"})
