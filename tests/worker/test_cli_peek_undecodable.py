"""``peek`` of a message whose stored event cannot be decoded, on a real
SQLite file and the suite's PostgreSQL: the message comes back with a
``leasequeue.Undecodable`` event (the stored form and a one-line error)
instead of raising, and ``leasequeue queue ... peek`` (a real process)
prints it, as a table and as ``--json``.  A claim of that message still
raises ``EventDecodeError`` carrying its lease.

The three ways a new user meets it: a pickle of a class defined in the
publisher's ``__main__``; JSON read with pickle; a pickle read as JSON.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, List

import pytest

import leasequeue
from leasequeue import EventDecodeError, Undecodable

PUBLISHER = textwrap.dedent(
    """
    import sys
    from leasequeue import PostgresTransport, SQLiteTransport

    class Order:  # defined in __main__: no other process can unpickle it
        def __init__(self, n):
            self.n = n

    kind, where = sys.argv[1], sys.argv[2]
    t = SQLiteTransport(where) if kind == "sqlite" else PostgresTransport(where, queue=sys.argv[3])
    t.publish("orders", Order(17))
    t.close()
    """
)


def _open(durable: Any, serializer: Any = None) -> Any:
    """Another transport on ``durable``'s queue, reading with ``serializer``."""
    durable.make()  # the queue exists (and the conninfo is known)
    if durable.name == "sqlite":
        from leasequeue import SQLiteTransport

        t = SQLiteTransport(durable.path, serializer=serializer)
    else:
        from leasequeue import PostgresTransport

        t = PostgresTransport(durable.conninfo, queue=durable.queue, serializer=serializer)
    durable.made.append(t)
    return t


def _cli(durable: Any, *args: str, cwd: Path) -> "subprocess.CompletedProcess[str]":
    return subprocess.run([sys.executable, "-m", "leasequeue", "queue", *durable.cli_args(), *args],
                          cwd=cwd, capture_output=True, text=True, timeout=60)


def _publish_main_class(durable: Any, tmp_path: Path) -> None:
    script = tmp_path / "publisher.py"
    script.write_text(PUBLISHER)
    durable.make()
    where: List[str] = ["sqlite", durable.path] if durable.name == "sqlite" else [
        "postgres", durable.conninfo, durable.queue]
    subprocess.run([sys.executable, str(script), *where], check=True, timeout=60, cwd=tmp_path)


def test_a_pickle_of_a_main_class_is_shown_not_raised(durable: Any, tmp_path: Path) -> None:
    _publish_main_class(durable, tmp_path)
    t = _open(durable)
    t.publish("orders", "after")
    before = (t.stats(), t.groups())
    head, after = t.peek("orders", 2)
    assert type(head.event) is Undecodable and after.event == "after"
    assert head.seq == 1 and head.attempt == 0
    assert type(head.event.raw) is bytes and head.event.raw.startswith(b"\x80")  # the pickle, as stored
    assert head.event.error.startswith("AttributeError: ") and "Order" in head.event.error
    assert "\n" not in head.event.error
    with pytest.raises(AttributeError):
        pickle.loads(head.event.raw)  # it is the stored pickle: still undecodable here
    assert (t.stats(), t.groups()) == before  # peek changed nothing
    with pytest.raises(EventDecodeError) as info:
        t.claim("w", 30.0)
    assert info.value.lease.group_id == "orders" and info.value.lease.event == head.event.raw


def test_json_read_with_pickle_and_pickle_read_as_json(durable: Any, tmp_path: Path) -> None:
    writer = _open(durable, serializer="json")
    writer.publish("j", {"n": 1})
    pickled = _open(durable)
    pickled.publish("p", {"n": 2})

    event = pickled.peek("j")[0].event
    # SQLite hands pickle the JSON text: the error a new user met from the command line.
    expected = "TypeError: a bytes-like object is required" if durable.name == "sqlite" else "UnpicklingError"
    assert type(event) is Undecodable and event.error.startswith(expected)
    stored = '{"n":1}' if durable.name == "sqlite" else b'{"n":1}'  # SQLite keeps JSON as text
    assert event.raw == stored and type(event.raw) is type(stored)

    event = writer.peek("p")[0].event
    assert type(event) is Undecodable and event.error.split(":")[0] in ("UnicodeDecodeError", "JSONDecodeError")
    assert pickle.loads(event.raw) == {"n": 2}
    assert writer.peek("j")[0].event == {"n": 1} and pickled.peek("p")[0].event == {"n": 2}


