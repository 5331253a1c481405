"""The dashboard's ASGI application: routes, actions and their guards.

``app(transport, read_only=False, auth=None)`` is a Starlette application
over one open transport (``SQLiteTransport``, ``PostgresTransport``, or any
``Transport``); the caller opens and closes the transport.  Pages:
``/``, ``/groups``, ``/groups/{group_id}``; JSON: ``/api/stats``,
``/api/groups``, ``/api/groups/{group_id}``; actions:
``POST /api/groups/{group_id}/{pause|resume|retry|skip|purge}``, each
needing the application's CSRF token and refused (403) when read-only.
Endpoints are plain functions: Starlette runs them in its thread pool, so
a transport call never blocks the event loop.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import parse_qs, urlencode

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from .._errors import LeaseQueueError
from .queries import STATES, groups_page
from .security import BasicAuth, CsrfToken, parse_credentials
from .views import group_json, group_url, message_json, messages_rows, render, stats_json

__all__ = ["ACTIONS", "app"]

#: The actions ``POST /api/groups/{group_id}/{action}`` takes.
ACTIONS = ("pause", "resume", "retry", "skip", "purge")

#: Messages a group's page and ``/api/groups/{group_id}`` show (``?n=`` up to ``_MAX_PEEK``).
_PEEK = 20
_MAX_PEEK = 200
_PAGE_SIZE = 50

# Scripts only from the dashboard itself (no inline script runs, even one
# that escaping missed), no plugins, no framing (clickjacking of the actions).
_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
                               "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


class _Refused(Exception):
    """An action that changed nothing: its HTTP status and a one-line message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _static(name: str) -> str:
    from importlib.resources import files

    return (files("leasequeue.dashboard") / "static" / name).read_text(encoding="utf-8")


