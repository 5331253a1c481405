"""The implementations the benchmark compares: one registry entry each.

An entry says how to import the implementation (its factory is called as
``make(clock=...)``), what the report calls it, whether it runs by default,
and whether it has leases (``"transport"``) or is a plain queue
(``"queue"``: only the workloads with a queue loop run on it).  A new
backend (SQLite, PostgreSQL) is one more entry in ``IMPLS``; the column
order of the report is the order of ``IMPLS``.
"""

from __future__ import annotations

import queue as _queue_mod
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Tuple

from .seed import SeedTransport

__all__ = [
    "ALL_IMPLS",
    "DEFAULT_IMPLS",
    "IMPLS",
    "LABELS",
    "SEED_OPS",
    "Impl",
    "available_impls",
    "load",
]


@dataclass(frozen=True)
class Impl:
    """One implementation in the comparison."""

    key: str  #: the name on the command line (``--impls``) and in the JSON
    label: str  #: the name in the report's tables
    load: Callable[[], Callable[..., Any]]  #: returns the factory ``make(clock=...)``; ImportError if absent
    default: bool = True  #: run without ``--impls``
    kind: str = "transport"  #: ``"transport"`` (leases) or ``"queue"`` (put/get only)


def _cython() -> Callable[..., Any]:
    from .._backends.inmemory.transport_c import InMemoryTransport

    return InMemoryTransport


def _pure() -> Callable[..., Any]:
    from .._backends.inmemory.transport_py import InMemoryTransport

    return InMemoryTransport


def _floor() -> Callable[..., Any]:
    from ._floor import FloorTransport

    return FloorTransport


def _floor_pymutex() -> Callable[..., Any]:
    from ._floor import FloorPymutexTransport

    return FloorPymutexTransport


def _seed() -> Callable[..., Any]:
    return SeedTransport


def _queue() -> Callable[..., Any]:
    return lambda clock=None: _queue_mod.Queue()


#: Every implementation, in the column order of the report.
IMPLS: Dict[str, Impl] = {
    i.key: i
    for i in (
        Impl("cython", "Cython", _cython),
        Impl("floor", "floor stub", _floor),
        Impl("pure", "pure Python", _pure),
        Impl("queue", "queue.Queue", _queue, kind="queue"),
        Impl("seed", "seed algorithm", _seed),
        Impl("floor_pymutex", "floor (pymutex)", _floor_pymutex, default=False),
    )
}

#: Implementation keys, in the column order of the report.
ALL_IMPLS: Tuple[str, ...] = tuple(IMPLS)
#: Run by default (``floor_pymutex`` only on request: ``--impls``).
DEFAULT_IMPLS: Tuple[str, ...] = tuple(k for k, i in IMPLS.items() if i.default)
LABELS: Dict[str, str] = {k: i.label for k, i in IMPLS.items()}

#: The seed's claim sorts every message: cap on the ops timed per measurement
#: at each N (the largest N it runs at is ``BenchConfig.seed_max_n``; beyond
#: it, its figures are extrapolated as N log N).
SEED_OPS = {1_000: 50, 10_000: 8, 100_000: 2}


def load(impl: str) -> Callable[..., Any]:
    """The factory ``make(clock)`` of one implementation (ImportError if absent)."""
    try:
        entry = IMPLS[impl]
    except KeyError:
        raise ValueError(f"unknown implementation {impl!r}") from None
    return entry.load()


def available_impls(wanted: Iterable[str] = DEFAULT_IMPLS) -> Tuple[List[str], Dict[str, str]]:
    """Split ``wanted`` into the importable implementations and the missing
    ones (with the reason)."""
    ok: List[str] = []
    missing: Dict[str, str] = {}
    for impl in wanted:
        try:
            load(impl)
        except ImportError as exc:
            missing[impl] = f"{type(exc).__name__}: {exc}"
        else:
            ok.append(impl)
    return ok, missing
