#!/usr/bin/env python3
"""Instructions per full cycle (publish + claim + ack), under callgrind.

Wall-clock time drifts on a shared or noisy machine; the number of
instructions executed does not (to within a fraction of a percent).  For
each implementation this runs the same fixed workload twice under
``valgrind --tool=callgrind`` -- prefill N messages in G groups, then K1 and
K2 full cycles -- and reports ``(Ir(K2) - Ir(K1)) / (K2 - K1)``: the
interpreter start-up, imports and prefill cancel out, leaving the
instructions of one cycle (loop overhead included, as in the timings).

With ``--batch K`` the cycle is batched: ``publish_many`` of K items +
``claim_many`` of K + ``ack_many`` of those leases, and the figure is per
message (implementations with batches only: cython, pure).  With
``--ack-and-claim`` the cycle is a worker's that acks each job with its next
claim: ``publish`` + ``ack_and_claim`` (cython, pure).

Usage::

    PYTHONPATH=src python3 benchmarks/callgrind.py            # N=10k, G=1k
    PYTHONPATH=src python3 benchmarks/callgrind.py --impls cython,pure --batch 64
    PYTHONPATH=src python3 benchmarks/callgrind.py --impls cython,pure --ack-and-claim
    python3 benchmarks/callgrind.py --n 100000 --groups 10000 --impls cython,floor
    python3 benchmarks/callgrind.py --json results/callgrind.json

Needs ``valgrind`` on PATH (``apt-get install valgrind``).  Each
implementation takes a few seconds to a minute (the pure-Python prefill is
the slow part under callgrind).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional

DEFAULT_IMPLS = ["cython", "floor", "pure", "queue"]
_COLLECTED = re.compile(r"Collected\s*:\s*([\d ]+)")
_EVENTS = re.compile(r"Events\s*:\s*([\w ]+)")


def _env() -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONHASHSEED"] = "0"  # same str hashes in every run: same instructions
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    if os.path.isdir(os.path.join(src, "leasequeue")):
        env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def instructions(
    impl: str, n: int, g: int, k: int, kmax: int, python: str, cache_sim: bool = False, batch: int = 0,
    ack_and_claim: bool = False,
) -> Dict[str, int]:
    """Event totals of one run (``Ir``; with ``cache_sim`` also ``D1mr``,
    ``D1mw``, ...): prefill ``n`` in ``g`` groups, then ``k`` cycles (the
    list of publish targets is built for ``kmax``; ``batch``: batched;
    ``ack_and_claim``: publish + ack_and_claim)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "callgrind.out")
        cmd = [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            f"--cache-sim={'yes' if cache_sim else 'no'}",
            python,
            "-m",
            "leasequeue.bench",
            "--callgrind-child",
            impl,
            str(n),
            str(g),
            str(k),
            str(kmax),
        ] + ([str(batch)] if batch else ["ack_and_claim"] if ack_and_claim else [])
        proc = subprocess.run(cmd, capture_output=True, text=True, env=_env())
        if proc.returncode != 0:
            raise RuntimeError(f"{impl}: callgrind run failed:\n{proc.stderr[-2000:]}")
        m = _COLLECTED.search(proc.stderr)
        if not m:
            raise RuntimeError(f"{impl}: no 'Collected' line in callgrind output:\n{proc.stderr[-2000:]}")
        names = _EVENTS.search(proc.stderr)
        keys = names.group(1).split() if names else ["Ir"]
        return dict(zip(keys, (int(x) for x in m.group(1).split())))


