"""The report: Markdown tables of a run, and a one-line summary.

``render_markdown`` joins sections, each a function from the report to its
lines; a new kind of measurement adds its section function to ``SECTIONS``.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List

from .batches import render_batches
from .fmt import fmt_ns, fmt_ratio, n_label
from .impls import ALL_IMPLS, LABELS
from .timing import find_ratio
from .waiting import render as _waiting
from .workloads import REGISTRY, WORKLOADS

__all__ = ["SECTIONS", "render_markdown", "render_summary"]


def _compiled(machine: Dict[str, Any]) -> str:
    """Which Cython compiled the extension (``None``: nothing compiled)."""
    if machine.get("cython") is None:
        return "no compiled extension (pure Python only)"
    return f"Cython {machine['cython']}"


def _header(report: Dict[str, Any]) -> List[str]:
    meta = report["meta"]
    ref = meta["ratio_reference"]
    m = meta["machine"]
    lines = [
        f"# leasequeue benchmark ({meta['mode']} mode)",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores; {m['python_implementation']} {m['python']}"
        f" ({m['platform']}); {_compiled(m)}; leasequeue {m['leasequeue']}.",
        f"Run {meta['started_utc']}, {meta['duration_s']:.0f} s; {meta['config']['repeats']} repeats,"
        f" interleaved; GC off in timed loops; bare loop overhead {meta['loop_overhead_ns']:.0f} ns/op"
        " (included in every figure).",
    ]
    if meta["missing"]:
        lines.append("")
        lines.append("Not available: " + "; ".join(f"{k} ({v})" for k, v in meta["missing"].items()))
    lines.append("")
    lines.append("Cells: median time per op [min–max over repeats]. `~` = extrapolated (seed only, N log N).")
    lines.append(f"Ratios: time of the other implementation / time of {LABELS[ref]} (median of per-repeat ratios);")
    lines.append(f"`{LABELS[ref]}/floor` is the reverse (how far above the bare call cost).")
    return lines


def _workloads(report: Dict[str, Any]) -> List[str]:
    """One table per workload: N, G, a time per implementation, the ratios."""
    meta = report["meta"]
    results = report["results"]
    ratios = report["ratios"]
    ref = meta["ratio_reference"]
    impls = [i for i in ALL_IMPLS if i in meta["implementations"]]
    lines: List[str] = []
    for w, desc in WORKLOADS.items():
        rows = [r for r in results if r["workload"] == w]
        if not rows:
            continue
        cols = [i for i in impls if REGISTRY[w].supports(i)]
        lines.append("")
        lines.append(f"## {w}: {desc}")
        lines.append("")
        ratio_cols = [i for i in cols if i != ref]
        header = ["N", "G"] + [LABELS[i] for i in cols]
        header += [f"{LABELS[ref]}/{i}" if i.startswith("floor") else f"{i}/{ref}" for i in ratio_cols]
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + "---|" * 2 + "---:|" * (len(header) - 2))
        keys = sorted({(r["n"], r["groups"], r["groups_spec"]) for r in rows})
        for n, g, spec in keys:
            cells = [n_label(n), f"{n_label(g)}"]
            for i in cols:
                r = next((x for x in rows if x["n"] == n and x["groups_spec"] == spec and x["impl"] == i), None)
                if r is None:
                    cells.append("-")
                elif r["extrapolated"]:
                    cells.append(f"~{fmt_ns(r['median_ns'])}")
                else:
                    cells.append(f"{fmt_ns(r['median_ns'])} [{fmt_ns(r['min_ns'])}–{fmt_ns(r['max_ns'])}]")
            for i in ratio_cols:
                r = find_ratio(ratios, w, n, spec, i)
                if r is None:
                    cells.append("-")
                else:
                    v = 1.0 / r["ratio"] if i.startswith("floor") else r["ratio"]
                    cells.append(("~" if r["extrapolated"] else "") + fmt_ratio(v))
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def _memory(report: Dict[str, Any]) -> List[str]:
    mem = report.get("memory") or []
    if not mem:
        return []
    lines = [
        "",
        "## Memory and garbage collector, per queued message",
        "",
        "Fresh interpreter per row; one shared event object, so only the transport's own memory counts.",
        "",
        "| impl | N | G | tracemalloc B/msg | RSS B/msg | GC-tracked objects/msg"
        " | gc.collect() with N queued | (empty) |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for x in mem:
        if "error" in x:
            lines.append(f"| {LABELS[x['impl']]} | {n_label(x['n'])} | {n_label(x['groups'])} | error | | | | |")
            continue
        rss = x["rss_bytes_per_msg"]
        lines.append(
            f"| {LABELS[x['impl']]} | {n_label(x['n'])} | {n_label(x['groups'])}"
            f" | {x['tracemalloc_bytes_per_msg']:.1f} | {'-' if rss is None else f'{rss:.1f}'}"
            f" | {x['gc_tracked_per_msg']:.2f} | {fmt_ns(x['gc_collect_s'] * 1e9)}"
            f" | {fmt_ns(x['gc_collect_empty_s'] * 1e9)} |"
        )
    return lines


def _goals(report: Dict[str, Any]) -> List[str]:
    """The project's performance goals (``targets`` in the JSON), each with why it is set."""
    goals = report.get("targets") or []
    if not goals:
        return []
    lines = [
        "",
        "## Performance goals",
        "",
        "The project's goals for the Cython transport (and one for the pure twin's thread wake-up), judged on this "
        "run (reported, never asserted in tests).",
    ]
    if any(t["at"].startswith("wake_") for t in goals):
        lines.append("Wake-up goals compare medians of p50s, which a loaded machine moves: judge them on a quiet run.")
    lines += [
        "",
        "| goal | bound | this run | met | where | note |",
        "|---|---|---:|---|---|---|",
    ]
    for t in goals:
        v = t["value"]
        if v is None:
            vs = "-"
        elif "bytes" in t["target"]:
            vs = f"{v:.1f}"
        else:
            vs = fmt_ratio(v)
        met = {True: "yes", False: "**no**", None: "-"}[t["met"]]
        lines.append(f"| {t['target']} | {t['goal']} | {vs} | {met} | {t['at']} | {t['note']} |")
    whys = [t for t in goals if t.get("why")]
    if whys:
        lines.append("")
        lines.append("Why each goal is set:")
        lines.append("")
        for t in whys:
            lines.append(f"- {t['target']} {t['goal']}: {t['why']}.")
    return lines


