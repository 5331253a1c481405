#!/usr/bin/env python3
"""Soak and leak runs for leasequeue (issue 6): the long versions of the suite's checks.

Stress soak: the harness of ``tests/inmemory/test_stress.py`` (worker threads acking,
nacking, parking, extending and crashing while publishers publish into
thousands of groups, every guarantee checked against an independent log),
in rounds, for ``--minutes`` minutes per implementation and clock::

    python tools/soak.py --minutes 10 --impl both --clock both

Leak run: ``--leak-cycles N`` publish+claim+ack cycles per implementation,
printing traced memory (tracemalloc) and RSS along the way::

    python tools/soak.py --leak-cycles 1000000 --impl both

Exit status 1 when any round found a problem or memory grew.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys
import time
import tracemalloc
from types import ModuleType
from typing import List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "tests", "inmemory"), os.path.join(ROOT, "tests"), os.path.join(ROOT, "src")]

from test_stress import StressConfig, StressResult, run_stress  # noqa: E402

MODULES = {
    "python": "leasequeue._backends.inmemory.transport_py",
    "cython": "leasequeue._backends.inmemory.transport_c",
}


def rss_bytes() -> int:
    """Resident set size now (Linux /proc), else the peak from getrusage."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def soak(impl: ModuleType, clock: str, seconds: float, args: argparse.Namespace) -> List[StressResult]:
    """Rounds of at most ``--round`` seconds (the log of a round is checked, then dropped)."""
    results = []
    end = time.monotonic() + seconds
    round_no = 0
    while True:
        left = end - time.monotonic()
        if left <= 1.0 and results:
            break
        round_no += 1
        cfg = StressConfig(
            impl=impl,
            clock=clock,
            workers=args.workers,
            publishers=args.publishers,
            groups=args.groups,
            messages=None,
            duration=max(1.0, min(args.round, left)),
            checkpoints=args.checkpoints,
            seed=args.seed + round_no,
            operator=args.operator,
        )
        res = run_stress(cfg)
        results.append(res)
        print(f"  round {round_no}: {res.summary()}", flush=True)
        for p in res.problems[:20]:
            print(f"    PROBLEM: {p}", flush=True)
    return results


def leak(impl: ModuleType, cycles: int, trace: bool) -> bool:
    """``cycles`` publish+claim+ack cycles (ten rotating groups); True when memory stayed flat."""
    t = impl.InMemoryTransport(clock=time.monotonic)
    groups = [f"g{i}" for i in range(10)]
    warm = min(cycles // 10, 20000)
    for i in range(warm):
        t.publish(groups[i % 10], object())
        t.ack(t.claim("w", 30.0))
    gc.collect()
    if trace:
        tracemalloc.start()
    base_traced = tracemalloc.get_traced_memory()[0] if trace else 0
    base_rss = rss_bytes()
    step = max(1, cycles // 10)
    started = time.monotonic()
    for done in range(1, cycles + 1):
        t.publish(groups[done % 10], object())
        t.ack(t.claim("w", 30.0))
        if done % step == 0 or done == cycles:
            traced = tracemalloc.get_traced_memory()[0] - base_traced if trace else 0
            print(
                f"  {done:>9} cycles  traced {traced:+10d} B  RSS {rss_bytes() - base_rss:+11d} B  "
                f"{time.monotonic() - started:7.1f}s",
                flush=True,
            )
    gc.collect()
    traced = tracemalloc.get_traced_memory()[0] - base_traced if trace else 0
    if trace:
        tracemalloc.stop()
    grown = rss_bytes() - base_rss
    ok = len(t) == 0 and traced < 64 * 1024 and grown < 8 * 1024 * 1024
    print(
        f"  {impl.__name__}: {cycles} cycles, traced growth {traced} B, RSS growth {grown} B, "
        f"len {len(t)}: {'flat' if ok else 'GREW'}",
        flush=True,
    )
    return ok


def main(argv: "List[str] | None" = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=0.0, help="stress soak minutes per implementation and clock")
    ap.add_argument("--impl", choices=("python", "cython", "both"), default="both")
    ap.add_argument("--clock", choices=("fake", "real", "both"), default="both")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--publishers", type=int, default=3)
    ap.add_argument("--groups", type=int, default=3000)
    ap.add_argument("--round", type=float, default=60.0, help="seconds per checked round")
    ap.add_argument("--checkpoints", type=int, default=3, help="quiescent stats()/len() checks per round")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--operator", action="store_true", help="an operator thread pauses, resumes, purges and re-prioritises groups"
    )
    ap.add_argument("--leak-cycles", type=int, default=0, help="publish+claim+ack cycles of the leak run")
    ap.add_argument("--no-tracemalloc", action="store_true", help="leak run: RSS only (much faster)")
    args = ap.parse_args(argv)
    if not args.minutes and not args.leak_cycles:
        ap.error("nothing to do: give --minutes and/or --leak-cycles")

    impls = ["python", "cython"] if args.impl == "both" else [args.impl]
    clocks = ["fake", "real"] if args.clock == "both" else [args.clock]
    failed = False
    for name in impls:
        impl = importlib.import_module(MODULES[name])
        if args.minutes:
            for clock in clocks:
                print(f"stress soak: {name}, {clock} clock, {args.minutes} min", flush=True)
                results = soak(impl, clock, args.minutes * 60.0, args)
                total_ops = sum(r.ops for r in results)
                problems = sum(len(r.problems) for r in results)
                secs = sum(r.seconds for r in results)
                print(
                    f"TOTAL {name}/{clock}: {len(results)} rounds, {results[0].threads} threads, "
                    f"{args.groups} groups, {sum(r.published for r in results)} messages, "
                    f"{total_ops} ops ({total_ops / secs:.0f}/s), {sum(r.deliveries for r in results)} deliveries, "
                    f"{sum(r.crashes for r in results)} crashes, {sum(r.lease_lost for r in results)} LeaseLost, "
                    f"max group concurrency {max(r.max_group_concurrency for r in results)}, "
                    f"{problems} problems",
                    flush=True,
                )
                failed |= problems > 0
        if args.leak_cycles:
            print(f"leak run: {name}, {args.leak_cycles} cycles", flush=True)
            failed |= not leak(impl, args.leak_cycles, not args.no_tracemalloc)
    print("FAILED" if failed else "OK")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
