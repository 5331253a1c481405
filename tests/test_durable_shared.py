"""The pieces the durable backends share (``_serializers``, ``_durable``,
``_validation.check_count`` / ``check_item``), on their own: no database.

Both backends must give the same answers here, so these are the rules:
which serializers ``serializer=`` names, what ``dumps`` may return, which
lease fields name a delivery (with either implementation's ``Lease``), and
how an undecodable event is reported."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from collections import namedtuple
from typing import Any

import pytest

import leasequeue
from leasequeue import EventDecodeError, LeaseLost, LeaseQueueError
from leasequeue._backends.durable import LEASE_TYPES, check_lease, decoded_lease, issue, lease_key, lost
from leasequeue._serializers import (
    JSON_SERIALIZER,
    PICKLE_SERIALIZER,
    check_serializer,
    serialize,
    serialize_bytes,
)
from leasequeue._validation import INT64_MAX, check_count, check_item

# -- serializers ----------------------------------------------------------------------------


def test_the_public_names_come_from_one_module_without_sqlite3_or_psycopg() -> None:
    assert leasequeue.JSON_SERIALIZER is JSON_SERIALIZER
    assert leasequeue.PICKLE_SERIALIZER is PICKLE_SERIALIZER
    assert issubclass(leasequeue.EventDecodeError, LeaseQueueError)
    code = ("import sys, leasequeue; leasequeue.JSON_SERIALIZER, leasequeue.PICKLE_SERIALIZER, "
            "leasequeue.EventDecodeError; print(sorted(m for m in ('sqlite3', 'psycopg') if m in sys.modules))")
    # Not measured by coverage (CI measures the run): coverage keeps its data in SQLite.
    env = {k: v for k, v in os.environ.items() if k != "COVERAGE_PROCESS_START"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "[]"


def test_names_resolve_to_the_pairs() -> None:
    assert check_serializer(None) is PICKLE_SERIALIZER
    assert check_serializer("pickle") is PICKLE_SERIALIZER
    assert check_serializer("json") is JSON_SERIALIZER
    pair = (repr, eval)
    assert check_serializer(pair) == pair and type(check_serializer(pair)) is tuple
    Pair = namedtuple("Pair", "dumps loads")
    assert check_serializer(Pair(repr, eval)) == (repr, eval)


@pytest.mark.parametrize("bad, error", [
    ("yaml", ValueError), ("", ValueError), (42, TypeError), ((pickle.dumps,), TypeError),
    ((pickle.dumps, pickle.loads, None), TypeError), ((1, 2), TypeError), ([pickle.dumps, pickle.loads], TypeError),
    (b"json", TypeError),
], ids=repr)
def test_a_bad_serializer_is_refused(bad: Any, error: type) -> None:
    with pytest.raises(error):
        check_serializer(bad)


def test_the_standard_pairs_round_trip() -> None:
    event = {"a": [1, "x", None], "b": 1.5}
    for dumps, loads in (PICKLE_SERIALIZER, JSON_SERIALIZER):
        assert loads(serialize(dumps, event)) == event
        assert loads(serialize_bytes(dumps, event)) == event  # both take bytes back
    assert type(serialize(JSON_SERIALIZER[0], event)) is str  # JSON is text
    assert serialize(JSON_SERIALIZER[0], {"x": 1}) == '{"x":1}'
    assert pickle.loads(serialize(PICKLE_SERIALIZER[0], ("t",))) == ("t",)
    with pytest.raises(ValueError):
        serialize(JSON_SERIALIZER[0], float("nan"))  # not JSON
    with pytest.raises(TypeError):
        serialize(JSON_SERIALIZER[0], {1, 2})


class Text(str):
    pass


def _value_id(value: Any) -> str:
    """A test id the same in every process (pytest-xdist's workers compare
    their collections): a memoryview's repr holds its address."""
    return f"memoryview({bytes(value)!r})" if isinstance(value, memoryview) else repr(value)


@pytest.mark.parametrize("returned, stored, as_bytes", [
    (b"ab", b"ab", b"ab"), (bytearray(b"ab"), b"ab", b"ab"), (memoryview(b"ab"), b"ab", b"ab"),
    ("ab", "ab", b"ab"), (Text("é"), "é", "é".encode()),
], ids=_value_id)
def test_what_dumps_may_return(returned: Any, stored: Any, as_bytes: bytes) -> None:
    got = serialize(lambda e: returned, None)
    assert got == stored and type(got) is type(stored)
    got_bytes = serialize_bytes(lambda e: returned, None)
    assert got_bytes == as_bytes and type(got_bytes) is bytes


@pytest.mark.parametrize("returned", [42, None, ["a"], 1.5])
def test_dumps_returning_anything_else_is_a_type_error(returned: Any) -> None:
    for convert in (serialize, serialize_bytes):
        with pytest.raises(TypeError, match="bytes or str"):
            convert(lambda e: returned, None)