def test_the_cli_peek_prints_raw_and_error(durable: Any, tmp_path: Path) -> None:
    _publish_main_class(durable, tmp_path)
    _open(durable).publish("orders", {"fine": True})

    r = _cli(durable, "peek", "orders", "-n", "2", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "UNDECODABLE (AttributeError: " in r.stdout and "Order" in r.stdout and "raw: b'\\x80" in r.stdout
    assert "{'fine': True}" in r.stdout

    r = _cli(durable, "peek", "orders", "-n", "2", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    bad, good = json.loads(r.stdout)
    assert bad["seq"] == 1 and bad["event"] is None and bad["error"].startswith("AttributeError: ")
    assert bad["raw_encoding"] == "base64"
    raw = base64.b64decode(bad["raw"])
    assert raw.startswith(b"\x80") and b"Order" in raw
    assert good["event"] == {"fine": True} and good["error"] is None and "raw" not in good


def test_the_cli_peek_of_json_read_with_pickle_gives_the_text(sqlite_backend: Any, tmp_path: Path) -> None:
    _open(sqlite_backend, serializer="json").publish("g", {"n": 1})
    r = _cli(sqlite_backend, "peek", "g", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    (m,) = json.loads(r.stdout)
    assert m["raw"] == '{"n":1}' and m["raw_encoding"] == "text" and m["error"].startswith("TypeError")
    assert "--serializer" in r.stderr  # the hint: published with another serializer?
    r = _cli(sqlite_backend, "--serializer", "json", "peek", "g", "--json", cwd=tmp_path)
    assert r.returncode == 0 and json.loads(r.stdout)[0]["event"] == {"n": 1} and r.stderr == ""


def test_undecodable_is_a_small_frozen_value() -> None:
    u = Undecodable(b"\x80\x05" + b"x" * 500, "AttributeError: Can't get attribute 'Order' on <module '__main__'>")
    assert u == Undecodable(u.raw, u.error) and hash(u) == hash(Undecodable(u.raw, u.error))
    with pytest.raises(dataclasses.FrozenInstanceError):
        u.raw = b""  # type: ignore[misc]
    text = repr(u)
    assert text.startswith("Undecodable(error=\"AttributeError: Can't get attribute 'Order'")
    assert "(502 bytes)" in text and len(text) < 200
    short = Undecodable("{bad", "JSONDecodeError: Expecting value")
    assert repr(short) == "Undecodable(error='JSONDecodeError: Expecting value', raw='{bad')"
    assert "Undecodable" in leasequeue.__all__


def test_undecodable_is_exported_without_sqlite3_or_psycopg() -> None:
    code = ("import sys, leasequeue; from leasequeue import Undecodable; "
            "from leasequeue._serializers import Undecodable as U; assert Undecodable is U; "
            "print(sorted(m for m in ('sqlite3', 'psycopg') if m in sys.modules))")
    env = {k: v for k, v in os.environ.items() if k != "COVERAGE_PROCESS_START"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "[]"


def test_an_undecodable_head_can_be_skipped_from_the_cli(durable: Any, tmp_path: Path) -> None:
    """``skip --seq`` peeks at the head first: before 0.7 that raised, so the
    poison message that most needed skipping could not be."""
    _publish_main_class(durable, tmp_path)
    t = _open(durable)
    t.publish("orders", "next")
    r = _cli(durable, "skip", "orders", "--seq", "1", "--yes", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "skipped seq 1 of orders" in r.stdout
    assert [(m.seq, m.event) for m in t.peek("orders", 5)] == [(2, "next")]
