"""Part 5 of the contract, "Once: idempotency keys", rule by rule.

``publish(..., key=k)`` stores ``k`` with its message; the key is *held* in
its group until its message has left the transport (ack, skip, purge) and,
with ``dedup_window > 0``, that many seconds of transport time have passed
since the publish.  A publish whose key is held publishes nothing and
returns the holder's seq (no seq used, no group created, priority and delay
ignored); ``publish_many`` does the same per item, within a batch too.  The
choices the SPEC leaves open are in docs/decisions.md, "Part 5 ... pinned",
"Once".  The rules that need a window call ``make_transport(clock,
dedup_window=w)``.
"""

from __future__ import annotations

import math
from typing import Any, Callable, List, Tuple

import pytest

from ._contract_base import ContractBase, ContractClock, MakeTransport, requires
from ._reference import INT64_MIN
from ._rules_bad_input import ClockTouched

__all__ = ["OnceRules"]

ONCE = "idempotency keys (publish(key=), keyed publish_many items, Message.key, dedup_window=)"
QUARANTINE = "the quarantine (bury, skip, peek; resume lifting a bury)"
BATCHES = "batches (publish_many, claim_many, ack_many)"
LATER = "delayed publish (publish(delay=), publish_many(delay=), the scheduled state, stats().scheduled, due_at)"


def _remove_by_ack(t: Any, lease: Any) -> None:
    t.ack(lease)


def _remove_by_ack_many(t: Any, lease: Any) -> None:
    assert t.ack_many([lease]) == []


def _remove_by_ack_and_claim(t: Any, lease: Any) -> None:
    assert t.ack_and_claim(lease, "w", 30) is None


def _remove_by_skip(t: Any, lease: Any) -> None:
    t.nack(lease)
    assert t.skip("g") is True


def _remove_by_purge(t: Any, lease: Any) -> None:
    assert t.purge("g") == 1


#: (how the keyed message leaves, the flag that needs)
_REMOVALS = [
    pytest.param(_remove_by_ack, None, id="ack"),
    pytest.param(_remove_by_ack_many, "supports_batches", id="ack_many"),
    pytest.param(_remove_by_ack_and_claim, "supports_ack_and_claim", id="ack_and_claim"),
    pytest.param(_remove_by_skip, "supports_quarantine", id="skip"),
    pytest.param(_remove_by_purge, "supports_control_plane", id="purge"),
]


