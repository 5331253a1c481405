"""The SQLite recipes of docs/transactions.md run as written (plain
``sqlite3``; SQLAlchemy with and without its "SQLAlchemy begins the
transaction" hooks), and each way commits the application's rows with the
queue's changes and rolls them back together."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest

sqlalchemy = pytest.importorskip("sqlalchemy")
from sqlalchemy import event, text  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

from leasequeue import LeaseLost, SQLiteTransport  # noqa: E402

PAGE = Path(__file__).resolve().parents[2] / "docs" / "transactions.md"


def _sqlite_section() -> str:
    if not PAGE.exists():
        pytest.skip("docs/ is not next to tests/ (the installed-wheel test run copies tests/ only)")
    page = PAGE.read_text(encoding="utf-8")
    start = page.index("\n## SQLite\n")
    end = page.find("\n## ", start + 1)
    return page[start:] if end == -1 else page[start:end]


def test_the_pages_sqlite_examples_run_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = re.findall(r"```python\n(.*?)```", _sqlite_section(), re.S)
    assert len(blocks) >= 2 and any("driver_connection" in b for b in blocks), "the SQLite recipes are gone"
    monkeypatch.chdir(tmp_path)
    namespace: Dict[str, Any] = {"__name__": "docs_transactions_sqlite"}
    try:
        for number, block in enumerate(blocks):
            exec(compile(block, f"docs/transactions.md (SQLite, example {number + 1})", "exec"), namespace)  # noqa: S102
    finally:
        for name in ("t", "conn"):
            if name in namespace:
                namespace[name].close()
        if "engine" in namespace:
            namespace["engine"].dispose()


# -- SQLAlchemy, both ways, commit and rollback ---------------------------------------------------


@pytest.fixture
def t(tmp_path: Path) -> Iterator[SQLiteTransport]:
    with SQLiteTransport(tmp_path / "shop.db") as transport:
        yield transport


def _engine(path: str, hooks: bool) -> Any:
    engine = sqlalchemy.create_engine(f"sqlite:///{path}")
    if hooks:
        @event.listens_for(engine, "connect")
        def _connect(dbapi_connection: Any, connection_record: Any) -> None:
            dbapi_connection.isolation_level = None

        @event.listens_for(engine, "begin")
        def _begin(connection: Any) -> None:
            connection.exec_driver_sql("BEGIN IMMEDIATE")
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, state TEXT)"))
    return engine


@pytest.mark.parametrize("hooks", [True, False], ids=["sqlalchemy-begins", "driver-begins"])
@pytest.mark.parametrize("outcome", ["commit", "rollback"])
@pytest.mark.parametrize("first", ["application-writes-first", "transport-writes-first"])
def test_a_session_commits_or_rolls_back_its_rows_with_the_queues_changes(
    t: SQLiteTransport, hooks: bool, outcome: str, first: str
) -> None:
    engine = _engine(t.path, hooks)
    t.publish("order-17", "charge")
    lease = t.claim("w", 30.0)
    try:
        with Session(engine) as session, session.begin():
            if first == "application-writes-first":
                session.execute(text("INSERT INTO orders VALUES (17, 'charged')"))
            conn = session.connection().connection.driver_connection
            t.publish("order-17", "ship", conn=conn)
            t.ack(lease, conn=conn)
            if first == "transport-writes-first":
                session.execute(text("INSERT INTO orders VALUES (17, 'charged')"))
            if outcome == "rollback":
                raise RuntimeError("the handler failed")
    except RuntimeError:
        pass
    with Session(engine) as session:
        rows = session.execute(text("SELECT id, state FROM orders")).all()
    if outcome == "commit":
        assert rows == [(17, "charged")]
        assert [m.event for m in t.peek("order-17", 10)] == ["ship"]
        with pytest.raises(LeaseLost):
            t.ack(lease)
    else:
        assert rows == []
        assert [m.event for m in t.peek("order-17", 10)] == ["charge"]
        t.ack(lease)  # the rolled-back ack left it current
    engine.dispose()


def test_a_raw_connection_of_the_engine_works_too(t: SQLiteTransport) -> None:
    engine = _engine(t.path, hooks=False)
    raw = engine.raw_connection()
    try:
        conn = raw.driver_connection
        t.publish("g", "e", conn=conn)  # the driver's implicit mode: the transport opens the transaction
        assert len(t) == 0
        raw.commit()
        assert len(t) == 1
    finally:
        raw.close()
        engine.dispose()
