"""Helpers of the worker's tests (imported by name: this folder is on sys.path)."""

from __future__ import annotations

import asyncio
import importlib
import os
import threading
import time
from types import ModuleType
from typing import Any, Callable, List

import pytest

#: Each twin's module (as tests/conftest.py's MODULES).
MODULES = {
    "python": "leasequeue._backends.inmemory.transport_py",
    "cython": "leasequeue._backends.inmemory.transport_c",
}


def load_implementation(name: str) -> ModuleType:
    """As tests/conftest.py: the Cython twin fails (not skips) unless disabled on purpose."""
    try:
        return importlib.import_module(MODULES[name])
    except ImportError as exc:
        if name == "cython" and os.environ.get("LEASEQUEUE_NO_EXTENSIONS"):
            pytest.skip("Cython transport disabled by LEASEQUEUE_NO_EXTENSIONS")
        pytest.fail(f"the {name} implementation did not import: {exc!r}")


def use_fast_path(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The thread runner's fast path of twin ``name`` for this test:
    ``python`` the pure ``ThreadRunner.fast``, ``cython`` the compiled one
    (it fails, not skips, unless disabled on purpose, as the twin does)."""
    from leasequeue.worker.runners import fastpath

    if name == "python":
        monkeypatch.setattr(fastpath, "COMPILED", None)
    elif fastpath.COMPILED is None:
        if os.environ.get("LEASEQUEUE_NO_EXTENSIONS"):
            pytest.skip("the compiled fast path disabled by LEASEQUEUE_NO_EXTENSIONS")
        pytest.fail("the compiled fast path (leasequeue.worker.runners._fastpath) was not built")


class Running:
    """A worker's run() or arun() on a background thread (no signal handlers there)."""

    def __init__(self, worker: Any, runner: str) -> None:
        self.worker = worker
        self.error: List[BaseException] = []

        def target() -> None:
            try:
                if runner == "asyncio":
                    asyncio.run(worker.arun())
                else:
                    worker.run()
            except BaseException as exc:  # noqa: BLE001 - reported by join()
                self.error.append(exc)

        self.thread = threading.Thread(target=target, daemon=True)
        self.thread.start()

    def join(self, timeout: float = 30.0) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the worker did not stop"
        assert not self.error, repr(self.error[0])

    def stop(self, timeout: float = 30.0) -> None:
        self.worker.stop()
        self.join(timeout)


def wait_until(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.01) -> Any:
    """Poll ``predicate`` (test-side only) until true; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {getattr(predicate, '__name__', predicate)}")
        time.sleep(interval)
