"""The plot: time per cycle vs N, log-log, one panel per group count.

matplotlib is optional (the ``bench`` extra); without it the plot is
skipped with a message and everything else works.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from .impls import ALL_IMPLS, LABELS

__all__ = ["write_plot"]

#: Line colours by implementation (matplotlib's default cycle).
COLORS = {"cython": "C0", "floor": "C7", "pure": "C1", "queue": "C2", "seed": "C3", "floor_pymutex": "C5"}


def write_plot(report: Dict[str, Any], path: str) -> Optional[str]:
    """Time per cycle vs N (log-log), one line per implementation, one panel
    per group count.  Returns None, or a message when matplotlib is missing
    or there is nothing to plot."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return (
            "matplotlib is not installed: plot skipped (python -m pip install matplotlib;"
            ' from a clone of leasequeue: python -m pip install ".[bench]")'
        )
    rows = [r for r in report["results"] if r["workload"] == "cycle"]
    if not rows:
        return "no cycle results: plot skipped"
    specs = [s for s in ("1", "N/10", "N") if any(r["groups_spec"] == s for r in rows)]
    specs += sorted({r["groups_spec"] for r in rows} - set(specs))
    fig, axes = plt.subplots(1, len(specs), figsize=(5.2 * len(specs), 4.4), squeeze=False, sharey=True)
    for ax, spec in zip(axes[0], specs):
        for n_impl, impl in enumerate(ALL_IMPLS):
            pts = sorted((r["n"], r) for r in rows if r["impl"] == impl and r["groups_spec"] == spec)
            meas = [r for _, r in pts if not r["extrapolated"]]
            extra = [r for _, r in pts if r["extrapolated"]]
            if not pts:
                continue
            color = COLORS.get(impl, f"C{n_impl % 10}")
            if meas:
                xs = [r["n"] for r in meas]
                ys = [r["median_ns"] for r in meas]
                yerr = [[r["median_ns"] - r["min_ns"] for r in meas], [r["max_ns"] - r["median_ns"] for r in meas]]
                ax.errorbar(xs, ys, yerr=yerr, marker="o", color=color, label=LABELS[impl], capsize=3)
            if extra:
                link = meas[-1:] + extra
                ax.plot([r["n"] for r in link], [r["median_ns"] for r in link], linestyle="--", marker="x",
                        color=color, label=f"{LABELS[impl]} (extrapolated)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"G = {spec}")
        ax.set_xlabel("N (messages queued)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("time per publish+claim+ack (ns)")
    axes[0][-1].legend(fontsize=8)
    m = report["meta"]["machine"]
    fig.suptitle(f"leasequeue full cycle — {m['cpu']}, Python {m['python']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
