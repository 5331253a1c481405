"""``import leasequeue`` imports no backend it does not need (SPEC Part 4, "One interface").

Each check runs in a fresh interpreter (the test process has long imported
everything).  The in-memory transport is imported at once (it is the
default); SQLite and PostgreSQL only on first use, and a missing psycopg
names the extra to install.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import leasequeue
from helpers import _CHILD_COVERAGE, package_root


def helpers_prelude() -> str:
    """Start coverage in the child when the run measures it (as helpers.python_argv's children do)."""
    return _CHILD_COVERAGE

HEAVY = ("sqlite3", "_sqlite3", "psycopg", "leasequeue._backends.sqlite", "leasequeue._backends.sqlite.transport",
         "leasequeue._backends.postgres", "leasequeue._backends.postgres.transport", "leasequeue.testing",
         "leasequeue.bench", "asyncio")


def run(code: str, *, extra_path: str = "", measured: bool = False) -> "subprocess.CompletedProcess[str]":
    # Not measured by coverage unless asked: coverage keeps its data in SQLite, and would import sqlite3.
    env = {k: v for k, v in os.environ.items() if measured or k != "COVERAGE_PROCESS_START"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (extra_path, package_root(leasequeue)) if p)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def loaded_after(statement: str) -> list:
    code = f"import sys, json\n{statement}\nprint(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    out = run(code)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_import_leasequeue_loads_no_durable_backend() -> None:
    assert loaded_after("import leasequeue; t = leasequeue.InMemoryTransport(); t.publish('g', 1)") == []


def test_the_public_names_that_need_no_backend_load_none() -> None:
    statement = ("import leasequeue\n"
                 "leasequeue.Transport, leasequeue.LeaseLike, leasequeue.GroupInfo, leasequeue.TransportStats\n"
                 "leasequeue.LeaseLost, leasequeue.IMPLEMENTATION, leasequeue.PyInMemoryTransport, dir(leasequeue)")
    assert loaded_after(statement) == []


def test_sqlite_is_imported_on_first_use_only() -> None:
    loaded = loaded_after("import leasequeue; leasequeue.SQLiteTransport")
    assert {"sqlite3", "leasequeue._backends.sqlite.transport"} <= set(loaded)
    assert not {"psycopg", "leasequeue._backends.postgres.transport"} & set(loaded)


def test_postgres_is_imported_on_first_use_only() -> None:
    loaded = loaded_after("import leasequeue; leasequeue.PostgresTransport")
    assert {"psycopg", "leasequeue._backends.postgres.transport"} <= set(loaded)
    assert "leasequeue._backends.sqlite.transport" not in loaded


def test_a_missing_psycopg_names_the_extra(tmp_path: Path) -> None:
    # A psycopg that cannot be imported, first on the path: as if it were not installed.
    blocker = tmp_path / "psycopg"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'psycopg'\", name='psycopg')\n")
    code = ("import leasequeue\n"
            "try:\n    leasequeue.PostgresTransport\n"
            "except ImportError as exc:\n    print(type(exc).__name__, exc)\n"
            "else:\n    print('imported')")
    out = run(helpers_prelude() + code, extra_path=str(tmp_path), measured=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ModuleNotFoundError "), out.stdout
    assert "pip install 'leasequeue[postgres]'" in out.stdout and "psycopg" in out.stdout, out.stdout


def test_another_import_error_in_a_backend_is_not_disguised(tmp_path: Path) -> None:
    # psycopg is there but one of *its* dependencies is missing under another name:
    # the error is the driver's own, not a misleading "install the extra".
    blocker = tmp_path / "psycopg"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("import no_such_module_for_leasequeue_tests\n")
    out = run("import leasequeue\ntry:\n    leasequeue.PostgresTransport\nexcept ImportError as exc:\n    print(exc)",
              extra_path=str(tmp_path))
    assert "no_such_module_for_leasequeue_tests" in out.stdout and "pip install" not in out.stdout, out.stdout


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        leasequeue.NoSuchTransport  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchTransport" in str(exc)
    else:
        raise AssertionError("no AttributeError")
