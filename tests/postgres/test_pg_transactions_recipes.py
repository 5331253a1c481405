"""The PostgreSQL recipes of docs/transactions.md run, as written, against a
fresh database of the suite's server (the recipe's ``DSN``, with an
``orders`` table and the queue ``orders``), and do what the page says:
the work, the next step and the ack commit together; a failing request
leaves neither its row nor its job; SQLAlchemy's session commits the
publish with its own statements."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any, Dict, Iterator

import psycopg
import pytest

from leasequeue import PostgresTransport

PAGE = Path(__file__).resolve().parent.parent.parent / "docs" / "transactions.md"
_RECIPE = re.compile(r"<!-- recipe: ([\w-]+) -->\n```python\n(.*?)^```", re.M | re.S)


def recipe(name: str) -> str:
    if not PAGE.is_file():
        pytest.skip("needs the source tree (docs/ is not next to tests/)")
    found = {m.group(1): m.group(2) for m in _RECIPE.finditer(PAGE.read_text(encoding="utf-8"))}
    assert name in found, f"docs/transactions.md has no recipe {name!r} (it has {sorted(found)})"
    return found[name]


@pytest.fixture
def dsn(conninfo: str) -> Iterator[str]:
    """A fresh database: the leasequeue schema, the queue ``orders``, and an ``orders`` table."""
    name = f"lq_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    there = conninfo.replace("dbname=postgres", f"dbname={name}")
    PostgresTransport.install(there, queues=["orders"])
    with psycopg.connect(there, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, amount int NOT NULL DEFAULT 0, state text NOT NULL)")
    yield there
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE {name} WITH (FORCE)")


def run(name: str, dsn: str, **extra: Any) -> Dict[str, Any]:
    namespace: Dict[str, Any] = {"__name__": "docs_recipe", "DSN": dsn, **extra}
    exec(compile(recipe(name), f"docs/transactions.md ({name})", "exec"), namespace)  # noqa: S102
    return namespace


def _orders(dsn: str) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT id, amount, state FROM orders ORDER BY id").fetchall()


def test_the_handler_recipe(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO orders (id, state) VALUES (17, 'new')")
    with PostgresTransport(dsn, queue="orders") as t:
        charge = t.publish("order-17", {"step": "charge", "order": 17})
        ns = run("pg-psycopg", dsn)
        ns["t"].close()
        assert _orders(dsn) == [(17, 0, "charged")]
        messages = t.peek("order-17", 5)
        assert [m.event for m in messages] == [{"step": "ship", "order": 17}]  # the charge acked, the next step there
        assert messages[0].seq > charge


def test_the_handler_recipe_rolled_back_leaves_everything_as_it_was(dsn: str) -> None:
    """The same recipe whose UPDATE fails (the table's check refuses it):
    nothing of the transaction stays, and the lease is still current."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO orders (id, state) VALUES (17, 'new')")
        conn.execute("ALTER TABLE orders ADD CONSTRAINT not_yet CHECK (state <> 'charged')")
    with PostgresTransport(dsn, queue="orders") as t:
        t.publish("order-17", {"step": "charge", "order": 17})
        with pytest.raises(psycopg.errors.CheckViolation):
            run("pg-psycopg", dsn)
        assert _orders(dsn) == [(17, 0, "new")]
        assert [m.event["step"] for m in t.peek("order-17", 5)] == ["charge"]
        assert t.group("order-17").state == "leased"  # the recipe's lease: not acked, not lost


def test_the_web_handler_recipe(dsn: str) -> None:
    ns = run("pg-web-handler", dsn)
    t = ns["t"]
    try:
        assert _orders(dsn) == [(18, 250, "new")]
        assert [m.event for m in t.peek("order-18")] == [{"step": "charge", "order": 18}]
        # A failing request (the order exists): neither a second row nor a job.
        with psycopg.connect(dsn) as conn:
            with pytest.raises(psycopg.errors.UniqueViolation):
                ns["create_order"](conn, 18, 999)
        assert _orders(dsn) == [(18, 250, "new")]
        assert len(t.peek("order-18", 5)) == 1
        lease = t.claim("worker", 30.0)
        assert lease.event == {"step": "charge", "order": 18}
    finally:
        t.close()


def test_the_sqlalchemy_recipe(dsn: str) -> None:
    pytest.importorskip("sqlalchemy")
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    url = f"postgresql+psycopg://{info['user']}@{info['host']}:{info['port']}/{info['dbname']}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO orders (id, amount, state) VALUES (18, 250, 'new')")
    ns = run("pg-sqlalchemy", dsn, SQLALCHEMY_URL=url)
    t = ns["t"]
    try:
        assert _orders(dsn) == [(18, 250, "paid")]
        assert [m.event for m in t.peek("order-18")] == [{"step": "ship", "order": 18}]
    finally:
        t.close()
        ns["engine"].dispose()


def test_a_sqlalchemy_connection_itself_is_refused_with_the_way_to_the_psycopg_one(dsn: str) -> None:
    sqlalchemy = pytest.importorskip("sqlalchemy")
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    engine = sqlalchemy.create_engine(
        f"postgresql+psycopg://{info['user']}@{info['host']}:{info['port']}/{info['dbname']}")
    try:
        with PostgresTransport(dsn, queue="orders") as t, engine.connect() as conn:
            with pytest.raises(TypeError, match="driver_connection"):
                t.publish("g", 1, conn=conn)
            with pytest.raises(TypeError, match="driver_connection"):
                t.publish("g", 1, conn=conn.connection)  # the pool's proxy
            assert len(t) == 0
    finally:
        engine.dispose()
