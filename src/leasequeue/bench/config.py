"""What a benchmark run measures: ``BenchConfig`` and its presets.

The configuration is saved in the JSON report (``meta.config``) and read
back by ``bench --from-json``, so its fields are part of the JSON format.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from .impls import DEFAULT_IMPLS
from .workloads import WORKLOADS

__all__ = ["SEED_MAX_N_FULL", "SEED_MAX_N_QUICK", "BenchConfig", "parse_groups"]

#: The largest N the seed's sort-per-claim algorithm is run at (beyond it,
#: its figures are extrapolated as N log N).
SEED_MAX_N_QUICK = 100_000
SEED_MAX_N_FULL = 100_000


def parse_groups(spec: str, n: int) -> int:
    """``"1"``, ``"N/10"``, ``"N"`` or a number -> a group count for ``n``."""
    s = spec.strip().upper()
    if s == "N":
        return n
    if s.startswith("N/"):
        return max(1, n // int(s[2:]))
    return max(1, min(n, int(s)))


@dataclass
class BenchConfig:
    """What to run.  ``quick()``, ``full()`` and ``smoke()`` are the presets."""

    mode: str = "quick"
    sizes: List[int] = field(default_factory=lambda: [1_000, 10_000, 100_000])
    groups: List[str] = field(default_factory=lambda: ["N/10"])
    workloads: List[str] = field(default_factory=lambda: list(WORKLOADS))
    impls: List[str] = field(default_factory=lambda: list(DEFAULT_IMPLS))
    repeats: int = 5
    ops: int = 20_000
    seed_max_n: int = SEED_MAX_N_QUICK
    memory_n: Optional[int] = 100_000
    memory_groups: List[str] = field(default_factory=lambda: ["N/10"])
    #: the waiting measurements (``bench/waiting.py``): wake-up latency and throughput
    waiting: bool = True
    wake_samples: int = 400
    throughput_messages: int = 20_000
    throughput_threads: List[int] = field(default_factory=lambda: [1, 2, 4, 8])
    #: the batched cycle (``bench/batches.py``): batch sizes, and the N it runs at (G = N/10)
    batch_sizes: List[int] = field(default_factory=lambda: [1, 16, 64, 256])
    batch_n: List[int] = field(default_factory=lambda: [10_000, 100_000])
    #: N of the control-plane measurement (G = N/10); None: skip it
    control_n: Optional[int] = 100_000

    @classmethod
    def quick(cls) -> "BenchConfig":
        """Default: N in {1k, 10k, 100k}, G = N/10, 5 repeats (about a minute)."""
        return cls()

    @classmethod
    def full(cls) -> "BenchConfig":
        """Every size and group count, 11 repeats (about 5 minutes)."""
        return cls(
            mode="full",
            sizes=[1_000, 10_000, 100_000, 1_000_000],
            groups=["1", "N/10", "N"],
            repeats=11,
            ops=50_000,
            seed_max_n=SEED_MAX_N_FULL,
            memory_n=1_000_000,
            memory_groups=["1", "N/10", "N"],
            wake_samples=2_000,
            throughput_messages=100_000,
            batch_n=[10_000, 1_000_000],
            control_n=1_000_000,
        )

    @classmethod
    def smoke(cls) -> "BenchConfig":
        """A few seconds: checks that everything runs, measures nothing useful."""
        return cls(
            mode="smoke",
            sizes=[1_000],
            groups=["N/10"],
            repeats=1,
            ops=200,
            seed_max_n=1_000,
            memory_n=1_000,
            memory_groups=["N/10"],
            wake_samples=20,
            throughput_messages=500,
            throughput_threads=[1, 2],
            batch_n=[1_000],
            control_n=1_000,
        )
