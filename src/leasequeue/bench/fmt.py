"""How the report writes sizes, durations and ratios."""

from __future__ import annotations

from typing import Optional

from .config import parse_groups

__all__ = ["fmt_ns", "fmt_ratio", "g_label", "n_label"]


def n_label(n: int) -> str:
    """``1000`` -> ``1k``, ``1000000`` -> ``1M``; other numbers as they are."""
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n >= 1_000 and n % 1_000 == 0:
        return f"{n // 1_000}k"
    return str(n)


def g_label(spec: str, n: int) -> str:
    """A group spec with its value at ``n``: ``N/10=1k``."""
    return f"{spec}={n_label(parse_groups(spec, n))}" if "N" in spec.upper() else spec


def fmt_ns(ns: Optional[float]) -> str:
    """A duration in ns, with a unit that keeps 2-3 significant digits."""
    if ns is None:
        return "-"
    if ns < 1e3:
        return f"{ns:.0f} ns"
    if ns < 1e6:
        return f"{ns / 1e3:.3g} µs"
    if ns < 1e9:
        return f"{ns / 1e6:.3g} ms"
    return f"{ns / 1e9:.3g} s"


def fmt_ratio(x: Optional[float]) -> str:
    """A ratio: ``1.25×``, ``861×``, ``7.77e5×``."""
    if x is None:
        return "-"
    if x >= 1e4:
        return f"{x:.3g}×".replace("e+0", "e").replace("e+", "e")
    if x >= 100:
        return f"{x:.0f}×"
    return f"{x:.2f}×"
