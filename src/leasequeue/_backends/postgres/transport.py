"""``PostgresTransport``: the leasequeue contract on a PostgreSQL database.

Any number of processes on any number of machines share one queue.  Each
operation is one round trip: a call of a server-side function
(``_backends/postgres/schema.sql``) in its own transaction, or, given
``conn=``, in the application's (``appconn.py``).  Queues are made by
``install`` and ``create_queue`` only (``queues.py``).  The contract notes
(what differs from the in-memory transport, time, waiting, faults) are in
``docs/postgres.md``.

Needs psycopg 3 (``pip install leasequeue[postgres]``).
"""

from __future__ import annotations

import asyncio
import math
import random
import threading
import time
import weakref
from typing import Any, Callable, Iterable, List, Optional, Sequence, Tuple, TypeVar

import psycopg  # only leasequeue._backends.load() imports this module: it names the extra when psycopg is missing

from ..durable import DeliveryKey, check_lease, decoded_lease, issue, lease_delivery, lease_key, lost
from ..._errors import LeaseQueueError, QueueNotFound
from . import queues as _queues
from .appconn import IDENTITY_SQL, AppConnections, check_async_conn, check_conn, in_app_tx
from .waiting import Listener, Waiter, WaitRoom
from ..._serializers import EventDecodeError, check_serializer, decode_or_undecodable, serialize_bytes
from ..sqlfiles import load_migrations, load_queries, load_script
from ..._types import GroupInfo, Message, TransportStats
from ..._validation import (
    INT64_MAX,
    check_count,
    check_duration,
    check_id,
    check_key,
    check_keyed_item,
    check_priority,
    check_time,
    check_timeout,
    check_worker,
)


_Self = TypeVar("_Self")  # what __enter__ returns: the transport itself (a subclass's too)

__all__ = ["SCHEMA_VERSION", "PostgresTransport"]

#: The schema version this code writes and understands (``leasequeue.meta``).
#: ``install()`` upgrades an older one (1, leasequeue 0.3, or later) with the
#: numbered files of ``_backends/postgres/migrations/``.  Version 4
#: (leasequeue 0.6): delayed publish, idempotency keys, release, retry,
#: fencing by delivery.  Version 5 (0.7): operations in the application's
#: transaction (``conn=``: ``leasequeue.app_tx``; no table change).
SCHEMA_VERSION = 5
#: The oldest schema version ``install()`` can upgrade: the first released one.
OLDEST_UPGRADABLE = 1

_INF = math.inf
#: ``claim``'s count is a SQL ``int``: a larger ``max_count`` claims every
#: eligible group all the same.
_INT32_MAX = 2**31 - 1

# Set on each connection: the server-side functions' statements keep their
# generic (prepared) plans, which are index scans whatever the values; with
# custom plans PostgreSQL would re-plan them on each call, and planning
# probes the indexes' ends, which costs more than running them.
_SESSION = "SET plan_cache_mode = force_generic_plan"
_STATES = {1: "leased", 2: "parked"}
_BURIED = 3  # lock_state of a buried group
_SCHEDULED = 4  # lock_state of a group whose head is scheduled (until expires_at, its due)

# The named queries of ``_backends/postgres/queries.sql``, loaded once.
_Q = load_queries("postgres")
_Q_CLAIM = _Q["claim"]
_Q_PUBLISH = _Q["publish"]
_Q_ACK = _Q["ack"]
_Q_ACK_AND_CLAIM = _Q["ack_and_claim"]
_Q_NACK = _Q["nack"]
_Q_EXTEND = _Q["extend"]


#: Stands for the time in a statement's parameters: ``_execute`` puts the
#: injected clock's reading there (None: the server's clock) once it holds
#: the connection, so that the reading is taken as late as possible (a
#: connection being made can take long; a lease ends ``visibility`` after
#: the time its claim read).
_NOW: Any = object()


def _delivery(key: Tuple[str, int, int, str], lease: Any) -> Tuple[str, int, int, str, Optional[int]]:
    """A lease's key ``(group_id, attempt, seq, worker_id)`` and its delivery
    number (None for a lease built by hand) as the server-side functions
    take them: ``(group_id, seq, attempt, worker_id, delivery)``."""
    group_id, attempt, seq, worker_id = key
    delivery = lease_delivery(lease)
    if delivery is not None and not 0 < delivery <= INT64_MAX:  # no claim's number (a bigint): names none
        delivery = 0
    return (group_id, seq, attempt, worker_id, delivery)


def _error(exc: BaseException, what: str) -> LeaseQueueError:
    """A clear ``LeaseQueueError`` for a psycopg error."""
    if isinstance(exc, psycopg.errors.QueryCanceled):
        detail = (
            "PostgreSQL cancelled the statement (statement_timeout or lock_timeout: is a "
            f"leasequeue table locked?): {str(exc).strip()}"
        )
    elif isinstance(exc, (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedFunction,
                          psycopg.errors.InvalidSchemaName)):
        detail = (
            "the database has no (or an incomplete) leasequeue schema: run "
            f"leasequeue.PostgresTransport.install(conninfo): {str(exc).strip()}"
        )
    elif isinstance(exc, psycopg.OperationalError):
        detail = (
            "the connection to PostgreSQL failed (the operation may or may not have committed): "
            f"{str(exc).strip()}"
        )
    else:
        detail = f"PostgreSQL error: {str(exc).strip()}"
    return LeaseQueueError(f"{what}: {detail}")


class _Pool:
    """Idle connections shared by threads; each call takes one and returns it.

    A connection that failed is closed, and so is every idle one (they are
    likely dead too: the server restarted), so the next call reconnects.
    """

    def __init__(self, connect: Callable[[], Any]) -> None:
        self._connect = connect
        self._idle: List[Any] = []
        self._lock = threading.Lock()
        self._generation = 0
        self.closed = False

    def get(self) -> Tuple[Any, int]:
        with self._lock:
            if self.closed:
                raise LeaseQueueError("the PostgresTransport is closed")
            generation = self._generation
            if self._idle:
                return self._idle.pop(), generation
        return self._connect(), generation

    def put(self, conn: Any, generation: int) -> None:
        with self._lock:
            if not self.closed and generation == self._generation and not conn.closed:
                self._idle.append(conn)
                return
        conn.close()

    def discard(self, conn: Any) -> None:
        with self._lock:
            self._generation += 1
            idle, self._idle = self._idle, []
        for c in [conn, *idle]:
            try:
                c.close()
            except Exception:
                pass

    def close(self) -> None:
        with self._lock:
            self.closed = True
            idle, self._idle = self._idle, []
        for c in idle:
            try:
                c.close()
            except Exception:
                pass


_LOOK, _SIGN_UP, _SLEEP = "look", "sign up", "sleep"