class OnceRules(ContractBase):
    """The idempotency-key rules (see the module docstring)."""

    def _served(self, t: Any) -> List[Tuple[str, int]]:
        """Claim and ack until nothing is eligible: ``(group, seq)`` in order."""
        out = []
        while (lease := t.claim("w", 30, INT64_MIN)) is not None:
            out.append((lease.group_id, lease.seq))
            t.ack(lease)
            assert len(out) <= 1000, "claimed more messages than were published"
        return out

    # -- a held key ----------------------------------------------------------------

    @requires("supports_once", ONCE)
    def test_once_a_held_key_returns_the_holders_seq_and_changes_nothing(self, new_transport: MakeTransport) -> None:
        """A publish whose key is held publishes nothing and returns the seq
        of the message holding it: no seq used up, priority (and delay)
        ignored; the transport is as if it had not been called."""
        clocks = [ContractClock(), ContractClock()]
        subject, control = (new_transport(c) for c in clocks)
        for t in (subject, control):
            assert t.publish("g", "first", key="k") == 1
            assert t.publish("h", "h1") == 2
        assert subject.publish("g", "again", priority=9, key="k") == 1
        if self.supports_later:
            assert subject.publish("g", "again", 5, delay=100, key="k") == 1
        assert len(subject) == 2
        for t in (subject, control):
            assert t.publish("g", "second") == 3  # the next seq: none was used up
        assert self.fingerprint(subject, clocks[0]) == self.fingerprint(control, clocks[1])

    @requires("supports_once", ONCE)
    def test_once_a_key_is_held_while_its_message_is(self, transport: Any, clock: ContractClock) -> None:
        """With the default ``dedup_window=0`` a key is held while its message
        is held, leased, parked or buried, whatever time passes."""
        transport.publish("g", "e", key="k")
        clock.advance(1e6)
        assert transport.publish("g", "x", key="k") == 1
        lease = transport.claim("w", 30)
        assert transport.publish("g", "x", key="k") == 1  # leased
        transport.nack(lease, 100)
        assert transport.publish("g", "x", key="k") == 1  # parked
        clock.advance(101)
        lease = transport.claim("w", 30)
        if self.supports_quarantine:
            transport.bury(lease, "boom")
            assert transport.publish("g", "x", key="k") == 1  # buried
        assert len(transport) == 1

    @requires("supports_once", ONCE)
    def test_once_a_key_belongs_to_its_group(self, transport: Any) -> None:
        """The same key in two groups is two keys; ``""`` is a key; ``None``
        is no key."""
        assert transport.publish("a", "e", key="k") == 1
        assert transport.publish("b", "e", key="k") == 2
        assert transport.publish("a", "e", key="") == 3
        assert transport.publish("a", "e", key="") == 3
        assert transport.publish("a", "e", key=None) == 4
        assert transport.publish("a", "e", key=None) == 5
        assert transport.publish("b", "e", key="k") == 2
        assert len(transport) == 5

    @requires("supports_once", ONCE)
    def test_once_a_str_subclass_key_is_converted(self, transport: Any) -> None:
        """A ``str`` subclass is taken as the exact ``str`` it is: it names
        the same key, and its own ``__hash__``/``__eq__`` are never called."""

        class Key(str):
            def __hash__(self) -> int:
                raise AssertionError("the key's own __hash__ was called")

            def __eq__(self, other: object) -> bool:
                raise AssertionError("the key's own __eq__ was called")

            __ne__ = __eq__

        assert transport.publish("g", "e", key=Key("k")) == 1
        assert transport.publish("g", "e", key="k") == 1
        assert transport.publish("g", "e", key=Key("k")) == 1
        if self.supports_quarantine:
            key = transport.peek("g")[0].key
            assert key == "k" and type(key) is str

    @requires("supports_once", ONCE)
    @requires("supports_quarantine", QUARANTINE)
    def test_once_message_key(self, transport: Any) -> None:
        """``Message.key`` is the message's key, ``None`` without one."""
        transport.publish("g", "a", key="k1")
        transport.publish("g", "b")
        transport.publish("g", "c", key="")
        assert [(m.seq, m.key) for m in transport.peek("g", 5)] == [(1, "k1"), (2, None), (3, "")]

    # -- releasing a key --------------------------------------------------------------

    @requires("supports_once", ONCE)
    @pytest.mark.parametrize("remove, flag", _REMOVALS)
    def test_once_the_key_is_released_when_its_message_leaves(
        self, transport: Any, clock: ContractClock, remove: Callable[[Any, Any], None], flag: Any
    ) -> None:
        """With ``dedup_window=0`` the key is released when its message leaves
        the transport (``ack`` and its batch forms, ``skip``, ``purge``): the
        next publish with it is a new message."""
        if flag is not None and not getattr(self, flag):
            pytest.skip(f"{type(self).__name__}.{flag} is False")
        assert transport.publish("g", "e", key="k") == 1
        lease = transport.claim("w", 30)
        remove(transport, lease)
        assert len(transport) == 0
        assert transport.publish("g", "again", key="k") == 2
        assert transport.publish("g", "again", key="k") == 2
        assert self._served(transport) == [("g", 2)]

    @requires("supports_once", ONCE)
    def test_once_a_window_holds_the_key_by_time(self, new_transport: MakeTransport) -> None:
        """With ``dedup_window=w`` the key is held until its message has left
        and ``now >= published_at + w`` (counted from the publish, not the
        ack; both must hold): the key survives its group being forgotten,
        and a publish of it then creates no group and uses no seq."""
        clock = ContractClock()
        t = new_transport(clock, dedup_window=10)
        assert t.publish("g", "e", key="k") == 1  # published_at 1000
        clock.set(1008.0)
        t.ack(t.claim("w", 30))
        assert len(t) == 0
        assert t.publish("g", "again", key="k") == 1  # gone, but held by time
        clock.set(math.nextafter(1010.0, -math.inf))
        assert t.publish("g", "again", priority=4, key="k") == 1
        assert len(t) == 0 and t.stats().groups == 0
        if self.supports_control_plane:
            assert t.group("g") is None
        clock.set(1010.0)  # now >= published_at + window: released
        assert t.publish("g", "new", key="k") == 2
        assert t.publish("g", "new", key="k") == 2
        # a message still held keeps its key whatever the window says
        clock.set(1100.0)
        assert t.publish("g", "new", key="k") == 2
        assert len(t) == 1

    @requires("supports_once", ONCE)
    def test_once_an_infinite_window_holds_a_key_for_the_transports_life(self, new_transport: MakeTransport) -> None:
        """``dedup_window=math.inf``: a key is never released."""
        clock = ContractClock()
        t = new_transport(clock, dedup_window=math.inf)
        t.publish("g", "e", key="k")
        t.ack(t.claim("w", 30))
        clock.advance(1e300)
        assert t.publish("g", "again", key="k") == 1
        assert len(t) == 0
        assert t.publish("g", "other", key="k2") == 2

    # -- the clock ----------------------------------------------------------------------

    @requires("supports_once", ONCE)
    def test_once_a_key_reads_the_clock_only_with_a_window(self, new_transport: MakeTransport) -> None:
        """A keyed publish reads the clock once when ``dedup_window > 0``, and
        not at all with the default window (nor does a publish without key)."""
        clock = ContractClock()
        t = new_transport(clock)
        clock.bad = ClockTouched()
        assert t.publish("g", "e", key="k") == 1
        assert t.publish("g", "e", key="k") == 1
        clock.behave()
        windowed_clock = ContractClock()
        w = new_transport(windowed_clock, dedup_window=5)
        reads = windowed_clock.reads
        assert w.publish("g", "e") == 1
        assert windowed_clock.reads == reads
        assert w.publish("g", "e", key="k") == 2
        assert windowed_clock.reads == reads + 1
        assert w.publish("g", "e", key="k") == 2
        assert windowed_clock.reads == reads + 2

    @requires("supports_once", ONCE)
    def test_once_a_failing_clock_changes_nothing(self, new_transport: MakeTransport) -> None:
        """With a window, a keyed publish whose clock raises raises that
        error: no message, no seq used, the key not taken."""
        clock = ContractClock()
        t = new_transport(clock, dedup_window=5)
        t.publish("g", "e", key="k")
        clock.bad = RuntimeError("clock")
        with pytest.raises(RuntimeError):
            t.publish("g", "x", key="k2")
        with pytest.raises(RuntimeError):
            t.publish("h", "x", key="k")
        with pytest.raises(RuntimeError):
            t.publish("g", "x", key="k")  # held or not: it reads the clock first
        clock.behave()
        assert len(t) == 1 and t.stats().groups == 1
        assert t.publish("g", "y", key="k2") == 2
        assert t.publish("h", "y", key="k") == 3

    @requires("supports_once", ONCE)
    def test_once_a_held_key_publish_still_moves_the_transport_time(self, new_transport: MakeTransport) -> None:
        """A publish whose key is held read the clock (with a window): the
        transport acts at that time from then on, as after any reading."""
        clock = ContractClock()
        t = new_transport(clock, dedup_window=5)
        t.publish("g", "e", key="k")
        clock.set(1050.0)
        assert t.publish("g", "again", key="k") == 1
        clock.set(1020.0)
        lease = t.claim("w", 30)
        assert lease is not None and lease.expires_at == 1080.0

    # -- batches --------------------------------------------------------------------------

    @requires("supports_once", ONCE)
    @requires("supports_batches", BATCHES)
    def test_once_publish_many_keys(self, transport: Any) -> None:
        """``publish_many``: an item whose key is held, or repeats the key of
        an earlier item of the batch in the same group, gets the holder's
        seq and publishes nothing; the new messages get consecutive seqs in
        item order."""
        assert transport.publish("g", "held", key="k0") == 1
        seqs = transport.publish_many([
            ("g", "a", 0, "k1"),
            ("g", "dup-in-batch", 7, "k1"),
            ("h", "same-key-other-group", 0, "k1"),
            ("g", "no-key", 0, None),
            ("g", "dup-of-held", 0, "k0"),
            ("g", "b"),
            ("q", "only-a-dup", 3, "k1"),
            ("q", "dup", 5, "k1"),
        ])
        assert seqs == [2, 2, 3, 4, 1, 5, 6, 6]
        assert len(transport) == 6
        assert transport.publish("z", "z") == 7
        if self.supports_quarantine:
            assert [(m.seq, m.key) for m in transport.peek("g", 10)] == [
                (1, "k0"), (2, "k1"), (4, None), (5, None)]
        if self.supports_control_plane:
            assert transport.group("q").priority == 3

    @requires("supports_once", ONCE)
    @requires("supports_batches", BATCHES)
    def test_once_publish_many_with_every_key_held_publishes_nothing(self, new_transport: MakeTransport) -> None:
        """A batch whose every item is held changes nothing and uses no seq."""
        clocks = [ContractClock(), ContractClock()]
        subject, control = (new_transport(c) for c in clocks)
        for t in (subject, control):
            t.publish("g", "a", key="k")
            t.publish("h", "b", key="k")
        assert subject.publish_many([("h", "x", 4, "k"), ("g", "y", 0, "k")]) == [2, 1]
        for t in (subject, control):
            assert t.publish("n", "c") == 3
        assert self.fingerprint(subject, clocks[0]) == self.fingerprint(control, clocks[1])

    @requires("supports_once", ONCE)
    @requires("supports_later", LATER)
    def test_once_a_held_key_ignores_the_delay(self, transport: Any, clock: ContractClock) -> None:
        """A held key's publish with a delay schedules nothing."""
        transport.publish("g", "e", key="k")
        assert transport.publish("g", "e", delay=50, key="k") == 1
        assert transport.stats().scheduled == 0
        if self.supports_batches:
            assert transport.publish_many([("g", "e", 0, "k")], delay=50) == [1]
            assert transport.stats().scheduled == 0
        lease = transport.claim("w", 30)
        assert lease is not None and lease.seq == 1
