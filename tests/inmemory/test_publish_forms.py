"""Every way of calling ``publish`` does the same, on both in-memory twins.

The Cython twin sends a positional call with no keyword (2 or 3 arguments)
straight to its Part 1 publish, past the argument parsing of the
keyword-only ``delay`` and ``key`` (``lq_publish_entry`` in
``transport_c.pyx``); every other form of call goes through that parsing.
Both routes must give the same results and the same errors, whether the
method is called bound, unbound or through a stored bound method.
"""

from __future__ import annotations

from typing import Any, Callable, List

import pytest

from leasequeue.testing import ManualClock


def calls(t: Any) -> List[Callable[..., Any]]:
    """``publish`` reached in each way a caller can reach it."""
    cls = type(t)
    bound = t.publish
    return [
        lambda *a, **k: t.publish(*a, **k),
        lambda *a, **k: bound(*a, **k),
        lambda *a, **k: cls.publish(t, *a, **k),
    ]


@pytest.mark.parametrize("way", [0, 1, 2])
def test_positional_and_keyword_forms_agree(transport_cls: Any, way: int) -> None:
    results = []
    for form in range(6):
        t = transport_cls(clock=ManualClock(10.0))
        publish = calls(t)[way]
        if form == 0:
            seqs = [publish("g", "a"), publish("g", "b", 3), publish("h", "c", 7)]
        elif form == 1:
            seqs = [publish("g", "a", 0), publish("g", "b", priority=3), publish("h", "c", priority=7)]
        elif form == 2:
            seqs = [publish(group_id="g", event="a"), publish("g", "b", 3, delay=0.0),
                    publish("h", event="c", priority=7, key=None)]
        elif form == 3:
            seqs = [publish("g", "a", delay=0), publish("g", "b", 3, delay=0.0, key=None),
                    publish("h", "c", 7)]
        elif form == 4:
            seqs = [publish(*("g", "a")), publish(*("g", "b"), **{"priority": 3}), publish("h", "c", *(7,))]
        else:
            seqs = [publish("g", event="a"), publish("g", "b", 3, key=None), publish("h", "c", 7, delay=0.0)]
        lease = t.claim("w", 5.0)
        results.append((seqs, [tuple(i) for i in t.groups()], (lease.seq, lease.group_id, lease.event)))
    assert all(r == results[0] for r in results), results
    assert results[0][0] == [1, 2, 3]
    assert [(g[0], g[1], g[2]) for g in results[0][1]] == [("g", 0, 2), ("h", 7, 1)]
    assert results[0][2] == (1, "g", "a")  # the oldest message of the never-claimed groups


@pytest.mark.parametrize("way", [0, 1, 2])
@pytest.mark.parametrize(
    "args, kwargs, error",
    [
        ((), {}, TypeError),  # no group, no event
        (("g",), {}, TypeError),  # no event
        (("g", "e", 0, 1), {}, TypeError),  # delay is keyword-only
        ((1, "e"), {}, TypeError),  # group_id not a str
        (("g", "e", "1"), {}, TypeError),  # priority not an int
        (("g", "e", True), {}, TypeError),  # a bool is no priority
        (("g", "e", 2**63), {}, OverflowError),
        (("g", "e"), {"delay": -1}, ValueError),
        (("g", "e"), {"delay": True}, TypeError),
        (("g", "e"), {"key": 1}, TypeError),
        (("g", "e"), {"nope": 1}, TypeError),
        (("g",), {"group_id": "g", "event": "e"}, TypeError),  # group_id twice
    ],
)
def test_bad_calls_raise_the_same_and_change_nothing(
    transport_cls: Any, way: int, args: tuple, kwargs: dict, error: type
) -> None:
    t = transport_cls(clock=ManualClock(10.0))
    t.publish("g", "first")
    before = (len(t), tuple(t.stats()), t.groups())
    with pytest.raises(error):
        calls(t)[way](*args, **kwargs)
    assert (len(t), tuple(t.stats()), t.groups()) == before
    assert t.publish("g", "next") == 2  # no seq was used up


def test_the_cython_twin_takes_its_direct_route(impl: Any) -> None:
    """The direct route is installed where it can be (CPython, this Cython);
    it is what the publish+claim+ack cycle's instruction count relies on."""
    if not impl.__name__.endswith("transport_c"):
        pytest.skip("the pure twin parses its arguments in Python")
    import platform

    if platform.python_implementation() != "CPython":
        pytest.skip("the direct route is for CPython")
    assert impl._FAST_PUBLISH is True
