"""The dashboard over real HTTP (uvicorn on a loopback port, urllib):
every route, the actions and their guards (CSRF, read-only, basic auth),
escaping, pagination, unknown groups, on a real SQLite file and a queue of
the suite's PostgreSQL."""

from __future__ import annotations

import base64
import json
from typing import Any, Callable

import pytest
from markupsafe import escape
from dashboard_helpers import Served, api_path, page_path

import leasequeue
from leasequeue import dashboard

EVIL_GROUP = "tenant a/<b>order</b> 17"
EVIL_EVENT = "<script>window.__pwned=1</script><img src=x onerror=\"window.__pwned=2\">"
EVIL_REASON = "<img src=x onerror=alert(1)> & 'quotes'"


def buried_queue(t: Any) -> None:
    """EVIL_GROUP buried (its head: EVIL_EVENT, then a second message), and a ready group."""
    t.publish(EVIL_GROUP, EVIL_EVENT)
    t.publish(EVIL_GROUP, {"n": 2})
    lease = t.claim("worker-1", 60)
    assert lease.group_id == EVIL_GROUP
    t.bury(lease, EVIL_REASON)
    t.publish("plain", 42)


def test_every_route(make_transport: Callable[..., Any], serve: Callable[[Any], Served]) -> None:
    t = make_transport()
    buried_queue(t)
    s = serve(dashboard.app(t))
    status, body = s.get("/")
    assert status == 200
    assert 'data-stat="buried">1<' in body and 'data-stat="messages">3<' in body
    assert str(escape(EVIL_REASON)) in body  # the buried group, with its reason, on the overview
    status, stats = s.get_json("/api/stats")
    assert status == 200 and stats == t.stats()._asdict()
    status, data = s.get_json("/api/groups")
    assert status == 200 and [g["group_id"] for g in data["groups"]] == ["plain", EVIL_GROUP]
    assert data["has_next"] is False and data["page"] == 1
    status, data = s.get_json("/api/groups?state=buried")
    assert [(g["group_id"], g["reason"]) for g in data["groups"]] == [(EVIL_GROUP, EVIL_REASON)]
    status, body = s.get("/groups?state=buried")
    assert status == 200 and str(escape(EVIL_GROUP)) in body and "plain" not in body
    status, data = s.get_json(api_path(EVIL_GROUP))
    assert status == 200
    assert data["group"]["state"] == "buried" and data["group"]["attempt"] == 1
    assert [(m["seq"], m["attempt"], m["event"]) for m in data["messages"]] == [
        (1, 1, EVIL_EVENT), (2, 0, {"n": 2})]
    status, body = s.get(page_path(EVIL_GROUP))
    assert status == 200 and 'id="group-state">buried<' in body
    assert 'name="seq" value="1"' in body  # skip names the head it was shown
    for path, kind in (("/static/dashboard.js", "javascript"), ("/static/dashboard.css", "css")):
        status, headers, _ = s.request(path)
        assert status == 200 and kind in headers["content-type"]


def test_everything_is_escaped(make_transport: Callable[..., Any], serve: Callable[[Any], Served]) -> None:
    t = make_transport()
    buried_queue(t)
    s = serve(dashboard.app(t))
    for path in ("/", "/groups", "/groups?state=buried&q=" + "tenant%20a%2F%3Cb%3E", page_path(EVIL_GROUP)):
        status, headers, body = s.request(path)
        assert status == 200, path
        assert "<script>window" not in body and "<img src=x" not in body and "<b>order</b>" not in body, path
        assert "script-src 'self'" in headers["content-security-policy"]
    _, body = s.get(page_path(EVIL_GROUP))
    assert str(escape(repr(EVIL_EVENT))) in body
    assert str(escape(EVIL_REASON)) in body
    # The group id of a link is percent-encoded whole, "/" included.
    _, body = s.get("/groups")
    assert 'href="/groups/tenant%20a%2F%3Cb%3Eorder%3C%2Fb%3E%2017"' in body
    # The same in the error page of an unknown group (its id is in the message).
    status, body = s.get(page_path("<i>nobody</i>"))
    assert status == 404 and "<i>" not in body and "&lt;i&gt;nobody&lt;/i&gt;" in body


