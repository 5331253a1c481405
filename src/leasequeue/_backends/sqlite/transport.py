"""``SQLiteTransport``: the transport contract, durable, shared by processes.

The same rules as ``InMemoryTransport`` (SPEC Parts 1 and 2; Part 3, "Durable
transport on SQLite"), kept in one SQLite database file that any number of
processes on one machine open at once.  Standard library ``sqlite3`` only.

How it works:

* The state is the in-memory twin's state, as rows (``schema.sql`` beside
  this module): ``lq_messages`` (seq = row id, the group, the serialized
  event, its due time and key) and ``lq_groups`` (priority, round-robin key,
  the lock of the head message: free, leased, parked, buried or scheduled,
  holder, end, attempt count, whether the delivery is open; paused; the bury
  reason; last claim time); ``lq_keys`` the keys a ``dedup_window`` holds
  after their message left.  One row
  ``lq_state`` holds the shared counters: the last seq, the claim counter
  (round-robin keys), the transport's time and the counts of messages,
  groups, leases, parks and pauses (and one row ``lq_quarantine`` the count
  of buried groups), kept by the statements that change them (``stats()``
  reads these two rows alone: O(1)).  A publish and an ack
  each fire one trigger; no other hot statement fires any (a trigger's
  sub-program costs more than a statement).
* Every operation is one ``BEGIN IMMEDIATE`` transaction (SQLite's one write
  lock serialises them across processes, as the seed's note says), its
  statements loaded by name from ``queries.sql``.  A process
  killed at any instant leaves the last committed state; its leases expire.
* Claims go through partial indexes only: ready groups by round-robin key
  (the claim with the common floor, O(log G)) and by (priority, key) (any
  other floor: a walk over the distinct ready priorities above it,
  O(L log G)); locked groups by lock end (expiry).  ``tests/sqlite/test_sqlite_plans.py``
  checks the query plans.
* Time: ``now = max(clock(), the latest time used)``, kept in the file, so the
  transport's time never runs backwards across processes either.
* Leases are ``leasequeue.Lease`` values.  Each claim is numbered by the
  file's claim counter (``lq_state.claims``; the group's round-robin key is
  that number from the claim on), and the lease it issues carries the
  number: it is current while its group's open delivery is that claim's
  (fencing by delivery: a released, nacked or retried delivery is never
  current again).  A lease rebuilt from its fields carries no number and is
  current when the open delivery has its seq, attempt and worker: any
  process may ack a lease it holds, or one rebuilt from the fields.
  Accepting and issuing leases (``../durable.py``), the serializers
  (``leasequeue._serializers``) and the SQL files (``../sqlfiles.py``) are
  shared with ``PostgresTransport``.
* Later and once (SPEC Part 5): a scheduled head is locked (lock 4) until its
  due time, so the expiry that ends a park makes it claimable, and the
  watcher that waits for the earliest lock end wakes waiting claims for it;
  keys are found through an index of the stored messages, and ``lq_keys``
  holds them for ``dedup_window`` after their message left.
* No user code under the lock: the clock is read and events are serialized
  before it, events are deserialized after it.

Waiting claims are in ``waiting.py``, the kernel file watch in ``watch.py``.
"""

from __future__ import annotations

import asyncio
import collections
import math
import os
import sqlite3
import threading
import time
import urllib.parse
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable, List, Optional, Tuple, Union, TypeVar

from ..._errors import LeaseQueueError
from ..durable import LEASE_TYPES as _LEASE_TYPES
from ..durable import check_lease as _check_lease
from ..durable import decoded_lease, issue
from .appconn import InAppTransaction, file_identity
from .later import LaterOnce
from .later import fence as _fence
from ..durable import lost as _lost
from ..._serializers import JSON_SERIALIZER, PICKLE_SERIALIZER, EventDecodeError, serialize
from ..._serializers import check_serializer as _check_serializer
from ..._serializers import decode_or_undecodable
from ..sqlfiles import load_migrations, load_queries, load_statements
from .waiting import Waiter, WaitQueue, Watcher, call_all
from ..._types import PARKED, GroupInfo, Message, TransportStats
from ..._validation import (
    INT64_MAX,
    INT64_MIN,
    check_duration,
    check_id,
    check_keyed_item,
    check_priority,
    check_time,
    check_worker,
)
from ..._validation import check_count as _check_count


_Self = TypeVar("_Self")  # what __enter__ returns: the transport itself (a subclass's too)

__all__ = ["JSON_SERIALIZER", "PICKLE_SERIALIZER", "SCHEMA_VERSION", "SQLiteTransport", "EventDecodeError"]

#: ``PRAGMA application_id`` of a leasequeue database ("LQUE").
APPLICATION_ID = 0x4C515545
#: The schema version this code reads and writes (``PRAGMA user_version``).
#: A file of an older version (3, leasequeue 0.3, or later) is upgraded on
#: open by the numbered files of ``migrations/`` beside this module.
SCHEMA_VERSION = 5
#: The oldest schema version a file may have and still be upgraded: the first
#: released one (leasequeue 0.3).  Versions 1 and 2 were never released.
OLDEST_UPGRADABLE = 3
#: Page size of a new database file.  Every commit writes each page it changed
#: whole into the WAL and checksums it, and an operation changes a handful of
#: small rows on 3-6 pages: 1 KiB pages cut the instructions per publish +
#: claim + ack by a fifth against SQLite's default 4 KiB (docs/sqlite.md).
PAGE_SIZE = int(os.environ.get("LEASEQUEUE_SQLITE_PAGE_SIZE", "1024"))
#: WAL size (bytes) at which a commit checkpoints it into the database file.
WAL_CHECKPOINT_BYTES = 4 * 1024 * 1024

_Q = load_queries("sqlite")
_NEVER_CLAIMED = 2**62
_INF = math.inf
#: ``publish``'s default ``delay``: the publish of Part 1 is told apart by identity (two
#: ``is`` tests); any other ``delay`` object, an equal 0.0 included, is checked.
_NO_DELAY = 0.0

# After a fork, a child must not touch its parent's connection (SQLite's
# rule), nor close it (closing could checkpoint or unlock the parent's file):
# every live transport's connection is parked here, and the child's calls
# raise LeaseQueueError.
_LIVE: "weakref.WeakSet[SQLiteTransport]" = weakref.WeakSet()
_ORPHANED: List[Any] = []
_FORK_GENERATION = 0


def _after_fork_in_child() -> None:
    global _FORK_GENERATION
    _FORK_GENERATION += 1
    for transport in list(_LIVE):
        transport._forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# ---------------------------------------------------------------- opening


def _database_error(exc: BaseException, path: str, busy_timeout: float) -> LeaseQueueError:
    """A clear ``LeaseQueueError`` for what SQLite said."""
    text = str(exc)
    lower = text.lower()
    if "locked" in lower or "busy" in lower:
        return LeaseQueueError(
            f"the database {path!r} is locked: another connection held its write lock "
            f"longer than the busy timeout ({busy_timeout:g} s); nothing was changed"
        )
    if "readonly" in lower or "read-only" in lower or "read only" in lower:
        return LeaseQueueError(f"the database {path!r} is read-only here ({text}); nothing was changed")
    if "malformed" in lower or "not a database" in lower or "corrupt" in lower:
        return LeaseQueueError(f"the database {path!r} is corrupted ({text})")
    if "unable to open" in lower:
        return LeaseQueueError(f"cannot open the database {path!r} ({text})")
    return LeaseQueueError(f"SQLite error on {path!r}: {text}")


