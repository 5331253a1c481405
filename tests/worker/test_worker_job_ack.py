"""A handler that acks its own delivery (``job.ack()`` / ``await
job.aack()``, ``conn=``: inside its own transaction): the worker records
``succeeded`` and leaves that ack alone (Part 5, "With the application's
data").  On every transport with both runners; ``conn=`` through a
transport wrapper that records the connection it is given (the durable
transports' own ``conn=`` is tested with them)."""

from __future__ import annotations

import asyncio
import collections
import threading
from typing import Any, Dict, List, Optional

import pytest
from worker_helpers import wait_until

from leasequeue import Job, LeaseLost, Retry, Worker


class Recording:
    """A transport passed through, counting the settling calls.  Its
    ``ack(lease, conn=...)`` stands for a durable transport's: with
    ``commit=True`` the ack happens (the application's transaction
    committed), with ``commit=False`` it does not (rolled back)."""

    def __init__(self, t: Any, commit: bool = True, passthrough: bool = False) -> None:
        self._t = t
        self.commit = commit
        self.passthrough = passthrough  # a durable transport's own ack(conn=)
        self.calls: Dict[str, int] = collections.Counter()
        self.conns: List[Any] = []
        self._lock = threading.Lock()

    def _count(self, name: str) -> None:
        with self._lock:
            self.calls[name] += 1

    def ack(self, lease: Any, conn: Any = None) -> None:
        if conn is None:
            self._count("ack")
            self._t.ack(lease)
            return
        self._count("ack_conn")
        self.conns.append(conn)
        if self.passthrough:
            self._t.ack(lease, conn=conn)
        elif self.commit:
            self._t.ack(lease)

    def ack_and_claim(self, *args: Any) -> Any:
        self._count("ack_and_claim")
        return self._t.ack_and_claim(*args)

    def nack(self, *args: Any) -> None:
        self._count("nack")
        self._t.nack(*args)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._t, name)
        if name == "aack":  # a durable transport's (PostgreSQL) ack from the event loop: counted as ack
            async def aack(lease: Any, conn: Any = None) -> None:
                self._count("ack" if conn is None else "ack_conn")
                await (value(lease) if conn is None else value(lease, conn=conn))

            return aack
        return value

    def __len__(self) -> int:
        return len(self._t)


def _handler(runner: str, body: Any) -> Any:
    if runner == "threads":
        return body

    async def handler(job: Job) -> None:
        await asyncio.sleep(0)
        body(job)

    return handler


@pytest.mark.parametrize("runner", ["threads", "asyncio"])
def test_a_handler_that_acks_is_recorded_once_and_not_acked_again(backend: Any, start: Any, runner: str) -> None:
    t = Recording(backend.make())
    for i in range(6):
        t.publish(f"g{i % 3}", i)
    seen: List[Any] = []
    acked: List[bool] = []

    def body(job: Job) -> None:
        assert not job.acked
        job.ack()
        acked.append(job.acked)
        with pytest.raises(RuntimeError, match="already acked"):
            job.ack()
        seen.append(job.event)

    w = Worker(t, _handler(runner, body), concurrency=2, visibility=10.0)
    running = start(w, runner)
    wait_until(lambda: w.counts["succeeded"] == 6)
    running.stop()
    assert sorted(seen) == list(range(6)) and acked == [True] * 6
    assert t.calls["ack"] == 6 and t.calls["ack_and_claim"] == 0 and t.calls["nack"] == 0, t.calls
    assert w.counts["lost"] == 0 and w.counts["retried"] == 0
    assert len(t) == 0


def test_an_async_handler_acks_with_aack(backend: Any, start: Any) -> None:
    t = Recording(backend.make())
    t.publish("g", 1)
    t.publish("g", 2)

    async def handler(job: Job) -> None:
        await job.aack()

    w = Worker(t, handler, visibility=10.0)
    running = start(w, "asyncio")
    wait_until(lambda: w.counts["succeeded"] == 2)
    running.stop()
    assert t.calls["ack"] == 2 and t.calls["nack"] == 0
    assert len(t) == 0