def main(argv: Optional[List[str]] = None) -> int:
    """Print instructions per cycle for each implementation."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--impls", default=",".join(DEFAULT_IMPLS), help="comma-separated: cython,floor,pure,queue,seed")
    ap.add_argument("--n", type=int, default=10_000, help="messages queued (default 10000)")
    ap.add_argument("--groups", type=int, default=1_000, help="groups (default 1000)")
    ap.add_argument("--k1", type=int, default=1_000, help="cycles in the first run")
    ap.add_argument("--k2", type=int, default=11_000, help="cycles in the second run")
    ap.add_argument("--python", default=sys.executable, help="interpreter to run")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    ap.add_argument(
        "--cache-sim", action="store_true", help="also simulate the caches: L1 data read/write misses per cycle"
    )
    ap.add_argument("--batch", type=int, default=0, metavar="K", help="batched cycles of K messages; per message")
    ap.add_argument("--ack-and-claim", action="store_true", help="publish + ack_and_claim cycles (a worker's loop)")
    args = ap.parse_args(argv)
    if args.batch and args.ack_and_claim:
        ap.error("--batch and --ack-and-claim measure different cycles: choose one")
    if shutil.which("valgrind") is None:
        sys.stderr.write("valgrind not found on PATH (apt-get install valgrind)\n")
        return 2
    impls = [i.strip() for i in args.impls.split(",") if i.strip()]
    if "seed" in impls and args.k2 > 100:
        sys.stderr.write("note: seed's claim sorts all messages; use small --k1/--k2 with it\n")
    rows = []
    for impl in impls:
        sys.stderr.write(f"callgrind: {impl} (N={args.n}, G={args.groups}, K={args.k1} and {args.k2}) ...\n")
        try:
            a = instructions(impl, args.n, args.groups, args.k1, args.k2, args.python, args.cache_sim, args.batch,
                             args.ack_and_claim)
            b = instructions(impl, args.n, args.groups, args.k2, args.k2, args.python, args.cache_sim, args.batch,
                             args.ack_and_claim)
        except RuntimeError as exc:
            sys.stderr.write(f"  skipped: {str(exc).splitlines()[0]}\n")
            rows.append({"impl": impl, "error": str(exc)[-500:]})
            continue
        done = args.k2 - args.k1 if not args.batch else (args.k2 // args.batch - args.k1 // args.batch) * args.batch
        per = {key: (b[key] - a[key]) / done for key in b}
        row = {"impl": impl, "ir_k1": a["Ir"], "ir_k2": b["Ir"], "ir_per_cycle": per["Ir"]}
        if args.cache_sim:
            row["d1_read_misses_per_cycle"] = per.get("D1mr")
            row["d1_write_misses_per_cycle"] = per.get("D1mw")
        rows.append(row)
    ref = next((r["ir_per_cycle"] for r in rows if r["impl"] == "cython" and "ir_per_cycle" in r), None)
    what = (
        f"message of the batched cycle (publish_many + claim_many + ack_many of {args.batch})"
        if args.batch
        else "publish+ack_and_claim cycle" if args.ack_and_claim
        else "publish+claim+ack cycle"
    )
    print(f"Instructions per {what} (N={args.n}, G={args.groups}; valgrind callgrind, PYTHONHASHSEED=0)")
    print()
    extra = " L1d read misses / cycle | L1d write misses / cycle |" if args.cache_sim else ""
    unit = "message" if args.batch else "cycle"
    print(f"| implementation | instructions / {unit} | / Cython |" + extra)
    print("|---|---:|---:|" + ("---:|---:|" if args.cache_sim else ""))
    for r in rows:
        if "ir_per_cycle" not in r:
            print(f"| {r['impl']} | error | |" + (" | |" if args.cache_sim else ""))
            continue
        rel = f"{r['ir_per_cycle'] / ref:.2f}×" if ref else "-"
        cells = f"| {r['impl']} | {r['ir_per_cycle']:,.0f} | {rel} |"
        if args.cache_sim:
            cells += f" {r['d1_read_misses_per_cycle']:.1f} | {r['d1_write_misses_per_cycle']:.1f} |"
        print(cells)
    if args.json:
        meta = {"n": args.n, "groups": args.groups, "k1": args.k1, "k2": args.k2, "python": sys.version.split()[0]}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return 0 if all("ir_per_cycle" in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
