"""One benchmark run, start to end: timings, ratios, memory, goals."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any, Dict

from .batches import run_batches
from .batches import steps as batch_steps
from .config import BenchConfig
from .goals import evaluate_goals
from .impls import ALL_IMPLS, available_impls
from .machine import machine
from .memory import run_memory
from .progress import Progress
from .timing import configs, extrapolate_seed, loop_overhead_ns, ratios, run_timings, runs
from .waiting import run_waiting
from .waiting import steps as waiting_steps
from .workloads import PAIRED, WORKLOADS, run_order

__all__ = ["run"]


def run(cfg: BenchConfig, progress: bool = True, memory: bool = True) -> Dict[str, Any]:
    """Run the benchmarks described by ``cfg``; return the JSON-able report."""
    impls, missing = available_impls(cfg.impls)
    steps = 0
    for n, _spec, _g, kind in configs(cfg):
        wls = run_order(kind, cfg.workloads)
        for w in wls:
            if w == PAIRED[1] and PAIRED[0] in wls:
                continue
            steps += cfg.repeats * len(runs(cfg, impls, n, w))
    if memory and cfg.memory_n:
        steps += len(impls) * len(cfg.memory_groups)
    if cfg.waiting:
        steps += waiting_steps(cfg)
    steps += batch_steps(cfg, impls)
    prog = Progress(steps, enabled=progress)
    started = time.time()
    loop_ns = loop_overhead_ns()
    results = run_timings(cfg, impls, prog)
    extrapolate_seed(cfg, results)
    ref = "cython" if "cython" in impls else "pure"
    rat = ratios(results, ref)
    batches = run_batches(cfg, impls, prog)
    mem = run_memory(cfg, impls, prog) if memory else []
    waiting = run_waiting(cfg, prog) if cfg.waiting else None
    prog.finish("benchmark done")
    report = {
        "meta": {
            "mode": cfg.mode,
            "config": asdict(cfg),
            "machine": machine(),
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "duration_s": time.time() - started,
            "implementations": impls,
            "missing": missing,
            "ratio_reference": ref,
            "loop_overhead_ns": loop_ns,
            "clock": "time.time (expiry workload: a C counter advancing 1 s per read)",
            "gc_during_timing": "disabled",
            "workloads": WORKLOADS,
        },
        "results": sorted(
            results,
            key=lambda r: (list(WORKLOADS).index(r["workload"]), r["n"], r["groups"], ALL_IMPLS.index(r["impl"])),
        ),
        "ratios": rat,
        "batches": batches,
        "memory": mem,
        "waiting": waiting,
    }
    report["targets"] = evaluate_goals(cfg, results, rat, mem, waiting, batches)
    return report
