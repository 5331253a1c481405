"""groups_page: the dashboard's paginated read, on a real SQLite file and
the suite's PostgreSQL, against what ``groups()`` says (the same groups,
states and fields, in ``group_id`` order)."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from leasequeue._backends.sqlite.pages import prefix_bound
from leasequeue.dashboard import STATES, groups_page


def one_group_in_each_state(t: Any) -> None:
    """Groups ``<state>-1`` (and some ready ones), one group per state."""
    t.publish("leased-1", "a")
    assert t.claim("w", 3600).group_id == "leased-1"
    t.publish("parked-1", "b")
    lease = t.claim("w", 3600)
    assert lease.group_id == "parked-1"
    t.nack(lease, 3600)
    t.publish("buried-1", "c")
    lease = t.claim("w", 3600)
    assert lease.group_id == "buried-1"
    t.bury(lease, "why <not>")
    t.publish("paused-1", "d")
    t.pause("paused-1")
    t.publish("scheduled-1", "e", delay=3600)
    for i in range(5):
        t.publish(f"ready-{i}", i)


def test_every_state_as_groups_says(make_transport: Callable[..., Any]) -> None:
    t = make_transport()
    one_group_in_each_state(t)
    everything = sorted(t.groups(), key=lambda g: g.group_id)
    assert {g.state for g in everything} == set(STATES)
    assert groups_page(t, size=500).groups == everything
    for state in STATES:
        page = groups_page(t, state, size=500)
        assert page.groups == [g for g in everything if g.state == state], state
        assert not page.has_next
    assert [g.group_id for g in groups_page(t, "buried").groups] == ["buried-1"]
    assert groups_page(t, "buried").groups[0].reason == "why <not>"


def test_pages_and_prefixes(make_transport: Callable[..., Any]) -> None:
    t = make_transport()
    ids = [f"order/{i:03d}" for i in range(23)] + [f"user {i}" for i in range(7)] + ["orders", "order"]
    for gid in ids:
        t.publish(gid, gid)
    seen = []
    page = 1
    while True:
        p = groups_page(t, page=page, size=10)
        assert len(p.groups) == 10 or not p.has_next
        seen += [g.group_id for g in p.groups]
        if not p.has_next:
            break
        page += 1
    assert seen == sorted(ids) and page == 4
    assert [g.group_id for g in groups_page(t, prefix="order/", size=500).groups] == sorted(ids[:23])
    assert [g.group_id for g in groups_page(t, prefix="order", size=500).groups] == sorted(ids[:23] + ["orders",
                                                                                                          "order"])
    assert [g.group_id for g in groups_page(t, "ready", prefix="user ", page=2, size=5).groups] == ["user 5",
                                                                                                    "user 6"]
    assert groups_page(t, prefix="nobody").groups == []
    # after=: the page after a group, as the next links ask for it: the same pages as page=N.
    for state, prefix in ((None, ""), ("ready", "order"), (None, "user ")):
        page, after, walked = 1, None, []
        while True:
            p = groups_page(t, state, prefix, page, 4, after=after)
            assert p.groups == groups_page(t, state, prefix, page, 4).groups
            walked += p.groups
            if not p.has_next:
                break
            page, after = page + 1, p.groups[-1].group_id
        assert walked == groups_page(t, state, prefix, size=500).groups
    assert groups_page(t, page=99).groups == []


def test_bad_arguments_are_refused(make_transport: Callable[..., Any]) -> None:
    t = make_transport()
    with pytest.raises(ValueError, match="unknown state"):
        groups_page(t, "asleep")
    with pytest.raises(ValueError, match="page"):
        groups_page(t, page=0)
    with pytest.raises(ValueError, match="size"):
        groups_page(t, size=501)
    with pytest.raises(TypeError, match="prefix"):
        groups_page(t, prefix=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="after"):
        groups_page(t, after=3)  # type: ignore[arg-type]


def test_in_memory_transports_too(impl: Any) -> None:
    t = impl.InMemoryTransport()
    one_group_in_each_state(t)
    everything = sorted(t.groups(), key=lambda g: g.group_id)
    for state in STATES:
        assert groups_page(t, state, size=500).groups == [g for g in everything if g.state == state]
    assert [g.group_id for g in groups_page(t, prefix="ready-", page=2, size=3).groups] == ["ready-3", "ready-4"]


def test_prefix_bound() -> None:
    assert prefix_bound("") is None
    assert prefix_bound("ab") == "ac"
    assert prefix_bound("a\U0010ffff") == "b"
    assert prefix_bound("\U0010ffff") is None
    assert prefix_bound("a\ud7ff") == "a\ue000"
    for prefix in ("ab", "a\U0010ffff", "x\ud7ff"):
        bound = prefix_bound(prefix)
        assert bound is not None
        for tail in ("", "\x00", "zz", "\U0010ffff\U0010ffff"):
            assert (prefix + tail).encode("utf-8") < bound.encode("utf-8")
