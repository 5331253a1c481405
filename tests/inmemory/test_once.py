"""SPEC Part 5, "Once": idempotency keys, on both in-memory twins.

``docs/decisions.md`` ("Once"): a key is held in its group (the group id,
not the group record) from the publish that stored it until its message has
left *and* ``dedup_window`` seconds of transport time have passed since that
publish; a publish with a held key publishes nothing, uses no seq, wakes
nobody and returns the holder's seq.  The memory of keys whose message left
is bounded by the window.
"""

from __future__ import annotations

import gc
import math
import threading
import time
import tracemalloc
from typing import Any, Callable, List

import pytest

from leasequeue.testing import ManualClock


@pytest.fixture
def windowed(make_transport: Callable[..., Any], clock: ManualClock) -> Any:
    with make_transport(clock=clock, dedup_window=10.0) as t:
        yield t


def test_a_held_key_publishes_nothing_and_returns_the_holder(transport: Any, clock: ManualClock) -> None:
    assert transport.publish("g", "charge", key="k") == 1
    reads = clock.reads
    assert transport.publish("g", "again", priority=9, key="k") == 1
    assert transport.publish("g", "again", delay=5, key="k") == 1
    assert clock.reads == reads + 1  # the delay read the clock (window 0: the key alone reads none)
    assert len(transport) == 1 and transport.stats().scheduled == 0
    assert transport.publish("g", "next") == 2  # no seq was used up
    assert transport.group("g").priority == 0
    assert [(m.seq, m.event, m.key) for m in transport.peek("g", 5)] == [(1, "charge", "k"), (2, "next", None)]


def test_a_key_belongs_to_its_group(transport: Any) -> None:
    assert transport.publish("a", 1, key="k") == 1
    assert transport.publish("b", 2, key="k") == 2
    assert transport.publish("a", 3, key="k2") == 3
    assert transport.publish("a", 4, key="") == 4  # the empty string is a key
    assert transport.publish("a", 5, key="") == 4
    assert len(transport) == 4


def test_a_held_key_creates_no_group(transport: Any) -> None:
    lease_source = transport.publish("g", "x", key="k")
    assert lease_source == 1
    transport.pause("p")
    assert transport.publish("g", "y", key="k") == 1
    assert [i.group_id for i in transport.groups()] == ["g", "p"]


def test_with_no_window_a_key_is_held_exactly_while_its_message_is(transport: Any) -> None:
    transport.publish("g", "a", key="k")
    lease = transport.claim("w", 30)
    assert transport.publish("g", "b", key="k") == 1  # leased: still held
    transport.nack(lease)
    assert transport.publish("g", "b", key="k") == 1
    transport.ack(transport.claim("w", 30))
    assert transport.publish("g", "b", key="k") == 2  # left: free again
    assert transport.skip("g") is True
    assert transport.publish("g", "c", key="k") == 3
    assert transport.purge("g") == 1
    assert transport.publish("g", "d", key="k") == 4


def test_a_held_key_survives_its_group_being_forgotten(windowed: Any, clock: ManualClock) -> None:
    windowed.publish("g", "a", key="k")
    windowed.ack(windowed.claim("w", 30))
    assert windowed.group("g") is None  # forgotten
    assert windowed.publish("g", "b", key="k") == 1
    assert windowed.group("g") is None


def test_a_window_holds_a_key_until_its_end(windowed: Any, clock: ManualClock) -> None:
    start = clock()
    windowed.publish("g", "a", key="k")
    clock.advance(3)
    windowed.ack(windowed.claim("w", 30))
    clock.set(start + 9.999)
    assert windowed.publish("g", "b", key="k") == 1
    clock.set(start + 10)  # now >= published_at + window: free
    assert windowed.publish("g", "b", key="k") == 2
    assert windowed.publish("g", "c", key="k") == 2  # the new holder


def test_a_key_whose_message_stays_is_held_past_the_window(windowed: Any, clock: ManualClock) -> None:
    windowed.publish("g", "a", key="k")
    lease = windowed.claim("w", 1000)
    clock.advance(100)
    assert windowed.publish("g", "b", key="k") == 1
    windowed.ack(lease)  # the window is over: the key goes with the message
    assert windowed.publish("g", "b", key="k") == 2


