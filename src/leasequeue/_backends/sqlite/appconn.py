"""SPEC Part 5, "With the application's data", on ``SQLiteTransport``: the
operations that take ``conn=`` run inside the application's transaction.

A mixin of ``transport.SQLiteTransport``: ``publish``, ``publish_many``,
``ack``, ``ack_many``, ``nack``, ``bury`` and ``release`` hand their checked
arguments here when ``conn`` is not None (docs/decisions.md,
"Transactions (conn=) on SQLite, pinned", says why each rule is what it is).

* **The connection.**  A ``sqlite3.Connection`` (else ``TypeError``), open
  (else ``ValueError``), whose ``main`` database is the transport's file:
  the same path once symbolic links are resolved (SQLite resolves them too,
  and names the WAL after the result).  A connection to another file, to
  ``:memory:``, to a temporary database, or to a hard link of the file
  (another name: another WAL, which would corrupt it) is a ``ValueError``.  All checked before anything is written.
* **The transaction.**  The operation runs in the transaction the
  connection is in.  A connection in the driver's implicit-transaction mode
  (``isolation_level`` not None, the default) that is not in one yet gets
  the one the driver would open before a write, as ``BEGIN IMMEDIATE`` (the
  write lock at once: no failed lock upgrade later), left open for the
  application to commit.  A connection in autocommit mode
  (``isolation_level=None``; ``autocommit=True`` on Python 3.12+) that is
  not in a transaction is refused (``ValueError``): each statement would
  commit on its own, and a transaction opened for it would stay open,
  unseen, holding the file's write lock.
* **Nothing half done.**  The operation's statements run inside a
  ``SAVEPOINT``, released when they all succeeded; a ``LeaseLost`` or a
  driver error rolls back to it, so the application's transaction holds
  either all of the operation or none of it.  The transport never commits
  and never rolls back the application's transaction (only one it opened
  itself, empty, when the operation it was opened for failed), and never
  changes the connection's settings (its statements run on a cursor of its
  own, whose ``row_factory`` is reset to None).
* **The SQL.**  The statements of ``queries.sql`` and the schema's
  triggers, which every connection to the file sees; nothing registered on
  the transport's own connection is needed (``publish_many`` publishes item
  by item instead of staging the batch in the transport's temporary
  table).  Seqs, the claim counter and the transport's time are rows of the
  file, so they commit and roll back with the application's work.
* **Wake-ups.**  Nothing here wakes anyone: the application's commit is a
  commit of another connection, which the waiting claims' watchers (this
  process's and others', ``waiting.py``) notice as they notice any other
  process's.
"""

from __future__ import annotations

import os
import sqlite3
from typing import Any, Callable, Iterable, List, Optional, Tuple, TypeVar

from ..durable import lease_fence, lost
from ..sqlfiles import load_queries

__all__ = ["InAppTransaction", "file_identity"]

_Q = load_queries("sqlite")
_T = TypeVar("_T")
#: The savepoint every operation on the application's connection runs in.
_SAVEPOINT = "leasequeue_operation"
#: ``(group_id, priority, serialized event, key)``
Row = Tuple[str, int, Any, Optional[str]]


def file_identity(path: str) -> Tuple[str, int, int]:
    """The resolved path, device and inode of a database file."""
    real = os.path.realpath(path)
    st = os.stat(real)
    return (real, st.st_dev, st.st_ino)


def _autocommit(conn: sqlite3.Connection) -> bool:
    """Whether the connection commits each statement on its own when it is not
    in a transaction: ``isolation_level=None``, or ``autocommit=True`` (3.12+)."""
    autocommit = getattr(conn, "autocommit", None)
    if autocommit is True:
        return True
    if autocommit is False:
        return False  # PEP 249 mode: always in a transaction the driver opened
    return conn.isolation_level is None