@pytest.mark.parametrize("runner", ["threads", "asyncio"])
def test_a_handler_that_raises_after_its_ack_succeeded(inmemory: Any, start: Any, runner: str,
                                                       caplog: Any) -> None:
    """The ack stands: ``succeeded`` (the hook gets the error), logged, not retried."""
    t = Recording(inmemory.make())
    t.publish("g", 1)
    t.publish("g", 2)
    hooked: List[Optional[BaseException]] = []

    def body(job: Job) -> None:
        job.ack()
        raise ValueError(f"after the ack {job.event}")

    w = Worker(t, _handler(runner, body), visibility=10.0, retry=Retry(max_attempts=3, backoff=0.0),
               hooks={"succeeded": lambda job, error: hooked.append(error)})
    running = start(w, runner)
    wait_until(lambda: w.counts["succeeded"] == 2)
    running.stop()
    assert [str(e) for e in hooked] == ["after the ack 1", "after the ack 2"]
    assert w.counts["retried"] == 0 and w.counts["buried"] == 0 and w.counts["lost"] == 0
    assert t.calls["nack"] == 0 and len(t) == 0
    assert "raised after its handler acked it" in caplog.text


@pytest.mark.parametrize("runner", ["threads", "asyncio"])
def test_ack_with_conn_goes_to_the_transport_and_is_not_repeated(inmemory: Any, start: Any, runner: str) -> None:
    t = Recording(inmemory.make())
    for i in range(4):
        t.publish("g", i)
    conn = object()

    w = Worker(t, _handler(runner, lambda job: job.ack(conn=conn)), visibility=10.0)
    running = start(w, runner)
    wait_until(lambda: w.counts["succeeded"] == 4)
    running.stop()
    assert t.conns == [conn] * 4
    assert t.calls["ack_conn"] == 4 and t.calls["ack"] == 0 and t.calls["ack_and_claim"] == 0
    assert len(t) == 0


@pytest.mark.parametrize("commit, outcome", [(True, "succeeded"), (False, "retried")])
def test_a_handler_raising_after_ack_with_conn(inmemory: Any, start: Any, commit: bool, outcome: str) -> None:
    """After ``ack(conn=...)`` the worker cannot know whether the
    transaction committed: it records the failure as usual; a ``LeaseLost``
    from that (the ack committed) makes it ``succeeded``."""
    t = Recording(inmemory.make(), commit=commit)
    t.publish("g", 1)
    runs: List[int] = []

    def handler(job: Job) -> None:
        runs.append(job.attempt)
        if len(runs) == 1:
            job.ack(conn="the application's connection")
            raise RuntimeError("after the ack")

    w = Worker(t, handler, visibility=10.0, retry=Retry(max_attempts=3, backoff=0.0, jitter=0.0))
    running = start(w, "threads")
    if commit:
        wait_until(lambda: w.counts["succeeded"] == 1)
    else:
        wait_until(lambda: w.counts["succeeded"] == 1 and w.counts["retried"] == 1)
    running.stop()
    assert t.calls["nack"] == 1  # the failure path was tried once
    assert w.counts["lost"] == 0 and w.counts["buried"] == 0
    if commit:
        assert runs == [1] and w.counts["retried"] == 0
    else:
        assert runs == [1, 2]  # rolled back: the message came back, and ran again
    assert len(t) == 0


def test_ack_with_conn_on_the_in_memory_transport_is_refused_and_changes_nothing(inmemory: Any,
                                                                                    start: Any) -> None:
    t = inmemory.make()
    t.publish("g", 1)
    errors: List[BaseException] = []

    def handler(job: Job) -> None:
        try:
            job.ack(conn=object())
        except TypeError as exc:
            errors.append(exc)
        assert not job.acked

    w = Worker(t, handler, visibility=10.0)
    running = start(w, "threads")
    wait_until(lambda: w.counts["succeeded"] == 1)
    running.stop()
    assert len(errors) == 1 and len(t) == 0  # the worker acked it


