"""Command line: ``leasequeue bench|worker|queue|dashboard|info`` (also ``python -m leasequeue``).

``leasequeue worker MODULE:OBJECT`` runs a worker on a durable queue and
``leasequeue queue`` operates one (``leasequeue._cli``, ``leasequeue._cli_worker``);
``leasequeue dashboard`` serves a web dashboard of one (``leasequeue._cli_dashboard``);
their errors, bad arguments included, are one line on stderr.

``leasequeue bench`` runs the side-by-side benchmarks (quick mode by
default, under a minute) and prints the comparison table and the ratios;
``--full`` runs every size, ``--plot FILE.png`` / ``--json FILE`` /
``--markdown FILE`` save the results.  ``leasequeue bench --sqlite`` and
``leasequeue bench --postgres`` run the SQLite and the PostgreSQL
benchmarks instead (``leasequeue.bench.sqlite``, ``leasequeue.bench.postgres``:
the options after them are that benchmark's).  ``leasequeue --version`` prints the
version and which implementation ``leasequeue.InMemoryTransport`` is.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import List, NoReturn, Optional, Sequence


def _version_string() -> str:
    import leasequeue

    return f"leasequeue {leasequeue.__version__} ({leasequeue.IMPLEMENTATION} implementation)"


def _int_list(text: str) -> List[int]:
    out = []
    for part in text.split(","):
        part = part.strip().lower().replace("_", "")
        mult = 1
        if part.endswith("k"):
            mult, part = 1_000, part[:-1]
        elif part.endswith("m"):
            mult, part = 1_000_000, part[:-1]
        value = int(float(part) * mult)
        if value < 1:
            raise argparse.ArgumentTypeError(f"size must be >= 1: {text!r}")
        out.append(value)
    return out


def _str_list(text: str) -> List[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line on stderr,
    ``PROG: error: MESSAGE (see PROG --help)``, exit status 2 (its subcommands'
    parsers are of this class too)."""

    def error(self, message: str) -> "NoReturn":
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    """The ``leasequeue`` argument parser (subcommands: ``bench``, ``worker``, ``queue``, ``info``)."""
    from ._cli import add_parsers
    from .bench import ALL_IMPLS, WORKLOADS

    parser = _Parser(
        prog="leasequeue",
        description="leasequeue: in-process message transport with per-group leases. "
        "Run 'leasequeue bench' to measure it against its pure-Python twin, queue.Queue, "
        "the seed algorithm and a bare-call floor on this machine; 'leasequeue worker' to run a "
        "handler on a SQLite or PostgreSQL queue; 'leasequeue queue' to inspect and operate one.",
    )
    parser.add_argument("--version", action="version", version=_version_string())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    sub.add_parser("info", help="print the version and which implementation is active")
    add_parsers(sub)
    from ._cli_dashboard import add_parser as add_dashboard_parser

    add_dashboard_parser(sub)

    b = sub.add_parser(
        "bench",
        help="run the side-by-side benchmarks (quick mode by default)",
        description="Side-by-side benchmarks, interleaved in one process: Cython transport, "
        "floor stub, pure-Python transport, queue.Queue put+get, and the seed's sort-per-claim "
        "algorithm. Prints Markdown tables of median [min-max] time per op and the ratios.",
    )
    mode = b.add_mutually_exclusive_group()
    mode.add_argument("--full", action="store_true", help="every size (1k..1M) and group count (1, N/10, N); minutes")
    mode.add_argument("--quick", action="store_true", help="the default: N in 1k,10k,100k, G=N/10, under a minute")
    mode.add_argument("--smoke", action="store_true", help="a few seconds; checks that everything runs")
    b.add_argument("--sizes", type=_int_list, metavar="N,N", help="queued message counts, e.g. 1k,10k,1M")
    b.add_argument("--groups", type=_str_list, metavar="G,G", help="group counts: 1, N/10, N or a number")
    b.add_argument("--repeats", type=int, metavar="R", help="repeats of every measurement")
    b.add_argument("--ops", type=int, metavar="K", help="ops timed per measurement (fast implementations)")
    b.add_argument(
        "--impls", type=_str_list, metavar="I,I", help=f"implementations, from: {','.join(ALL_IMPLS)}"
    )
    b.add_argument(
        "--workloads", type=_str_list, metavar="W,W", help=f"workloads, from: {','.join(WORKLOADS)}"
    )
    b.add_argument("--memory-n", type=int, metavar="N", help="N for the memory/GC measurements (0: skip)")
    b.add_argument(
        "--batch-n", type=_int_list, metavar="N,N", help="N of the batched cycle (G = N/10), e.g. 10k,1M"
    )
    b.add_argument("--batch-sizes", type=_int_list, metavar="K,K", help="batch sizes, e.g. 1,16,64,256")
    b.add_argument("--control-n", type=_int_list, metavar="N", help="N of the control-plane measurement (G = N/10)")
    b.add_argument("--no-batches", action="store_true", help="skip the batch and control-plane measurements")
    b.add_argument("--no-memory", action="store_true", help="skip the memory and GC measurements")
    b.add_argument("--json", metavar="FILE", help="write the full results as JSON")
    b.add_argument("--markdown", metavar="FILE", help="write the Markdown report to FILE")
    b.add_argument("--plot", metavar="FILE.png", help="plot time per cycle vs N (needs matplotlib)")
    b.add_argument("--no-progress", action="store_true", help="no progress display on stderr")
    b.add_argument(
        "--no-waiting", action="store_true", help="skip the waiting measurements (wake-up latency, throughput)"
    )
    b.add_argument(
        "--waiting-only",
        action="store_true",
        help="only the waiting measurements: wake-up latency (thread and asyncio) and worker throughput",
    )
    b.add_argument("--wake-samples", type=int, metavar="S", help="wake-up samples per implementation and repeat")
    b.add_argument(
        "--sqlite",
        action="store_true",
        help="run the SQLite benchmark instead: SQLiteTransport against persist-queue, litequeue and huey "
        "(its own options: leasequeue bench --sqlite --help)",
    )
    b.add_argument(
        "--postgres",
        action="store_true",
        help="run the PostgreSQL benchmark instead: PostgresTransport against procrastinate and PGQueuer "
        "on one server (its own options: leasequeue bench --postgres --help)",
    )
    b.add_argument(
        "--worker",
        action="store_true",
        help="run the worker benchmark instead: leasequeue.Worker against a bare loop, dramatiq, huey, "
        "procrastinate and PGQueuer (its own options: leasequeue bench --worker --help)",
    )
    b.add_argument(
        "--from-json",
        metavar="FILE",
        help="measure nothing: re-render the report (and --plot/--markdown) from a saved --json FILE",
    )
    return parser