def test_skip_and_purge_start_the_window_like_an_ack(windowed: Any, clock: ManualClock) -> None:
    windowed.publish("g", "a", key="k1")
    windowed.publish("h", "b", key="k2")
    assert windowed.skip("g") is True
    assert windowed.purge("h") == 1
    assert windowed.publish("g", "x", key="k1") == 1
    assert windowed.publish("h", "x", key="k2") == 2
    clock.advance(10)
    assert windowed.publish("g", "x", key="k1") == 3
    assert windowed.publish("h", "x", key="k2") == 4


def test_an_infinite_window_holds_a_key_for_the_transports_life(make_transport: Callable[..., Any]) -> None:
    clock = ManualClock()
    t = make_transport(clock=clock, dedup_window=math.inf)
    t.publish("g", "a", key="k")
    t.ack(t.claim("w", 30))
    clock.advance(1e12)
    assert t.publish("g", "b", key="k") == 1
    assert len(t) == 0


def test_a_keyed_publish_reads_the_clock_only_with_a_window(
    transport: Any, windowed: Any, clock: ManualClock
) -> None:
    reads = clock.reads
    transport.publish("g", "a", key="k")
    transport.publish("g", "a", key="k")
    assert clock.reads == reads
    windowed.publish("g", "a", key="k")
    windowed.publish("g", "a", key="k")  # held: the reading still moves the transport's time
    assert clock.reads == reads + 2
    windowed.publish_many([("g", "b", 0, "k"), ("g", "c", 0, "j")])
    assert clock.reads == reads + 3
    windowed.publish_many([("g", "b"), ("g", "c", 0, None)])  # no key: no reading
    assert clock.reads == reads + 3


def test_a_held_key_moves_the_transports_time(windowed: Any, clock: ManualClock) -> None:
    windowed.publish("g", "a", key="k")
    clock.advance(5)
    windowed.publish("g", "a", key="k")  # held; its reading is the transport's time now
    clock.set(0.0)  # turned back
    lease = windowed.claim("w", 30)
    assert lease.expires_at == 1005.0 + 30


def test_a_str_subclass_key_is_converted_and_runs_no_user_code_under_the_lock(
    transport: Any,
) -> None:
    calls: List[str] = []

    class Key(str):
        def __hash__(self) -> int:
            calls.append("hash")
            transport.publish("other", "from hash")  # would deadlock under the lock
            return str.__hash__(self)

        def __eq__(self, other: object) -> bool:
            calls.append("eq")
            return str.__eq__(self, other)

    assert transport.publish("g", "a", key=Key("k")) == 1
    assert transport.publish("g", "b", key="k") == 1
    assert type(transport.peek("g")[0].key) is str
    assert calls == []


@pytest.mark.parametrize("key", [1, b"k", ["k"], 1.5, True])
def test_a_key_that_is_not_a_str_is_a_type_error(transport: Any, key: Any) -> None:
    transport.publish("g", "a", key="k")
    with pytest.raises(TypeError, match="key"):
        transport.publish("g", "b", key=key)
    with pytest.raises(TypeError, match="key"):
        transport.publish_many([("g", "b", 0, "j"), ("g", "c", 0, key)])
    assert len(transport) == 1
    assert transport.publish("g", "c", key="j") == 2


@pytest.mark.parametrize("window, error", [
    (True, TypeError), ("1", TypeError), (None, TypeError), (-1, ValueError), (math.nan, ValueError),
])
def test_a_bad_dedup_window(make_transport: Callable[..., Any], window: Any, error: type) -> None:
    with pytest.raises(error, match="dedup_window"):
        make_transport(clock=ManualClock(), dedup_window=window)


def test_the_clock_is_checked_before_the_window(make_transport: Callable[..., Any]) -> None:
    with pytest.raises(TypeError, match="clock"):
        make_transport(clock=1, dedup_window=-1)
    for good in (0, 0.5, 3, math.inf):
        make_transport(clock=ManualClock(), dedup_window=good).close()