class _Steps:
    """What a waiting claim does next: the one loop of ``claim(timeout=)`` and
    ``aclaim``, which differ only in how they run a step (a call, or an
    ``await``; an ``Event`` to sleep on, or a future).

    ``first()``, then after each step ``looked(rows)`` (a claim's report),
    ``failed(error)`` (a ``LeaseQueueError`` of a look or a sign-up) or
    ``next()`` (a sign-up or a sleep done) give the next step,
    ``(_LOOK | _SIGN_UP | _SLEEP, seconds to sleep)``, or ``None`` when the
    claim is over; then ``lease`` is its result (``None``: the deadline, or
    ``close()``).  ``leave()`` leaves the wait room, always.

    A look that fails is tried once more at once: a connection lost while
    the claim slept (a server restart) fails the first statement sent on it,
    and the pool then reconnects; a second failure reaches the caller.
    Closing the transport meanwhile makes any failure a plain ``None``.
    """

    __slots__ = ("t", "waiter", "deadline", "worker_id", "visibility", "lease", "used", "busy", "retried", "held")

    def __init__(self, t: "PostgresTransport", waiter: Waiter, deadline: float, worker_id: str,
                 visibility: float) -> None:
        self.t = t
        self.waiter = waiter
        self.deadline = deadline
        self.worker_id = worker_id
        self.visibility = visibility
        self.lease: Any = None
        self.used = False
        self.busy = False
        self.retried: Optional[bool] = False  # None: the step under way is a sign-up
        #: successive looks that found the earliest lock end already past
        #: (a row another transaction holds: an ack in an application's
        #: transaction, docs/decisions.md): the next look backs off
        self.held = 0
        t._room.enter(waiter)

    def leave(self) -> None:
        self.t._room.leave(self.waiter, self.used)

    def first(self) -> Optional[Tuple[str, float]]:
        return self._look()

    def _look(self) -> Tuple[str, float]:
        self.waiter.arm()
        self.t._room.take_wake(self.waiter)
        self.retried = False
        return (_LOOK, 0.0)

    def looked(self, rows: List[Tuple[Any, ...]]) -> Optional[Tuple[str, float]]:
        self.used = any(row[0] is not None for row in rows)
        leases = self.t._leases(rows, self.worker_id, self.visibility)
        if leases:
            self.lease = leases[0]
            return None
        if self.t._room.dropped:
            self.t._check_queue()
        report = rows[-1]
        ended = report[3] is not None and report[3] != _INF and float(report[3]) <= float(report[6])
        self.held = self.held + 1 if ended else 0
        self.busy = self.t._learn(report, self.held)
        return self._after_look()

    def failed(self, exc: LeaseQueueError) -> Optional[Tuple[str, float]]:
        if self.t._closed:
            return None
        if self.retried is None:  # a sign-up failed
            raise exc
        if self.retried:
            raise exc
        self.retried = True
        return (_LOOK, 0.0)

    def _after_look(self) -> Optional[Tuple[str, float]]:
        if self.t._closed:
            return None
        sleep = self.t._room.sleep_for(self.waiter, self.deadline, self.busy)
        if sleep is None:  # not signed up since this claim began
            self.retried = None  # a failed sign-up reaches the caller (or None once closed)
            return (_SIGN_UP, 0.0)
        if self.busy:  # skipped a row another transaction held: look again soon
            sleep = min(sleep, 0.002)
        return (_SLEEP, sleep)

    def next(self) -> Optional[Tuple[str, float]]:
        """After a sign-up (look again) or a sleep (look again, or not)."""
        if self.retried is None:
            return self._look()
        if self.t._closed:
            return None
        waiter = self.waiter
        if waiter.woken or self.busy:
            return self._look()
        if waiter.rearm:  # became timekeeper, or learnt of an earlier lock end
            waiter.arm()
            return self._after_look()
        if time.monotonic() < self.deadline:  # the timekeeper's lock end is due
            return self._look()
        return None


