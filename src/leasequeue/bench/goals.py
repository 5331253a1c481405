"""The project's performance goals, judged on a run.

They are reported, never asserted in tests (a unit test must not depend on
machine speed).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from .config import BenchConfig
from .fmt import fmt_ratio, n_label
from .impls import LABELS
from .timing import find_ratio, find_result

__all__ = ["evaluate_targets"]


def evaluate_targets(cfg: BenchConfig, results: List[Dict[str, Any]], ratios: List[Dict[str, Any]],
                     memory: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Issue 4's targets, evaluated on this run (at the largest N measured
    when 1M was not run: the ``at`` field says where)."""
    out: List[Dict[str, Any]] = []
    sizes = sorted(cfg.sizes)
    if not sizes or "cycle" not in cfg.workloads:
        return out
    # Every target is about the Cython transport: without it, nothing to judge.
    ratios = [r for r in ratios if r["ref"] == "cython"]
    big = 1_000_000 if 1_000_000 in sizes else sizes[-1]
    spec = "N/10" if "N/10" in cfg.groups else cfg.groups[0]

    def add(name: str, goal: str, value: Optional[float], ok: Optional[bool], at: str, note: str = "") -> None:
        out.append({"target": name, "goal": goal, "value": value, "met": ok, "at": at, "note": note})

    def best(a: Optional[Dict[str, Any]], b: Optional[Dict[str, Any]]) -> str:
        """Ratio of the fastest samples: what a quiet machine would approach."""
        if not a or not b or a["min_ns"] <= 0 or b["min_ns"] <= 0:
            return ""
        return f"best-of-repeats: {fmt_ratio(a['min_ns'] / b['min_ns'])}"

    c = find_result(results, "cycle", big, spec, "cython")
    fl = find_result(results, "cycle", big, spec, "floor")
    r = find_ratio(ratios, "cycle", big, spec, "floor")
    at = f"cycle N={n_label(big)} G={spec}"
    if c and fl and r:
        v = 1.0 / r["ratio"]
        add("Cython / floor", "<= 1.25", v, v <= 1.25, at, best(c, fl))
    else:
        add("Cython / floor", "<= 1.25", None, None, at, "not measured")
    for impl, goal in (("queue", 5.0), ("pure", 6.0)):
        r = find_ratio(ratios, "cycle", big, spec, impl)
        name = f"{LABELS[impl]} / Cython"
        if r:
            other = find_result(results, "cycle", big, spec, impl)
            add(name, f">= {goal:g}", r["ratio"], r["ratio"] >= goal, at, best(other, c))
        else:
            add(name, f">= {goal:g}", None, None, at, "not measured")
    r = find_ratio(ratios, "cycle", 100_000, spec, "seed")
    at100 = f"cycle N=100k G={spec}"
    if r:
        note = "seed extrapolated (N log N)" if r["extrapolated"] else best(
            find_result(results, "cycle", 100_000, spec, "seed"), find_result(results, "cycle", 100_000, spec, "cython")
        )
        add("seed / Cython", ">= 1e5", r["ratio"], r["ratio"] >= 1e5, at100, note)
    else:
        add("seed / Cython", ">= 1e5", None, None, at100, "not measured at N=100k")
    c10 = find_result(results, "cycle", 10_000, spec, "cython")
    if c and c10 and big != 10_000:
        v = c["median_ns"] / c10["median_ns"]
        # The two sizes are timed minutes apart: drift does not cancel.  The
        # floor is stateless (same cost at every N), so Cython/floor at each
        # size, divided, is a drift-corrected estimate of the same figure.
        fb, f10 = find_ratio(ratios, "cycle", big, spec, "floor"), find_ratio(ratios, "cycle", 10_000, spec, "floor")
        note = f"drift-corrected via the floor: {f10['ratio'] / fb['ratio']:.2f}×; " if fb and f10 else ""
        note += best(c, c10)
        add(f"Cython N={n_label(big)} / N=10k", "<= 1.3", v, v <= 1.3, f"cycle G={spec}", note)
    else:
        add("Cython N=1M / N=10k", "<= 1.3", None, None, f"cycle G={spec}", "not measured")
    m = [x for x in memory if x.get("impl") == "cython" and x.get("groups_spec") == spec and "error" not in x]
    if m:
        v = m[0]["tracemalloc_bytes_per_msg"]
        rss = m[0].get("rss_bytes_per_msg")
        note = f"RSS {rss:.1f} B/msg" if rss is not None else ""
        where = f"N={n_label(m[0]['n'])} G={spec}"
        add("Cython bytes per queued message (tracemalloc)", "<= 48", v, v <= 48, where, note)
    else:
        add("Cython bytes per queued message", "<= 48", None, None, "", "not measured")
    return out