def _check_file(path: str, busy_timeout: float) -> None:
    """Refuse, without writing to it, a file that is not a leasequeue database.

    A missing or empty file, or an empty SQLite database, is fine (it becomes
    one).  The first 100 bytes are read as plain bytes: a file that is not
    SQLite, or is SQLite with another application id, never reaches SQLite
    in read-write mode.  A SQLite file without an application id is opened
    read-only to see whether it holds anything.
    """
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise LeaseQueueError(f"cannot open {path!r}: the directory {directory!r} does not exist")
    try:
        if os.path.isdir(path):
            raise LeaseQueueError(f"cannot open {path!r}: it is a directory")
        with open(path, "rb") as file:
            header = file.read(100)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise LeaseQueueError(f"cannot read {path!r}: {exc}") from exc
    if not header:
        return
    if len(header) < 100 or not header.startswith(b"SQLite format 3\x00"):
        raise LeaseQueueError(
            f"{path!r} is not a SQLite database (or its header is corrupted); it was left untouched"
        )
    application_id = int.from_bytes(header[68:72], "big")
    if application_id == APPLICATION_ID:
        return
    if application_id != 0:
        raise LeaseQueueError(
            f"{path!r} is a SQLite database of another application (application_id "
            f"{application_id:#010x}), not a leasequeue database; it was left untouched"
        )
    uri = "file:" + urllib.parse.quote(os.path.abspath(path)) + "?mode=ro"
    try:
        probe = sqlite3.connect(uri, uri=True, timeout=busy_timeout)
    except sqlite3.Error as exc:
        raise _database_error(exc, path, busy_timeout) from exc
    try:
        application_id = probe.execute("PRAGMA application_id").fetchone()[0]
        user_version = probe.execute("PRAGMA user_version").fetchone()[0]
        objects = probe.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
    except sqlite3.Error as exc:
        raise _database_error(exc, path, busy_timeout) from exc
    finally:
        probe.close()
    if application_id == APPLICATION_ID or (application_id == 0 and user_version == 0 and objects == 0):
        return
    raise LeaseQueueError(
        f"{path!r} is a SQLite database that is not a leasequeue database "
        f"({objects} schema objects, application_id {application_id:#x}); it was left untouched"
    )


def _initialise(conn: sqlite3.Connection, path: str) -> None:
    """Create the schema in a new (empty) database, or check an existing one."""
    conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")  # only takes effect on a new database
    conn.execute("BEGIN IMMEDIATE")
    try:
        application_id = conn.execute("PRAGMA application_id").fetchone()[0]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if application_id == 0:
            if conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
                raise LeaseQueueError(f"{path!r} is a SQLite database that is not a leasequeue database")
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            for statement in load_statements("sqlite"):
                conn.execute(statement)
        elif application_id != APPLICATION_ID:
            raise LeaseQueueError(f"{path!r} is not a leasequeue database (application_id {application_id:#x})")
        elif version > SCHEMA_VERSION:
            raise LeaseQueueError(
                f"{path!r} has leasequeue schema version {version}, newer than this leasequeue "
                f"supports ({SCHEMA_VERSION}): upgrade leasequeue to open it"
            )
        elif version < OLDEST_UPGRADABLE:
            raise LeaseQueueError(
                f"{path!r} has leasequeue schema version {version}, from a pre-release: it cannot be upgraded "
                f"(the oldest upgradable version is {OLDEST_UPGRADABLE}); it was left untouched"
            )
        else:
            row = conn.execute("SELECT magic, version FROM lq_state WHERE id = 1").fetchone()
            if row != ("leasequeue", version):
                raise LeaseQueueError(f"{path!r}: the leasequeue state row is missing or damaged ({row!r})")
            if version < SCHEMA_VERSION:
                _upgrade(conn, path, version)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def _upgrade(conn: sqlite3.Connection, path: str, version: int) -> None:
    """Bring a file of schema ``version`` up to ``SCHEMA_VERSION``, inside the
    caller's ``BEGIN IMMEDIATE`` transaction (an error rolls every step back:
    the file stays at ``version``, untouched).  Each step runs the statements
    of ``migrations/NNNN_*.sql`` and then records version NNNN in
    ``PRAGMA user_version`` and ``lq_state``."""
    steps = dict(load_migrations("sqlite"))
    for target in range(version + 1, SCHEMA_VERSION + 1):
        filename = steps.get(target)
        if filename is None:  # a packaging error: the wheel lacks a migration file
            raise LeaseQueueError(f"leasequeue has no migration to SQLite schema version {target}")
        for statement in load_statements("sqlite", filename):
            conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {target}")
        conn.execute("UPDATE lq_state SET version = ? WHERE id = 1", (target,))


def _open(path: str, durable: bool, busy_timeout: float) -> sqlite3.Connection:
    _check_file(path, busy_timeout)
    try:
        conn = sqlite3.connect(
            path, timeout=busy_timeout, isolation_level=None, check_same_thread=False, cached_statements=64
        )
    except sqlite3.Error as exc:
        raise _database_error(exc, path, busy_timeout) from exc
    try:
        _initialise(conn, path)
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise LeaseQueueError(f"{path!r}: SQLite could not switch to WAL mode (journal_mode is {mode!r})")
        conn.execute("PRAGMA synchronous = FULL" if durable else "PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA temp_store = MEMORY")
        # Checkpoint at 4 MiB of WAL, as SQLite's default does with 4 KiB pages:
        # counted in 1 KiB pages, the default would checkpoint (and fsync) 4x as often.
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        conn.execute(f"PRAGMA wal_autocheckpoint = {max(1, WAL_CHECKPOINT_BYTES // page_size)}")
        conn.execute(_Q["create_batch_table"])
    except BaseException as exc:
        conn.close()
        if isinstance(exc, sqlite3.Error):
            raise _database_error(exc, path, busy_timeout) from exc
        raise
    return conn


# ---------------------------------------------------------------- leases


def _check_timeout(timeout: Any) -> Optional[float]:
    if timeout is None:
        return None
    return check_duration(timeout, "timeout")


def _info(row: Tuple[Any, ...]) -> GroupInfo:
    group_id, priority, messages, lock, paused, head_seq, holder, expires_at, attempt, claimed_at, reason = row
    if lock == 4:
        # Scheduled (expiry applied: not due): nothing leased, its due time.
        return GroupInfo(group_id, priority, messages, "paused" if paused else "scheduled", bool(paused), head_seq,
                         None, None, None, None if claimed_at is None else float(claimed_at), None,
                         float(expires_at))
    if lock == 1:
        state = "leased"
    elif lock == 2:
        state = "parked"
    elif lock == 3:
        # Buried: the buried delivery's worker and attempt, no end.
        return GroupInfo(group_id, priority, messages, "buried", bool(paused), head_seq, holder, None, attempt,
                         None if claimed_at is None else float(claimed_at), reason)
    elif paused:
        state = "paused"
    else:
        state = "ready"
    locked = lock != 0
    return GroupInfo(
        group_id=group_id,
        priority=priority,
        messages=messages,
        state=state,
        paused=bool(paused),
        head_seq=head_seq,
        worker_id=holder if locked else None,
        expires_at=float(expires_at) if locked else None,
        attempt=attempt if locked else None,
        last_claimed_at=None if claimed_at is None else float(claimed_at),
    )


_CLOSED = object()  # a waiting claim's attempt found the transport closed
#: A claim waiting on the main thread wakes this often to let interrupts in.
_MAIN_THREAD_SLICE = 0.05