class PostgresTransport:
    """The leasequeue contract on PostgreSQL, shared across processes and machines.

    ``conninfo`` is a libpq connection string or URI.  ``queue`` names one
    of several isolated queues in the database.  ``clock=None`` (default)
    uses the database server's clock, so machines with skewed clocks agree
    on expiry; a zero-argument callable returning seconds injects a clock
    (tests).  ``serializer``: ``None``/``"pickle"`` (default, highest
    protocol), ``"json"``, or a ``(dumps, loads)`` pair; ``lease.event`` is
    an equal copy of the published event, not the object itself.
    ``dedup_window``: seconds a publish's key stays held after its message
    left (default 0: exactly while the message is held).

    The schema and the queue must exist: ``PostgresTransport.install(conninfo,
    queues=[...])`` or ``create_queue`` make them; a queue that does not
    exist raises ``QueueNotFound``.  The writes take ``conn=``, the
    application's psycopg connection, to run in its transaction.  Every method is thread-safe; errors of the database or the
    connection raise ``LeaseQueueError`` and the next call reconnects.
    """

    def __init__(
        self,
        conninfo: str,
        *,
        queue: str = "default",
        clock: Optional[Callable[[], float]] = None,
        serializer: Any = None,
        dedup_window: float = 0.0,
    ) -> None:
        if not isinstance(conninfo, str):
            raise TypeError(f"conninfo must be a str, not {type(conninfo).__name__}")
        queue = _queues.check_queue_name(queue)
        if clock is not None and not callable(clock):
            raise TypeError(f"clock must be callable, not {type(clock).__name__}")
        self._window = check_duration(dedup_window, "dedup_window")
        self._dumps, self._loads = check_serializer(serializer)
        self._conninfo = conninfo
        self._clock = clock
        self._name = queue
        self._closed = False
        self._pool = _Pool(self._connect)
        conn = self._connect()
        try:
            self._check_schema(conn, queue)
            found = _queues.find(conn, queue)
            if found is None:
                raise _queues.missing(queue)
            identity = conn.execute(IDENTITY_SQL).fetchone()
        except psycopg.Error as exc:
            conn.close()
            raise _error(exc, f"PostgresTransport(queue={queue!r})") from exc
        except BaseException:
            conn.close()
            raise
        self._queue, self._seq_oid = found
        self._app = AppConnections(identity, self._queue, queue)
        self._pool.put(conn, 0)
        self._channel = f"leasequeue_{self._queue}"
        self._room = WaitRoom()
        self._listener = Listener(self._connect, self._channel, self._room, self._poke,
                                  _Q["listen_register"], _Q["listen_unregister"], self._queue)
        self._aconns: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any]" = weakref.WeakKeyDictionary()

    # ------------------------------------------------------------ set-up

    @staticmethod
    def install(conninfo: str, queues: Iterable[str] = ("default",)) -> None:
        """Create the leasequeue schema, or bring it up to date, and create
        the named ``queues`` that do not exist yet; idempotent.

        ``queues``: queue names (default: ``("default",)``; ``()`` for none),
        each checked as the constructor's ``queue`` is, all before anything
        is sent.  Only this and :meth:`create_queue` create queues: opening
        one that does not exist raises ``QueueNotFound``.

        All in one transaction, under an advisory lock (concurrent installs
        wait for each other).  A database of an older schema version is
        upgraded in place, its data kept: first the numbered migrations of
        ``_backends/postgres/migrations/`` (table and index changes), then
        ``schema.sql`` (re)creates every function.  A database whose schema
        is newer than this leasequeue is refused, untouched.  Transports of
        the old release must be stopped first: they refuse the upgraded
        schema on their next start, but a running one would not notice it.
        """
        if not isinstance(conninfo, str):
            raise TypeError(f"conninfo must be a str, not {type(conninfo).__name__}")
        if isinstance(queues, (str, bytes)):
            raise TypeError("queues must be an iterable of queue names, not a single str: write queues=[name]")
        names = [_queues.check_queue_name(name, "a queue name") for name in queues]
        try:
            with psycopg.connect(conninfo, autocommit=True) as conn:
                with conn.transaction():
                    conn.execute("SELECT pg_advisory_xact_lock(hashtext('leasequeue.install'))")
                    exists = conn.execute("SELECT to_regclass('leasequeue.meta')").fetchone()
                    if exists is not None and exists[0] is not None:
                        found = conn.execute(_Q["schema_version"]).fetchone()
                        if found is not None:
                            _upgrade(conn, int(found[0]))
                    conn.execute(load_script("postgres"))
                    row = conn.execute(_Q["schema_version"]).fetchone()
                    version = int(row[0]) if row is not None else 0
                    if version != SCHEMA_VERSION:  # a packaging error; rolled back
                        raise LeaseQueueError(f"install left schema version {version}, not {SCHEMA_VERSION}")
                    for name in names:
                        _queues.create(conn, name)
        except psycopg.Error as exc:
            raise _error(exc, "PostgresTransport.install") from exc

    @staticmethod
    def create_queue(conninfo: str, name: str) -> bool:
        """Create the queue ``name``; True if it was made, False if it existed.

        The schema must be installed (``QueueNotFound`` otherwise: run
        :meth:`install`).  Safe to run concurrently with itself and with
        :meth:`install`.
        """
        return bool(_admin(conninfo, name, "create_queue", _queues.create))

    @staticmethod
    def drop_queue(conninfo: str, name: str) -> bool:
        """Remove the queue ``name`` and every message it holds, for good;
        True if it existed, False if there was no such queue.

        Waits for transactions that hold one of its groups (an application's
        transaction mid-ack).  Transports still open on it then fail clearly
        (``QueueNotFound``), also if a queue of that name is created again.
        """
        return bool(_admin(conninfo, name, "drop_queue", _queues.drop))

    @staticmethod
    def list_queues(conninfo: str) -> List[Tuple[str, TransportStats]]:
        """Every queue of the database, by name, with its counts (as
        ``stats()`` gives them; read only: this frees no expired lock)."""
        return list(_admin(conninfo, _NO_NAME, "list_queues", lambda conn, _name: _queues.list_all(conn)))

    def _connect(self) -> Any:
        try:
            conn = psycopg.connect(self._conninfo, autocommit=True, prepare_threshold=0)
        except psycopg.Error as exc:
            raise LeaseQueueError(f"cannot connect to PostgreSQL: {str(exc).strip()}") from exc
        try:
            conn.execute(_SESSION)
        except psycopg.Error as exc:
            conn.close()
            raise _error(exc, "connect") from exc
        return conn

    @staticmethod
    def _check_schema(conn: Any, queue: Optional[str] = None) -> None:
        exists = conn.execute("SELECT to_regclass('leasequeue.meta')").fetchone()
        if exists is None or exists[0] is None:
            raise _queues.no_schema(queue)
        row = conn.execute(_Q["schema_version"]).fetchone()
        version = int(row[0]) if row is not None else 0
        if version > SCHEMA_VERSION:
            raise LeaseQueueError(_newer(version))
        if version < SCHEMA_VERSION:
            raise LeaseQueueError(
                f"the database's leasequeue schema is version {version}, older than this leasequeue's "
                f"({SCHEMA_VERSION}): run leasequeue.PostgresTransport.install(conninfo) to upgrade it"
            )

    # ------------------------------------------------------------ plumbing

    def _check_open(self, what: str) -> None:
        """``LeaseQueueError`` once closed (after the arguments were checked,
        before the clock is read: docs/decisions.md, "After close()")."""
        if self._closed:
            raise LeaseQueueError(f"{what}: the PostgresTransport on queue {self._name!r} is closed")

    def _read_clock(self) -> Optional[float]:
        """The injected clock's reading (checked), or None: the server's clock."""
        clock = self._clock
        if clock is None:
            return None
        return check_time(clock())

    def _now(self, what: str) -> Optional[float]:
        """``_read_clock`` for a call that sends nothing (a lease whose fields
        name no delivery): a closed transport raises first, reading no clock."""
        self._check_open(what)
        return self._read_clock()

    def _execute(self, what: str, sql: str, params: Sequence[Any], check: bool = True) -> List[Tuple[Any, ...]]:
        """One statement on a pooled connection; its rows.  A ``_NOW`` among
        the parameters becomes the clock's reading, taken once the connection
        is in hand (after the closed check: a closed transport reads no clock)."""
        self._check_open(what)
        conn, generation = self._pool.get()
        if any(p is _NOW for p in params):
            try:
                now = self._read_clock()
            except BaseException:
                self._pool.put(conn, generation)
                raise
            params = tuple(now if p is _NOW else p for p in params)
        try:
            rows = conn.execute(sql, params).fetchall()
        except psycopg.Error as exc:
            self._pool.discard(conn)
            raise (self._failed(exc, what) if check else _error(exc, what)) from exc
        except BaseException:
            # Interrupted mid-call (KeyboardInterrupt): the connection's
            # state is unknown, so it is not reused.
            self._pool.discard(conn)
            raise
        self._pool.put(conn, generation)
        return rows

    def _scalar(self, what: str, sql: str, params: Sequence[Any]) -> Any:
        return self._execute(what, sql, params)[0][0]

    def _run(self, what: str, sql: str, params: Sequence[Any], conn: Any) -> List[Tuple[Any, ...]]:
        """``_execute``, or with ``conn`` (checked by ``check_conn``) on the
        application's connection, in its transaction (``appconn``)."""
        if conn is None:
            return self._execute(what, sql, params)
        self._check_open(what)
        if any(p is _NOW for p in params):
            now = self._read_clock()
            params = tuple(now if p is _NOW else p for p in params)
        try:
            return self._app.run(conn, what, in_app_tx(sql), params)
        except psycopg.Error as exc:
            self._gone(exc)
            raise

    def _gone(self, exc: BaseException) -> None:
        """On the application's connection a failed statement raises the
        driver's error, unless it failed because the queue was dropped (its
        sequence is gone): ``QueueNotFound`` then, checked on a connection
        of the transport's (the application's transaction has failed)."""
        if self._closed or isinstance(exc, (psycopg.OperationalError, psycopg.errors.InFailedSqlTransaction)):
            return
        try:
            self._check_queue()
        except QueueNotFound as gone:
            raise gone from exc
        except LeaseQueueError:
            pass

    async def _arun(self, what: str, sql: str, params: Sequence[Any], conn: Any) -> List[Tuple[Any, ...]]:
        """``_run`` for ``apublish`` / ``aack``: on ``conn`` (an
        ``AsyncConnection``) in its transaction, else on this loop's own
        autocommit connection."""
        self._check_open(what)
        if any(p is _NOW for p in params):
            now = self._read_clock()
            params = tuple(now if p is _NOW else p for p in params)
        if conn is not None:
            try:
                return await self._app.arun(conn, what, in_app_tx(sql), params)
            except psycopg.Error as exc:
                self._gone(exc)
                raise
        loop = asyncio.get_running_loop()
        own = await self._aconn(loop)
        try:
            cur = await own.execute(sql, params)
            return await cur.fetchall()
        except psycopg.Error as exc:
            self._aconns.pop(loop, None)
            try:
                await own.close()
            except Exception:
                pass
            raise self._failed(exc, what) from exc

    def _failed(self, exc: BaseException, what: str) -> LeaseQueueError:
        """The error for a failed statement of this transport: ``QueueNotFound``
        if the queue is gone (a dropped queue's sequence is gone too, so its
        publishes fail), else ``_error``'s."""
        if not self._closed and isinstance(exc, psycopg.Error) and not isinstance(exc, psycopg.OperationalError):
            try:
                self._check_queue()
            except QueueNotFound as gone:
                return gone
            except LeaseQueueError:
                pass
        return _error(exc, what)

    def _check_queue(self) -> None:
        """``QueueNotFound`` unless this transport's queue (its id and name)
        still exists: the check of the paths that found nothing (an empty
        claim or read, a lease not current), never of a hot path."""
        rows = self._execute("check queue", "SELECT 1 FROM leasequeue.queues WHERE id = %s AND name = %s",
                             (self._queue, self._name), check=False)
        if not rows:
            raise _queues.missing(self._name)

    def _lost(self, lease: Any) -> BaseException:
        """``LeaseLost`` for a lease the database found not current, or
        ``QueueNotFound`` if that is because the queue was dropped."""
        self._check_queue()
        return lost(lease)

    def _poke(self, payload: str) -> None:
        """NOTIFY this queue's channel (also while closing: no closed check)."""
        conn = self._connect()
        try:
            conn.execute("SELECT pg_notify(%s, %s)", (self._channel, payload))
        finally:
            conn.close()

    # ------------------------------------------------------------ Part 1

    def publish(
        self, group_id: str, event: Any, priority: int = 0, *, delay: float = 0.0, key: Optional[str] = None,
        conn: Any = None,
    ) -> int:
        """Append ``event`` to group ``group_id``; return its sequence number.

        The event is serialized first (its errors propagate; nothing is
        published).  ``priority`` is taken when the group is created.
        ``delay > 0``: not delivered before ``now + delay`` (its group's
        later messages wait behind it).  ``key``: while it is held in the
        group, nothing is published and the holder's seq is returned.
        ``conn``: the application's psycopg ``Connection``: the publish is
        part of its transaction, visible to others at its commit, gone at
        its rollback (docs/transactions.md); the transport neither commits
        nor rolls back.
        """
        group_id = check_id(group_id, "group_id")
        priority = check_priority(priority, "priority")
        delay = check_duration(delay, "delay")
        key = check_key(key)
        conn = check_conn(conn, "publish")
        payload = serialize_bytes(self._dumps, event)
        sql, params = self._publish_call(group_id, payload, priority, delay, key)
        seq = int(self._run("publish", sql, params, conn)[0][0])
        if delay > 0.0:
            self._locked(delay)
        return seq

    async def apublish(
        self, group_id: str, event: Any, priority: int = 0, *, delay: float = 0.0, key: Optional[str] = None,
        conn: Any = None,
    ) -> int:
        """``publish`` as a coroutine: ``conn`` is the application's psycopg
        ``AsyncConnection`` (its transaction), or None (this transport's own
        async connection, autocommit)."""
        group_id = check_id(group_id, "group_id")
        priority = check_priority(priority, "priority")
        delay = check_duration(delay, "delay")
        key = check_key(key)
        conn = check_async_conn(conn, "apublish")
        payload = serialize_bytes(self._dumps, event)
        sql, params = self._publish_call(group_id, payload, priority, delay, key)
        seq = int((await self._arun("apublish", sql, params, conn))[0][0])
        if delay > 0.0:
            self._locked(delay)
        return seq

    def _publish_call(self, group_id: str, payload: bytes, priority: int, delay: float,
                      key: Optional[str]) -> Tuple[str, Tuple[Any, ...]]:
        if delay == 0.0 and key is None:  # Part 1's publish: its own function, no clock
            return _Q_PUBLISH, (self._queue, self._seq_oid, group_id, payload, priority)
        now = _NOW if delay > 0.0 or (key is not None and self._window > 0.0) else None
        return _Q["publish_ext"], (self._queue, self._seq_oid, group_id, payload, priority, delay, key,
                                   self._window, now, self._clock is None)

    def claim(
        self, worker_id: str, visibility: float, min_priority: int = 0, *, timeout: Optional[float] = 0.0
    ) -> Any:
        """Lease the next message to ``worker_id`` for ``visibility`` seconds.

        As the in-memory claim; ``timeout > 0`` (or ``None``: no deadline)
        waits up to that many seconds of real time for a claimable message.
        """
        worker_id = check_worker(worker_id)
        visibility = check_duration(visibility, "visibility")
        min_priority = check_priority(min_priority, "min_priority")
        wait = check_timeout(timeout)
        if wait > 0.0:
            return self._claim_waiting(worker_id, visibility, min_priority, wait)
        rows = self._execute(
            "claim", _Q_CLAIM, (self._queue, worker_id, visibility, min_priority, _NOW, 1, False, None)
        )
        leases = self._leases(rows, worker_id, visibility)
        if leases:
            return leases[0]
        self._check_queue()
        return None

    def ack(self, lease: Any, *, conn: Any = None) -> None:
        """Done: remove the leased message (``LeaseLost`` if not current).

        ``conn``: the application's psycopg ``Connection``: the ack is part
        of its transaction (the message is gone at its commit; at its
        rollback the lease is as it was), and from this call until that
        transaction ends no other claim can take the delivery over."""
        check_lease(lease)
        conn = check_conn(conn, "ack")
        key = lease_key(lease)
        self._check_open("ack")
        if key is None:
            raise lost(lease)
        if not self._run("ack", _Q_ACK, (self._queue, *_delivery(key, lease)), conn)[0][0]:
            raise self._lost(lease)

    async def aack(self, lease: Any, *, conn: Any = None) -> None:
        """``ack`` as a coroutine: ``conn`` is the application's psycopg
        ``AsyncConnection`` (its transaction), or None (this transport's own
        async connection, autocommit)."""
        check_lease(lease)
        conn = check_async_conn(conn, "aack")
        key = lease_key(lease)
        self._check_open("aack")
        if key is None:
            raise lost(lease)
        if not (await self._arun("aack", _Q_ACK, (self._queue, *_delivery(key, lease)), conn))[0][0]:
            raise self._lost(lease)

    def nack(self, lease: Any, delay: float = 0.0, *, conn: Any = None) -> None:
        """Give the message back: retry now (``delay == 0``) or park it for ``delay`` s.
        ``conn``: in the application's transaction, as ``ack``'s."""
        self._hand_back("nack", _Q_NACK, lease, delay, conn)

    def release(self, lease: Any, delay: float = 0.0, *, conn: Any = None) -> None:
        """``nack(lease, delay)`` whose delivery does not count: the message's
        attempt count goes back to ``lease.attempt - 1``, so its next delivery
        carries this one's ``attempt`` (a hand-back, not a failure).
        ``conn``: in the application's transaction, as ``ack``'s."""
        self._hand_back("release", _Q["release"], lease, delay, conn)

    def _hand_back(self, what: str, sql: str, lease: Any, delay: float, conn: Any = None) -> None:
        check_lease(lease)
        delay = check_duration(delay, "delay")
        conn = check_conn(conn, what)
        now = _NOW if delay > 0.0 else None
        key = lease_key(lease)
        if key is None:
            if delay > 0.0:
                self._now(what)
            self._check_open(what)
            raise lost(lease)
        if not self._run(what, sql, (self._queue, *_delivery(key, lease), delay, now), conn)[0][0]:
            raise self._lost(lease)
        if delay > 0.0:
            self._locked(delay)

    def extend(self, lease: Any, visibility: float) -> Any:
        """Heartbeat: the same delivery, leased until ``now + visibility``."""
        check_lease(lease)
        visibility = check_duration(visibility, "visibility")
        key = lease_key(lease)
        if key is None:
            self._now("extend")
            raise lost(lease)
        expires_at = self._scalar("extend", _Q_EXTEND, (self._queue, *_delivery(key, lease), visibility, _NOW))
        if expires_at is None:
            raise self._lost(lease)
        self._locked(visibility)
        group_id, attempt, seq, worker_id = key
        return issue(seq, group_id, lease.event, worker_id, float(expires_at), attempt, lease_delivery(lease))

    def stats(self) -> TransportStats:
        """Counts as of now (expired leases and parks count as neither;
        ``scheduled``: messages published with a delay and not yet due)."""
        row = self._execute("stats", _Q["stats"], (self._queue, _NOW))[0]
        if not any(row):
            self._check_queue()
        return TransportStats(*(int(x) for x in row))

    def __len__(self) -> int:
        """Messages held: ready + leased + parked + scheduled (+ buried)."""
        n = int(self._scalar("len", _Q["count"], (self._queue,)))
        if not n:
            self._check_queue()
        return n

    # ------------------------------------------------------------ leases

    def _locked(self, seconds: float) -> None:
        """This process made a lock ending ``seconds`` from now: a waiting
        claim's timekeeper must wake by then (crash recovery)."""
        if seconds != _INF and len(self._room):
            self._room.note_due(time.monotonic() + seconds + 0.002)

    def _leases(self, rows: List[Tuple[Any, ...]], worker_id: str, visibility: float = _INF) -> List[Any]:
        """Leases from claim rows (the report row, seq NULL, is skipped).

        An event that does not deserialize: the claims stand and
        ``EventDecodeError`` carries the first such lease (its ``leases``:
        every lease of the batch, the undecodable ones with their stored
        bytes as the event).  An interruption (``KeyboardInterrupt``) while
        the leases are made undoes the claims (docs/decisions.md, "Interrupted
        claims").
        """
        if any(row[0] is not None for row in rows):
            self._locked(visibility)
        leases = []
        failed: Optional[EventDecodeError] = None
        try:
            for seq, group_id, payload, expires_at, attempt, *_, delivery in rows:
                if seq is None:
                    continue
                try:
                    lease = decoded_lease(self._loads, bytes(payload), int(seq), group_id, worker_id,
                                          float(expires_at), int(attempt), int(delivery))
                except EventDecodeError as exc:
                    lease = exc.lease
                    failed = failed or exc
                leases.append(lease)
        except BaseException:
            self._undo(rows, worker_id)
            raise
        if failed is not None:
            failed.leases = leases
            raise failed
        return leases

    def _undo(self, rows: List[Tuple[Any, ...]], worker_id: str) -> None:
        """Give back claims whose caller will never see them (in reverse order)."""
        for row in reversed(rows):
            seq, group_id, _payload, _expires, attempt, prev_rr, prev_last, prev_open, prev_worker, delivery = row
            if seq is None:
                continue
            try:
                self._execute(
                    "unclaim",
                    _Q["unclaim"],
                    (self._queue, group_id, seq, attempt, worker_id, delivery, prev_rr, prev_last, prev_open,
                     prev_worker),
                )
            except LeaseQueueError:
                pass  # the lease stays until it expires: nothing is lost

    # ------------------------------------------------------------ waiting

    @property
    def closed(self) -> bool:
        """True once ``close()`` was called."""
        return self._closed

    def _claim_waiting(self, worker_id: str, visibility: float, min_priority: int, wait: float) -> Any:
        if self._closed:
            return None
        deadline = time.monotonic() + wait
        self._start_listener()
        waiter = Waiter(min_priority)
        event = waiter.event
        assert event is not None
        steps = _Steps(self, waiter, deadline, worker_id, visibility)
        try:
            step = steps.first()
            while step is not None:
                kind, sleep = step
                if kind is _SLEEP:
                    if sleep > 0.0:
                        event.wait(None if sleep == _INF else sleep)
                    step = steps.next()
                    continue
                try:
                    if kind is _LOOK:
                        rows = self._claim_report(worker_id, visibility, min_priority)
                    else:
                        self._sign_up()
                except LeaseQueueError as exc:  # not an EventDecodeError: that is looked's, for the caller
                    step = steps.failed(exc)
                    continue
                step = steps.looked(rows) if kind is _LOOK else steps.next()
            return steps.lease
        finally:
            steps.leave()

    def _learn(self, report: Tuple[Any, ...], held: int = 0) -> bool:
        """Take a waiting claim's report row: the earliest lock end (for the
        timekeeper); True if a claimable row was skipped.  ``held``: how many
        looks in a row found that end already past (the claim's expiry
        skipped it: another transaction holds the row, such as an ack in an
        application's transaction that stays open): the timekeeper then looks
        again after 2, 4, 8 ... ms, at most 100 ms, instead of every 2 ms (a
        rollback there frees the lease without a notification)."""
        next_end, used_now, busy = report[3], report[6], report[7]
        if next_end is None or next_end == _INF:
            self._room.set_due(_INF)
        else:
            pause = 0.002 if held <= 1 else min(0.002 * 2.0 ** (held - 1), 0.1)
            self._room.set_due(time.monotonic() + max(float(next_end) - float(used_now), 0.0) + pause)
        return bool(busy)

    def _claim_report(self, worker_id: str, visibility: float, min_priority: int) -> List[Tuple[Any, ...]]:
        # A token names the lease this call may make, so that it can be given
        # back if the caller is interrupted (KeyboardInterrupt, a lost
        # connection) before the answer arrives: it may have committed.
        token = random.getrandbits(62) + 1
        try:
            return self._execute(
                "claim", _Q_CLAIM, (self._queue, worker_id, visibility, min_priority, _NOW, 1, True, token)
            )
        except BaseException:
            self._release(token)
            raise

    def _release(self, token: int) -> None:
        try:
            self._execute("release", _Q["release_token"], (self._queue, token))
        except Exception:
            pass  # unreachable server: the lease, if any, ends at its visibility

    def _sign_up(self) -> None:
        """Sign this process up as a listener of the queue before a waiting
        claim sleeps (writers notify only while some process is signed up)."""
        self._start_listener()

        def execute(sql: str, params: Sequence[Any]) -> None:
            try:
                self._execute("claim (LISTEN)", sql, params)
            except LeaseQueueError:
                if self._closed:
                    raise
                # As a waiting claim's look: a pooled connection that died
                # while the claim slept (a server restart) fails first, and
                # the pool reconnects: once more at once.
                self._execute("claim (LISTEN)", sql, params)

        self._listener.sign_up(execute)

    def _start_listener(self) -> None:
        if not self._listener.running:
            try:
                self._listener.start()
            except psycopg.Error as exc:
                raise _error(exc, "claim (LISTEN)") from exc

    async def aclaim(
        self, worker_id: str, visibility: float, min_priority: int = 0, *, timeout: Optional[float] = None
    ) -> Any:
        """``claim`` as a coroutine (default: wait with no deadline).

        Uses psycopg's async connection; cancellation while waiting leaves
        nothing leased (a claim that was under way is undone).
        """
        worker_id = check_worker(worker_id)
        visibility = check_duration(visibility, "visibility")
        min_priority = check_priority(min_priority, "min_priority")
        wait = check_timeout(timeout)
        if self._closed:
            return None  # any timeout: a worker loop on aclaim ends on close()
        loop = asyncio.get_running_loop()
        if wait == 0.0:
            rows = await self._aclaim_once(loop, worker_id, visibility, min_priority, False)
            leases = self._leases(rows, worker_id, visibility)
            return leases[0] if leases else None
        deadline = time.monotonic() + wait
        if not self._listener.running:
            await loop.run_in_executor(None, self._start_listener)
        waiter = Waiter(min_priority, loop)
        steps = _Steps(self, waiter, deadline, worker_id, visibility)
        try:
            step = steps.first()
            while step is not None:
                kind, sleep = step
                if kind is _SLEEP:
                    future = waiter.future
                    assert future is not None
                    if sleep > 0.0 and not waiter.woken and not waiter.rearm:
                        try:
                            await asyncio.wait_for(asyncio.shield(future), None if sleep == _INF else sleep)
                        except asyncio.TimeoutError:
                            pass
                    step = steps.next()
                    continue
                try:
                    if kind is _LOOK:
                        rows = await self._aclaim_shielded(loop, worker_id, visibility, min_priority)
                    else:
                        await loop.run_in_executor(None, self._sign_up)
                except LeaseQueueError as exc:  # not an EventDecodeError: that is looked's, for the caller
                    step = steps.failed(exc)
                    continue
                step = steps.looked(rows) if kind is _LOOK else steps.next()
            return steps.lease
        finally:
            steps.leave()

    async def _aclaim_shielded(
        self, loop: asyncio.AbstractEventLoop, worker_id: str, visibility: float, min_priority: int
    ) -> List[Tuple[Any, ...]]:
        """One claim round trip that a cancellation cannot cut in half: if the
        caller is cancelled meanwhile, the claim finishes and is undone."""
        task = loop.create_task(self._aclaim_once(loop, worker_id, visibility, min_priority, True))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            def undo(done: "asyncio.Task[List[Tuple[Any, ...]]]") -> None:
                if not done.cancelled() and done.exception() is None:
                    threading.Thread(target=self._undo, args=(done.result(), worker_id), daemon=True).start()

            task.add_done_callback(undo)
            raise

    async def _aclaim_once(
        self, loop: asyncio.AbstractEventLoop, worker_id: str, visibility: float, min_priority: int, report: bool
    ) -> List[Tuple[Any, ...]]:
        self._check_open("aclaim")
        conn = await self._aconn(loop)
        now = self._read_clock()  # once the connection is in hand, as _execute does
        try:
            cur = await conn.execute(
                _Q_CLAIM, (self._queue, worker_id, visibility, min_priority, now, 1, report, None)
            )
            return await cur.fetchall()
        except psycopg.Error as exc:
            self._aconns.pop(loop, None)
            try:
                await conn.close()
            except Exception:
                pass
            raise _error(exc, "aclaim") from exc

    async def _aconn(self, loop: asyncio.AbstractEventLoop) -> Any:
        conn = self._aconns.get(loop)
        if conn is None or conn.closed:
            try:
                conn = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True, prepare_threshold=0)
                await conn.execute(_SESSION)
            except psycopg.Error as exc:
                raise LeaseQueueError(f"cannot connect to PostgreSQL: {str(exc).strip()}") from exc
            self._aconns[loop] = conn
        return conn

    def close(self) -> None:
        """Wake every waiting claim (they return None), close the connections.

        Idempotent.  Afterwards a claim with a non-zero timeout returns None
        at once; every other operation raises ``LeaseQueueError``.
        """
        if self._closed:
            return
        self._closed = True
        self._room.closed = True
        self._room.wake_all()
        self._listener.stop()
        self._pool.close()
        for loop, conn in list(self._aconns.items()):
            try:
                if loop.is_running() and not loop.is_closed():
                    asyncio.run_coroutine_threadsafe(conn.close(), loop)
                else:
                    conn.pgconn.finish()
            except Exception:
                pass

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = " closed" if self._closed else ""
        return f"<leasequeue.PostgresTransport queue={self._name!r}{state}>"

    def __reduce__(self) -> Any:
        raise TypeError("a PostgresTransport cannot be pickled: make one per process from the conninfo")

    # ------------------------------------------------------------ control plane

    def pause(self, group_id: str) -> bool:
        """Never serve the group until ``resume``; True if it was not paused."""
        group_id = check_id(group_id, "group_id")
        self._check_open("pause")
        self._check_queue()  # a pause records even an empty group: never in a dropped queue
        return bool(self._scalar("pause", _Q["pause"], (self._queue, group_id)))

    def resume(self, group_id: str) -> bool:
        """Lift a pause and end a park now; True if either was lifted."""
        group_id = check_id(group_id, "group_id")
        done = bool(self._scalar("resume", _Q["resume"], (self._queue, group_id)))
        if not done:
            self._check_queue()
        return done

    def purge(self, group_id: str) -> int:
        """Remove every message of the group and forget it; the count removed."""
        group_id = check_id(group_id, "group_id")
        done = int(self._scalar("purge", _Q["purge"], (self._queue, group_id)))
        if not done:
            self._check_queue()
        return done

    def set_priority(self, group_id: str, priority: int) -> bool:
        """Change a live group's priority; False if there is no such group."""
        group_id = check_id(group_id, "group_id")
        priority = check_priority(priority, "priority")
        done = bool(self._scalar("set_priority", _Q["set_priority"], (self._queue, group_id, priority)))
        if not done:
            self._check_queue()
        return done

    def group(self, group_id: str) -> Optional[GroupInfo]:
        """What one group is doing now, or None."""
        group_id = check_id(group_id, "group_id")
        rows = self._execute("group", _Q["group_info"], (self._queue, group_id, _NOW))
        if not rows:
            self._check_queue()
            return None
        return _info(rows[0])

    def groups(self) -> List[GroupInfo]:
        """A snapshot of every group, in group creation order: O(G + N)."""
        rows = self._execute("groups", _Q["group_info"], (self._queue, None, _NOW))
        if not rows:
            self._check_queue()
        return [_info(row) for row in rows]

    # ------------------------------------------------------------ quarantine

    def bury(self, lease: Any, reason: str = "", *, conn: Any = None) -> None:
        """Quarantine the lease's group: the delivery ends, its message stays
        at the head, and no claim serves the group until ``resume`` (the same
        message again, attempt + 1) or ``skip``.  ``reason`` (a ``str``) is
        kept with the group.  ``LeaseLost`` if the lease is not current.
        ``conn``: in the application's transaction, as ``ack``'s."""
        check_lease(lease)
        if type(reason) is not str:
            if not isinstance(reason, str):
                raise TypeError(f"reason must be a str, not {type(reason).__name__}")
            reason = str.__str__(reason)
        conn = check_conn(conn, "bury")
        key = lease_key(lease)
        self._check_open("bury")
        if key is None:
            raise lost(lease)
        if not self._run("bury", _Q["bury"], (self._queue, *_delivery(key, lease), reason), conn)[0][0]:
            raise self._lost(lease)

    def skip(self, group_id: str) -> bool:
        """Remove the group's head unless a lease that has not expired holds it
        (any park, bury or expired lease of it ends), lift a bury (not a
        pause); True if removed.  The next message is claimable unless the
        group is paused, and wakes a waiting claim on any machine."""
        group_id = check_id(group_id, "group_id")
        done = bool(self._scalar("skip", _Q["skip"], (self._queue, group_id, _NOW)))
        if not done:
            self._check_queue()
        return done

    def retry(self, group_id: str) -> bool:
        """The operator's "run it again from scratch": the head's attempt count
        back to 0 (its next delivery is attempt 1), a bury lifted, a park
        ended, an expired lease's delivery closed; a pause and a schedule
        stay.  False, nothing changed, for an unknown group, one holding no
        message, or a head under a lease that has not expired.  A head then
        claimable wakes a waiting claim on any machine."""
        group_id = check_id(group_id, "group_id")
        done = bool(self._scalar("retry", _Q["retry"], (self._queue, group_id, _NOW)))
        if not done:
            self._check_queue()
        return done

    def peek(self, group_id: str, max_count: int = 1) -> List[Message]:
        """The group's oldest ``max_count`` messages, head first, whatever their
        state, as ``Message(seq, event, attempt, due_at, key)`` (equal copies
        of the events; ``attempt``: the attempt count so far).  ``[]`` for an unknown group.  Changes
        nothing.  An event that cannot be deserialized is shown as a
        ``leasequeue.Undecodable`` (its stored bytes and the error) instead of raising."""
        group_id = check_id(group_id, "group_id")
        max_count = check_count(max_count)
        self._check_open("peek")
        if max_count == 0:
            return []
        rows = self._execute("peek", _Q["peek"], (min(max_count, 2**63 - 1), self._queue, group_id))
        if not rows:
            self._check_queue()
        out = []
        for seq, payload, attempt, due_at, key in rows:
            event = decode_or_undecodable(self._loads, bytes(payload))
            out.append(Message(int(seq), event, int(attempt), None if due_at is None else float(due_at), key))
        return out

    # ------------------------------------------------------------ batches

    def publish_many(self, items: Iterable[Any], *, delay: float = 0.0, conn: Any = None) -> List[int]:
        """Publish every item (``(group_id, event[, priority[, key]])``) in one
        transaction, each with ``delay``; every item is validated and
        serialized first.  An item whose key is held (or repeats an earlier
        item's in its group) publishes nothing and gets the holder's seq.
        ``conn``: in the application's transaction, as ``publish``'s."""
        checked = [check_keyed_item(item) for item in list(items)]
        delay = check_duration(delay, "delay")
        conn = check_conn(conn, "publish_many")
        groups = [group_id for group_id, _event, _priority, _key in checked]
        payloads = [serialize_bytes(self._dumps, event) for _group_id, event, _priority, _key in checked]
        priorities = [priority for _group_id, _event, priority, _key in checked]
        keys = [key for _group_id, _event, _priority, key in checked]
        self._check_open("publish_many")
        if not groups:
            return []
        keyed = any(key is not None for key in keys)
        if delay == 0.0 and not keyed:  # Part 2's batch: its own function, no clock
            rows = self._run(
                "publish_many", _Q["publish_many"], (self._queue, self._seq_oid, groups, payloads, priorities), conn
            )
            return [int(r[0]) for r in rows]
        now = _NOW if delay > 0.0 or (keyed and self._window > 0.0) else None
        rows = self._run("publish_many", _Q["publish_many_ext"], (
            self._queue, self._seq_oid, groups, payloads, priorities, keys, delay, self._window, now,
            self._clock is None), conn)
        if delay > 0.0:
            self._locked(delay)
        return [int(r[0]) for r in rows]

    def claim_many(self, worker_id: str, visibility: float, max_count: int, min_priority: int = 0) -> List[Any]:
        """Up to ``max_count`` claims at one time, in one transaction; never waits."""
        worker_id = check_worker(worker_id)
        visibility = check_duration(visibility, "visibility")
        max_count = check_count(max_count)
        min_priority = check_priority(min_priority, "min_priority")
        count = min(max_count, _INT32_MAX)
        rows = self._execute(
            "claim_many", _Q_CLAIM, (self._queue, worker_id, visibility, min_priority, _NOW, count, False, None)
        )
        leases = self._leases(rows, worker_id, visibility)
        if not leases:
            self._check_queue()
        return leases

    def ack_and_claim(self, lease: Any, worker_id: str, visibility: float, min_priority: int = 0) -> Any:
        """``ack(lease)``, then ``claim(worker_id, visibility, min_priority)``:
        one round trip and one transaction (one commit per job).

        Returns the new lease, or ``None`` when nothing is claimable (the ack
        stands).  A lease that is not current raises ``LeaseLost`` and
        changes nothing.  Never waits.
        """
        check_lease(lease)
        worker_id = check_worker(worker_id)
        visibility = check_duration(visibility, "visibility")
        min_priority = check_priority(min_priority, "min_priority")
        key = lease_key(lease)
        if key is None:
            self._now("ack_and_claim")
            raise lost(lease)
        rows = self._execute(
            "ack_and_claim",
            _Q_ACK_AND_CLAIM,
            (self._queue, *_delivery(key, lease), worker_id, visibility, min_priority, _NOW),
        )
        if not rows:
            raise self._lost(lease)
        leases = self._leases(rows, worker_id, visibility)
        return leases[0] if leases else None

    def ack_many(self, leases: Iterable[Any], *, conn: Any = None) -> List[Any]:
        """Ack each current lease, in order, in one transaction; return the others.
        ``conn``: in the application's transaction, as ``ack``'s."""
        leases = list(leases)
        for lease in leases:
            check_lease(lease)
        conn = check_conn(conn, "ack_many")
        self._check_open("ack_many")
        lost_at = []  # positions in ``leases`` of the leases that were not current
        keyed: List[Tuple[int, Tuple[str, int, int, str]]] = []  # (position, key) of the others, in order
        for pos, lease in enumerate(leases):
            key: DeliveryKey = lease_key(lease)
            if key is None:
                lost_at.append(pos)
            else:
                keyed.append((pos, key))
        deliveries = [lease_delivery(leases[pos]) for pos, _key in keyed]
        if keyed:
            rows = self._run(
                "ack_many",
                _Q["ack_many"],
                (
                    self._queue,
                    [group_id for _, (group_id, _a, _s, _w) in keyed],
                    [seq for _, (_g, _a, seq, _w) in keyed],
                    [attempt for _, (_g, attempt, _s, _w) in keyed],
                    [worker_id for _, (_g, _a, _s, worker_id) in keyed],
                    deliveries,
                ),
                conn,
            )
            lost_at.extend(keyed[int(r[0]) - 1][0] for r in rows)
        if lost_at:
            self._check_queue()
        return [leases[pos] for pos in sorted(lost_at)]


