"""Timing: how each figure is measured, interleaved, and compared.

For each configuration (N queued messages, G groups) every implementation
gets its own prefilled :class:`~.workloads.State`; then, in each repeat,
every workload is timed on every implementation back to back, the order
rotating with the repeat, so a drifting machine hits all of them alike.
Timed loops run with the cyclic garbage collector off (as ``timeit`` does).
Ratios are the median of the per-repeat ratios (paired measurements).
"""

from __future__ import annotations

import gc
import itertools
import math
import statistics
import time
from typing import Any, Dict, List, Optional, Tuple

from .config import BenchConfig, parse_groups
from .fmt import g_label, n_label
from .impls import IMPLS, SEED_OPS
from .progress import Progress
from .workloads import PAIRED, REGISTRY, STATES, State, run_order

__all__ = [
    "configs",
    "extrapolate_seed",
    "find_ratio",
    "find_result",
    "loop_overhead_ns",
    "measure",
    "ops_for",
    "pair_ops",
    "ratios",
    "run_timings",
    "runs",
]


def measure(state: State, workload: str, k: int) -> float:
    """Nanoseconds per op, with the cyclic GC off during the loop."""
    loop = REGISTRY[workload].loops[IMPLS[state.impl].kind]
    was = gc.isenabled()
    gc.disable()
    try:
        ns = loop(state, k)
    finally:
        if was:
            gc.enable()
    return ns / k


def loop_overhead_ns(k: int = 200_000) -> float:
    """Cost of the bare timing loop (iterate + one no-op C call), ns/op."""
    f = len
    x = ()
    rep = itertools.repeat(None, k)
    t0 = time.perf_counter_ns()
    for _ in rep:
        f(x)
    return (time.perf_counter_ns() - t0) / k