def _bench(args: argparse.Namespace) -> int:
    from . import bench

    if args.full:
        cfg = bench.BenchConfig.full()
    elif args.smoke:
        cfg = bench.BenchConfig.smoke()
    else:
        cfg = bench.BenchConfig.quick()
    if args.sizes:
        cfg.sizes = args.sizes
    if args.groups:
        cfg.groups = args.groups
        cfg.memory_groups = [g for g in args.groups if g.upper() in ("1", "N/10", "N")] or args.groups[:1]
    if args.repeats:
        cfg.repeats = max(1, args.repeats)
    if args.ops:
        cfg.ops = max(1, args.ops)
    if args.impls:
        bad = [i for i in args.impls if i not in bench.ALL_IMPLS]
        if bad:
            sys.stderr.write(f"unknown implementation(s): {', '.join(bad)}\n")
            return 2
        cfg.impls = args.impls
    if args.workloads:
        bad = [w for w in args.workloads if w not in bench.WORKLOADS]
        if bad:
            sys.stderr.write(f"unknown workload(s): {', '.join(bad)}\n")
            return 2
        cfg.workloads = args.workloads
    if args.batch_n:
        cfg.batch_n = args.batch_n
    if args.batch_sizes:
        cfg.batch_sizes = args.batch_sizes
    if args.control_n:
        cfg.control_n = args.control_n[0]
    if args.no_batches:
        cfg.batch_n = []
        cfg.control_n = None
    if args.memory_n is not None:
        cfg.memory_n = args.memory_n or None
    elif args.sizes:
        cfg.memory_n = max(args.sizes)
    if args.no_waiting:
        cfg.waiting = False
    if args.waiting_only:
        cfg.waiting = True
        cfg.workloads = []
        cfg.batch_n = []
        cfg.control_n = None
        args.no_memory = True
    if args.wake_samples:
        cfg.wake_samples = max(2, args.wake_samples)
    if args.from_json:
        with open(args.from_json, encoding="utf-8") as f:
            report = json.load(f)
        saved = bench.BenchConfig(**report["meta"]["config"])
        report["targets"] = bench.evaluate_goals(
            saved,
            report["results"],
            report["ratios"],
            report["memory"],
            report.get("waiting"),
            report.get("batches"),
        )
    else:
        report = bench.run(cfg, progress=not args.no_progress, memory=not args.no_memory)
    md = bench.render_markdown(report)
    sys.stdout.write(md + "\n")
    summary = bench.render_summary(report)
    if summary:
        sys.stdout.write(summary + "\n")
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(md)
    if args.json and not args.from_json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
    if args.plot:
        msg = bench.write_plot(report, args.plot)
        if msg:
            sys.stderr.write(msg + "\n")
        else:
            sys.stderr.write(f"plot written to {args.plot}\n")
    if report["meta"]["missing"]:
        for impl, why in report["meta"]["missing"].items():
            sys.stderr.write(f"note: {impl} not measured: {why}\n")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``leasequeue`` console script and ``python -m leasequeue``."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["bench"] and "--postgres" in args_list[1:] and "--worker" not in args_list[1:]:
        # The PostgreSQL benchmark has options of its own (--conninfo, --sync, ...).
        from .bench.postgres import main as postgres_main

        return postgres_main([a for a in args_list[1:] if a != "--postgres"])
    if args_list[:1] == ["bench"] and "--worker" in args_list[1:]:
        # The worker benchmark (its own --postgres means "also PostgreSQL").
        from .bench.worker import main as worker_main

        return worker_main([a for a in args_list[1:] if a != "--worker"])
    if args_list[:1] == ["bench"] and "--sqlite" in args_list[1:]:
        from .bench.sqlite import main as sqlite_main

        return sqlite_main([a for a in args_list[1:] if a != "--sqlite"])
    parser = build_parser()
    args = parser.parse_args(args_list)
    if args.command == "bench":
        try:
            return _bench(args)
        except KeyboardInterrupt:
            sys.stderr.write("\ninterrupted\n")
            return 130
    if args.command == "worker":
        from ._cli import main_worker

        return main_worker(args)
    if args.command == "queue":
        from ._cli import main_queue

        return main_queue(args)
    if args.command == "dashboard":
        from ._cli_dashboard import main_dashboard

        return main_dashboard(args)
    if args.command == "info":
        print(_version_string())
        return 0
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