def _info(row: Tuple[Any, ...]) -> GroupInfo:
    group_id, priority, messages, paused, lock_state, head_seq, worker, expires_at, attempt, last, reason, due = row
    if lock_state == _BURIED:
        # The buried delivery's worker and attempt, no end.
        return GroupInfo(group_id, int(priority), int(messages), "buried", bool(paused),
                         None if head_seq is None else int(head_seq), worker, None, int(attempt),
                         None if last is None else float(last), reason)
    if lock_state in _STATES:
        state = _STATES[lock_state]
        held: Tuple[Any, Any, Any] = (worker, float(expires_at), int(attempt))
    else:  # free, or its head scheduled (lock_state 4; a paused one says "paused")
        state = "paused" if paused else ("scheduled" if lock_state == _SCHEDULED else "ready")
        held = (None, None, None)
    return GroupInfo(
        group_id,
        int(priority),
        int(messages),
        state,
        bool(paused),
        None if head_seq is None else int(head_seq),
        *held,
        None if last is None else float(last),
        None,
        None if due is None else float(due),
    )


_NO_NAME: Any = object()


def _admin(conninfo: str, name: Any, what: str, act: Callable[[Any, Any], Any]) -> Any:
    """Run ``act(conn, name)`` in one transaction on a connection of its own,
    once the schema is known to be there and current (``name``, unless
    ``_NO_NAME``, checked first)."""
    if not isinstance(conninfo, str):
        raise TypeError(f"conninfo must be a str, not {type(conninfo).__name__}")
    if name is not _NO_NAME:
        name = _queues.check_queue_name(name, "name")
    try:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            PostgresTransport._check_schema(conn)
            with conn.transaction():
                return act(conn, name)
    except psycopg.Error as exc:
        raise _error(exc, f"PostgresTransport.{what}") from exc


def _upgrade(conn: Any, version: int) -> None:
    """Run the migrations from ``version`` up to ``SCHEMA_VERSION`` in the
    caller's transaction (each file sets the version it reaches)."""
    if version > SCHEMA_VERSION:
        raise LeaseQueueError(_newer(version))
    if version == SCHEMA_VERSION:
        return
    if version < OLDEST_UPGRADABLE:
        raise LeaseQueueError(
            f"the database's leasequeue schema is version {version}, from a pre-release: it cannot be "
            f"upgraded (the oldest upgradable version is {OLDEST_UPGRADABLE}); nothing was changed"
        )
    steps = dict(load_migrations("postgres"))
    for target in range(version + 1, SCHEMA_VERSION + 1):
        filename = steps.get(target)
        if filename is None:  # a packaging error: the wheel lacks a migration file
            raise LeaseQueueError(f"leasequeue has no migration to PostgreSQL schema version {target}")
        conn.execute(load_script("postgres", filename))


def _newer(version: int) -> str:
    return (
        f"the database's leasequeue schema is version {version}, newer than this leasequeue understands "
        f"({SCHEMA_VERSION}): upgrade leasequeue"
    )