class InAppTransaction:
    """The ``conn=`` half of the operations that take it."""

    # Provided by SQLiteTransport.
    _path: str
    _identity: Tuple[str, int, int]
    _dedup_window: float
    _cur: Any
    _unusable: Callable[[], Exception]
    _now: Callable[[], float]

    # ------------------------------------------------------------ the connection

    def _app_cursor(self, conn: Any) -> Tuple[Any, bool]:
        """A cursor of the application's connection, checked, and whether the
        connection is in a transaction.  Nothing is written."""
        if not isinstance(conn, sqlite3.Connection):
            raise TypeError(
                f"conn must be a sqlite3.Connection to {self._path!r} (the application's own), "
                f"not {type(conn).__name__}"
            )
        if self._cur is None:
            raise self._unusable()
        try:
            in_transaction = conn.in_transaction
        except sqlite3.ProgrammingError as exc:
            if "closed" in str(exc):
                raise ValueError(f"conn is closed: it cannot run an operation on {self._path!r}") from exc
            raise  # another thread's connection: the driver's error
        cur = conn.cursor()
        cur.row_factory = None  # the cursor's own: the connection's setting is untouched
        # As bytes, whatever the connection's text_factory (its own setting).
        row = cur.execute("SELECT CAST(file AS BLOB) FROM pragma_database_list WHERE name = 'main'").fetchone()
        main = bytes(row[0]).decode("utf-8", "surrogateescape") if row is not None and row[0] else ""
        if not main:
            raise ValueError(
                f"conn is a connection to an in-memory or temporary database, not to {self._path!r}: "
                "open it on the transport's file"
            )
        self._check_same_file(main)
        if not in_transaction and _autocommit(conn):
            raise ValueError(
                "conn is in autocommit mode and not inside a transaction: the operation would commit at once; "
                "open the transaction first (conn.execute('BEGIN IMMEDIATE')) and commit it after"
            )
        return cur, in_transaction

    def _check_same_file(self, main: str) -> None:
        """``ValueError`` unless ``main`` (the connection's main database, as
        SQLite resolved it: symbolic links followed) is the transport's file."""
        real, device, inode = self._identity
        if os.path.realpath(main) == real:
            return
        try:
            st = os.stat(main)
        except OSError:
            st = None
        if st is not None and (st.st_dev, st.st_ino) == (device, inode):
            raise ValueError(
                f"conn is a connection to {main!r}, a hard link to the transport's file {self._path!r}: SQLite "
                "names its WAL after the name it opened, so two names of one file must not be used at once; "
                "open the connection on the transport's path"
            )
        raise ValueError(
            f"conn is a connection to {main!r}, not to the transport's file {self._path!r}: "
            "a transaction cannot span two SQLite files"
        )

    def _in_app(self, cur: Any, in_transaction: bool, work: Callable[[Any], _T]) -> _T:
        """Run ``work(cur)`` in a savepoint of the application's transaction
        (opened first, ``BEGIN IMMEDIATE``, if the connection's implicit
        transaction has not started).  All of it or none of it stays."""
        opened = False
        if not in_transaction:
            cur.execute("BEGIN IMMEDIATE")  # what the driver would open before a write
            opened = True
        try:
            cur.execute("SAVEPOINT " + _SAVEPOINT)
        except BaseException:
            if opened:
                _quietly(cur, "ROLLBACK")
            raise
        try:
            result = work(cur)
            cur.execute("RELEASE " + _SAVEPOINT)
        except BaseException:
            if opened:
                _quietly(cur, "ROLLBACK")  # the transaction it opened holds nothing else
            elif _quietly(cur, "ROLLBACK TO " + _SAVEPOINT):
                _quietly(cur, "RELEASE " + _SAVEPOINT)
            raise
        return result

    # ------------------------------------------------------------ the operations

    def _publish_in_app(self, conn: Any, rows: List[Row], delay: float, now_needed: bool) -> List[int]:
        """Publish checked, serialized ``rows`` in the application's transaction,
        item by item (as ``publish_many`` would, without its staging table)."""
        cur, in_transaction = self._app_cursor(conn)
        now = self._now() if now_needed else None
        return self._in_app(cur, in_transaction, lambda c: self._publish_rows(c, rows, delay, now))

    def _publish_rows(self, cur: Any, rows: List[Row], delay: float, now: Optional[float]) -> List[int]:
        window = self._dedup_window
        if now is not None:
            cur.execute(_Q["use_time"], (now,))  # no expiry applied: as a publish with no waiting claim
        if any(row[3] is not None for row in rows):
            cur.execute(_Q["drop_keys"])
            cur.execute(_Q["defer_keys"])
        time_now: Optional[float] = None
        seqs: List[int] = []
        for group_id, priority, data, key in rows:
            if key is not None:
                found = cur.execute(_Q["key_holder"], (group_id, key)).fetchone()
                if found is not None:
                    seqs.append(int(found[0]))  # held (by a stored message, or an earlier item)
                    continue
            seq = cur.execute(_Q["publish"], (group_id, priority, data)).fetchone()[0]
            if delay > 0.0 or key is not None:
                if time_now is None:
                    time_now = cur.execute(_Q["now"]).fetchone()[0]
                due = time_now + delay if delay > 0.0 else None
                cur.execute(_Q["publish_extras"], (group_id, seq, due, key))
                if due is not None:
                    cur.execute(_Q["drop_due"])
                    cur.execute(_Q["count_due"], (seq, due))
                    cur.execute(_Q["schedule_head"], (group_id,))
                if key is not None:
                    cur.execute(_Q["keep_key"], (group_id, key, seq, time_now + window))
            seqs.append(int(seq))
        return seqs

    def _settle_in_app(
        self,
        conn: Any,
        lease: Any,
        statements: List[Tuple[str, Tuple[Any, ...]]],
        last: str,
        after: Tuple[Tuple[str, Tuple[Any, ...]], ...] = (),
    ) -> None:
        """Run ``statements`` (each ``(name, extra parameters)`` after the
        lease's five) for a lease in the application's transaction; the one
        named ``last`` must change one row, else ``LeaseLost`` and nothing
        stays.  Then ``after`` (``(name, parameters)``: no lease's)."""
        cur, in_transaction = self._app_cursor(conn)
        key = lease_fence(lease)

        def work(c: Any) -> None:
            if key is None:
                raise lost(lease)
            for name, extra in statements:
                changed = c.execute(_Q[name], key + extra).rowcount
                if name == last and changed != 1:
                    raise lost(lease)
            for name, parameters in after:
                c.execute(_Q[name], parameters)

        self._in_app(cur, in_transaction, work)

    def _ack_many_in_app(self, conn: Any, leases: Iterable[Any]) -> List[Any]:
        """``ack_many`` in the application's transaction: the leases that were not current."""
        cur, in_transaction = self._app_cursor(conn)

        def work(c: Any) -> List[Any]:
            lost_leases = []
            ack = _Q["ack"]
            for lease in leases:
                key = lease_fence(lease)
                if key is None or c.execute(ack, key).rowcount != 1:
                    lost_leases.append(lease)
            return lost_leases

        return self._in_app(cur, in_transaction, work)


def _quietly(cur: Any, statement: str) -> bool:
    """Run ``statement``; False (and nothing raised) if SQLite refuses it (the
    transaction is gone: SQLite rolled it back itself after the error)."""
    try:
        cur.execute(statement)
    except sqlite3.Error:
        return False
    return True