def test_the_serializers_own_error_propagates() -> None:
    def dumps(event: Any) -> bytes:
        raise KeyError("nope")

    with pytest.raises(KeyError):
        serialize(dumps, 1)


# -- leases --------------------------------------------------------------------------------


def test_either_implementations_lease_is_accepted(impl: Any) -> None:
    assert impl.Lease in LEASE_TYPES
    check_lease(impl.Lease(1, "g", None, "w", 0.0, 1))
    for bad in (None, (1, "g", "w", 1), "lease", leasequeue.TransportStats(0, 0, 0, 0, 0)):
        with pytest.raises(TypeError, match="expected a Lease"):
            check_lease(bad)


class Name(str):
    pass


class Number(int):
    pass


def test_a_lease_names_its_delivery_by_four_exact_fields(impl: Any) -> None:
    lease = impl.Lease(7, "g", object(), "w", 12.5, 3)
    assert lease_key(lease) == ("g", 3, 7, "w")  # (group_id, attempt, seq, worker_id)
    assert lease_key(impl.Lease(INT64_MAX, "", None, "", -1.0, INT64_MAX)) == ("", INT64_MAX, INT64_MAX, "")


@pytest.mark.parametrize("fields", [
    dict(seq=0), dict(seq=-1), dict(seq=INT64_MAX + 1), dict(seq=2**70), dict(attempt=0),
    dict(attempt=INT64_MAX + 1), dict(seq=True), dict(attempt=True), dict(seq=1.0), dict(seq="1"),
    dict(seq=Number(1)), dict(attempt=Number(1)), dict(group_id=Name("g")), dict(worker_id=Name("w")),
    dict(group_id=None), dict(worker_id=5), dict(group_id=b"g"),
], ids=repr)
def test_fields_that_name_no_delivery(impl: Any, fields: dict) -> None:
    """Not an exact ``int`` / ``str``, or out of ``1 .. 2**63 - 1``: such a
    lease is never current (``LeaseLost``), never a ``TypeError``."""
    values = dict(seq=1, group_id="g", event=None, worker_id="w", expires_at=0.0, attempt=1)
    values.update(fields)
    lease = impl.Lease(**values)
    check_lease(lease)
    assert lease_key(lease) is None


def test_lost_and_issue(impl: Any) -> None:
    lease = impl.Lease(4, "g", None, "w", 1.0, 2)
    error = lost(lease)
    assert type(error) is LeaseLost and "message 4" in str(error) and "'g'" in str(error)
    issued = issue(4, "g", "e", "w", 31.0, 2)
    assert type(issued) is leasequeue.Lease
    assert (issued.seq, issued.group_id, issued.event, issued.worker_id, issued.expires_at, issued.attempt) == (
        4, "g", "e", "w", 31.0, 2)


def test_an_undecodable_event_carries_its_lease() -> None:
    data = json.dumps([1]).encode()
    good = decoded_lease(json.loads, data, 3, "g", "w", 40.0, 1)
    assert type(good) is leasequeue.Lease and good.event == [1]

    def loads(stored: bytes) -> Any:
        raise ValueError("cannot read that")

    with pytest.raises(EventDecodeError) as info:
        decoded_lease(loads, data, 3, "g", "w", 40.0, 1)
    lease = info.value.lease
    assert info.value.leases == [lease]
    assert (lease.seq, lease.group_id, lease.event, lease.worker_id, lease.expires_at, lease.attempt) == (
        3, "g", data, "w", 40.0, 1)
    assert "ValueError: cannot read that" in str(info.value)
    assert isinstance(info.value.__cause__, ValueError)

    def interrupted(stored: bytes) -> Any:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # not a decoding failure: the caller undoes the claim
        decoded_lease(interrupted, data, 3, "g", "w", 40.0, 1)


# -- batch arguments -------------------------------------------------------------------------


def test_check_count() -> None:
    assert check_count(0) == 0 and check_count(2**70) == 2**70 and type(check_count(Number(3))) is int
    for bad, error in [(-1, ValueError), (True, TypeError), (1.0, TypeError), ("1", TypeError), (None, TypeError)]:
        with pytest.raises(error):
            check_count(bad)


def test_check_item() -> None:
    Item = namedtuple("Item", "group_id event priority")
    assert check_item(("g", "e")) == ("g", "e", 0)
    assert check_item(Item(Name("g"), "e", Number(5))) == ("g", "e", 5)
    assert type(check_item((Name("g"), 1))[0]) is str
    for bad, error in [(["g", "e"], TypeError), ("ge", TypeError), (("g",), ValueError), (("g", 1, 2, 3), ValueError),
                       ((1, "e"), TypeError), (("g", "e", 1.5), TypeError), (("g", "e", 2**63), OverflowError)]:
        with pytest.raises(error):
            check_item(bad)