def test_actions(make_transport: Callable[..., Any], serve: Callable[[Any], Served]) -> None:
    t = make_transport()
    buried_queue(t)
    s = serve(dashboard.app(t))
    token = s.token()
    assert s.act_json(EVIL_GROUP, "retry", token) == (200, {
        "ok": True, "group_id": EVIL_GROUP, "action": "retry",
        "done": f"retried {EVIL_GROUP}: its head runs again from attempt 1"})
    info = t.group(EVIL_GROUP)
    assert info.state == "ready" and t.peek(EVIL_GROUP)[0].attempt == 0
    assert s.act_json(EVIL_GROUP, "pause", token)[0] == 200 and t.group(EVIL_GROUP).paused
    status, data = s.act_json(EVIL_GROUP, "pause", token)
    assert status == 409 and "already paused" in data["error"]
    assert s.act_json(EVIL_GROUP, "resume", token)[0] == 200 and not t.group(EVIL_GROUP).paused
    # skip: only the head it names
    status, data = s.act_json(EVIL_GROUP, "skip", token, seq=2)
    assert status == 409 and "is seq 1, not 2" in data["error"] and len(t.peek(EVIL_GROUP, 5)) == 2
    status, data = s.act_json(EVIL_GROUP, "skip", token)
    assert status == 400 and len(t.peek(EVIL_GROUP, 5)) == 2
    status, data = s.act_json(EVIL_GROUP, "skip", token, seq=1)
    assert (status, data["skipped_seq"]) == (200, 1) and [m.seq for m in t.peek(EVIL_GROUP, 5)] == [2]
    # a head under a live lease is not skipped
    lease = t.claim("w", 60)
    assert lease.group_id in (EVIL_GROUP, "plain")
    status, data = s.act_json(lease.group_id, "skip", token, seq=lease.seq)
    assert status == 409 and "lease" in data["error"] and t.peek(lease.group_id)[0].seq == lease.seq
    status, data = s.act_json(EVIL_GROUP, "purge", token)
    assert (status, data["removed"]) == (200, 1) and t.group(EVIL_GROUP) is None
    status, data = s.act_json(EVIL_GROUP, "purge", token)
    assert status == 404 and "no group" in data["error"]
    status, data = s.act_json("plain", "explode", token)
    assert status == 404 and "no action" in data["error"]


def test_a_form_action_redirects_to_the_group(make_transport: Callable[..., Any],
                                               serve: Callable[[Any], Served]) -> None:
    t = make_transport()
    buried_queue(t)
    s = serve(dashboard.app(t))
    status, headers, _ = s.act_form(EVIL_GROUP, "retry", csrf_token=s.token())
    assert status == 303 and headers["location"].startswith(page_path(EVIL_GROUP) + "?msg=retried")
    assert t.group(EVIL_GROUP).state == "ready"
    status, headers, _ = s.act_form(EVIL_GROUP, "purge", csrf_token=s.token())
    assert status == 303 and headers["location"].startswith("/groups?msg=purged")
    status, body = s.get(headers["location"])
    assert status == 200 and "purged tenant a/&lt;b&gt;" in body


def test_actions_need_the_csrf_token(make_transport: Callable[..., Any], serve: Callable[[Any], Served]) -> None:
    t = make_transport()
    buried_queue(t)
    s = serve(dashboard.app(t))
    before = (t.stats(), t.groups(), t.peek(EVIL_GROUP, 5))
    for action in dashboard.ACTIONS:
        for token in (None, "", "forged", s.token() + "x"):
            status, data = s.act_json(EVIL_GROUP, action, token, seq=1)
            assert status == 403 and "CSRF" in data["error"], (action, token)
        status, _, body = s.act_form(EVIL_GROUP, action, seq=1)  # a cross-site form post carries none
        assert status == 403 and "CSRF" in body
    # A token from another dashboard (another process's) is not this one's.
    other = serve(dashboard.app(t))
    assert s.act_json(EVIL_GROUP, "retry", other.token())[0] == 403
    assert (t.stats(), t.groups(), t.peek(EVIL_GROUP, 5)) == before


def test_read_only_refuses_every_action(make_transport: Callable[..., Any],
                                        serve: Callable[[Any], Served]) -> None:
    t = make_transport()
    buried_queue(t)
    s = serve(dashboard.app(t, read_only=True))
    before = (t.stats(), t.groups(), t.peek(EVIL_GROUP, 5))
    token = s.token()
    for action in dashboard.ACTIONS:
        status, data = s.act_json(EVIL_GROUP, action, token, seq=1)
        assert status == 403 and "read-only" in data["error"], action
    _, body = s.get(page_path(EVIL_GROUP))
    assert "<form method=\"post\"" not in body and "read-only" in body
    assert (t.stats(), t.groups(), t.peek(EVIL_GROUP, 5)) == before