# ---------------------------------------------------------------- transport


class SQLiteTransport(LaterOnce, InAppTransaction):
    """The transport contract in a SQLite database file, shared by processes.

    ``path``: the database file (created if missing; its directory must
    exist).  A file of an older released schema (leasequeue 0.3) is upgraded
    in place, in one transaction, with nothing lost.  A file that is not a
    leasequeue database is refused with ``LeaseQueueError`` and left
    untouched; so is one written by a newer leasequeue (a newer schema
    version).

    ``clock``: a zero-argument callable returning seconds (default
    ``time.time``).  Every process sharing a file must use the same clock.

    ``serializer``: how events are stored: ``None`` or ``"pickle"`` (pickle,
    highest protocol), ``"json"``, or a ``(dumps, loads)`` pair where
    ``dumps(event)`` returns ``bytes`` or ``str``.  ``lease.event`` is an
    equal copy of the published event, not the object itself.

    ``durable``: ``False`` (default) commits with ``synchronous=NORMAL``
    (survives any process crash; the last commits may be lost on power
    failure), ``True`` with ``synchronous=FULL`` (an fsync per commit).

    ``busy_timeout``: seconds an operation waits for another connection's
    write lock before it raises ``LeaseQueueError`` (default 5).

    ``dedup_window``: seconds (default 0) for which a publish's ``key`` stays
    held after its message has left (SPEC Part 5, "Once").  The window is the
    publishing transport's: a key is kept in the file until the publish's time
    plus the window of the transport that stored it.

    Every method is atomic (one transaction) and thread-safe; the connection
    is used under one lock per transport.  After ``close()`` every call but
    ``close()`` and ``closed`` raises ``LeaseQueueError``.  A transport must
    not cross ``fork()``: open one in each process.
    """

    def __init__(
        self,
        path: Union[str, "os.PathLike[str]"],
        *,
        clock: Callable[[], float] = time.time,
        serializer: Any = None,
        durable: bool = False,
        busy_timeout: float = 5.0,
        dedup_window: float = 0.0,
    ) -> None:
        if isinstance(path, os.PathLike):
            path = os.fspath(path)
        if not isinstance(path, str):
            raise TypeError(f"path must be a str or os.PathLike, not {type(path).__name__}")
        if path in ("", ":memory:") or path.startswith("file:"):
            raise ValueError(f"SQLiteTransport needs the path of a database file, not {path!r}")
        if not callable(clock):
            raise TypeError(f"clock must be callable, not {type(clock).__name__}")
        dedup_window = check_duration(dedup_window, "dedup_window")
        dumps, loads = _check_serializer(serializer)
        if type(durable) is not bool:
            raise TypeError(f"durable must be a bool, not {type(durable).__name__}")
        busy_timeout = check_duration(busy_timeout, "busy_timeout")
        if busy_timeout == _INF:
            raise ValueError("busy_timeout must be finite")
        self._path = path
        self._clock = clock
        self._dumps = dumps
        self._loads = loads
        self._durable = durable
        self._busy_timeout = busy_timeout
        self._dedup_window = dedup_window
        self._lock = threading.Lock()
        self._conn: Optional[sqlite3.Connection] = None
        self._cur: Any = None
        self._closed = False
        self._generation = _FORK_GENERATION
        self._queue = WaitQueue()
        self._watcher = Watcher(self, self._queue)
        self._executor: Optional[ThreadPoolExecutor] = None
        self._data_version: Optional[int] = None
        self._next_expiry: Optional[float] = None
        conn = _open(path, durable, busy_timeout)
        self._identity = file_identity(path)  # what an application's conn= must be connected to
        self._conn = conn
        self._cur = conn.cursor()
        _LIVE.add(self)

    # ------------------------------------------------------------ helpers

    def _now(self) -> float:
        """The clock's reading, checked (LeaseQueueError first when closed:
        a closed transport reads no clock)."""
        if self._cur is None:
            raise self._unusable()
        now = self._clock()
        if type(now) is not float or now - now != 0.0:
            now = check_time(now)
        return now

    def _cursor(self) -> Any:
        """The cursor, with the lock held; LeaseQueueError if closed or forked."""
        cur = self._cur
        if cur is None:
            raise self._unusable()
        return cur

    def _unusable(self) -> LeaseQueueError:
        if self._generation != _FORK_GENERATION:
            return LeaseQueueError(
                "this SQLiteTransport was opened before fork(): a SQLite connection must not cross "
                "processes; open a new SQLiteTransport(path) in this process"
            )
        return LeaseQueueError(f"the SQLiteTransport on {self._path!r} is closed")

    def _abort(self, exc: BaseException) -> None:
        """Roll back the current transaction (lock held); raise the error to report."""
        conn = self._conn
        if conn is not None and conn.in_transaction:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass
        if isinstance(exc, sqlite3.Error):
            raise _database_error(exc, self._path, self._busy_timeout) from exc
        raise exc

    def _serialize(self, event: Any) -> Union[bytes, str]:
        return serialize(self._dumps, event)

    def _lease(self, row: Tuple[Any, ...], worker_id: str) -> Any:
        """A Lease from a claim's row (after the lock: deserializing is user
        code), naming its delivery (the claim's number)."""
        _gid, group_id, seq, attempt, _priority, data, expires_at, delivery = row
        return decoded_lease(self._loads, data, seq, group_id, worker_id, expires_at, attempt, delivery)

    def _signal(self, priorities: Iterable[int]) -> List[Callable[[], None]]:
        return self._queue.signal(priorities)

    def _forked(self) -> None:
        """In a child after fork(): park the parent's connection, refuse calls."""
        self._lock = threading.Lock()
        if self._conn is not None:
            _ORPHANED.append(self._conn)
        self._conn = None
        self._cur = None
        self._watcher.forget()  # its thread did not survive the fork; its descriptors did
        self._queue = WaitQueue()
        self._watcher = Watcher(self, self._queue)
        self._executor = None

    # ------------------------------------------------------------ Part 1

    def publish(
        self,
        group_id: str,
        event: Any,
        priority: int = 0,
        *,
        delay: float = _NO_DELAY,
        key: Optional[str] = None,
        conn: Optional[sqlite3.Connection] = None,
    ) -> int:
        """Append ``event`` to group ``group_id``; return its sequence number.

        The event is serialized (before the lock).  ``priority`` is taken
        when the group is created and ignored otherwise.  ``delay > 0``: the
        message is scheduled, not delivered before ``now + delay`` (its group
        waits behind it while it is the head).  ``key``: if the key is held in
        the group (its message is stored, or was published less than
        ``dedup_window`` ago), nothing is published and the holder's seq is
        returned (SPEC Part 5, ``later.py``).  ``conn``: the application's
        ``sqlite3.Connection`` to this file: the publish is part of its
        transaction, visible to others when it commits, gone if it rolls
        back (``appconn.py``; docs/transactions.md).
        """
        if type(group_id) is not str:
            group_id = check_id(group_id, "group_id")
        if type(priority) is not int or not INT64_MIN <= priority <= INT64_MAX:
            priority = check_priority(priority, "priority")
        if delay is not _NO_DELAY or key is not None or conn is not None:
            return self._publish_later_once(group_id, event, priority, delay, key, conn)
        data = self._serialize(event)
        wakes: Any = ()
        with self._lock:
            cur = self._cursor()
            try:
                if not self._queue.waiters:
                    # One statement: SQLite makes it its own write transaction, and
                    # commits it when fetchone() steps it to its end.
                    seq = cur.execute(_Q["publish"], (group_id, priority, data)).fetchone()[0]
                else:
                    cur.execute("BEGIN IMMEDIATE")
                    seq = cur.execute(_Q["publish"], (group_id, priority, data)).fetchone()[0]
                    messages, ready, priority = cur.execute(_Q["group_state"], (group_id,)).fetchone()
                    if ready and messages == 1:  # the group was idle: claimable now
                        wakes = self._signal((priority,))
                    cur.execute("COMMIT")
            except BaseException as exc:
                self._abort(exc)
        if wakes:
            call_all(wakes)
        return seq

    def claim(
        self,
        worker_id: str,
        visibility: float,
        min_priority: int = 0,
        *,
        timeout: Optional[float] = 0.0,
    ) -> Any:
        """Lease the next message to ``worker_id`` for ``visibility`` seconds.

        As ``InMemoryTransport.claim``: expiry first, then the eligible group
        claimed least recently among priorities ``>= min_priority``.
        ``timeout`` (seconds of real time, ``None``: no deadline) waits for a
        message to become claimable when none is; ``0`` never waits.
        """
        if type(worker_id) is not str or worker_id == PARKED:
            worker_id = check_worker(worker_id)
        if type(visibility) is not float or not visibility >= 0.0:
            visibility = check_duration(visibility, "visibility")
        if type(min_priority) is not int or not INT64_MIN <= min_priority <= INT64_MAX:
            min_priority = check_priority(min_priority, "min_priority")
        if timeout != 0.0 or type(timeout) is not float:
            timeout = _check_timeout(timeout)
            if timeout != 0.0:
                return self._wait(worker_id, visibility, min_priority, timeout)
        now = self._now()
        wakes: Any = ()
        with self._lock:
            cur = self._cursor()
            try:
                cur.execute("BEGIN IMMEDIATE")
                rows = self._claim_rows(cur, worker_id, visibility, min_priority, now, 1)
                if self._queue.waiters:
                    wakes = self._topup_in(cur)
                cur.execute("COMMIT")
            except BaseException as exc:
                self._abort(exc)
        if not rows and not wakes:
            return None
        try:
            if wakes:
                call_all(wakes)
            return self._lease(rows[0], worker_id) if rows else None
        except EventDecodeError:
            raise  # the claim stands: the error carries its lease
        except BaseException:
            self._unclaim(rows, worker_id)  # interrupted before the caller got the lease
            raise

    def ack(self, lease: Any, *, conn: Optional[sqlite3.Connection] = None) -> None:
        """Done: remove the leased message; its group may serve its next one.

        An emptied group is forgotten (unless paused).  ``LeaseLost`` if the
        lease is not current; an expired lease whose message nobody has
        claimed since is accepted.  ``conn``: the application's connection to
        this file: the ack is part of its transaction (done when it commits;
        the lease stays current if it rolls back).
        """
        if type(lease) not in _LEASE_TYPES:
            _check_lease(lease)
        if conn is not None:
            return self._settle_in_app(conn, lease, [("ack", ())], "ack")
        key = _fence(lease)
        wakes: Any = ()
        done = False
        with self._lock:
            cur = self._cursor()
            if key is not None:
                try:
                    if not self._queue.waiters:
                        # One statement: SQLite makes it its own write transaction.
                        done = cur.execute(_Q["ack"], key).rowcount == 1
                    else:
                        cur.execute("BEGIN IMMEDIATE")
                        done = cur.execute(_Q["ack"], key).rowcount == 1
                        if done:
                            wakes = self._signal_if_ready(cur, key[0])
                        cur.execute("COMMIT" if done else "ROLLBACK")
                except BaseException as exc:
                    self._abort(exc)
            if not done:
                raise _lost(lease)
        if wakes:
            call_all(wakes)

    def nack(self, lease: Any, delay: float = 0.0, *, conn: Optional[sqlite3.Connection] = None) -> None:
        """Give the message back: retry now (``delay == 0``) or park it.

        ``delay > 0`` parks it until ``now + delay``, blocking its group.
        The group keeps its round-robin position.  ``LeaseLost`` if the
        lease is not current.  ``conn``: as ``ack``'s.
        """
        _check_lease(lease)
        delay = check_duration(delay, "delay")
        now = self._now() if delay > 0.0 else 0.0
        if conn is not None:
            if delay == 0.0:
                return self._settle_in_app(conn, lease, [("nack_now", ())], "nack_now")
            return self._settle_in_app(conn, lease, [("park_time", (now,)), ("park", (delay,))], "park")
        key = _fence(lease)
        wakes: Any = ()
        with self._lock:
            cur = self._cursor()
            done = False
            if key is not None:
                try:
                    if delay == 0.0 and not self._queue.waiters:
                        # One statement: SQLite makes it its own write transaction.
                        done = cur.execute(_Q["nack_now"], key).rowcount == 1
                    else:
                        cur.execute("BEGIN IMMEDIATE")
                        if delay == 0.0:
                            done = cur.execute(_Q["nack_now"], key).rowcount == 1
                        else:
                            # The time and the counts are kept only if the lease is current (else rolled back).
                            cur.execute(_Q["park_time"], key + (now,))
                            done = cur.execute(_Q["park"], key + (delay,)).rowcount == 1
                        if done and self._queue.waiters:
                            wakes = self._signal_if_ready(cur, key[0]) if delay == 0.0 else self._topup_in(cur)
                        cur.execute("COMMIT" if done else "ROLLBACK")
                except BaseException as exc:
                    self._abort(exc)
            if not done:
                raise _lost(lease)
        if wakes:
            call_all(wakes)

    def extend(self, lease: Any, visibility: float) -> Any:
        """Heartbeat: lease the same message again until ``now + visibility``.

        Returns a new ``Lease`` (same seq, attempt, worker and event object).
        ``LeaseLost`` if the lease is not current.
        """
        _check_lease(lease)
        visibility = check_duration(visibility, "visibility")
        now = self._now()
        key = _fence(lease)
        with self._lock:
            cur = self._cursor()
            done = False
            wakes: Any = ()
            if key is not None:
                try:
                    cur.execute("BEGIN IMMEDIATE")
                    cur.execute(_Q["extend_time"], key + (now,))
                    now = cur.execute(_Q["now"]).fetchone()[0]
                    expires_at = now + visibility
                    done = cur.execute(_Q["extend"], key + (expires_at,)).rowcount == 1
                    if done and self._queue.waiters:
                        wakes = self._topup_in(cur)
                    cur.execute("COMMIT" if done else "ROLLBACK")
                except BaseException as exc:
                    self._abort(exc)
            if not done:
                raise _lost(lease)
        if wakes:
            call_all(wakes)
        assert key is not None  # done
        return issue(lease.seq, lease.group_id, lease.event, lease.worker_id, expires_at, lease.attempt, key[4])

    def stats(self) -> TransportStats:
        """Counts now: messages, groups, live leases, parked messages, paused
        groups, buried groups, scheduled messages (not due yet).

        Applies expiry first (expired leases and parks count as neither).
        """
        now = self._now()
        wakes: Any = ()
        with self._lock:
            cur = self._cursor()
            try:
                cur.execute("BEGIN IMMEDIATE")
                self._use_time(cur, now)
                cur.execute(_Q["drop_due"])
                counts = cur.execute(_Q["counts"]).fetchone()
                if self._queue.waiters:
                    wakes = self._topup_in(cur)
                cur.execute("COMMIT")
            except BaseException as exc:
                self._abort(exc)
        if wakes:
            call_all(wakes)
        return TransportStats(*counts)

    def __len__(self) -> int:
        """Messages held: ready + leased + parked."""
        with self._lock:
            cur = self._cursor()
            try:
                return int(cur.execute(_Q["count_messages"]).fetchone()[0])
            except BaseException as exc:
                self._abort(exc)
                raise  # not reached

    @property
    def closed(self) -> bool:
        """True after ``close()``."""
        return self._closed

    @property
    def path(self) -> str:
        """The database file."""
        return self._path

    def close(self) -> None:
        """Wake every waiting claim (they return None) and close the connection.

        Idempotent.  Every later call but ``close()`` and ``closed`` raises
        ``LeaseQueueError``.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            wakes = self._queue.close()
            conn = self._conn
            self._conn = None
            self._cur = None
            if conn is not None:
                try:
                    conn.close()
                except sqlite3.Error:
                    pass
        call_all(wakes)
        self._watcher.stop()
        executor = self._executor
        if executor is not None:
            executor.shutdown(wait=False)
        _LIVE.discard(self)

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if not self._closed and self._generation == _FORK_GENERATION:
                self.close()
        except Exception:
            pass

    def __reduce__(self) -> Any:
        raise TypeError("a SQLiteTransport cannot be pickled: open SQLiteTransport(path) in each process")

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<leasequeue.SQLiteTransport {self._path!r} {state}>"

    # ------------------------------------------------------------ internals (lock held)

    def _claim_rows(
        self, cur: Any, worker_id: str, visibility: float, floor: int, now: float, count: int
    ) -> List[Tuple[Any, ...]]:
        """Move the time to ``now`` (expiry), then up to ``count`` claims at it.

        Each row: gid, group_id, seq, attempt, priority, serialized event,
        expires_at, and the delivery's number (the claim's: the group's
        round-robin key from now on).
        """
        if count == 1:
            # Find first, then one statement on lq_state: the time used, and (if
            # a group was leased) the claim number taken and the lease counted in.
            find = _Q["find_claimable"]
            row = cur.execute(find, (floor, now)).fetchone()
            now, key, next_expiry = row[0], row[1], row[2]
            if next_expiry is not None and next_expiry < now:
                # A lock has ended: expiry first, then look again.
                self._use_time(cur, now)
                row = cur.execute(find, (floor, now)).fetchone()
            gid = row[3]
            if gid is None:
                cur.execute(_Q["use_time"], (now,))
                return []
            expires_at = now + visibility
            cur.execute(_Q["lease"], (gid, worker_id, expires_at, key, now))
            cur.execute(_Q["claimed"], (now,))
            return [row[3:] + (expires_at, key)]  # the delivery: the claim's number
        self._use_time(cur, now)
        if count == 0:
            return []
        # count successive claims at one now take the first count eligible groups
        # in round-robin order: one query, then the leases in claim order.
        now, claims = cur.execute(_Q["now"]).fetchone()
        expires_at = now + visibility
        found = cur.execute(_Q["find_claimable_many"], (floor, min(count, INT64_MAX))).fetchall()
        if not found:
            return []
        cur.execute(_Q["take_claims"], (len(found),))
        first_key = claims + 1
        cur.executemany(
            _Q["lease"], [(row[0], worker_id, expires_at, first_key + i, now) for i, row in enumerate(found)]
        )
        return [row + (expires_at, first_key + i) for i, row in enumerate(found)]

    def _use_time(self, cur: Any, now: float) -> None:
        """Move the transport's time to ``now`` (never back) and apply expiry at it."""
        cur.execute(_Q["use_time_and_expire"], (now,))
        cur.execute(_Q["expire"])

    def _signal_if_ready(self, cur: Any, group_id: str) -> List[Callable[[], None]]:
        """Wake a waiting claim if ``group_id`` is claimable now (it just became so)."""
        state = cur.execute(_Q["group_state"], (group_id,)).fetchone()
        if state is None or not state[1]:
            return []
        return self._signal((state[2],))

    def _topup_in(self, cur: Any) -> List[Callable[[], None]]:
        """Something may have become claimable (expiry, another process): if no
        waiting claim holds a token, wake the longest one the best ready group admits."""
        if not self._queue.needs_topup():
            return []
        top = cur.execute(_Q["top_ready_priority"]).fetchone()[0]
        if top is None:
            return []
        return self._signal((top,))

    # ------------------------------------------------------------ Part 2: control plane

    def pause(self, group_id: str) -> bool:
        """Stop serving ``group_id`` (a leased message stays leased).

        Returns True if the group was not paused.  Pausing a group that holds
        nothing records it, so messages published later wait in it.
        """
        group_id = check_id(group_id, "group_id")
        with self._lock:
            cur = self._cursor()
            try:
                cur.execute("BEGIN IMMEDIATE")
                row = cur.execute(_Q["find_group"], (group_id,)).fetchone()
                if row is None:
                    cur.execute(_Q["pause_new"], (group_id,))
                elif not row[1]:
                    cur.execute(_Q["pause"], (row[0],))
                if row is None or not row[1]:
                    cur.execute(_Q["count_paused"], (1,))
                cur.execute("COMMIT")
            except BaseException as exc:
                self._abort(exc)
        return row is None or not row[1]

    def resume(self, group_id: str) -> bool:
        """Lift a pause, end a park at once and lift a bury; True if any was lifted.

        The group is claimable again (a waiting claim is woken); a parked or
        buried message's next delivery is attempt + 1.  An emptied group is
        forgotten.
        """
        group_id = check_id(group_id, "group_id")
        wakes: Any = ()
        lifted = False
        with self._lock:
            cur = self._cursor()
            try:
                cur.execute("BEGIN IMMEDIATE")
                row = cur.execute(_Q["find_group"], (group_id,)).fetchone()
                if row is not None:
                    gid, paused, lock, messages = row
                    lifted = bool(paused) or lock == 2 or lock == 3
                    if lifted:
                        cur.execute(_Q["resume"], (gid,))
                        if paused:
                            cur.execute(_Q["count_paused"], (-1,))
                        if lock == 3:
                            cur.execute(_Q["count_buried"], (-1,))
                        if not messages:
                            cur.execute(_Q["forget_group"], (gid,))  # it held nothing but its pause
                        elif self._queue.waiters:
                            wakes = self._signal_if_ready(cur, group_id)
                cur.execute("COMMIT")
            except BaseException as exc:
                self._abort(exc)
        if wakes:
            call_all(wakes)
        return lifted

    def purge(self, group_id: str) -> int:
        """Remove every message of ``group_id`` and forget the group; returns
        how many messages were removed.  Its current lease is no longer current."""
        group_id = check_id(group_id, "group_id")
        with self._lock:
            cur = self._cursor()
            removed = 0
            try:
                cur.execute("BEGIN IMMEDIATE")
                row = cur.execute(_Q["find_group"], (group_id,)).fetchone()
                if row is not None:
                    removed = row[3]
                    cur.execute(_Q["purge_due"], (row[0],))
                    cur.execute(_Q["purge_messages"], (row[0],))
                    cur.execute(_Q["forget_group"], (row[0],))
                    lock = row[2]
                    cur.execute(_Q["count_purged"], (removed, 1 if row[1] else 0, int(lock == 1), int(lock == 2)))
                    if lock == 3:
                        cur.execute(_Q["count_buried"], (-1,))
                cur.execute("COMMIT")
            except BaseException as exc:
                self._abort(exc)
        return int(removed)

    def set_priority(self, group_id: str, priority: int) -> bool:
        """Change a live group's priority (its round-robin position is kept).

        False if there is no such group (it is not created).
        """
        group_id = check_id(group_id, "group_id")
        priority = check_priority(priority, "priority")
        wakes: Any = ()
        with self._lock:
            cur = self._cursor()
            try:
                cur.execute("BEGIN IMMEDIATE")
                found = cur.execute(_Q["set_priority"], (group_id, priority)).rowcount == 1
                if found and self._queue.waiters:
                    wakes = self._signal_if_ready(cur, group_id)
                cur.execute("COMMIT")
            except BaseException as exc:
                self._abort(exc)
        if wakes:
            call_all(wakes)
        return found

    def group(self, group_id: str) -> Optional[GroupInfo]:
        """What group ``group_id`` is doing now (expiry applied), or None."""
        group_id = check_id(group_id, "group_id")
        rows = self._inspect(_Q["group_info"], (group_id,))
        return _info(rows[0]) if rows else None

    def groups(self) -> List[GroupInfo]:
        """A snapshot of every group (expiry applied), in creation order. O(G)."""
        return [_info(row) for row in self._inspect(_Q["groups_info"], ())]

    def _inspect(self, query: str, params: Tuple[Any, ...]) -> List[Any]:
        now = self._now()
        wakes: Any = ()
        with self._lock:
            cur = self._cursor()
            try:
                cur.execute("BEGIN IMMEDIATE")
                self._use_time(cur, now)
                rows = cur.execute(query, params).fetchall()
                if self._queue.waiters:
                    wakes = self._topup_in(cur)
                cur.execute("COMMIT")
            except BaseException as exc:
                self._abort(exc)
        if wakes:
            call_all(wakes)
        return rows

    # ------------------------------------------------------------ Part 4: quarantine

    def bury(self, lease: Any, reason: str = "", *, conn: Optional[sqlite3.Connection] = None) -> None:
        """Quarantine the lease's group: the delivery ends, its message stays
        at the group's head, and no claim serves the group until
        ``resume(group_id)`` (the same message again, attempt + 1) or
        ``skip(group_id)``.  The group's later messages wait behind it, in
        order.  ``reason`` (a ``str``) is kept with the group (``group()``).

        ``LeaseLost`` if the lease is not current; nothing changes then.
        ``conn``: as ``ack``'s.
        """
        if type(lease) not in _LEASE_TYPES:
            _check_lease(lease)
        if type(reason) is not str:
            if not isinstance(reason, str):
                raise TypeError(f"reason must be a str, not {type(reason).__name__}")
            reason = str.__str__(reason)
        if conn is not None:
            return self._settle_in_app(
                conn, lease, [("bury_count", ()), ("bury", (reason,))], "bury", (("count_buried", (1,)),)
            )
        key = _fence(lease)
        with self._lock:
            cur = self._cursor()
            done = False
            if key is not None:
                try:
                    cur.execute("BEGIN IMMEDIATE")
                    # The counts are kept only if the lease is current (else rolled back).
                    cur.execute(_Q["bury_count"], key)
                    done = cur.execute(_Q["bury"], key + (reason,)).rowcount == 1
                    if done:
                        cur.execute(_Q["count_buried"], (1,))
                    cur.execute("COMMIT" if done else "ROLLBACK")
                except BaseException as exc:
                    self._abort(exc)
            if not done:
                raise _lost(lease)

    def skip(self, group_id: str) -> bool:
        """Remove the group's head message unless a lease that has not expired
        holds it (ready, parked, paused, buried, or under a lease that ran out,
        which stops being current), lift a bury (not a pause), and return True.

        The group's next message becomes its head and is claimable unless the
        group is paused (a waiting claim is woken); an emptied group that is
        not paused is forgotten.  False, changing nothing, for an unknown
        group, an empty paused group, or a head under a live lease.
        """
        group_id = check_id(group_id, "group_id")
        now = self._now()
        wakes: Any = ()
        removed = False
        with self._lock:
            cur = self._cursor()
            try:
                cur.execute("BEGIN IMMEDIATE")
                self._use_time(cur, now)  # expiry first: a lease that ran out holds nothing
                row = cur.execute(_Q["find_head"], (group_id,)).fetchone()
                if row is not None and row[4] is not None and row[2] != 1:
                    gid = row[0]
                    cur.execute(_Q["skip_count"], (gid,))
                    if row[2] == 3:
                        cur.execute(_Q["count_buried"], (-1,))
                    cur.execute(_Q["skip_due"], (row[4],))
                    cur.execute(_Q["skip"], (gid,))
                    cur.execute(_Q["schedule_head"], (group_id,))  # the new head may be scheduled
                    removed = True
                if self._queue.waiters:
                    # The exposed head, and whatever the expiry freed (topup: only
                    # if no waiting claim already holds a wake-up).
                    wakes = (self._signal_if_ready(cur, group_id) if removed else []) + self._topup_in(cur)
                cur.execute("COMMIT")
            except BaseException as exc:
                self._abort(exc)
        # The removed event was never deserialized: nothing of it to drop here.
        if wakes:
            call_all(wakes)
        return removed

    def peek(self, group_id: str, max_count: int = 1) -> List[Message]:
        """The group's oldest ``max_count`` messages, head first, whatever their
        state, as ``Message(seq, event, attempt, due_at, key)`` (``attempt``:
        deliveries so far; the event an equal copy; ``due_at``: the due time
        it was published with, or None; ``key``: its key, or None).  ``[]`` for an unknown group.  Changes
        nothing; O(log G + max_count).  Events are deserialized after the
        lock; one that cannot be is shown as a ``leasequeue.Undecodable``
        (its stored form and the error) instead of raising.
        """
        group_id = check_id(group_id, "group_id")
        max_count = _check_count(max_count)
        if max_count == 0:
            if self._cur is None:
                raise self._unusable()
            return []
        with self._lock:
            cur = self._cursor()
            try:
                # One read statement: its own (read) transaction, a consistent snapshot.
                rows = cur.execute(_Q["peek"], (group_id, min(max_count, INT64_MAX))).fetchall()
            except BaseException as exc:
                self._abort(exc)
        return [
            Message(seq, self._decoded(data, seq, group_id), attempt, None if due is None else float(due), key)
            for seq, data, attempt, due, key in rows
        ]

    def _decoded(self, data: Any, seq: int, group_id: str) -> Any:
        """A peeked message's event (after the lock: deserializing is user code),
        or an ``Undecodable`` of the stored data if it cannot be deserialized."""
        return decode_or_undecodable(self._loads, data)

    # ------------------------------------------------------------ Part 2: batches

    def publish_many(
        self, items: Iterable[Any], *, delay: float = 0.0, conn: Optional[sqlite3.Connection] = None
    ) -> List[int]:
        """Publish ``(group_id, event[, priority[, key]])`` items in one
        transaction; returns their seqs (the new messages' consecutive, in
        item order; an item whose key is held, or repeats an earlier item's
        key in its group, gets the holder's seq and publishes nothing).
        ``delay``: as ``publish``'s, for every item.

        Every item is validated, then ``delay``, then every event serialized:
        one bad item raises and nothing is published.  ``conn``: as
        ``publish``'s (the items are published one by one in its transaction).
        """
        checked = [check_keyed_item(item) for item in list(items)]
        if type(delay) is not float or delay:
            delay = check_duration(delay, "delay")
        rows = [(group_id, priority, self._serialize(event), key) for group_id, event, priority, key in checked]
        if conn is not None:
            if not rows:
                self._app_cursor(conn)  # checked all the same
                return []
            keyed = any(row[3] is not None for row in rows)
            return self._publish_in_app(conn, rows, delay, delay > 0.0 or (keyed and self._dedup_window > 0.0))
        if not rows:
            if self._cur is None:
                raise self._unusable()
            return []
        if delay > 0.0 or any(row[3] is not None for row in rows):
            return self._publish_many_later_once(rows, delay)
        wakes: Any = ()
        with self._lock:
            cur = self._cursor()
            try:
                cur.execute("BEGIN IMMEDIATE")
                # Set-based: stage the items, then one statement for the groups
                # and one for the messages (the same state as one by one).
                cur.executemany(_Q["batch_add"], rows)
                cur.execute(_Q["batch_take_seqs"])
                last = cur.execute(_Q["last_seq"]).fetchone()[0]
                base = last - len(rows)
                cur.execute(_Q["batch_groups"], (base,))
                cur.execute(_Q["batch_heads"], (base,))
                cur.execute(_Q["batch_messages"], (base, None))
                cur.execute(_Q["batch_clear"])
                if self._queue.waiters:
                    claimable = []
                    published = collections.Counter(row[0] for row in rows)
                    for group_id, count in published.items():
                        messages, ready, priority = cur.execute(_Q["group_state"], (group_id,)).fetchone()
                        if ready and messages == count:
                            claimable.append(priority)  # the group was idle before the batch
                    wakes = self._signal(claimable)
                cur.execute("COMMIT")
            except BaseException as exc:
                self._abort(exc)
        if wakes:
            call_all(wakes)
        return list(range(last - len(rows) + 1, last + 1))

    def claim_many(self, worker_id: str, visibility: float, max_count: int, min_priority: int = 0) -> List[Any]:
        """Up to ``max_count`` leases (distinct groups) in one transaction at one
        ``now``: exactly what that many successive claims would return. Never waits."""
        worker_id = check_worker(worker_id)
        visibility = check_duration(visibility, "visibility")
        max_count = _check_count(max_count)
        min_priority = check_priority(min_priority, "min_priority")
        now = self._now()
        wakes: Any = ()
        with self._lock:
            cur = self._cursor()
            try:
                cur.execute("BEGIN IMMEDIATE")
                rows = self._claim_rows(cur, worker_id, visibility, min_priority, now, max_count)
                if self._queue.waiters:
                    wakes = self._topup_in(cur)
                cur.execute("COMMIT")
            except BaseException as exc:
                self._abort(exc)
        leases = []
        failed: Optional[EventDecodeError] = None
        try:
            if wakes:
                call_all(wakes)
            for row in rows:
                try:
                    leases.append(self._lease(row, worker_id))
                except EventDecodeError as exc:
                    leases.append(exc.lease)
                    failed = failed or exc
        except BaseException:
            self._unclaim(rows, worker_id)  # interrupted before the caller got the leases
            raise
        if failed is not None:
            failed.leases = leases
            raise failed
        return leases

    def ack_many(self, leases: Iterable[Any], *, conn: Optional[sqlite3.Connection] = None) -> List[Any]:
        """Ack each current lease, in order, in one transaction; returns the
        leases that were not current (it never raises ``LeaseLost``).
        ``conn``: as ``ack``'s (all of them in the application's transaction)."""
        leases = list(leases)
        for lease in leases:
            _check_lease(lease)
        if conn is not None:
            return self._ack_many_in_app(conn, leases)
        lost = []
        claimable = []
        wakes: Any = ()
        with self._lock:
            cur = self._cursor()
            try:
                cur.execute("BEGIN IMMEDIATE")
                ack = _Q["ack"]
                waiting = bool(self._queue.waiters)
                for lease in leases:
                    key = _fence(lease)
                    if key is None or cur.execute(ack, key).rowcount != 1:
                        lost.append(lease)
                    elif waiting:
                        claimable.append(key[0])
                if claimable:
                    wakes = [w for group_id in claimable for w in self._signal_if_ready(cur, group_id)]
                cur.execute("COMMIT")
            except BaseException as exc:
                self._abort(exc)
        if wakes:
            call_all(wakes)
        return lost

    def ack_and_claim(self, lease: Any, worker_id: str, visibility: float, min_priority: int = 0) -> Any:
        """``ack(lease)`` then a non-waiting ``claim``, in one transaction (one
        commit) at one clock reading.

        ``LeaseLost`` (nothing acked, nothing claimed) if the lease is not
        current.  Returns the claim's lease, or ``None`` when no group is
        eligible (the ack stands).  Waiting claims, in this process or
        another, are woken for what the claim leaves, as after a claim.
        """
        if type(lease) not in _LEASE_TYPES:
            _check_lease(lease)
        if type(worker_id) is not str or worker_id == PARKED:
            worker_id = check_worker(worker_id)
        visibility = check_duration(visibility, "visibility")
        if type(min_priority) is not int or not INT64_MIN <= min_priority <= INT64_MAX:
            min_priority = check_priority(min_priority, "min_priority")
        now = self._now()
        key = _fence(lease)
        rows: List[Tuple[Any, ...]]
        wakes: Any = ()
        with self._lock:
            cur = self._cursor()
            if key is None:
                raise _lost(lease)
            try:
                cur.execute("BEGIN IMMEDIATE")
                if cur.execute(_Q["ack"], key).rowcount != 1:
                    raise _lost(lease)  # rolled back by _abort: nothing acked or claimed, the time unmoved
                rows = self._claim_rows(cur, worker_id, visibility, min_priority, now, 1)
                if self._queue.waiters:
                    # what the claim left (the acked group's next message, the
                    # groups its expiry freed): a top-up, as after a claim
                    wakes = self._topup_in(cur)
                cur.execute("COMMIT")
            except BaseException as exc:
                self._abort(exc)
        if not rows and not wakes:
            return None
        try:
            if wakes:
                call_all(wakes)
            return self._lease(rows[0], worker_id) if rows else None
        except EventDecodeError:
            raise  # the claim stands: the error carries its lease
        except BaseException:
            self._unclaim(rows, worker_id)  # interrupted before the caller got the lease (the ack stands)
            raise

    # ------------------------------------------------------------ Part 2: waiting

    def _attempt(self, worker_id: str, visibility: float, floor: int, waiter: Waiter, now: float) -> Any:
        """One claim attempt at ``now`` (read by the caller, in its own thread)
        for a waiting claim: the claim's raw row, None, or _CLOSED.  Registers
        the waiter when nothing was claimable, in the same critical section,
        and tops up a token if work is left for another."""
        wakes: List[Callable[[], None]] = []
        with self._lock:
            cur = self._cur
            if cur is None:
                if self._closed:
                    return _CLOSED
                raise self._unusable()
            try:
                cur.execute("BEGIN IMMEDIATE")
                rows = self._claim_rows(cur, worker_id, visibility, floor, now, 1)
                row = rows[0] if rows else None
                queue = self._queue
                if not queue.attempted(waiter, row):
                    # The caller was cancelled while this ran: undo the claim.
                    assert row is not None
                    key = (row[1], row[3], row[2], worker_id, row[7])
                    cur.execute(_Q["unclaim_count"], key)
                    cur.execute(_Q["unclaim"], key)
                    wakes += self._signal_if_ready(cur, row[1])
                    row = None
                wakes += self._topup_in(cur)
                cur.execute("COMMIT")
            except BaseException as exc:
                self._abort(exc)
        if wakes:
            call_all(wakes)
        return row

    def _unclaim(self, rows: List[Any], worker_id: str) -> None:
        """Undo claims made for a caller that is gone or was interrupted before
        it got its leases (``rows``: the claims' raw rows).  Each is undone
        exactly (attempt, round-robin key and previous delivery restored) if
        it is still current.  If that fails (closed, locked), the leases
        expire by themselves; the caller's own exception is what propagates."""
        wakes: List[Callable[[], None]] = []
        with self._lock:
            cur = self._cur
            if cur is None:
                return  # closed: the leases expire by themselves
            try:
                cur.execute("BEGIN IMMEDIATE")
                for row in rows:
                    key = (row[1], row[3], row[2], worker_id, row[7])
                    cur.execute(_Q["unclaim_count"], key)
                    if cur.execute(_Q["unclaim"], key).rowcount == 1:
                        wakes += self._signal_if_ready(cur, row[1])
                cur.execute("COMMIT")
            except Exception:
                conn = self._conn
                try:
                    if conn is not None and conn.in_transaction:
                        conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
                return
        if wakes:
            call_all(wakes)

    def _wait(self, worker_id: str, visibility: float, floor: int, timeout: Optional[float]) -> Any:
        """``claim(timeout=...)`` in a thread."""
        if self._closed:
            return None  # the worker loop ends on close(); the database is not touched
        if self._cur is None:
            raise self._unusable()
        deadline = None if timeout is None else time.monotonic() + timeout
        waiter = Waiter(floor)
        queue = self._queue
        event = waiter.event
        assert event is not None
        try:
            while True:
                try:
                    now = self._now()
                except LeaseQueueError:
                    if self._closed:
                        return None
                    raise
                row = self._attempt(worker_id, visibility, floor, waiter, now)
                if row is _CLOSED:
                    return None
                if row is not None:
                    return self._received(row, worker_id, waiter)
                self._watcher.ensure()
                # On the main thread, sleep in slices so that a KeyboardInterrupt
                # from _thread.interrupt_main() (which sends no real signal) is seen.
                slice_ = _MAIN_THREAD_SLICE if threading.current_thread() is threading.main_thread() else None
                while True:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0.0:
                        return None
                    if slice_ is not None and (remaining is None or remaining > slice_):
                        remaining = slice_
                    if event.wait(remaining) or self._closed:
                        break
                if self._closed:
                    return None
        except BaseException:
            raw = queue.take_result(waiter)
            if raw is not None:
                self._unclaim([raw], worker_id)
            raise
        finally:
            call_all(queue.leave(waiter))

    async def aclaim(
        self,
        worker_id: str,
        visibility: float,
        min_priority: int = 0,
        *,
        timeout: Optional[float] = None,
    ) -> Any:
        """``claim`` as a coroutine: waits (without a thread per waiter) up to
        ``timeout`` seconds (``None``: no deadline) for a message.

        The SQLite calls run on one helper thread per transport; a publish,
        ack or nack from any thread, event loop or process wakes it.
        Cancelling it leaves nothing leased on its behalf.
        """
        worker_id = check_worker(worker_id)
        visibility = check_duration(visibility, "visibility")
        min_priority = check_priority(min_priority, "min_priority")
        timeout = _check_timeout(timeout)
        if self._closed:
            return None  # as claim(timeout=...): the worker loop ends on close()
        if self._cur is None:
            raise self._unusable()
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        executor = self._get_executor()
        queue = self._queue
        # The future the next wake-up resolves (a new one after each wake).
        holder: List["asyncio.Future[None]"] = [loop.create_future()]

        def wake() -> None:
            loop.call_soon_threadsafe(_resolve, holder[0])

        waiter = Waiter(min_priority, wake)
        try:
            while True:
                try:
                    # The clock is read here, on the caller's thread; the
                    # database work runs on the helper thread.
                    try:
                        now = self._now()
                    except LeaseQueueError:
                        if self._closed:
                            return None
                        raise
                    row = await loop.run_in_executor(
                        executor, self._attempt, worker_id, visibility, min_priority, waiter, now
                    )
                except RuntimeError:
                    if self._closed:
                        return None
                    raise
                if row is _CLOSED:
                    return None
                if row is not None:
                    return self._received(row, worker_id, waiter)
                if timeout == 0.0:
                    return None
                self._watcher.ensure()
                current = holder[0]
                if deadline is None:
                    await current
                else:
                    remaining = deadline - loop.time()
                    if remaining <= 0.0:
                        return None
                    try:
                        await asyncio.wait_for(asyncio.shield(current), remaining)
                    except asyncio.TimeoutError:
                        return None
                if self._closed:
                    return None
                holder[0] = loop.create_future()
        except BaseException:
            raw = queue.take_result(waiter)
            if raw is not None:
                executor.submit(self._unclaim, [raw], worker_id)
            raise
        finally:
            call_all(queue.leave(waiter))

    def _received(self, row: Any, worker_id: str, waiter: Waiter) -> Any:
        """A waiting claim's lease from its row.  The row stays recorded as the
        waiter's result until the lease exists, so an exception meanwhile (an
        interrupt while the event is deserialized) finds it and undoes the
        claim; an undecodable event is the caller's (EventDecodeError)."""
        try:
            lease = self._lease(row, worker_id)
        except EventDecodeError:
            waiter.result = None
            raise
        waiter.result = None
        return lease

    def _get_executor(self) -> ThreadPoolExecutor:
        executor = self._executor
        if executor is None:
            with self._lock:
                executor = self._executor
                if executor is None:
                    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="leasequeue-sqlite")
                    self._executor = executor
        return executor

    # ------------------------------------------------------------ the watcher's calls

    def _poll(self) -> Tuple[bool, Optional[float]]:
        """Has another connection committed since the last poll?  And the
        earliest lock end (this process's own commits move it too)."""
        with self._lock:
            cur = self._cursor()
            try:
                version = cur.execute("PRAGMA data_version").fetchone()[0]
                changed = version != self._data_version
                self._next_expiry = cur.execute(_Q["next_expiry"]).fetchone()[0]
            except BaseException as exc:
                self._abort(exc)
        self._data_version = version
        return changed, self._next_expiry

    def _expire_due(self, next_expiry: float) -> float:
        """Apply expiry if the earliest lock end is due by the clock, and wake
        a waiting claim if that made work claimable.  Returns the clock's reading.

        Only while a claim waits: the watcher's last round may run after the
        last waiting claim left, and its clock reading must not then move the
        transport's time (an operation that reads no clock, an ack, uses that
        time to tell whether the next head is scheduled)."""
        now = self._now()
        if not now > next_expiry:
            return now
        wakes: Any = ()
        with self._lock:
            if not self._queue.waiters:
                return now
            cur = self._cursor()
            try:
                cur.execute("BEGIN IMMEDIATE")
                self._use_time(cur, now)
                wakes = self._topup_in(cur)
                cur.execute("COMMIT")
            except BaseException as exc:
                self._abort(exc)
        if wakes:
            call_all(wakes)
        return now

    def _topup(self) -> None:
        """Another process committed: if work is claimable and no waiting claim
        holds a token, wake the longest waiter it admits."""
        wakes: Any = ()
        with self._lock:
            cur = self._cursor()
            try:
                wakes = self._topup_in(cur)
            except BaseException as exc:
                self._abort(exc)
        if wakes:
            call_all(wakes)


def _resolve(future: "asyncio.Future[None]") -> None:
    if not future.done():
        future.set_result(None)

