"""Batches and the control plane, measured next to the single calls.

Two measurements of their own shape (not a workload of the main tables):

* **the batched cycle**: ``publish_many`` of k items + ``claim_many`` of k +
  ``ack_many`` of those k leases, reported *per message*, for each batch
  size k (``BenchConfig.batch_sizes``), next to the single-call cycle
  (``publish`` + ``claim`` + ``ack``) of the same transport and of the
  floor stub (three bare calls: the least any per-message API can cost), at
  each N of ``BenchConfig.batch_n`` with G = N/10;
* **the control plane**: ``pause`` + ``resume`` (a pair per op) and
  ``group()`` per call, next to ``claim`` per call, at N =
  ``BenchConfig.control_n`` with G = N/10.

The rules of the rest of the suite hold: every implementation in one
process on its own prefilled state, each repeat timing everything back to
back in an order that rotates, the cyclic GC off in the timed loops, and
ratios as the median of the per-repeat ratios.  The implementations are
those of the run that have the operations (``floor`` only does single calls).
"""

from __future__ import annotations

import gc
import itertools
import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from .fmt import fmt_ns, fmt_ratio, n_label
from .impls import IMPLS, LABELS
from .progress import Progress
from .workloads import EVENT, VISIBILITY, WORKER, State

__all__ = ["BATCH_IMPLS", "CONTROL_OPS", "render_batches", "run_batches", "steps"]

#: Implementations measured here, in column order; ``floor`` runs the single-call cycle only.
BATCH_IMPLS = ("cython", "floor", "pure")
#: The control-plane ops, in report order (``claim`` is the yardstick).
CONTROL_OPS = ("claim", "pause+resume", "group")


def _has_batches(impl: str) -> bool:
    return IMPLS[impl].kind == "transport" and impl != "floor"


def _timed(loop: Callable[[], int], count: int) -> float:
    """ns per item of ``loop`` (which returns its elapsed ns), GC off."""
    was = gc.isenabled()
    gc.disable()
    try:
        return loop() / count
    finally:
        if was:
            gc.enable()


# -- the loops (locals bound first; only the calls between the clock reads)


def _single_cycle(state: State, messages: int) -> float:
    t, ev, w, vis, pc = state.t, EVENT, WORKER, VISIBILITY, time.perf_counter_ns
    pub, cl, ack = t.publish, t.claim, t.ack
    seq = state.group_seq(messages)

    def loop() -> int:
        t0 = pc()
        for gid in seq:
            pub(gid, ev)
            ack(cl(w, vis))
        return pc() - t0

    return _timed(loop, messages)


