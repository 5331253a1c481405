"""Side-by-side benchmarks: ``python -m leasequeue bench``.

Runs identical workloads, in one process and interleaved, on

* ``cython`` -- ``leasequeue._backends.inmemory.transport_c.InMemoryTransport`` (the extension),
* ``floor``  -- ``leasequeue.bench._floor.FloorTransport``: a compiled stub with the
  same call shape that only takes a lock, reads the clock and allocates one
  lease (the cost of the calls themselves),
* ``pure``   -- ``leasequeue._backends.inmemory.transport_py.InMemoryTransport`` (pure Python),
* ``queue``  -- ``queue.Queue`` ``put`` + ``get`` (the familiar baseline; no
  groups, leases or priorities),
* ``seed``   -- the design note's literal algorithm (:class:`SeedTransport`:
  a list of dicts, sorted on every claim), only at sizes where it finishes
  in reasonable time; larger sizes are *extrapolated* and marked so.

One module per idea:

==================  ==========================================================
``impls``           the implementations compared (a registry)
``seed``            the seed's sort-per-claim algorithm
``workloads``       what one timed op is, and the prefilled states (a registry)
``timing``          measuring, interleaving, ratios, the seed's extrapolation
``batches``         the batched cycle and the control plane, next to the single calls
``memory``          memory and GC cost, in a fresh interpreter per figure
``goals``           the project's performance goals, judged on a run
``machine``         the machine description
``progress``        the progress display
``runner``          one run, start to end: the JSON-able report
``report``          the Markdown tables and the summary line
``plot``            the PNG plot (matplotlib, optional)
``waiting``         waiting for work: wake-up latency (thread, asyncio) and
                    worker throughput, against queue.Queue, asyncio.Queue,
                    janus and culsans
``callgrind``       the fixed cycle ``benchmarks/callgrind.py`` counts
``config``, ``fmt`` the run's configuration; number formatting
==================  ==========================================================

This package is importable from an installed wheel (no repository needed).
"""

from __future__ import annotations

from .config import BenchConfig
from .fmt import fmt_ns
from .goals import evaluate_goals
from .impls import ALL_IMPLS, DEFAULT_IMPLS, LABELS, available_impls
from .plot import write_plot
from .report import render_markdown, render_summary
from .runner import run
from .seed import SeedTransport
from .workloads import WORKLOADS

__all__ = [
    "ALL_IMPLS",
    "DEFAULT_IMPLS",
    "LABELS",
    "WORKLOADS",
    "BenchConfig",
    "SeedTransport",
    "available_impls",
    "evaluate_goals",
    "fmt_ns",
    "render_markdown",
    "render_summary",
    "run",
    "write_plot",
]
