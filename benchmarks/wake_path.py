"""Where a wake-up's time goes: the pure twin's publish -> waiting claim path,
step by step, against ``queue.Queue``'s put -> get, with caches cold.

    python3 benchmarks/wake_path.py              # 9 interleaved repeats of 200 samples
    python3 benchmarks/wake_path.py --repeats 15 --baseline /tmp/old_transport_py.py

``leasequeue bench --waiting-only`` measures the whole wake-up across two
threads, where the thread switch dominates and a loaded machine moves the
figures by half.  This measures, in one thread, the two pieces of it that
are the transport's own code, each right after a 0.3 ms sleep (as in the
bench, where the producer sleeps before it publishes, so the code runs on
cold caches -- measured so, it costs several times what a hot loop says):

* **publisher**: ``publish`` with one claim waiting, until it returns (the
  hand-off and the wake-up call included); for ``queue.Queue``, ``put``
  with one getter waiting (its ``Condition`` waiter lock released);
* **consumer**: what the woken claim runs before it returns
  (``_wait_end`` and the lease); for ``queue.Queue`` what ``get`` runs
  after its waiter lock is released (the ``Condition`` lock again,
  ``_get``, ``not_full.notify``);
* and, for the attribution, ``publish`` alone and ``claim`` alone (no claim
  waiting), cold too.

``--baseline FILE``: also measure another version of the pure twin's module
(e.g. ``git show d13ce49:src/leasequeue/_backends/inmemory/transport_py.py > FILE``, from a
tree with the same layout), loaded beside this tree's (its relative imports
resolve in the same package), in the same repeats.
"""

from __future__ import annotations

import argparse
import importlib.util
import queue
import random
import statistics
import sys
import time
from _thread import allocate_lock
from typing import Any, Dict, List, Tuple

perf = time.perf_counter_ns
GAP = 0.0003


def _pure(module: Any, n: int) -> Dict[str, float]:
    t = module.InMemoryTransport()
    pub: List[int] = []
    end: List[int] = []
    alone: List[int] = []
    claim: List[int] = []
    for i in range(n):
        lock = allocate_lock()
        lock.acquire()
        rec = t._waiter("c", 30.0, 0, lock.release)
        t._wait_start(rec)
        time.sleep(GAP)
        a = perf()
        t.publish("g", i)
        b = perf()
        lease = t._wait_end(rec, True)
        c = perf()
        t.ack(lease)
        time.sleep(GAP)
        d = perf()
        t.publish("g", i)
        e = perf()
        time.sleep(GAP)
        f = perf()
        lease = t.claim("c", 30.0)
        g = perf()
        t.ack(lease)
        pub.append(b - a)
        end.append(c - b)
        alone.append(e - d)
        claim.append(g - f)
    return {"publisher": statistics.median(pub), "consumer": statistics.median(end),
            "publish alone": statistics.median(alone), "claim alone": statistics.median(claim)}


def _queue(n: int) -> Dict[str, float]:
    q: Any = queue.Queue()
    pub: List[int] = []
    end: List[int] = []
    for i in range(n):
        waiter = allocate_lock()
        waiter.acquire()
        q.not_empty._waiters.append(waiter)  # a getter waiting, as Condition.wait leaves it
        time.sleep(GAP)
        a = perf()
        q.put(i)
        b = perf()
        with q.not_empty:  # the rest of get() once its waiter lock is released
            q._get()
            q.not_full.notify()
        c = perf()
        pub.append(b - a)
        end.append(c - b)
    return {"publisher": statistics.median(pub), "consumer": statistics.median(end)}


def _load(path: str, beside: Any) -> Any:
    """``path`` as a module of ``beside``'s package (its relative imports resolve there)."""
    spec = importlib.util.spec_from_file_location(beside.__name__ + "_baseline", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--baseline", metavar="FILE",
                        help="another copy of the pure twin (transport_py.py) to measure alongside")
    args = parser.parse_args()
    from leasequeue.bench.impls import load

    pure = sys.modules[load("pure").__module__]  # the pure twin's module, wherever the tree keeps it
    contenders: Dict[str, Any] = {"pure": pure, "queue.Queue": None}
    if args.baseline:
        contenders = {"baseline": _load(args.baseline, pure), **contenders}
    runs: Dict[str, List[Dict[str, float]]] = {k: [] for k in contenders}
    rng = random.Random(1)
    for _ in range(args.repeats):
        order: List[Tuple[str, Any]] = list(contenders.items())
        rng.shuffle(order)
        for name, module in order:
            runs[name].append(_queue(args.samples) if module is None else _pure(module, args.samples))
    print(f"cold costs, µs (median over {args.repeats} interleaved repeats of the per-repeat medians of "
          f"{args.samples} samples, each after a {GAP * 1e3:.1f} ms sleep)")
    keys = ["publisher", "consumer", "publish alone", "claim alone"]
    print("| | " + " | ".join(keys) + " | publisher + consumer |")
    print("|---|" + "---:|" * (len(keys) + 1))
    for name, rows in runs.items():
        cells = []
        for k in keys:
            cells.append(f"{statistics.median(r[k] for r in rows) / 1e3:.1f}" if k in rows[0] else "-")
        both = statistics.median(r["publisher"] + r["consumer"] for r in rows) / 1e3
        print(f"| {name} | " + " | ".join(cells) + f" | {both:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