#: The report's sections, in order.
SECTIONS: List[Callable[[Dict[str, Any]], List[str]]] = [
    _header, _workloads, render_batches, _memory, _waiting, _goals
]


def render_markdown(report: Dict[str, Any]) -> str:
    """The comparison tables, ratios, memory figures and goals as Markdown."""
    lines: List[str] = []
    for section in SECTIONS:
        lines.extend(section(report))
    lines.append("")
    return "\n".join(lines)


def render_summary(report: Dict[str, Any]) -> str:
    """A short plain-text headline: the cycle ratios at the largest N."""
    ref = report["meta"]["ratio_reference"]
    cyc = [r for r in report["ratios"] if r["workload"] == "cycle"]
    if not cyc:
        return ""
    big = max(r["n"] for r in cyc)
    specs = sorted({r["groups_spec"] for r in cyc if r["n"] == big})
    spec = "N/10" if "N/10" in specs else specs[0]
    parts = []
    for r in cyc:
        if r["n"] != big or r["groups_spec"] != spec:
            continue
        if r["impl"].startswith("floor"):
            parts.append(f"{1 / r['ratio']:.2f}× the {LABELS[r['impl']]}")
        else:
            x = r["ratio"]
            rel = f"{fmt_ratio(x)} faster than" if x >= 1 else f"{fmt_ratio(1 / x)} slower than"
            parts.append(f"{rel} {LABELS[r['impl']]}" + (" (extrapolated)" if r["extrapolated"] else ""))
    return f"{LABELS[ref]} full cycle at N={n_label(big)}, G={spec}: " + ", ".join(parts)
