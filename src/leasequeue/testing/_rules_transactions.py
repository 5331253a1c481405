"""Part 5 of the contract, "With the application's data": operations that
run inside the application's own database transaction (``conn=``), rule by
rule.  Run when the subclass sets ``supports_transactions = True``.

``publish``, ``publish_many``, ``ack``, ``ack_many``, ``nack``, ``bury`` and
``release`` take ``conn=``, the application's connection.  Their effects
exist for everyone else exactly when the application commits, and never if
it rolls back: a rolled-back ack leaves the lease current.  A lease that is
not current raises ``LeaseLost`` and adds nothing to the transaction, which
goes on.  From the ack until the transaction ends nobody takes the delivery
over, even once its lease has expired.  A waiting claim is woken at the
commit, not before.  A ``conn`` of the wrong kind is a ``TypeError`` and
changes nothing.

The backend's test class provides the application's side through four
hooks (``_contract_base.py``): ``open_app_connection(transport)`` (required),
``app_begin``, ``app_commit``, ``app_rollback`` (DB-API defaults).  Each rule
compares the backend with itself: the same history, once with ``conn=`` and
a commit, once with the plain call (``fingerprint``: everything observable).
"""

from __future__ import annotations

import time
from typing import Any, Callable, List, Optional, Tuple

import pytest

from .._errors import LeaseLost
from ._contract_base import ContractBase, ContractClock, MakeTransport, Waiter, requires

__all__ = ["TransactionRules"]

TRANSACTIONS = (
    "operations in the application's transaction (conn= on publish, publish_many, ack, ack_many, nack, bury, release)"
)
WAITING = "waiting claims (claim(timeout=...), aclaim, close() waking waiters)"

#: ``settle(t, lease, conn)``: one settling call; ``conn=None`` is the plain call.
Settle = Callable[[Any, Any, Any], None]


def _ack(t: Any, lease: Any, conn: Any) -> None:
    if conn is None:
        t.ack(lease)
    else:
        t.ack(lease, conn=conn)


def _ack_many(t: Any, lease: Any, conn: Any) -> None:
    lost = t.ack_many([lease]) if conn is None else t.ack_many([lease], conn=conn)
    if lost:
        raise LeaseLost(f"ack_many returned {lost!r}")  # as the other calls say it


def _nack(t: Any, lease: Any, conn: Any) -> None:
    if conn is None:
        t.nack(lease)
    else:
        t.nack(lease, conn=conn)


def _nack_later(t: Any, lease: Any, conn: Any) -> None:
    if conn is None:
        t.nack(lease, 50.0)
    else:
        t.nack(lease, 50.0, conn=conn)


def _bury(t: Any, lease: Any, conn: Any) -> None:
    if conn is None:
        t.bury(lease, "poison")
    else:
        t.bury(lease, "poison", conn=conn)


def _release(t: Any, lease: Any, conn: Any) -> None:
    if conn is None:
        t.release(lease)
    else:
        t.release(lease, conn=conn)


#: (settling call, the flag it needs)
_SETTLES = [
    pytest.param(_ack, None, id="ack"),
    pytest.param(_ack_many, "supports_batches", id="ack_many"),
    pytest.param(_nack, None, id="nack"),
    pytest.param(_nack_later, None, id="nack-delay"),
    pytest.param(_bury, "supports_quarantine", id="bury"),
    pytest.param(_release, "supports_release", id="release"),
]

#: ``call(t, lease, conn)``: every call that takes ``conn``, for the bad-input rule.
_CALLS = [
    pytest.param(lambda t, lease, conn: t.publish("g", "x", conn=conn), None, id="publish"),
    pytest.param(lambda t, lease, conn: t.publish_many([("g", "x")], conn=conn), "supports_batches", id="publish_many"),
    pytest.param(lambda t, lease, conn: t.ack(lease, conn=conn), None, id="ack"),
    pytest.param(lambda t, lease, conn: t.ack_many([lease], conn=conn), "supports_batches", id="ack_many"),
    pytest.param(lambda t, lease, conn: t.nack(lease, conn=conn), None, id="nack"),
    pytest.param(lambda t, lease, conn: t.bury(lease, conn=conn), "supports_quarantine", id="bury"),
    pytest.param(lambda t, lease, conn: t.release(lease, conn=conn), "supports_release", id="release"),
]


def _history(t: Any) -> Any:
    """Two groups, ``g``'s head leased (the lease returned)."""
    t.publish("g", "e1")
    t.publish("g", "e2")
    t.publish("h", "x")
    lease = t.claim("w", 30.0)
    assert lease is not None and lease.group_id == "g"
    return lease


