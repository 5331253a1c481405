"""The type checker says every backend is a ``leasequeue.Transport`` (SPEC Part 4, "One interface").

``backends_are_transports.py`` assigns every backend (both in-memory twins,
SQLite, PostgreSQL) to ``Transport`` and its parts; mypy must accept it.  A
class that lacks one method of the protocol must be refused, or the check
proves nothing: the second test writes such a class (every method of the
pure twin but ``nack``) and one with a wrong signature, and expects mypy's
error for each.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("mypy", reason="mypy is in the [test] extra")

HERE = Path(__file__).resolve().parent


def mypy(*files: Path, cwd: Path) -> "subprocess.CompletedProcess[str]":
    cache = cwd / ".mypy_cache"
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict-optional", "--no-error-summary", "--show-error-codes",
         "--cache-dir", str(cache), *map(str, files)],
        capture_output=True, text=True, cwd=str(cwd), timeout=600,
    )


def test_every_backend_is_a_transport(tmp_path: Path) -> None:
    out = mypy(HERE / "backends_are_transports.py", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr


BROKEN = '''
from __future__ import annotations
from typing import Any, Iterable, List, Optional, Tuple
from leasequeue import GroupInfo, Message, Transport, TransportStats
from leasequeue._backends.inmemory.transport_py import InMemoryTransport, Lease


class Subclass(InMemoryTransport):
    """A subclass that changes nothing is still a Transport (the control case)."""


class NoNack(InMemoryTransport):
    """Everything of the pure twin, but ``nack`` is not a method any more."""
    nack = None  # type: ignore[assignment]


class WrongClaim(InMemoryTransport):
    def claim(self, worker_id: int) -> Optional[Lease]:  # type: ignore[override]
        return None


class Forgetful:
    """A transport written from scratch with every method but ``extend``."""
    def publish(self, group_id: str, event: Any, priority: int = 0, *, delay: float = 0.0,
                key: Optional[str] = None) -> int: raise NotImplementedError
    def claim(self, worker_id: str, visibility: float, min_priority: int = 0, *,
              timeout: Optional[float] = 0.0) -> Optional[Lease]: raise NotImplementedError
    def ack(self, lease: Lease) -> None: raise NotImplementedError
    def nack(self, lease: Lease, delay: float = 0.0) -> None: raise NotImplementedError
    def release(self, lease: Lease, delay: float = 0.0) -> None: raise NotImplementedError
    def stats(self) -> TransportStats: raise NotImplementedError
    def __len__(self) -> int: raise NotImplementedError
    def close(self) -> None: raise NotImplementedError
    def __enter__(self) -> Forgetful: return self
    def __exit__(self, *exc_info: object) -> None: raise NotImplementedError
    async def aclaim(self, worker_id: str, visibility: float, min_priority: int = 0, *,
                     timeout: Optional[float] = None) -> Optional[Lease]: raise NotImplementedError
    @property
    def closed(self) -> bool: raise NotImplementedError
    def pause(self, group_id: str) -> bool: raise NotImplementedError
    def resume(self, group_id: str) -> bool: raise NotImplementedError
    def purge(self, group_id: str) -> int: raise NotImplementedError
    def set_priority(self, group_id: str, priority: int) -> bool: raise NotImplementedError
    def group(self, group_id: str) -> Optional[GroupInfo]: raise NotImplementedError
    def groups(self) -> List[GroupInfo]: raise NotImplementedError
    def publish_many(self, items: Iterable[Tuple[Any, ...]], *,
                     delay: float = 0.0) -> List[int]: raise NotImplementedError
    def claim_many(self, worker_id: str, visibility: float, max_count: int,
                   min_priority: int = 0) -> List[Lease]: raise NotImplementedError
    def ack_many(self, leases: Iterable[Lease]) -> List[Lease]: raise NotImplementedError
    def ack_and_claim(self, lease: Lease, worker_id: str, visibility: float,
                      min_priority: int = 0) -> Optional[Lease]: raise NotImplementedError
    def bury(self, lease: Lease, reason: str = "") -> None: raise NotImplementedError
    def skip(self, group_id: str) -> bool: raise NotImplementedError
    def peek(self, group_id: str, max_count: int = 1) -> List[Message]: raise NotImplementedError
    def retry(self, group_id: str) -> bool: raise NotImplementedError


ok: Transport = Subclass()
a: Transport = NoNack()
b: Transport = Forgetful()
c: Transport = WrongClaim()
'''


def test_a_backend_lacking_a_method_is_refused(tmp_path: Path) -> None:
    broken = tmp_path / "broken_backend.py"
    broken.write_text(textwrap.dedent(BROKEN))
    out = mypy(broken, cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    errors = {int(line.split(":")[1]): line for line in out.stdout.splitlines() if ": error:" in line}
    source = broken.read_text().splitlines()
    where = {text.split(":")[0]: n for n, text in enumerate(source, 1) if ": Transport = " in text}
    assert sorted(errors) == sorted([where["a"], where["b"], where["c"]]), out.stdout  # not "ok"
    assert all("[assignment]" in line for line in errors.values()), out.stdout
    notes = {n: [line for line in out.stdout.splitlines() if line.startswith(f"{broken.name}:{n}: note:")]
             for n in errors}
    assert any("nack" in note for note in notes[where["a"]]), out.stdout
    assert any("extend" in note for note in notes[where["b"]]), out.stdout
    assert any("claim" in note for note in notes[where["c"]]), out.stdout
