"""README's "With the application's data" example runs as written (in a
temporary directory, on a real SQLite file), and its effects are checked;
a rolled-back transaction of the same shape leaves neither the row nor
the message."""

import os
import re
import sqlite3
from pathlib import Path

import leasequeue

README = Path(__file__).resolve().parent.parent / "README.md"


def _example() -> str:
    text = README.read_text(encoding="utf-8")
    section = text.split("## With the application's data", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1, blocks
    return blocks[0]


def test_the_readme_transaction_example_runs(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(_example(), "README.md", "exec"), scope)
    t, app = scope["t"], scope["app"]
    try:
        assert app.execute("SELECT state FROM orders WHERE id = 17").fetchone() == ("shipped",)
        assert len(t) == 0 and t.claim("worker-2", 30.0) is None   # the ack committed with the update
    finally:
        app.close()
        t.close()


def test_a_rolled_back_transaction_of_the_example_leaves_nothing(tmp_path: Path) -> None:
    path = os.fspath(tmp_path / "app.db")
    t = leasequeue.SQLiteTransport(path)
    app = sqlite3.connect(path)
    try:
        app.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, state TEXT)")
        app.commit()
        try:
            with app:
                app.execute("INSERT INTO orders VALUES (17, 'charged')")
                t.publish("order-17", {"step": "ship"}, conn=app)
                raise RuntimeError("the application fails before its commit")
        except RuntimeError:
            pass
        assert app.execute("SELECT count(*) FROM orders").fetchone() == (0,)
        assert len(t) == 0 and t.claim("worker-1", 30.0) is None
    finally:
        app.close()
        t.close()