def test_ack_of_a_lost_lease_raises_lease_lost(inmemory: Any, start: Any) -> None:
    t = inmemory.make()
    t.publish("g", 1)
    got: List[BaseException] = []

    def handler(job: Job) -> None:
        t.purge("g")
        try:
            job.ack()
        except LeaseLost as exc:
            got.append(exc)
        assert not job.acked

    w = Worker(t, handler, visibility=10.0)
    running = start(w, "threads")
    wait_until(lambda: got and w.counts["lost"] == 1)
    running.stop()
    assert w.counts["succeeded"] == 0


# ---------------------------------------------------------------- end to end, durable (Part 5)


def _takes_conn(t: Any) -> bool:
    import inspect

    return "conn" in inspect.signature(type(t).ack).parameters


class _App:
    """The application's own database: a table of effects, on its own connection."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        if backend.name == "sqlite":
            import sqlite3

            self.conn: Any = sqlite3.connect(backend.path, timeout=30, check_same_thread=False)
            with self.conn:
                self.conn.execute("CREATE TABLE IF NOT EXISTS app_effects (event TEXT, attempt INTEGER)")
        else:
            import psycopg

            self.conn = psycopg.connect(backend.conninfo)
            self.table = f"app_effects_{backend.queue}"
            with self.conn.transaction():
                self.conn.execute(f"CREATE TABLE {self.table} (event TEXT, attempt INTEGER)")

    def work_and_ack(self, job: Job, fail: bool) -> None:
        """The work and the ack in one transaction; ``fail``: raise inside it (rolled back)."""
        if self.backend.name == "sqlite":
            with self.conn:
                self.conn.execute("INSERT INTO app_effects VALUES (?, ?)", (job.event, job.attempt))
                job.ack(conn=self.conn)
                if fail:
                    raise RuntimeError("after the ack, inside the transaction")
        else:
            with self.conn.transaction():
                self.conn.execute(f"INSERT INTO {self.table} VALUES (%s, %s)", (job.event, job.attempt))
                job.ack(conn=self.conn)
                if fail:
                    raise RuntimeError("after the ack, inside the transaction")

    def effects(self) -> List[Any]:
        if self.backend.name == "sqlite":
            return sorted(self.conn.execute("SELECT event, attempt FROM app_effects").fetchall())
        return sorted(tuple(r) for r in self.conn.execute(f"SELECT event, attempt FROM {self.table}").fetchall())


def test_the_work_and_the_ack_commit_together(durable: Any, start: Any) -> None:
    """A handler does its work and acks in one transaction: the first
    attempt of ``b`` rolls back (work and ack together), so it is retried,
    and each message's work is committed once."""
    t = Recording(durable.make(), passthrough=True)
    if not _takes_conn(durable.made[0]):
        pytest.skip("the durable transports' ack(conn=) is not on this branch yet (Part 5, issue 30)")
    app = _App(durable)
    for event in ("a", "b", "c"):
        t.publish(event, event)

    def handler(job: Job) -> None:
        app.work_and_ack(job, fail=job.event == "b" and job.attempt == 1)

    w = Worker(t, handler, visibility=10.0, retry=Retry(max_attempts=3, backoff=0.0, jitter=0.0))
    running = start(w, "threads")
    wait_until(lambda: w.counts["succeeded"] == 3, timeout=30)
    running.stop()
    assert app.effects() == [("a", 1), ("b", 2), ("c", 1)]
    assert w.counts["retried"] == 1 and w.counts["lost"] == 0
    assert t.calls["ack_conn"] == 4  # b's first ack was rolled back with its work
    assert t.calls["ack"] == 0 and t.calls["ack_and_claim"] == 0  # the worker left those acks alone
    assert len(durable.made[0]) == 0