def ops_for(impl: str, workload: str, n: int, ops: int) -> int:
    """Ops per measurement: publish/claim_ack are paired and must not drain
    the queue; the seed's claim is O(N log N) so it gets few ops."""
    k = ops
    if workload in PAIRED:
        k = min(k, max(1, n // 2))
    if impl == "seed":
        k = min(k, SEED_OPS.get(n, 2))
    return k


def pair_ops(impl: str, n: int, ops: int) -> Tuple[int, int]:
    """(k, rounds) for the publish / claim+ack pair: each round publishes k
    messages then claims and acks k, so the queue swings between N and N + k
    (k <= N/2) and ends each round at N; ``rounds`` makes up ``ops`` in all."""
    k = ops_for(impl, "publish", n, ops)
    rounds = 1 if impl == "seed" else max(1, ops // k)
    return k, rounds


def _measure_pair(state: State, k: int, rounds: int) -> Tuple[float, float]:
    """ns per publish and ns per claim+ack, over ``rounds`` rounds of k each."""
    pub = ca = 0.0
    for _ in range(rounds):
        pub += measure(state, "publish", k)
        ca += measure(state, "claim_ack", k)
    return pub / rounds, ca / rounds


def configs(cfg: BenchConfig) -> List[Tuple[int, str, int, str]]:
    """(N, G spec, G, state kind) for every state group to build."""
    out = []
    for n in cfg.sizes:
        seen = set()
        for spec in cfg.groups:
            g = parse_groups(spec, n)
            if g in seen:
                continue
            seen.add(g)
            for kind, state in STATES.items():
                if run_order(kind, cfg.workloads) and state.wanted(spec, g):
                    out.append((n, spec, g, kind))
    return out


def runs(cfg: BenchConfig, impls: List[str], n: int, workload: str) -> List[str]:
    """The implementations that run ``workload`` at ``n``."""
    w = REGISTRY[workload]
    return [i for i in impls if w.supports(i) and not (i == "seed" and n > cfg.seed_max_n)]


def run_timings(cfg: BenchConfig, impls: List[str], progress: Progress) -> List[Dict[str, Any]]:
    """Every (workload, N, G, implementation) figure of ``cfg``, with its samples."""
    results: List[Dict[str, Any]] = []
    for n, spec, g, kind in configs(cfg):
        wls = run_order(kind, cfg.workloads)
        run_impls = [i for i in impls if any(i in runs(cfg, impls, n, w) for w in wls)]
        head = f"N={n_label(n)} G={g_label(spec, n)} {kind}"
        states: Dict[str, State] = {}
        for impl in run_impls:
            progress.step(head, f"prefill {impl}", advance=0)
            gc.disable()
            try:
                states[impl] = State(impl, n, g, kind)
            finally:
                gc.enable()
        samples: Dict[Tuple[str, str], List[float]] = {}
        for r in range(cfg.repeats):
            order = run_impls[r % len(run_impls):] + run_impls[: r % len(run_impls)]
            for w in wls:
                if w == "claim_ack" and "publish" in wls:
                    continue  # measured together with publish, below
                for impl in order:
                    if not REGISTRY[w].supports(impl):
                        continue
                    progress.step(head, f"repeat {r + 1}/{cfg.repeats} {w} {impl}")
                    if w in PAIRED:
                        k, rounds = pair_ops(impl, n, cfg.ops)
                        pub_ns, ca_ns = _measure_pair(states[impl], k, rounds)
                        for name, v in (("publish", pub_ns), ("claim_ack", ca_ns)):
                            if name in wls:
                                samples.setdefault((name, impl), []).append(v)
                    else:
                        k = ops_for(impl, w, n, cfg.ops)
                        samples.setdefault((w, impl), []).append(measure(states[impl], w, k))
        for (w, impl), vals in samples.items():
            results.append(
                {
                    "workload": w,
                    "n": n,
                    "groups_spec": spec,
                    "groups": g,
                    "impl": impl,
                    "ops_per_sample": (
                        pair_ops(impl, n, cfg.ops)[0] * pair_ops(impl, n, cfg.ops)[1]
                        if w in PAIRED
                        else ops_for(impl, w, n, cfg.ops)
                    ),
                    "median_ns": statistics.median(vals),
                    "min_ns": min(vals),
                    "max_ns": max(vals),
                    "samples_ns": vals,
                    "extrapolated": False,
                }
            )
        del states
        gc.collect()
    return results


def extrapolate_seed(cfg: BenchConfig, results: List[Dict[str, Any]]) -> None:
    """Add seed figures for sizes it was not run at: N log N from its largest
    measured size (publish is O(1): held constant).  Marked extrapolated."""
    measured = [r for r in results if r["impl"] == "seed" and not r["extrapolated"]]
    by_key: Dict[Tuple[str, str], Dict[str, Any]] = {}
    for r in measured:
        key = (r["workload"], r["groups_spec"])
        if key not in by_key or r["n"] > by_key[key]["n"]:
            by_key[key] = r
    for (w, spec), base in by_key.items():
        for n in cfg.sizes:
            if n <= base["n"]:
                continue
            if not any(r["workload"] == w and r["n"] == n and r["groups_spec"] == spec for r in results):
                continue  # nothing else measured there either
            if w == "publish":
                f = 1.0
            else:
                f = (n * math.log(n)) / (base["n"] * math.log(base["n"]))
            results.append(
                {
                    "workload": w,
                    "n": n,
                    "groups_spec": spec,
                    "groups": parse_groups(spec, n),
                    "impl": "seed",
                    "ops_per_sample": 0,
                    "median_ns": base["median_ns"] * f,
                    "min_ns": base["min_ns"] * f,
                    "max_ns": base["max_ns"] * f,
                    "samples_ns": [s * f for s in base["samples_ns"]],
                    "extrapolated": True,
                    "extrapolated_from_n": base["n"],
                }
            )


def ratios(results: List[Dict[str, Any]], ref: str) -> List[Dict[str, Any]]:
    """time(other) / time(ref) per (workload, N, G): the median of the
    per-repeat ratios when both were measured in the same repeats."""
    index = {(r["workload"], r["n"], r["groups_spec"], r["impl"]): r for r in results}
    out = []
    for (w, n, spec, impl), r in index.items():
        if impl == ref:
            continue
        base = index.get((w, n, spec, ref))
        if base is None:
            continue
        a, b = r["samples_ns"], base["samples_ns"]
        if len(a) == len(b) and not r["extrapolated"]:
            ratio = statistics.median(x / y for x, y in zip(a, b))
        else:
            ratio = r["median_ns"] / base["median_ns"]
        out.append(
            {
                "workload": w,
                "n": n,
                "groups_spec": spec,
                "impl": impl,
                "ref": ref,
                "ratio": ratio,
                "extrapolated": r["extrapolated"],
            }
        )
    return out


def find_result(results: List[Dict[str, Any]], w: str, n: int, spec: str, impl: str) -> Optional[Dict[str, Any]]:
    """The figure of one (workload, N, G spec, implementation), or None."""
    for r in results:
        if r["workload"] == w and r["n"] == n and r["groups_spec"] == spec and r["impl"] == impl:
            return r
    return None


def find_ratio(ratios: List[Dict[str, Any]], w: str, n: int, spec: str, impl: str) -> Optional[Dict[str, Any]]:
    """The ratio of one (workload, N, G spec, implementation), or None."""
    for r in ratios:
        if r["workload"] == w and r["n"] == n and r["groups_spec"] == spec and r["impl"] == impl:
            return r
    return None
