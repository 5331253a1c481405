"""What is particular to the PostgreSQL backend: leases named by their
fields, serialized events, isolated named queues, durability across
transport instances, the server's clock, and O(log G) plans."""

from __future__ import annotations

import math
import time
from typing import Any, List

import psycopg
import pytest

import leasequeue
from leasequeue import LeaseLost, PostgresTransport
from leasequeue import _inmemory_py


def lease_classes() -> List[type]:
    classes: List[type] = [_inmemory_py.Lease]
    try:
        from leasequeue import _inmemory_c
    except ImportError:
        pass
    else:
        classes.append(_inmemory_c.Lease)
    return classes


def test_leases_are_leasequeue_leases(pg: Any) -> None:
    pg.publish("g", {"k": [1, 2]})
    lease = pg.claim("w", 30)
    assert type(lease) is leasequeue.Lease
    assert lease.event == {"k": [1, 2]}


@pytest.mark.parametrize("cls", lease_classes())
def test_a_lease_rebuilt_by_hand_is_accepted(pg: Any, cls: type) -> None:
    """Another process (or a restarted worker) names the delivery by its fields."""
    pg.publish("g", "e")
    real = pg.claim("w", 30)
    rebuilt = cls(real.seq, real.group_id, None, real.worker_id, 0.0, real.attempt)
    extended = pg.extend(rebuilt, 60)
    assert extended.seq == real.seq and extended.expires_at > real.expires_at
    pg.ack(rebuilt)
    with pytest.raises(LeaseLost):
        pg.ack(real)


@pytest.mark.parametrize("change", [
    dict(worker_id="other"), dict(attempt=2), dict(seq=99), dict(group_id="h"),
    dict(seq="1"), dict(attempt=True), dict(seq=2**70), dict(worker_id=5),
])
def test_a_lease_with_other_fields_is_not_current(pg: Any, change: dict) -> None:
    pg.publish("g", "e")
    real = pg.claim("w", 30)
    fields = dict(seq=real.seq, group_id=real.group_id, event=None, worker_id=real.worker_id,
                  expires_at=0.0, attempt=real.attempt)
    fields.update(change)
    forged = _inmemory_py.Lease(**fields)
    for call in (pg.ack, pg.nack, lambda x: pg.extend(x, 5)):
        with pytest.raises(LeaseLost):
            call(forged)
    pg.ack(real)


def test_not_a_lease_is_a_type_error(pg: Any) -> None:
    class Fake:
        seq, group_id, worker_id, attempt = 1, "g", "w", 1

    for bad in (None, (1, "g"), Fake()):
        with pytest.raises(TypeError):
            pg.ack(bad)
        with pytest.raises(TypeError):
            pg.ack_many([bad])


def test_serializers(make_pg: Any) -> None:
    js = make_pg(serializer="json")
    js.publish("g", {"a": [1, "x", None]})
    assert js.claim("w", 30).event == {"a": [1, "x", None]}
    with pytest.raises(TypeError):
        js.publish("g", {1, 2})  # not JSON: the serializer's error, nothing published
    assert len(js) == 1
    pair = make_pg(serializer=(lambda e: repr(e).encode(), lambda b: ("loaded", b.decode())))
    pair.publish("g", 42)
    assert pair.claim("w", 30).event == ("loaded", "42")
    pk = make_pg()
    import pickle

    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        pk.publish("g", lambda: 0)  # unpicklable
    assert len(pk) == 0
    for bad, err in [("xml", ValueError), (3, TypeError), ((1, 2), TypeError)]:
        with pytest.raises(err):
            make_pg(serializer=bad)


def test_an_event_that_cannot_be_loaded_is_not_left_leased(make_pg: Any, queue_name: str) -> None:
    writer = make_pg(queue_name, serializer="json")
    reader = make_pg(queue_name, serializer=(lambda e: b"", lambda b: 1 / 0))
    writer.publish("g", 1)
    with pytest.raises(leasequeue.LeaseQueueError):
        reader.claim("w", 30)
    lease = writer.claim("w", 30)
    assert lease.attempt == 1 and lease.event == 1


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
    import subprocess
    import sys

    code = "import sys, leasequeue; assert 'psycopg' not in sys.modules; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"
    PostgresTransport.install(conninfo)
    PostgresTransport.install(conninfo)


# ---------------------------------------------------------------- time


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


def test_time_never_runs_back_on_an_injected_clock(make_pg: Any) -> None:
    now = [1000.0]
    t = make_pg(clock=lambda: now[0])
    t.publish("g", 1)
    t.claim("w", 10)
    now[0] = 1020.0
    assert t.stats().leased == 0  # expired at 1020, for good
    now[0] = 1005.0  # the clock goes back
    lease = t.claim("w", 10)
    assert lease.attempt == 2 and lease.expires_at == 1030.0  # acts at 1020


# ---------------------------------------------------------------- plans


def test_claim_plans_use_indexes_at_100k_groups(conninfo: str, make_pg: Any) -> None:
    """The statements inside the claim function (seen through auto_explain)
    are index scans, never sequential scans, with 100k groups queued."""
    t = make_pg()
    q = t._queue
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO leasequeue.groups (queue, group_id, priority, rr_key) "
            "SELECT %s, 'g' || i, i %% 3, i - 4611686018427387904 FROM generate_series(1, 100000) i", (q,))
        conn.execute(
            "INSERT INTO leasequeue.messages (queue, group_id, seq, payload) "
            "SELECT %s, 'g' || i, i, '\\x80054b012e'::bytea FROM generate_series(1, 100000) i", (q,))
        conn.execute(f"SELECT setval({t._seq_oid}::regclass, 100000)")
        conn.execute("ANALYZE leasequeue.groups")
        conn.execute("ANALYZE leasequeue.messages")
        plans: List[str] = []
        conn.add_notice_handler(lambda diag: plans.append(diag.message_primary or ""))
        conn.execute("LOAD 'auto_explain'")
        for setting in ("log_min_duration = 0", "log_nested_statements = on", "log_level = notice"):
            conn.execute(f"SET auto_explain.{setting}")
        calls = [
            ("claim", "SELECT * FROM leasequeue.claim(%s, 'w', 30, 0, NULL, 1, false, NULL)"),
            ("floor", "SELECT * FROM leasequeue.claim(%s, 'w', 30, 2, NULL, 1, false, NULL)"),
            ("claim_many", "SELECT * FROM leasequeue.claim(%s, 'w', 30, 0, NULL, 64, true, 7)"),
            ("stats-expire", "SELECT leasequeue.expire(%s, 1e18)"),
        ]
        for name, sql in calls:
            plans.clear()
            conn.execute(sql, (q,)).fetchall()
            text = "\n".join(plans)
            assert "Index" in text, f"{name}: no index scan in\n{text}"
            if name != "stats-expire":
                assert "using groups_ready" in text and "using messages_pkey" in text, text
            for line in text.splitlines():
                if "Seq Scan" in line:
                    assert "leasequeue.groups" not in line and "leasequeue.messages" not in line, (
                        f"{name}: sequential scan\n{text}")
                    assert "on groups" not in line and "on messages" not in line, f"{name}: {text}"
        lease = t.claim("w", 30)
        assert lease is not None and lease.event == 1 and lease.attempt == 1
    assert math.isfinite(lease.expires_at)
