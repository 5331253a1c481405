"""``PostgresTransport``: the leasequeue contract on a PostgreSQL database.

Any number of processes on any number of machines share one queue.  Each
operation is one round trip: a call of a server-side function
(``sql/postgres/schema.sql``) in its own transaction.  The contract notes
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
from typing import Any, Callable, Iterable, List, Optional, Sequence, Tuple

try:
    import psycopg
except ImportError as _exc:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "leasequeue.PostgresTransport needs psycopg 3: pip install 'leasequeue[postgres]'"
    ) from _exc

from ._errors import LeaseLost, LeaseQueueError
from ._postgres_lease import check_lease, delivery_key, issue
from ._postgres_serial import dump, resolve_serializer
from ._postgres_sql import SCHEMA_VERSION, query, schema
from ._postgres_wait import Listener, Waiter, WaitRoom
from ._types import GroupInfo, TransportStats
from ._validation import (
    check_duration,
    check_id,
    check_priority,
    check_time,
    check_worker,
)

__all__ = ["PostgresTransport"]

_INF = math.inf

# Set on each connection: the server-side functions' statements keep their
# generic (prepared) plans, which are index scans whatever the values; with
# custom plans PostgreSQL would re-plan them on each call, and planning
# probes the indexes' ends, which costs more than running them.
_SESSION = "SET plan_cache_mode = force_generic_plan"
_STATES = {1: "leased", 2: "parked"}

# Queries, by name, loaded once.
_Q_CLAIM = query("claim")
_Q_PUBLISH = query("publish")
_Q_ACK = query("ack")
_Q_NACK = query("nack")
_Q_EXTEND = query("extend")


def _lost(key: Any, lease: Any) -> LeaseLost:
    return LeaseLost(
        f"lease of message {lease.seq!r} in group {lease.group_id!r} (attempt {lease.attempt!r}) "
        "is not current: it was acked, nacked, re-delivered, purged, or names no delivery of this queue"
    )


def _check_timeout(timeout: Any) -> float:
    if timeout is None:
        return _INF
    return check_duration(timeout, "timeout")


def _check_count(value: Any) -> int:
    if type(value) is not int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"max_count must be an int, not {type(value).__name__}")
        value = int(value)
    if value < 0:
        raise ValueError(f"max_count must be >= 0, not {value!r}")
    return min(value, 2**31 - 1)  # no upper bound: a huge count claims every eligible group


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


class PostgresTransport:
    """The leasequeue contract on PostgreSQL, shared across processes and machines.

    ``conninfo`` is a libpq connection string or URI.  ``queue`` names one
    of several isolated queues in the database.  ``clock=None`` (default)
    uses the database server's clock, so machines with skewed clocks agree
    on expiry; a zero-argument callable returning seconds injects a clock
    (tests).  ``serializer``: ``None``/``"pickle"`` (default, highest
    protocol), ``"json"``, or a ``(dumps, loads)`` pair; ``lease.event`` is
    an equal copy of the published event, not the object itself.

    The schema must exist: ``PostgresTransport.install(conninfo)`` creates
    it.  Every method is thread-safe; errors of the database or the
    connection raise ``LeaseQueueError`` and the next call reconnects.
    """

    def __init__(
        self,
        conninfo: str,
        *,
        queue: str = "default",
        clock: Optional[Callable[[], float]] = None,
        serializer: Any = None,
    ) -> None:
        if not isinstance(conninfo, str):
            raise TypeError(f"conninfo must be a str, not {type(conninfo).__name__}")
        queue = check_id(queue, "queue")
        if clock is not None and not callable(clock):
            raise TypeError(f"clock must be callable, not {type(clock).__name__}")
        self._dumps, self._loads = resolve_serializer(serializer)
        self._conninfo = conninfo
        self._clock = clock
        self._name = queue
        self._closed = False
        self._pool = _Pool(self._connect)
        conn = self._connect()
        try:
            self._check_schema(conn)
            row = conn.execute(query("register_queue"), (queue,)).fetchone()
        except psycopg.Error as exc:
            conn.close()
            raise _error(exc, f"PostgresTransport(queue={queue!r})") from exc
        except BaseException:
            conn.close()
            raise
        self._queue, self._seq_oid = int(row[0]), int(row[1])
        self._pool.put(conn, 0)
        self._channel = f"leasequeue_{self._queue}"
        self._room = WaitRoom()
        self._listener = Listener(self._connect, self._channel, self._room, self._poke,
                                  query("listen_register"), query("listen_unregister"), self._queue)
        self._aconns: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any]" = weakref.WeakKeyDictionary()

    # ------------------------------------------------------------ set-up

    @staticmethod
    def install(conninfo: str) -> None:
        """Create (or bring up to date) the leasequeue schema; idempotent.

        Refuses a database whose schema is newer than this leasequeue.
        """
        try:
            with psycopg.connect(conninfo, autocommit=True) as conn:
                with conn.transaction():
                    conn.execute("SELECT pg_advisory_xact_lock(hashtext('leasequeue.install'))")
                    exists = conn.execute("SELECT to_regclass('leasequeue.meta')").fetchone()
                    if exists is not None and exists[0] is not None:
                        found = conn.execute(query("schema_version")).fetchone()
                        if found is not None and int(found[0]) > SCHEMA_VERSION:
                            raise LeaseQueueError(_newer(int(found[0])))
                    conn.execute(schema())
        except psycopg.Error as exc:
            raise _error(exc, "PostgresTransport.install") from exc

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
    def _check_schema(conn: Any) -> None:
        exists = conn.execute("SELECT to_regclass('leasequeue.meta')").fetchone()
        if exists is None or exists[0] is None:
            raise LeaseQueueError(
                "the database has no leasequeue schema: run leasequeue.PostgresTransport.install(conninfo) first"
            )
        row = conn.execute(query("schema_version")).fetchone()
        version = int(row[0]) if row is not None else 0
        if version > SCHEMA_VERSION:
            raise LeaseQueueError(_newer(version))
        if version < SCHEMA_VERSION:
            raise LeaseQueueError(
                f"the database's leasequeue schema is version {version}, older than this leasequeue's "
                f"({SCHEMA_VERSION}): run leasequeue.PostgresTransport.install(conninfo) to upgrade it"
            )

    # ------------------------------------------------------------ plumbing

    def _now(self) -> Optional[float]:
        """The injected clock's reading (checked), or None: the server's clock."""
        clock = self._clock
        if clock is None:
            return None
        return check_time(clock())

    def _execute(self, what: str, sql: str, params: Sequence[Any]) -> List[Tuple[Any, ...]]:
        """One statement on a pooled connection; its rows."""
        if self._closed:
            raise LeaseQueueError(f"{what}: the PostgresTransport is closed")
        conn, generation = self._pool.get()
        try:
            rows = conn.execute(sql, params).fetchall()
        except psycopg.Error as exc:
            self._pool.discard(conn)
            raise _error(exc, what) from exc
        except BaseException:
            # Interrupted mid-call (KeyboardInterrupt): the connection's
            # state is unknown, so it is not reused.
            self._pool.discard(conn)
            raise
        self._pool.put(conn, generation)
        return rows

    def _scalar(self, what: str, sql: str, params: Sequence[Any]) -> Any:
        return self._execute(what, sql, params)[0][0]

    def _poke(self, payload: str) -> None:
        """NOTIFY this queue's channel (also while closing: no closed check)."""
        conn = self._connect()
        try:
            conn.execute("SELECT pg_notify(%s, %s)", (self._channel, payload))
        finally:
            conn.close()

    # ------------------------------------------------------------ Part 1

    def publish(self, group_id: str, event: Any, priority: int = 0) -> int:
        """Append ``event`` to group ``group_id``; return its sequence number.

        The event is serialized first (its errors propagate; nothing is
        published).  ``priority`` is taken when the group is created.
        """
        group_id = check_id(group_id, "group_id")
        priority = check_priority(priority, "priority")
        payload = dump(self._dumps, event)
        return int(self._scalar("publish", _Q_PUBLISH, (self._queue, self._seq_oid, group_id, payload, priority)))

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
        wait = _check_timeout(timeout)
        if wait > 0.0:
            return self._claim_waiting(worker_id, visibility, min_priority, wait)
        now = self._now()
        rows = self._execute("claim", _Q_CLAIM, (self._queue, worker_id, visibility, min_priority, now, 1, False, None))
        leases = self._leases(rows, worker_id, visibility)
        return leases[0] if leases else None

    def ack(self, lease: Any) -> None:
        """Done: remove the leased message (``LeaseLost`` if not current)."""
        check_lease(lease)
        key = delivery_key(lease)
        if key is None or not self._scalar("ack", _Q_ACK, (self._queue, *key)):
            raise _lost(key, lease)

    def nack(self, lease: Any, delay: float = 0.0) -> None:
        """Give the message back: retry now (``delay == 0``) or park it for ``delay`` s."""
        check_lease(lease)
        delay = check_duration(delay, "delay")
        now = self._now() if delay > 0.0 else None
        key = delivery_key(lease)
        if key is None or not self._scalar("nack", _Q_NACK, (self._queue, *key, delay, now)):
            raise _lost(key, lease)
        if delay > 0.0:
            self._locked(delay)

    def extend(self, lease: Any, visibility: float) -> Any:
        """Heartbeat: the same delivery, leased until ``now + visibility``."""
        check_lease(lease)
        visibility = check_duration(visibility, "visibility")
        now = self._now()
        key = delivery_key(lease)
        expires_at = None if key is None else self._scalar("extend", _Q_EXTEND, (self._queue, *key, visibility, now))
        if expires_at is None:
            raise _lost(key, lease)
        assert key is not None
        self._locked(visibility)
        return issue(key[1], key[0], lease.event, key[3], float(expires_at), key[2])

    def stats(self) -> TransportStats:
        """Counts as of now (expired leases and parks count as neither)."""
        now = self._now()
        row = self._execute("stats", query("stats"), (self._queue, now))[0]
        return TransportStats(*(int(x) for x in row))

    def __len__(self) -> int:
        """Messages held: ready + leased + parked."""
        return int(self._scalar("len", query("count"), (self._queue,)))

    # ------------------------------------------------------------ leases

    def _locked(self, seconds: float) -> None:
        """This process made a lock ending ``seconds`` from now: a waiting
        claim's timekeeper must wake by then (crash recovery)."""
        if seconds != _INF and len(self._room):
            self._room.note_due(time.monotonic() + seconds + 0.002)

    def _leases(self, rows: List[Tuple[Any, ...]], worker_id: str, visibility: float = _INF) -> List[Any]:
        """Leases from claim rows (the report row, seq NULL, is skipped).

        An event that does not deserialize: the claims are undone and
        ``LeaseQueueError`` raised.
        """
        leases = []
        try:
            for seq, group_id, payload, expires_at, attempt, *_ in rows:
                if seq is None:
                    continue
                event = self._loads(bytes(payload))
                leases.append(issue(int(seq), group_id, event, worker_id, float(expires_at), int(attempt)))
        except BaseException as exc:
            self._undo(rows, worker_id)
            if isinstance(exc, Exception):
                raise LeaseQueueError(f"claim: an event could not be deserialized: {exc!r}") from exc
            raise
        if leases:
            self._locked(visibility)
        return leases

    def _undo(self, rows: List[Tuple[Any, ...]], worker_id: str) -> None:
        """Give back claims whose caller will never see them (in reverse order)."""
        for seq, group_id, _payload, _expires, attempt, prev_rr, prev_last, prev_open, prev_worker in reversed(rows):
            if seq is None:
                continue
            try:
                self._execute(
                    "unclaim",
                    query("unclaim"),
                    (self._queue, group_id, seq, attempt, worker_id, prev_rr, prev_last, prev_open, prev_worker),
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
        room = self._room
        waiter = Waiter(min_priority)
        event = waiter.event
        assert event is not None
        room.enter(waiter)
        used = False
        try:
            claim = True
            while True:
                if claim:
                    room.take_wake(waiter)
                    rows = self._claim_report(worker_id, visibility, min_priority)
                    leases = self._leases(rows, worker_id, visibility)
                    if leases:
                        used = True
                        return leases[0]
                    busy = self._learn(rows[-1])
                if self._closed:
                    return None
                sleep = room.sleep_for(waiter, deadline)
                if busy:  # skipped a row another transaction held: look again soon
                    sleep = min(sleep, 0.002)
                if sleep > 0.0:
                    event.wait(None if sleep == _INF else sleep)
                if self._closed:
                    return None
                now = time.monotonic()
                if waiter.woken or busy:
                    claim = True
                elif waiter.rearm:
                    claim = False  # became timekeeper, or learnt of an earlier lock end
                else:
                    claim = now < deadline  # the timekeeper's lock end is due
                    if not claim:
                        return None
        finally:
            room.leave(waiter, used)

    def _learn(self, report: Tuple[Any, ...]) -> bool:
        """Take a waiting claim's report row: the earliest lock end (for the
        timekeeper); True if a claimable row was skipped."""
        next_end, used_now, busy = report[3], report[6], report[7]
        if next_end is None or next_end == _INF:
            self._room.set_due(_INF)
        else:
            self._room.set_due(time.monotonic() + max(float(next_end) - float(used_now), 0.0) + 0.002)
        return bool(busy)

    def _claim_report(self, worker_id: str, visibility: float, min_priority: int) -> List[Tuple[Any, ...]]:
        now = self._now()
        # A token names the lease this call may make, so that it can be given
        # back if the caller is interrupted (KeyboardInterrupt, a lost
        # connection) before the answer arrives: it may have committed.
        token = random.getrandbits(62) + 1
        try:
            return self._execute(
                "claim", _Q_CLAIM, (self._queue, worker_id, visibility, min_priority, now, 1, True, token)
            )
        except BaseException:
            self._release(token)
            raise

    def _release(self, token: int) -> None:
        try:
            self._execute("release", query("release_token"), (self._queue, token))
        except Exception:
            pass  # unreachable server: the lease, if any, ends at its visibility

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
        wait = _check_timeout(timeout)
        loop = asyncio.get_running_loop()
        if wait == 0.0:
            rows = await self._aclaim_once(loop, worker_id, visibility, min_priority, False)
            leases = self._leases(rows, worker_id, visibility)
            return leases[0] if leases else None
        if self._closed:
            return None
        deadline = time.monotonic() + wait
        if not self._listener.running:
            await loop.run_in_executor(None, self._start_listener)
        room = self._room
        waiter = Waiter(min_priority, loop)
        room.enter(waiter)
        used = False
        try:
            claim = True
            while True:
                waiter.arm()
                if claim:
                    room.take_wake(waiter)
                    rows = await self._aclaim_shielded(loop, worker_id, visibility, min_priority)
                    leases = self._leases(rows, worker_id, visibility)
                    if leases:
                        used = True
                        return leases[0]
                    busy = self._learn(rows[-1])
                if self._closed:
                    return None
                sleep = room.sleep_for(waiter, deadline)
                if busy:
                    sleep = min(sleep, 0.002)
                future = waiter.future
                assert future is not None
                if sleep > 0.0 and not waiter.woken and not waiter.rearm:
                    try:
                        await asyncio.wait_for(asyncio.shield(future), None if sleep == _INF else sleep)
                    except asyncio.TimeoutError:
                        pass
                if self._closed:
                    return None
                if waiter.woken or busy:
                    claim = True
                elif waiter.rearm:
                    claim = False
                else:
                    claim = time.monotonic() < deadline
                    if not claim:
                        return None
        finally:
            room.leave(waiter, used)

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
        if self._closed:
            raise LeaseQueueError("claim: the PostgresTransport is closed")
        now = self._now()
        conn = await self._aconn(loop)
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

    def __enter__(self) -> "PostgresTransport":
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
        return bool(self._scalar("pause", query("pause"), (self._queue, group_id)))

    def resume(self, group_id: str) -> bool:
        """Lift a pause and end a park now; True if either was lifted."""
        group_id = check_id(group_id, "group_id")
        return bool(self._scalar("resume", query("resume"), (self._queue, group_id)))

    def purge(self, group_id: str) -> int:
        """Remove every message of the group and forget it; the count removed."""
        group_id = check_id(group_id, "group_id")
        return int(self._scalar("purge", query("purge"), (self._queue, group_id)))

    def set_priority(self, group_id: str, priority: int) -> bool:
        """Change a live group's priority; False if there is no such group."""
        group_id = check_id(group_id, "group_id")
        priority = check_priority(priority, "priority")
        return bool(self._scalar("set_priority", query("set_priority"), (self._queue, group_id, priority)))

    def group(self, group_id: str) -> Optional[GroupInfo]:
        """What one group is doing now, or None."""
        group_id = check_id(group_id, "group_id")
        now = self._now()
        rows = self._execute("group", query("group_info"), (self._queue, group_id, now))
        return _info(rows[0]) if rows else None

    def groups(self) -> List[GroupInfo]:
        """A snapshot of every group, in group creation order: O(G + N)."""
        now = self._now()
        return [_info(row) for row in self._execute("groups", query("group_info"), (self._queue, None, now))]

    # ------------------------------------------------------------ batches

    def publish_many(self, items: Iterable[Any]) -> List[int]:
        """Publish every item (``(group_id, event)`` or ``(group_id, event, priority)``)
        in one transaction; every item is validated and serialized first."""
        groups: List[str] = []
        payloads: List[bytes] = []
        priorities: List[int] = []
        checked = []
        for item in list(items):
            if not isinstance(item, tuple):
                raise TypeError(
                    "publish_many items must be (group_id, event) or (group_id, event, priority) tuples, "
                    f"not {type(item).__name__}"
                )
            size = tuple.__len__(item)  # a tuple subclass is read as the tuple it is
            if size not in (2, 3):
                raise ValueError(f"publish_many items must have 2 or 3 fields, not {size}")
            group_id = check_id(tuple.__getitem__(item, 0), "group_id")
            priority = check_priority(tuple.__getitem__(item, 2), "priority") if size == 3 else 0
            checked.append((group_id, tuple.__getitem__(item, 1), priority))
        for group_id, event, priority in checked:
            groups.append(group_id)
            payloads.append(dump(self._dumps, event))
            priorities.append(priority)
        if not groups:
            return []
        rows = self._execute(
            "publish_many", query("publish_many"), (self._queue, self._seq_oid, groups, payloads, priorities)
        )
        return [int(r[0]) for r in rows]

    def claim_many(self, worker_id: str, visibility: float, max_count: int, min_priority: int = 0) -> List[Any]:
        """Up to ``max_count`` claims at one time, in one transaction; never waits."""
        worker_id = check_worker(worker_id)
        visibility = check_duration(visibility, "visibility")
        max_count = _check_count(max_count)
        min_priority = check_priority(min_priority, "min_priority")
        now = self._now()
        rows = self._execute(
            "claim_many", _Q_CLAIM, (self._queue, worker_id, visibility, min_priority, now, max_count, False, None)
        )
        return self._leases(rows, worker_id, visibility)

    def ack_many(self, leases: Iterable[Any]) -> List[Any]:
        """Ack each current lease, in order, in one transaction; return the others."""
        leases = list(leases)
        for lease in leases:
            check_lease(lease)
        lost_at = []  # positions in ``leases`` of the leases that were not current
        keyed = []  # (position, key) of the others, in order
        for pos, lease in enumerate(leases):
            key = delivery_key(lease)
            if key is None:
                lost_at.append(pos)
            else:
                keyed.append((pos, key))
        if keyed:
            rows = self._execute(
                "ack_many",
                query("ack_many"),
                (
                    self._queue,
                    [k[0] for _, k in keyed],
                    [k[1] for _, k in keyed],
                    [k[2] for _, k in keyed],
                    [k[3] for _, k in keyed],
                ),
            )
            lost_at.extend(keyed[int(r[0]) - 1][0] for r in rows)
        return [leases[pos] for pos in sorted(lost_at)]


def _info(row: Tuple[Any, ...]) -> GroupInfo:
    group_id, priority, messages, paused, lock_state, head_seq, worker, expires_at, attempt, last = row
    if lock_state in _STATES:
        state = _STATES[lock_state]
        held: Tuple[Any, Any, Any] = (worker, float(expires_at), int(attempt))
    else:
        state = "paused" if paused else "ready"
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
    )


def _newer(version: int) -> str:
    return (
        f"the database's leasequeue schema is version {version}, newer than this leasequeue understands "
        f"({SCHEMA_VERSION}): upgrade leasequeue"
    )