class _Dashboard:
    """The endpoints of one application: its transport, its mode, its CSRF token."""

    def __init__(self, transport: Any, read_only: bool) -> None:
        self.t = transport
        self.read_only = read_only
        self.csrf = CsrfToken()
        self.js = _static("dashboard.js")
        self.css = _static("dashboard.css")

    # ------------------------------------------------------------ helpers

    @staticmethod
    def _base(request: Request) -> str:
        return str(request.scope.get("root_path", "")).rstrip("/")

    def _page(self, request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        context.setdefault("message", None)
        html = render(name, base=self._base(request), read_only=self.read_only, csrf=self.csrf.value,
                      states=STATES, **context)
        return HTMLResponse(html, status_code=status, headers=_HEADERS)

    @staticmethod
    def _json(data: Any, status: int = 200) -> JSONResponse:
        return JSONResponse(data, status_code=status, headers={"Cache-Control": "no-store"})

    @staticmethod
    def _list_args(request: Request) -> Tuple[Optional[str], str, int, int, Optional[str]]:
        q = request.query_params
        state = q.get("state") or None
        if state is not None and state not in STATES:
            raise HTTPException(400, f"unknown state {state!r}: one of {', '.join(STATES)}")
        try:
            page = int(q.get("page") or 1)
            size = int(q.get("size") or _PAGE_SIZE)
        except ValueError:
            raise HTTPException(400, "page and size must be integers") from None
        if page < 1 or not 1 <= size <= 500:
            raise HTTPException(400, "page must be >= 1 and size from 1 to 500")
        return state, q.get("q") or "", page, size, q.get("after") or None

    def _group(self, request: Request) -> Tuple[str, Any, List[Any]]:
        group_id = request.path_params["group_id"]
        try:
            n = min(max(int(request.query_params.get("n") or _PEEK), 1), _MAX_PEEK)
        except ValueError:
            raise HTTPException(400, "n must be an integer") from None
        try:
            info = self.t.group(group_id)
        except (TypeError, ValueError):
            info = None
        if info is None:
            raise HTTPException(404, f"no group {group_id!r}")
        return group_id, info, self.t.peek(group_id, n)

    # ------------------------------------------------------------ pages

    def overview(self, request: Request) -> Response:
        stats = self.t.stats()
        buried = groups_page(self.t, "buried", "", 1, 20)
        return self._page(request, "overview.html", stats=stats_json(stats), buried=buried,
                          message=request.query_params.get("msg"))

    def groups(self, request: Request) -> Response:
        state, prefix, page, size, after = self._list_args(request)
        result = groups_page(self.t, state, prefix, page, size, after=after)
        return self._page(request, "groups.html", result=result, state=state, prefix=prefix,
                          message=request.query_params.get("msg"))

    def group(self, request: Request) -> Response:
        group_id, info, messages = self._group(request)
        return self._page(request, "group.html", info=info, group_id=group_id, rows=messages_rows(messages),
                          head_seq=messages[0].seq if messages else None, actions=ACTIONS,
                          message=request.query_params.get("msg"))

    def js_file(self, request: Request) -> Response:
        return Response(self.js, media_type="text/javascript", headers={"Cache-Control": "no-cache"})

    def css_file(self, request: Request) -> Response:
        return Response(self.css, media_type="text/css", headers={"Cache-Control": "no-cache"})

    # ------------------------------------------------------------ JSON

    def api_stats(self, request: Request) -> Response:
        return self._json(stats_json(self.t.stats()))

    def api_groups(self, request: Request) -> Response:
        state, prefix, page, size, after = self._list_args(request)
        result = groups_page(self.t, state, prefix, page, size, after=after)
        return self._json({"groups": [group_json(g) for g in result.groups], "page": result.page,
                           "size": result.size, "has_next": result.has_next, "state": state, "q": prefix,
                           "next_after": result.groups[-1].group_id if result.has_next else None})

    def api_group(self, request: Request) -> Response:
        _, info, messages = self._group(request)
        return self._json({"group": group_json(info), "messages": [message_json(m) for m in messages]})

    # ------------------------------------------------------------ actions

    async def action(self, request: Request) -> Response:
        group_id = request.path_params["group_id"]
        action = request.path_params["action"]
        fields = await self._fields(request)
        is_form = not request.headers.get("content-type", "").startswith("application/json")
        try:
            if self.read_only:
                raise _Refused(403, "the dashboard is read-only: actions are refused")
            if not self.csrf.check(request.headers.get("x-csrf-token") or fields.get("csrf_token")):
                raise _Refused(403, "missing or wrong CSRF token: reload the page and try again")
            if action not in ACTIONS:
                raise _Refused(404, f"no action {action!r}: one of {', '.join(ACTIONS)}")
            result = await run_in_threadpool(self._apply, group_id, action, fields)
        except _Refused as exc:
            if is_form:
                return self._page(request, "error.html", status=exc.status, error=exc.message)
            return self._json({"ok": False, "error": exc.message}, exc.status)
        if is_form:
            base = self._base(request)
            target = f"{base}/groups" if action == "purge" else group_url(base, group_id)
            return RedirectResponse(f"{target}?{urlencode({'msg': result['done']})}", status_code=303)
        return self._json({"ok": True, "group_id": group_id, "action": action, **result})

    @staticmethod
    async def _fields(request: Request) -> Dict[str, Any]:
        """The body's fields: a JSON object, or a URL-encoded form (no multipart)."""
        body = await request.body()
        if not body:
            return {}
        if request.headers.get("content-type", "").startswith("application/json"):
            try:
                data = json.loads(body)
            except ValueError:
                return {}
            return data if isinstance(data, dict) else {}
        try:
            return {k: v[-1] for k, v in parse_qs(body.decode("utf-8"), keep_blank_values=True).items()}
        except UnicodeDecodeError:
            return {}

    def _apply(self, group_id: str, action: str, fields: Dict[str, Any]) -> Dict[str, Any]:
        """Run one action (in a worker thread); ``_Refused`` if it changed nothing."""
        t = self.t
        try:
            info = t.group(group_id)
        except (TypeError, ValueError) as exc:
            raise _Refused(400, str(exc)) from None
        if info is None:
            raise _Refused(404, f"no group {group_id!r}")
        if action == "pause":
            if not t.pause(group_id):
                raise _Refused(409, f"group {group_id!r} is already paused")
            return {"done": f"paused {group_id}"}
        if action == "resume":
            if not t.resume(group_id):
                raise _Refused(409, f"nothing to resume: group {group_id!r} is not paused, parked or buried")
            return {"done": f"resumed {group_id}"}
        if action == "retry":
            if not t.retry(group_id):
                raise _Refused(409, f"refused: the head of group {group_id!r} is leased by a worker, "
                                    "or the group holds no message")
            return {"done": f"retried {group_id}: its head runs again from attempt 1"}
        if action == "skip":
            return self._skip(group_id, fields.get("seq"))
        removed = t.purge(group_id)
        return {"done": f"purged {group_id}: {removed} message(s) removed", "removed": removed}

    def _skip(self, group_id: str, seq: Any) -> Dict[str, Any]:
        """Skip the head only if it is ``seq`` (as ``leasequeue queue skip G --seq N``)."""
        try:
            want = int(seq)
        except (TypeError, ValueError):
            raise _Refused(400, "skip needs the head's seq (the seq shown on the group's page)") from None
        head = self.t.peek(group_id, 1)
        if not head:
            raise _Refused(409, f"refused: group {group_id!r} holds no message")
        if head[0].seq != want:
            raise _Refused(409, f"refused: the head of group {group_id!r} is seq {head[0].seq}, not {want}: "
                                "nothing skipped")
        if not self.t.skip(group_id):
            raise _Refused(409, f"refused: the head of group {group_id!r} (seq {want}) is under a lease that "
                                "has not expired: a worker is running it")
        return {"done": f"skipped seq {want} of {group_id}", "skipped_seq": want}

    # ------------------------------------------------------------ errors

    def http_error(self, request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 500)
        detail = str(getattr(exc, "detail", exc))
        if request.url.path.startswith(f"{self._base(request)}/api/"):
            return self._json({"ok": False, "error": detail}, status)
        return self._page(request, "error.html", status=status, error=detail)

    def queue_error(self, request: Request, exc: Exception) -> Response:
        """A transport error (a queue dropped, a database gone): 503, one line."""
        text = " ".join(str(exc).split()) or type(exc).__name__
        if request.url.path.startswith(f"{self._base(request)}/api/"):
            return self._json({"ok": False, "error": text}, 503)
        return self._page(request, "error.html", status=503, error=text)


def app(transport: Any, read_only: bool = False, *, auth: Optional[str] = None) -> Any:
    """The dashboard of ``transport`` as an ASGI application.

    Mount it in a Starlette or FastAPI application
    (``Mount("/queue", app=leasequeue.dashboard.app(t))``), or serve it with
    any ASGI server.  ``read_only=True`` refuses every action (403).
    ``auth="user:password"`` asks for HTTP basic auth on every route.  The
    transport stays the caller's: open it before, close it after.
    """
    if type(read_only) is not bool:
        raise TypeError(f"read_only must be a bool, not {type(read_only).__name__}")
    if auth is not None and not isinstance(auth, str):
        raise TypeError(f"auth must be a 'user:password' str or None, not {type(auth).__name__}")
    credentials = parse_credentials(auth) if auth is not None else None
    for name in ("stats", "group", "groups", "peek"):
        if not callable(getattr(transport, name, None)):
            raise TypeError(f"transport must be a leasequeue transport, not {type(transport).__name__}")
    d = _Dashboard(transport, read_only)
    routes = [
        Route("/", d.overview, methods=["GET"]),
        Route("/groups", d.groups, methods=["GET"]),
        Route("/groups/{group_id:path}", d.group, methods=["GET"]),
        Route("/api/stats", d.api_stats, methods=["GET"]),
        Route("/api/groups", d.api_groups, methods=["GET"]),
        Route("/api/groups/{group_id:path}/{action}", d.action, methods=["POST"]),
        Route("/api/groups/{group_id:path}", d.api_group, methods=["GET"]),
        Route("/static/dashboard.js", d.js_file, methods=["GET"]),
        Route("/static/dashboard.css", d.css_file, methods=["GET"]),
    ]
    star = Starlette(routes=routes, exception_handlers={HTTPException: d.http_error,
                                                        LeaseQueueError: d.queue_error})
    if credentials is not None:
        return BasicAuth(star, *credentials)
    return star


