"""What is particular to the PostgreSQL backend, beyond the conformance kit
(``test_pg_contract.py``): leases of either implementation named by their
fields, serialized events and undecodable ones, isolated named queues,
state that outlives a transport, the lazy import and ``install``, and the
server's clock against skewed client clocks."""

from __future__ import annotations

import pickle
import subprocess
import sys
import time
from typing import Any

import pytest

import leasequeue
from leasequeue import EventDecodeError, LeaseLost, PostgresTransport

# -- leases ------------------------------------------------------------------------------


def test_leases_are_leasequeue_leases(pg: Any) -> None:
    pg.publish("g", {"k": [1, 2]})
    lease = pg.claim("w", 30)
    assert type(lease) is leasequeue.Lease
    assert lease.event == {"k": [1, 2]}


def test_a_lease_of_either_implementation_rebuilt_by_hand(pg: Any, impl: Any) -> None:
    """Another process (or a restarted worker) names the delivery by its
    fields, with whichever ``Lease`` class it has."""
    pg.publish("g", "e")
    real = pg.claim("w", 30)
    rebuilt = impl.Lease(real.seq, real.group_id, None, real.worker_id, 0.0, real.attempt)
    extended = pg.extend(rebuilt, 60)
    assert extended.seq == real.seq and extended.expires_at > real.expires_at
    pg.ack(rebuilt)
    with pytest.raises(LeaseLost):
        pg.ack(real)


class Name(str):
    pass


class Number(int):
    pass


@pytest.mark.parametrize("change", [
    dict(worker_id="other"), dict(attempt=2), dict(seq=99), dict(group_id="h"),
    dict(seq="1"), dict(attempt=True), dict(seq=2**70), dict(attempt=2**63), dict(worker_id=5),
    dict(group_id=Name("g")), dict(seq=Number(1)), dict(seq=0), dict(attempt=-1),
], ids=repr)
def test_a_lease_whose_fields_name_nothing_is_lost(pg: Any, impl: Any, change: dict) -> None:
    """Wrong values, and fields that cannot name a delivery at all (not an
    exact int or str, out of range): ``LeaseLost``, nothing changes."""
    pg.publish("g", "e")
    real = pg.claim("w", 30)
    fields = dict(seq=real.seq, group_id=real.group_id, event=None, worker_id=real.worker_id,
                  expires_at=0.0, attempt=real.attempt)
    fields.update(change)
    forged = impl.Lease(**fields)
    for call in (pg.ack, pg.nack, lambda x: pg.nack(x, 5), lambda x: pg.extend(x, 5)):
        with pytest.raises(LeaseLost):
            call(forged)
    assert pg.ack_many([forged]) == [forged]
    assert tuple(pg.stats()) == (1, 1, 1, 0, 0, 0, 0)
    pg.ack(real)


def test_a_lease_of_another_queue_is_named_by_its_fields(make_pg: Any) -> None:
    """Seqs are numbered per queue (1, 2, 3, ... as Part 1 says of every
    transport), so a lease of another queue is refused when its fields name
    no open delivery here.  One whose fields do name one is refused too: it
    carries its delivery's number (a claim number of the database, unique
    across its queues; docs/decisions.md, "Fencing by delivery"); only a
    lease rebuilt by hand from those fields is accepted -- the price of
    naming deliveries by their fields (decisions.md, "Part 3")."""
    a, b = make_pg(), make_pg()
    a.publish("g", "a")
    b.publish("g", "b")
    la = a.claim("w", 30)
    lb = b.claim("other", 30)
    with pytest.raises(LeaseLost):
        a.ack(lb)  # names (g, seq 1, attempt 1, "other"): a's delivery is w's
    assert a.stats().leased == 1
    b.nack(lb)
    lb = b.claim("w", 30)
    assert (lb.seq, lb.attempt) == (1, 2)
    with pytest.raises(LeaseLost):
        a.ack(lb)  # attempt 2: not a's delivery either
    b.ack(lb)
    b.publish("g", "b2")
    lb = b.claim("w", 30)
    assert (lb.seq, lb.worker_id, lb.attempt) == (2, "w", 1)
    with pytest.raises(LeaseLost):
        a.ack(lb)  # seq 2 is no message of a
    a.extend(la, 60)
    twin = make_pg()
    twin.publish("g", "twin")
    same_fields = twin.claim("w", 30)
    assert (same_fields.seq, same_fields.group_id, same_fields.worker_id, same_fields.attempt) == (
        la.seq, la.group_id, la.worker_id, la.attempt)
    with pytest.raises(LeaseLost):
        a.ack(same_fields)  # twin's delivery, not a's: its number says so
    assert a.stats().leased == 1
    rebuilt = type(same_fields)(same_fields.seq, same_fields.group_id, None, same_fields.worker_id, 0.0,
                                same_fields.attempt)
    a.ack(rebuilt)  # indistinguishable from la rebuilt by hand: accepted
    with pytest.raises(LeaseLost):
        a.ack(la)
    assert len(a) == 0 and len(twin) == 1
    twin.ack(same_fields)
    assert len(twin) == 0


# -- events ---------------------------------------------------------------------------------