def _batch_cycle(state: State, k: int, messages: int) -> float:
    t, w, vis, pc = state.t, WORKER, VISIBILITY, time.perf_counter_ns
    pm, cm, am = t.publish_many, t.claim_many, t.ack_many
    rounds = max(1, messages // k)
    batches = [[(gid, EVENT) for gid in state.group_seq(k)] for _ in range(rounds)]

    def loop() -> int:
        t0 = pc()
        for items in batches:
            pm(items)
            am(cm(w, vis, k))
        return pc() - t0

    return _timed(loop, rounds * k)


def _claims(state: State, calls: int) -> float:
    t, w, vis, pc = state.t, WORKER, VISIBILITY, time.perf_counter_ns
    cl = t.claim
    rep = itertools.repeat(None, calls)
    held: List[Any] = []
    keep = held.append

    def loop() -> int:
        t0 = pc()
        for _ in rep:
            keep(cl(w, vis))
        return pc() - t0

    ns = _timed(loop, calls)
    t.ack_many(held)  # back to the state before (not timed)
    return ns


def _pause_resume(state: State, calls: int) -> float:
    t, pc = state.t, time.perf_counter_ns
    pause, resume = t.pause, t.resume
    seq = state.group_seq(calls)

    def loop() -> int:
        t0 = pc()
        for gid in seq:
            pause(gid)
            resume(gid)
        return pc() - t0

    return _timed(loop, calls)


def _group(state: State, calls: int) -> float:
    t, pc = state.t, time.perf_counter_ns
    group = t.group
    seq = state.group_seq(calls)

    def loop() -> int:
        t0 = pc()
        for gid in seq:
            group(gid)
        return pc() - t0

    return _timed(loop, calls)


# -- running


def steps(cfg: Any, impls: List[str]) -> int:
    """Progress steps ``run_batches`` takes (for the progress display)."""
    mine = [i for i in BATCH_IMPLS if i in impls]
    per_n = sum(1 + (len(cfg.batch_sizes) if _has_batches(i) else 0) for i in mine)
    control = sum(len(CONTROL_OPS) for i in mine if _has_batches(i))
    return cfg.repeats * (per_n * len(cfg.batch_n) + (control if cfg.control_n else 0))


def _row(vals: List[float], **fields: Any) -> Dict[str, Any]:
    return {**fields, "median_ns": statistics.median(vals), "min_ns": min(vals), "max_ns": max(vals),
            "samples_ns": vals}


def _paired(a: List[float], b: List[float]) -> float:
    return statistics.median(x / y for x, y in zip(a, b))


def run_batches(cfg: Any, impls: List[str], progress: Progress) -> Dict[str, Any]:
    """Measure the batched cycle and the control plane (see module doc):
    ``{"cycle": [...], "cycle_ratios": [...], "control": [...], "control_ratios": [...]}``."""
    mine = [i for i in BATCH_IMPLS if i in impls]
    out: Dict[str, List[Dict[str, Any]]] = {"cycle": [], "cycle_ratios": [], "control": [], "control_ratios": []}
    ops = cfg.ops
    for n in cfg.batch_n:
        g = max(1, n // 10)
        head = f"batches N={n_label(n)} G={n_label(g)}"
        states = _prefill(mine, n, g, progress, head)
        samples: Dict[Tuple[str, int], List[float]] = {}
        for r in range(cfg.repeats):
            for impl in mine[r % len(mine):] + mine[: r % len(mine)]:
                progress.step(head, f"repeat {r + 1}/{cfg.repeats} {impl} single calls")
                samples.setdefault((impl, 0), []).append(_single_cycle(states[impl], ops))
                if _has_batches(impl):
                    for k in cfg.batch_sizes:
                        progress.step(head, f"repeat {r + 1}/{cfg.repeats} {impl} k={k}")
                        samples.setdefault((impl, k), []).append(_batch_cycle(states[impl], k, ops))
        del states
        gc.collect()
        for (impl, k), vals in samples.items():
            out["cycle"].append(_row(vals, n=n, groups=g, impl=impl, k=k))
        for (impl, k), vals in samples.items():
            if k == 0:
                continue
            for ref in (impl, "floor"):
                base = samples.get((ref, 0))
                if base is not None:
                    out["cycle_ratios"].append(
                        {"n": n, "groups": g, "impl": impl, "k": k, "ref": ref, "ratio": _paired(vals, base)}
                    )
    if cfg.control_n:
        n = cfg.control_n
        g = max(1, n // 10)
        head = f"control plane N={n_label(n)} G={n_label(g)}"
        ctl = [i for i in mine if _has_batches(i)]
        states = _prefill(ctl, n, g, progress, head)
        calls = max(1, min(ops, g // 2))  # claims take distinct groups: fewer than G
        loops = {"claim": _claims, "pause+resume": _pause_resume, "group": _group}
        csamples: Dict[Tuple[str, str], List[float]] = {}
        for r in range(cfg.repeats):
            for impl in ctl[r % len(ctl):] + ctl[: r % len(ctl)]:
                for op in CONTROL_OPS:
                    progress.step(head, f"repeat {r + 1}/{cfg.repeats} {impl} {op}")
                    csamples.setdefault((impl, op), []).append(loops[op](states[impl], calls))
        del states
        gc.collect()
        for (impl, op), vals in csamples.items():
            out["control"].append(_row(vals, n=n, groups=g, impl=impl, op=op, calls_per_sample=calls))
            if op != "claim":
                out["control_ratios"].append(
                    {"n": n, "groups": g, "impl": impl, "op": op, "ref": "claim",
                     "ratio": _paired(vals, csamples[(impl, "claim")])}
                )
    return out


def _prefill(impls: List[str], n: int, g: int, progress: Progress, head: str) -> Dict[str, State]:
    states = {}
    for impl in impls:
        progress.step(head, f"prefill {impl}", advance=0)
        gc.disable()
        try:
            states[impl] = State(impl, n, g, "main")
        finally:
            gc.enable()
    return states


# -- the report section


def _find(rows: List[Dict[str, Any]], **key: Any) -> Optional[Dict[str, Any]]:
    return next((r for r in rows if all(r.get(k) == v for k, v in key.items())), None)


def render_batches(report: Dict[str, Any]) -> List[str]:
    """The Markdown of the batch and control-plane measurements (none: [])."""
    data = report.get("batches") or {}
    lines: List[str] = []
    cycle = data.get("cycle") or []
    ratios = data.get("cycle_ratios") or []
    if cycle:
        sizes = sorted({r["k"] for r in cycle if r["k"]})
        lines += [
            "",
            "## Batches: publish_many + claim_many + ack_many, per message",
            "",
            "Time per message of the cycle in batches of k (`publish_many` of k items, `claim_many` of k,"
            " `ack_many` of the k leases) next to the single-call cycle (`publish` + `claim` + `ack`) of the"
            " same transport and of the floor stub (three bare calls). Median [min–max] over repeats;"
            " ratios are medians of per-repeat ratios.",
            "",
        ]
        header = ["N", "G", "implementation", "single calls"] + [f"k={k}" for k in sizes]
        header += [f"k={k} / single" for k in sizes] + [f"k={k} / floor single" for k in sizes]
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + "---|" * 3 + "---:|" * (len(header) - 3))
        for n, g in sorted({(r["n"], r["groups"]) for r in cycle}):
            for impl in BATCH_IMPLS:
                single = _find(cycle, n=n, impl=impl, k=0)
                if single is None:
                    continue
                cells = [n_label(n), n_label(g), LABELS[impl], _cell(single)]
                cells += [_cell(_find(cycle, n=n, impl=impl, k=k)) for k in sizes]
                for ref in (impl, "floor"):
                    for k in sizes:
                        r = _find(ratios, n=n, impl=impl, k=k, ref=ref)
                        cells.append(fmt_ratio(r["ratio"]) if r else "-")
                lines.append("| " + " | ".join(cells) + " |")
    control = data.get("control") or []
    cratios = data.get("control_ratios") or []
    if control:
        lines += [
            "",
            "## Control plane, per call",
            "",
            "`pause` + `resume` (one pair per op) and `group()` next to `claim`, on rotating groups."
            " Median [min–max] over repeats; ratios to `claim` are medians of per-repeat ratios.",
            "",
            "| N | G | implementation | " + " | ".join(f"`{op}`" for op in CONTROL_OPS)
            + " | " + " | ".join(f"`{op}` / `claim`" for op in CONTROL_OPS[1:]) + " |",
            "|---|---|---|" + "---:|" * (2 * len(CONTROL_OPS) - 1),
        ]
        for n, g in sorted({(r["n"], r["groups"]) for r in control}):
            for impl in BATCH_IMPLS:
                if _find(control, n=n, impl=impl, op="claim") is None:
                    continue
                cells = [n_label(n), n_label(g), LABELS[impl]]
                cells += [_cell(_find(control, n=n, impl=impl, op=op)) for op in CONTROL_OPS]
                for op in CONTROL_OPS[1:]:
                    r = _find(cratios, n=n, impl=impl, op=op)
                    cells.append(fmt_ratio(r["ratio"]) if r else "-")
                lines.append("| " + " | ".join(cells) + " |")
    return lines


def _cell(r: Optional[Dict[str, Any]]) -> str:
    if r is None:
        return "-"
    return f"{fmt_ns(r['median_ns'])} [{fmt_ns(r['min_ns'])}–{fmt_ns(r['max_ns'])}]"