# -- batches ------------------------------------------------------------------------


def test_publish_many_with_keys(windowed: Any, clock: ManualClock) -> None:
    windowed.publish("g", "held", key="h")
    seqs = windowed.publish_many([
        ("g", 1, 0, "h"),  # held: the holder's seq
        ("g", 2, 0, "a"),
        ("g", 3, 0, "a"),  # repeats an earlier item of the batch: its seq
        ("x", 4, 0, "a"),  # another group: another key
        ("g", 5),
        ("g", 6, 0, None),
    ])
    assert seqs == [1, 2, 2, 3, 4, 5]
    assert len(windowed) == 5
    assert windowed.publish("g", 7) == 6  # consecutive: no seq used by the duplicates
    assert windowed.publish("g", 8, key="a") == 2


def test_publish_many_where_every_key_is_held(windowed: Any) -> None:
    windowed.publish("g", 1, key="a")
    assert windowed.publish_many([("g", 2, 0, "a"), ("g", 3, 0, "a")]) == [1, 1]
    assert len(windowed) == 1 and windowed.publish("g", 4) == 2


# -- memory ------------------------------------------------------------------------


def test_the_memory_of_keys_is_bounded_by_the_window(make_transport: Callable[..., Any]) -> None:
    """Keys published and acked for a long time: the keys the window still
    holds are kept, the older ones dropped, so memory does not grow with the
    number of keys ever published."""
    clock = ManualClock()
    t = make_transport(clock=clock, dedup_window=1.0)

    def run(count: int, base: int) -> None:
        for i in range(count):
            t.publish("g", None, key=f"key-{base + i}")
            t.ack(t.claim("w", 30))
            clock.advance(0.01)  # about 100 keys within a window

    run(2000, 0)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        run(20000, 10**6)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 200_000, f"{grown} bytes kept for 20000 keys that left"
    # and the window still works at the end
    assert t.publish("g", None, key=f"key-{10**6 + 19999}") == 22000
    assert t.publish("g", None, key="key-0") == 22001


# -- threads ------------------------------------------------------------------------


def test_racing_publishers_of_one_key_publish_it_once(make_transport: Callable[..., Any]) -> None:
    t = make_transport(clock=time.time, dedup_window=60.0)
    results: List[List[int]] = [[] for _ in range(4)]
    start = threading.Barrier(4)

    def publisher(i: int) -> None:
        start.wait()
        for k in range(300):
            results[i].append(t.publish(f"g{k % 7}", (i, k), key=f"step-{k}"))

    threads = [threading.Thread(target=publisher, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert results[0] == results[1] == results[2] == results[3]
    assert sorted(results[0]) == list(range(1, 301))
    assert len(t) == 300


def test_a_held_key_wakes_nobody(make_transport: Callable[..., Any]) -> None:
    clock = ManualClock()
    t = make_transport(clock=clock, dedup_window=5.0)
    t.publish("g", "a", key="k")
    lease = t.claim("w", 30)
    got: List[Any] = []
    waiter = threading.Thread(target=lambda: got.append(t.claim("w2", 30, timeout=10)))
    waiter.start()
    deadline = time.monotonic() + 5
    while t._waiting_count() == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    hands = t._wake_counts()[0]
    assert t.publish("other", "b", key="k") == 2  # another group: a new message, handed over
    waiter.join(10)
    assert got and got[0] is not None and got[0].seq == 2
    assert t._wake_counts()[0] == hands + 1
    got.clear()
    waiter = threading.Thread(target=lambda: got.append(t.claim("w3", 30, timeout=10)))
    waiter.start()
    while t._waiting_count() == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert t.publish("g", "dup", key="k") == 1  # held: nothing published, nobody woken
    assert t.publish_many([("g", "dup", 0, "k"), ("other", "dup", 0, "k")]) == [1, 2]
    assert t._wake_counts()[0] == hands + 1 and t._waiting_count() == 1
    t.ack(lease)  # the waiting claim is still there for real work
    t.publish("g", "next")
    waiter.join(10)
    assert got and got[0] is not None and got[0].event == "next"
    t.close()
