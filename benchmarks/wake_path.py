"""Where a wake-up's time goes: the pure twin's publish -> waiting claim path,
step by step, against ``queue.Queue``'s put -> get, with caches cold; and the
whole wake-up across two threads, against another version of the pure twin
in the same process.

    python3 benchmarks/wake_path.py              # 9 interleaved repeats
    python3 benchmarks/wake_path.py --repeats 15 --baseline-ref 9e92f20
    python3 benchmarks/wake_path.py --baseline /tmp/old_transport_py.py

``leasequeue bench --waiting-only`` measures the whole wake-up across two
threads, where the thread switch dominates and a loaded machine moves the
figures by half; and it can only measure the tree it runs from.  This
script measures, interleaved in one process:

**The two-thread wake-up** (``--samples`` per repeat, the bench's method:
the consumer blocks in ``claim(timeout=None)`` / ``get()``, the producer
waits 0.3 ms more, reads the clock and publishes / puts; the consumer reads
the clock as its call returns): p50 and p99 of each repeat, and their
ratios to ``queue.Queue``'s in the same repeat (medians over repeats), for
this tree's pure twin and the baseline.

**The cold costs**, in one thread, of the two pieces of that path that are
the transport's own code, each right after a 0.3 ms sleep (as in the bench,
where the producer sleeps before it publishes, so the code runs on cold
caches -- measured so, it costs several times what a hot loop says):

* **publisher**: ``publish`` with one claim waiting, until it returns (the
  hand-off and the wake-up call included); for ``queue.Queue``, ``put``
  with one getter waiting (its ``Condition`` waiter lock released);
* **consumer**: what the woken claim runs before it returns
  (``_wait_end`` and the lease); for ``queue.Queue`` what ``get`` runs
  after its waiter lock is released (the ``Condition`` lock again,
  ``_get``, ``not_full.notify``);
* and, for the attribution, ``publish`` alone and ``claim`` alone (no claim
  waiting), cold too.

``--baseline FILE`` / ``--baseline-ref REF``: the other version of the pure
twin's module (a file, or this file's path at a git commit of this
repository, from a tree with the same layout), loaded beside this tree's
(its relative imports resolve in the same package).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import queue
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from _thread import allocate_lock
from typing import Any, Callable, Dict, List, Optional, Tuple

perf = time.perf_counter_ns
GAP = 0.0003
#: The pure twin's module in the tree (for --baseline-ref).
MODULE_PATH = "src/leasequeue/_backends/inmemory/transport_py.py"


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


_Pair = Tuple[Callable[[int], Any], Callable[[], Any], Callable[[Any], Any], Callable[[], Any]]


def _pair(module: Optional[Any]) -> _Pair:
    """(put, get, done, close) of one producer/consumer pair, as the bench makes them."""
    if module is None:
        q: Any = queue.Queue()
        return q.put, q.get, _nothing, _nothing
    t = module.InMemoryTransport()
    return (lambda i: t.publish("g", i)), (lambda: t.claim("c", 30.0, timeout=None)), t.ack, t.close


def _nothing(*_args: Any) -> None:
    return None


def _threads(module: Optional[Any], samples: int) -> Tuple[float, float]:
    """(p50, p99) ns of the two-thread wake-up (``leasequeue.bench.waiting``'s method)."""
    from leasequeue.bench.waiting import _percentile, _producer

    put, get, finish, close = _pair(module)
    waiting = [-1]
    done = [0] * samples
    errors: List[BaseException] = []

    def consumer() -> None:
        try:
            for i in range(samples):
                waiting[0] = i
                item = get()
                done[i] = perf()
                finish(item)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    th = threading.Thread(target=consumer, daemon=True)
    th.start()
    try:
        sent = _producer(put, samples, waiting, done, th.is_alive)
    finally:
        close()
    th.join(30)
    if errors:
        raise errors[0]
    lat = [d - s for d, s in zip(done, sent)]
    return _percentile(lat, 0.50), _percentile(lat, 0.99)


def _load(path: str, beside: Any) -> Any:
    """``path`` as a module of ``beside``'s package (its relative imports resolve there)."""
    spec = importlib.util.spec_from_file_location(beside.__name__ + "_baseline", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _at_ref(ref: str) -> str:
    """This tree's pure twin at git ``ref``, written to a temporary file."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    text = subprocess.run(["git", "-C", root, "show", f"{ref}:{MODULE_PATH}"], check=True,
                          capture_output=True, text=True).stdout
    fd, path = tempfile.mkstemp(suffix="_transport_py.py")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--samples", type=int, default=200, help="cold-cost samples per repeat")
    parser.add_argument("--wake-samples", type=int, default=400, help="two-thread wake-ups per repeat (0: skip)")
    parser.add_argument("--baseline", metavar="FILE",
                        help="another copy of the pure twin (transport_py.py) to measure alongside")
    parser.add_argument("--baseline-ref", metavar="REF",
                        help=f"the pure twin at this git commit ({MODULE_PATH}) as the baseline")
    args = parser.parse_args()
    from leasequeue.bench.impls import load

    pure = sys.modules[load("pure").__module__]  # the pure twin's module, wherever the tree keeps it
    contenders: Dict[str, Any] = {"pure": pure, "queue.Queue": None}
    baseline = args.baseline or (_at_ref(args.baseline_ref) if args.baseline_ref else None)
    if baseline:
        name = f"baseline ({args.baseline_ref})" if args.baseline_ref and not args.baseline else "baseline"
        contenders = {name: _load(baseline, pure), **contenders}
    runs: Dict[str, List[Dict[str, float]]] = {k: [] for k in contenders}
    wakes: Dict[str, List[Tuple[float, float]]] = {k: [] for k in contenders}
    rng = random.Random(1)
    for _ in range(args.repeats):
        order: List[Tuple[str, Any]] = list(contenders.items())
        rng.shuffle(order)
        for name, module in order:
            if args.wake_samples:
                wakes[name].append(_threads(module, args.wake_samples))
        rng.shuffle(order)
        for name, module in order:
            runs[name].append(_queue(args.samples) if module is None else _pure(module, args.samples))
    if args.wake_samples:
        ref = wakes["queue.Queue"]
        print(f"two-thread wake-up, µs (publish/put in one thread to claim/get returning in another; "
              f"{args.wake_samples} samples per repeat, {args.repeats} interleaved repeats; cells: median over "
              "repeats of each repeat's p50 / p99; ratios: median of the per-repeat ratios to queue.Queue's)")
        print("| | p50 | p99 | p50 / queue.Queue | p99 / queue.Queue |")
        print("|---|---:|---:|---:|---:|")
        for name, rows in wakes.items():
            p50 = statistics.median(r[0] for r in rows) / 1e3
            p99 = statistics.median(r[1] for r in rows) / 1e3
            r50 = statistics.median(a[0] / b[0] for a, b in zip(rows, ref))
            r99 = statistics.median(a[1] / b[1] for a, b in zip(rows, ref))
            print(f"| {name} | {p50:.1f} | {p99:.1f} | {r50:.2f}× | {r99:.2f}× |")
        print()
    print(f"cold costs, µs (median over {args.repeats} interleaved repeats of the per-repeat medians of "
          f"{args.samples} samples, each after a {GAP * 1e3:.1f} ms sleep)")
    keys = ["publisher", "consumer", "publish alone", "claim alone"]
    print("| | " + " | ".join(keys) + " | publisher + consumer | / queue.Queue |")
    print("|---|" + "---:|" * (len(keys) + 2))
    ref_both = [r["publisher"] + r["consumer"] for r in runs["queue.Queue"]]
    for name, rows in runs.items():
        cells = []
        for k in keys:
            cells.append(f"{statistics.median(r[k] for r in rows) / 1e3:.1f}" if k in rows[0] else "-")
        both = statistics.median(r["publisher"] + r["consumer"] for r in rows) / 1e3
        ratio = statistics.median((r["publisher"] + r["consumer"]) / b for r, b in zip(rows, ref_both))
        print(f"| {name} | " + " | ".join(cells) + f" | {both:.1f} | {ratio:.2f}× |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