def test_serializers(make_pg: Any) -> None:
    js = make_pg(serializer="json")
    js.publish("g", {"a": [1, "x", None], "é": 1.5})
    assert js.claim("w", 30).event == {"a": [1, "x", None], "é": 1.5}
    for bad, err in [({1, 2}, TypeError), (float("nan"), ValueError)]:
        with pytest.raises(err):
            js.publish("g", bad)  # not JSON: the serializer's error, nothing published
    assert len(js) == 1
    same = make_pg(serializer=leasequeue.JSON_SERIALIZER)
    same.publish("g", [1, 2])
    assert same.claim("w", 30).event == [1, 2]
    text = make_pg(serializer=(lambda e: e.upper(), lambda b: b.decode().lower()))
    text.publish("g", "abc")  # a str from dumps is stored as UTF-8 bytes
    assert text.claim("w", 30).event == "abc"
    pk = make_pg()
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        pk.publish("g", lambda: 0)  # unpicklable
    with pytest.raises(TypeError, match="bytes or str"):
        make_pg(serializer=(lambda e: 42, pickle.loads)).publish("g", 1)
    assert len(pk) == 0
    for bad, err in [("xml", ValueError), (3, TypeError), ((1, 2), TypeError), ((pickle.dumps,), TypeError),
                     ([pickle.dumps, pickle.loads], TypeError)]:
        with pytest.raises(err):
            make_pg(serializer=bad)


def test_an_undecodable_event_stays_leased(make_pg: Any, queue_name: str) -> None:
    """docs/decisions.md, "Interrupted claims": the claim stands and
    ``EventDecodeError`` carries its lease (from ``claim_many``: the batch)."""
    def loads(data: bytes) -> Any:
        raise ValueError("cannot read that")

    writer = make_pg(queue_name)
    reader = make_pg(queue_name, serializer=(pickle.dumps, loads))
    writer.publish("g", 1)
    with pytest.raises(EventDecodeError) as info:
        reader.claim("w", 30)
    lease = info.value.lease
    assert (lease.seq, lease.attempt, lease.event) == (1, 1, pickle.dumps(1, pickle.HIGHEST_PROTOCOL))
    assert writer.stats().leased == 1
    writer.ack(lease)
    writer.publish_many([("a", 1), ("b", 2)])
    with pytest.raises(EventDecodeError) as info:
        reader.claim_many("w", 30, 5)
    assert [x.seq for x in info.value.leases] == [2, 3]  # the whole batch, claimed
    assert reader.ack_many(info.value.leases) == []
    writer.publish("c", 3)
    with pytest.raises(EventDecodeError) as info:
        reader.claim("w", 30, timeout=5)  # a waiting claim too
    reader.ack(info.value.lease)
    assert len(writer) == 0


# -- queues and durability ----------------------------------------------------------------


def test_queues_are_isolated(make_pg: Any) -> None:
    a, b = make_pg(), make_pg()
    assert a.publish("g", "a") == 1 and b.publish("g", "b") == 1
    la = a.claim("w", 30)
    assert b.group("g").state == "ready"
    lb = b.claim("w", 30)
    assert (la.event, lb.event) == ("a", "b")
    a.ack(la)
    assert len(a) == 0 and len(b) == 1
    a.pause("g")
    assert not b.group("g").paused


def test_state_outlives_the_transport(make_pg: Any, queue_name: str) -> None:
    first = make_pg(queue_name)
    first.publish("g", 1)
    first.publish("g", 2)
    lease = first.claim("w", 30)
    first.close()
    second = make_pg(queue_name)
    assert second.stats().leased == 1
    second.ack(lease)  # the lease is a value: any transport of the queue takes it
    assert second.claim("w", 30).event == 2


def test_lazy_import_and_install_is_idempotent(conninfo: str) -> None:
    code = ("import sys, leasequeue; leasequeue.JSON_SERIALIZER; leasequeue.EventDecodeError; "
            "assert 'psycopg' not in sys.modules and 'sqlite3' not in sys.modules; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"
    PostgresTransport.install(conninfo)
    PostgresTransport.install(conninfo)


# -- time -----------------------------------------------------------------------------------


def test_server_clock_ignores_skewed_client_clocks(make_pg: Any, queue_name: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Two machines 10 s apart: with the server's clock (the default) they
    agree on expiry; with their own injected clocks they would not."""
    a, b = make_pg(queue_name), make_pg(queue_name)
    a.publish("g", 1)
    lease = a.claim("a", 5)
    monkeypatch.setattr(time, "time", lambda real=time.time: real() + 10)  # b's machine is 10 s ahead
    assert b.claim("b", 5) is None  # not expired on the server's clock
    assert b.group("g").expires_at == lease.expires_at
    assert abs(lease.expires_at - 5 - time.time() + 10) < 5  # server time, not b's
    monkeypatch.undo()
    # With injected clocks 10 s apart, the machine ahead steals the lease early.
    c = make_pg(clock=time.time)
    d = make_pg(c._name, clock=lambda: time.time() + 10)
    c.publish("g", 1)
    c.claim("c", 5)
    assert d.claim("d", 5) is not None