def test_pagination(make_transport: Callable[..., Any], serve: Callable[[Any], Served]) -> None:
    t = make_transport()
    t.publish_many([(f"g{i:03d}", i) for i in range(120)])
    s = serve(dashboard.app(t))
    got = []
    for page in (1, 2, 3):
        status, data = s.get_json(f"/api/groups?page={page}")
        assert status == 200 and data["has_next"] == (page < 3)
        got += [g["group_id"] for g in data["groups"]]
    assert got == [f"g{i:03d}" for i in range(120)]
    status, body = s.get("/groups?page=2")
    assert 'rel="next" href="/groups?state=&amp;q=&amp;page=3&amp;after=g099"' in body
    assert "g050" in body and "g100" not in body
    # Following next_after (what the pages' next links carry) seeks instead of skipping.
    walked, after = [], ""
    while after is not None:
        _, data = s.get_json(f"/api/groups?size=40&after={after}" if after else "/api/groups?size=40")
        walked += [g["group_id"] for g in data["groups"]]
        after = data["next_after"]
    assert walked == got
    _, data = s.get_json("/api/groups?q=g11&size=5&state=ready")
    assert [g["group_id"] for g in data["groups"]] == [f"g11{i}" for i in range(5)] and data["has_next"]
    for bad in ("page=0", "page=x", "size=501", "state=sleeping"):
        status, data = s.get_json(f"/api/groups?{bad}")
        assert status == 400 and data["ok"] is False, bad
    status, body = s.get("/groups?state=sleeping")
    assert status == 400 and "unknown state" in body


def test_unknown_group(make_transport: Callable[..., Any], serve: Callable[[Any], Served]) -> None:
    t = make_transport()
    s = serve(dashboard.app(t))
    status, body = s.get(page_path("nobody/here"))
    assert status == 404 and "no group" in body
    status, data = s.get_json(api_path("nobody/here"))
    assert status == 404 and data == {"ok": False, "error": "no group 'nobody/here'"}
    status, data = s.act_json("nobody", "pause", s.token())
    assert status == 404 and t.group("nobody") is None


def test_an_undecodable_event_is_shown_as_such(make_transport: Callable[..., Any],
                                               serve: Callable[[Any], Served]) -> None:
    writer = make_transport()  # pickle
    writer.publish("g", {"a": 1})
    reader = make_transport(serializer="json")
    s = serve(dashboard.app(reader))
    status, data = s.get_json(api_path("g"))
    assert status == 200
    (m,) = data["messages"]
    assert m["undecodable"] is True and m["event"] is None and m["error"]
    status, body = s.get(page_path("g"))
    assert status == 200 and "UNDECODABLE (" in body and 'class="event undecodable"' in body


def test_basic_auth(make_transport: Callable[..., Any], serve: Callable[[Any], Served]) -> None:
    t = make_transport()
    t.publish("g", 1)
    s = serve(dashboard.app(t, auth="ops:s3cret:x"))
    for path in ("/", "/api/stats", page_path("g")):
        status, headers, _ = s.request(path)
        assert status == 401 and headers["www-authenticate"].startswith("Basic"), path
    bad = base64.b64encode(b"ops:wrong").decode()
    assert s.get("/api/stats", headers={"Authorization": f"Basic {bad}"})[0] == 401
    good = {"Authorization": "Basic " + base64.b64encode(b"ops:s3cret:x").decode()}
    status, body = s.get("/api/stats", headers=good)
    assert status == 200 and json.loads(body)["messages"] == 1
    status, _, body = s.request(api_path("g", "pause"), method="POST", data=b"{}",
                                headers={"Content-Type": "application/json"})
    assert status == 401 and not t.group("g").paused


def test_mounted_in_an_application(make_transport: Callable[..., Any], serve: Callable[[Any], Served]) -> None:
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Mount, Route

    t = make_transport()
    buried_queue(t)
    outer = Starlette(routes=[Route("/", lambda request: PlainTextResponse("the app")),
                              Mount("/ops/queue", app=dashboard.app(t))])
    s = serve(outer)
    assert s.get("/") == (200, "the app")
    status, body = s.get("/ops/queue/")
    assert status == 200 and 'href="/ops/queue/groups/tenant%20a%2F%3Cb%3Eorder%3C%2Fb%3E%2017"' in body
    assert 'src="/ops/queue/static/dashboard.js"' in body
    status, data = s.get_json("/ops/queue" + api_path(EVIL_GROUP))
    assert status == 200 and data["group"]["state"] == "buried"
    status, headers, _ = s.request("/ops/queue" + api_path(EVIL_GROUP, "retry"), method="POST",
                                   data=f"csrf_token={s.token_at('/ops/queue/')}".encode(),
                                   headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 303 and headers["location"].startswith("/ops/queue" + page_path(EVIL_GROUP))
    assert t.group(EVIL_GROUP).state == "ready"


def test_a_transport_error_is_a_clear_error_page(make_transport: Callable[..., Any],
                                                 serve: Callable[[Any], Served]) -> None:
    t = make_transport()
    s = serve(dashboard.app(t))
    t.close()
    status, body = s.get("/")
    assert status == 503 and 'id="error"' in body and "closed" in body
    status, data = s.get_json("/api/stats")
    assert status == 503 and "closed" in data["error"]


def test_bad_arguments() -> None:
    t = leasequeue.InMemoryTransport()
    with pytest.raises(TypeError, match="read_only"):
        dashboard.app(t, read_only="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="user:password"):
        dashboard.app(t, auth="nopassword")
    with pytest.raises(TypeError, match="transport"):
        dashboard.app(object())