class TransactionRules(ContractBase):
    """SPEC Part 5, "With the application's data" (``supports_transactions``)."""

    # -- helpers ----------------------------------------------------------------

    def _needs(self, flag: Optional[str]) -> None:
        if flag is not None and not getattr(self, flag):
            pytest.skip(f"{type(self).__name__}.{flag} is False")

    def seen_by_others(self, t: Any, groups: Tuple[str, ...] = ("g", "h")) -> List[Any]:
        """What the transport shows while an application's transaction is
        open: ``len``, the groups' messages (``peek``), and, unless an open
        transaction blocks the transport's writes, ``stats()``."""
        seen: List[Any] = [len(t)]
        if self.supports_quarantine:
            seen.append([(m.seq, m.event, m.attempt) for g in groups for m in t.peek(g, 100)])
        if not self.transactions_block_writers:
            seen.append(tuple(t.stats()))
        return seen

    def end(self, conn: Any, outcome: str) -> None:
        if outcome == "commit":
            self.app_commit(conn)
        else:
            self.app_rollback(conn)

    # -- publish ------------------------------------------------------------------

    @requires("supports_transactions", TRANSACTIONS)
    @pytest.mark.parametrize("outcome", ["commit", "rollback"])
    def test_tx_publish_exists_for_others_exactly_when_the_application_commits(
        self, transport: Any, outcome: str
    ) -> None:
        t = transport
        t.publish("g", "before")
        held = t.claim("w", 30.0)  # nothing claimable is left
        before = self.seen_by_others(t)
        with self.open_app_connection(t) as conn:
            self.app_begin(conn)
            seq = t.publish("h", "inside", conn=conn)
            assert type(seq) is int
            assert self.seen_by_others(t) == before, "a publish was seen before the application's transaction ended"
            if not self.transactions_block_writers:
                assert t.claim("w2", 30.0) is None, "a publish was claimed before the application committed"
            self.end(conn, outcome)
        if outcome == "commit":
            assert len(t) == 2
            lease = t.claim("w2", 30.0)
            assert lease is not None, "a committed publish is not claimable"
            assert (lease.seq, lease.group_id, lease.attempt) == (seq, "h", 1)
            assert lease.event == "inside"
        else:
            assert self.seen_by_others(t) == before, "a rolled-back publish left something"
            assert t.claim("w2", 30.0) is None, "a rolled-back publish left a message to claim"
            later = t.publish("h", "later")
            assert later > held.seq  # seqs still increase (a rolled-back one may be skipped or taken again)
            lease = t.claim("w2", 30.0)
            assert lease is not None and (lease.seq, lease.group_id) == (later, "h")

    @requires("supports_transactions", TRANSACTIONS)
    @pytest.mark.parametrize("outcome", ["commit", "rollback"])
    def test_tx_publish_many_exists_for_others_exactly_when_the_application_commits(
        self, transport: Any, outcome: str
    ) -> None:
        self._needs("supports_batches")
        t = transport
        before = self.seen_by_others(t, ("h", "k"))
        with self.open_app_connection(t) as conn:
            self.app_begin(conn)
            seqs = t.publish_many([("h", "a"), ("k", "b"), ("h", "c")], conn=conn)
            assert len(seqs) == 3 and seqs == sorted(seqs) and len(set(seqs)) == 3
            assert self.seen_by_others(t, ("h", "k")) == before, "a batch was seen before the transaction ended"
            self.end(conn, outcome)
        if outcome == "commit":
            assert len(t) == 3
            got = [(x.seq, x.group_id) for x in self.claim_all(t)]
            assert got == [(seqs[0], "h"), (seqs[1], "k")]
        else:
            assert len(t) == 0 and self.seen_by_others(t, ("h", "k")) == before
            assert t.claim("w", 30.0) is None

    # -- settling calls ---------------------------------------------------------------

    @requires("supports_transactions", TRANSACTIONS)
    @pytest.mark.parametrize("settle, flag", _SETTLES)
    def test_tx_settling_is_done_when_the_application_commits(
        self, new_transport: MakeTransport, settle: Settle, flag: Optional[str]
    ) -> None:
        """The same history on two transports: ``settle`` with ``conn=`` and a
        commit on one, the plain call on the other, and nothing told apart."""
        self._needs(flag)
        in_tx_clock, plain_clock = ContractClock(), ContractClock()
        t, plain = new_transport(in_tx_clock), new_transport(plain_clock)
        lease = _history(t)
        settle(plain, _history(plain), None)
        with self.open_app_connection(t) as conn:
            self.app_begin(conn)
            before = self.seen_by_others(t)
            settle(t, lease, conn)
            if settle in (_ack, _ack_many):
                assert self.seen_by_others(t) == before, "an ack was seen before the transaction ended"
            self.app_commit(conn)
        assert self.fingerprint(t, in_tx_clock) == self.fingerprint(plain, plain_clock)

    @requires("supports_transactions", TRANSACTIONS)
    @pytest.mark.parametrize("settle, flag", _SETTLES)
    def test_tx_settling_rolled_back_leaves_the_lease_current(
        self, new_transport: MakeTransport, settle: Settle, flag: Optional[str]
    ) -> None:
        """After a rollback the lease is current: a plain ack of it works, and
        the transport is the one on which only that ack happened."""
        self._needs(flag)
        in_tx_clock, plain_clock = ContractClock(), ContractClock()
        t, plain = new_transport(in_tx_clock), new_transport(plain_clock)
        lease = _history(t)
        plain.ack(_history(plain))
        with self.open_app_connection(t) as conn:
            self.app_begin(conn)
            settle(t, lease, conn)
            self.app_rollback(conn)
        try:
            t.ack(lease)
        except LeaseLost:
            pytest.fail(f"after a rolled-back {settle.__name__.strip('_')}, the lease is not current")
        assert self.fingerprint(t, in_tx_clock) == self.fingerprint(plain, plain_clock)

    @requires("supports_transactions", TRANSACTIONS)
    @pytest.mark.parametrize("settle, flag", _SETTLES)
    def test_tx_a_lease_not_current_raises_lease_lost_and_the_transaction_goes_on(
        self, transport: Any, clock: ContractClock, settle: Settle, flag: Optional[str]
    ) -> None:
        self._needs(flag)
        t = transport
        t.publish("g", "e")
        stale = t.claim("w1", 10.0)
        clock.advance(20)
        fresh = t.claim("w2", 10.0)
        assert fresh is not None and fresh.seq == stale.seq
        with self.open_app_connection(t) as conn:
            self.app_begin(conn)
            with pytest.raises(LeaseLost):
                settle(t, stale, conn)
            seq = t.publish("h", "after", conn=conn)
            self.app_commit(conn)
        t.ack(fresh)  # the new holder's delivery is untouched
        lease = t.claim("w3", 10.0)
        assert lease is not None and (lease.seq, lease.group_id) == (seq, "h"), "the transaction did not go on"
        assert len(t) == 1

    # -- what a transaction holds ------------------------------------------------------

    @requires("supports_transactions", TRANSACTIONS)
    def test_tx_an_ack_holds_its_delivery_until_the_transaction_ends(
        self, transport: Any, clock: ContractClock
    ) -> None:
        """Acked in a transaction, then the lease expires: a claim meanwhile
        never gets the acked message (it waits for the transaction, or finds
        the group held), and after the commit it is gone."""
        t = transport
        t.publish("g", "e1")
        t.publish("g", "e2")
        lease = t.claim("w", 10.0)
        with self.open_app_connection(t) as conn:
            self.app_begin(conn)
            t.ack(lease, conn=conn)
            clock.advance(60)  # the lease has expired
            other = Waiter(lambda: t.claim("w2", 10.0), name="other-claim")
            other.start()
            time.sleep(self.settle_seconds)
            self.app_commit(conn)
        got = other.outcome(self.liveness_timeout)
        assert got is None or got.seq != lease.seq, f"the acked message went to another worker: {got!r}"
        assert len(t) == 1
        assert [x.seq for x in self.claim_all(t, "w3")] in ([lease.seq + 1], [])

    # -- waiting ------------------------------------------------------------------------

    @requires("supports_transactions", TRANSACTIONS)
    @pytest.mark.parametrize("outcome", ["commit", "rollback"])
    def test_tx_a_waiting_claim_is_woken_at_the_commit_not_before(
        self, transport: Any, clock: ContractClock, outcome: str
    ) -> None:
        self._needs("supports_waiting")
        t = transport
        waiter = self.start_waiting(clock, lambda: t.claim("w", 30.0, timeout=self.far()))
        with self.open_app_connection(t) as conn:
            self.app_begin(conn)
            seq = t.publish("g", "e", conn=conn)
            time.sleep(self.settle_seconds)
            assert not waiter.done, f"a waiting claim returned before the commit: {waiter.result!r}"
            self.end(conn, outcome)
        if outcome == "rollback":
            time.sleep(self.settle_seconds)
            assert not waiter.done, f"a rolled-back publish woke a waiting claim: {waiter.result!r}"
            seq = t.publish("g", "later")
        lease = waiter.outcome(self.liveness_timeout)
        assert lease is not None and lease.seq == seq

    # -- bad input ----------------------------------------------------------------------

    @requires("supports_transactions", TRANSACTIONS)
    @pytest.mark.parametrize("bad", [object(), "dbname=app", 42], ids=["object", "str", "int"])
    @pytest.mark.parametrize("call, flag", _CALLS)
    def test_tx_a_conn_of_the_wrong_kind_is_a_type_error_and_changes_nothing(
        self, transport: Any, call: Callable[[Any, Any, Any], Any], flag: Optional[str], bad: Any
    ) -> None:
        self._needs(flag)
        t = transport
        lease = _history(t)
        before = (len(t), tuple(t.stats()))
        with pytest.raises(TypeError):
            call(t, lease, bad)
        assert (len(t), tuple(t.stats())) == before
        t.ack(lease)  # still current
