"""The project's performance goals, judged on a run.

Each goal is a bound on one figure of the full publish + claim + ack cycle
(or of memory, of the batched cycle, or of waiting for work), with the
reason it is set (``WHY``; the waiting goals are ``waiting.py``'s).  They
are reported at the end of every run, never asserted in tests (a unit test must not depend
on machine speed).  In the JSON report they are the ``targets`` list.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from .config import BenchConfig
from .fmt import fmt_ratio, n_label
from .impls import LABELS
from .timing import find_ratio, find_result
from .waiting import waiting_goals

__all__ = ["WHY", "evaluate_goals"]

#: Why each goal is set, by goal.
WHY: Dict[str, str] = {
    "floor": "the floor is the price of the calls themselves (lock, clock read, one lease object); "
    "the queue's own bookkeeping should add at most a quarter to it",
    "queue": "queue.Queue put+get is what Python programmers already use; groups, leases and "
    "priorities should come several times cheaper than it, not at a price",
    "pure": "the compiled core must earn what it costs: wheels for every platform and two "
    "implementations kept in step",
    "seed": "the seed sorts every queued message on each claim; a ratio this large at 100k messages "
    "shows that a claim does not touch the queued messages (O(log G), not O(N log N))",
    "flat": "a backlog must not slow the workers: the cost of an operation should stay nearly "
    "flat from 10k to 1M queued messages",
    "memory": "a million queued messages should take under 48 MB beyond the events "
    "themselves (the seed's dict per message takes about 240 bytes)",
    "batch": "a batch pays for the calls, the lock and the clock read once for k messages: at 64 a "
    "message should cost at most half of what it costs one call at a time",
    "batch_floor": "the floor stub's single-call cycle is three bare calls, the least any "
    "per-message API can cost: batching should beat it",
}

#: The batch size the batch goals are judged at.
BATCH_K = 64


def evaluate_goals(cfg: BenchConfig, results: List[Dict[str, Any]], ratios: List[Dict[str, Any]],
                   memory: List[Dict[str, Any]], waiting: Optional[Dict[str, Any]] = None,
                   batches: Optional[Dict[str, Any]] = None) -> List[Dict[str, Any]]:
    """The performance goals, evaluated on this run (at the largest N measured
    when 1M was not run: the ``at`` field says where); the batch goals follow
    when ``batches`` was measured, and the waiting goals
    (``waiting.waiting_goals``) when ``waiting`` was."""
    out: List[Dict[str, Any]] = []
    _cycle_goals(cfg, results, ratios, memory, out)
    _batch_goals(batches or {}, out)
    return out + waiting_goals(waiting)


def _batch_goals(batches: Dict[str, Any], out: List[Dict[str, Any]]) -> None:
    """The batched cycle at k = 64, per message, against the single-call cycles."""
    ratios = batches.get("cycle_ratios") or []
    sizes = sorted({r["n"] for r in ratios if r["impl"] == "cython" and r["k"] == BATCH_K})
    if not sizes:
        return
    big = sizes[-1]
    at = f"batched cycle k={BATCH_K} N={n_label(big)} G=N/10"
    for key, ref, name, goal, bound in (
        ("batch", "cython", f"Cython batched (k={BATCH_K}) / Cython single calls", "<= 0.5", 0.5),
        ("batch_floor", "floor", f"Cython batched (k={BATCH_K}) / floor single calls", "< 1", 1.0),
    ):
        r = next((x for x in ratios if x["n"] == big and x["impl"] == "cython" and x["k"] == BATCH_K
                  and x["ref"] == ref), None)
        value = r["ratio"] if r else None
        met = None if value is None else (value <= bound if key == "batch" else value < bound)
        out.append({"target": name, "goal": goal, "value": value, "met": met, "at": at,
                    "note": "" if r else "not measured", "why": WHY[key]})


def _cycle_goals(cfg: BenchConfig, results: List[Dict[str, Any]], ratios: List[Dict[str, Any]],
                 memory: List[Dict[str, Any]], out: List[Dict[str, Any]]) -> None:
    """The goals on the single-call cycle and on memory."""
    sizes = sorted(cfg.sizes)
    if not sizes or "cycle" not in cfg.workloads:
        return
    # Every goal is about the Cython transport: without it, nothing to judge.
    ratios = [r for r in ratios if r["ref"] == "cython"]
    big = 1_000_000 if 1_000_000 in sizes else sizes[-1]
    spec = "N/10" if "N/10" in cfg.groups else cfg.groups[0]

    def add(key: str, name: str, goal: str, value: Optional[float], ok: Optional[bool], at: str,
            note: str = "") -> None:
        out.append({"target": name, "goal": goal, "value": value, "met": ok, "at": at, "note": note,
                    "why": WHY[key]})

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
        add("floor", "Cython / floor", "<= 1.25", v, v <= 1.25, at, best(c, fl))
    else:
        add("floor", "Cython / floor", "<= 1.25", None, None, at, "not measured")
    for impl, goal in (("queue", 5.0), ("pure", 6.0)):
        r = find_ratio(ratios, "cycle", big, spec, impl)
        name = f"{LABELS[impl]} / Cython"
        if r:
            other = find_result(results, "cycle", big, spec, impl)
            add(impl, name, f">= {goal:g}", r["ratio"], r["ratio"] >= goal, at, best(other, c))
        else:
            add(impl, name, f">= {goal:g}", None, None, at, "not measured")
    r = find_ratio(ratios, "cycle", 100_000, spec, "seed")
    at100 = f"cycle N=100k G={spec}"
    if r:
        note = "seed extrapolated (N log N)" if r["extrapolated"] else best(
            find_result(results, "cycle", 100_000, spec, "seed"), find_result(results, "cycle", 100_000, spec, "cython")
        )
        add("seed", "seed / Cython", ">= 1e5", r["ratio"], r["ratio"] >= 1e5, at100, note)
    else:
        add("seed", "seed / Cython", ">= 1e5", None, None, at100, "not measured at N=100k")
    c10 = find_result(results, "cycle", 10_000, spec, "cython")
    if c and c10 and big != 10_000:
        v = c["median_ns"] / c10["median_ns"]
        # The two sizes are timed minutes apart: drift does not cancel.  The
        # floor is stateless (same cost at every N), so Cython/floor at each
        # size, divided, is a drift-corrected estimate of the same figure.
        fb, f10 = find_ratio(ratios, "cycle", big, spec, "floor"), find_ratio(ratios, "cycle", 10_000, spec, "floor")
        note = f"drift-corrected via the floor: {f10['ratio'] / fb['ratio']:.2f}×; " if fb and f10 else ""
        note += best(c, c10)
        add("flat", f"Cython N={n_label(big)} / N=10k", "<= 1.3", v, v <= 1.3, f"cycle G={spec}", note)
    else:
        add("flat", "Cython N=1M / N=10k", "<= 1.3", None, None, f"cycle G={spec}", "not measured")
    m = [x for x in memory if x.get("impl") == "cython" and x.get("groups_spec") == spec and "error" not in x]
    if m:
        v = m[0]["tracemalloc_bytes_per_msg"]
        rss = m[0].get("rss_bytes_per_msg")
        note = f"RSS {rss:.1f} B/msg" if rss is not None else ""
        where = f"N={n_label(m[0]['n'])} G={spec}"
        add("memory", "Cython bytes per queued message (tracemalloc)", "<= 48", v, v <= 48, where, note)
    else:
        add("memory", "Cython bytes per queued message", "<= 48", None, None, "", "not measured")
