"""Memory and garbage-collector cost per queued message, in a fresh interpreter.

For each implementation the parent starts ``python -m leasequeue.bench
--memory-child IMPL N G``, which fills a transport with N messages in G
groups and prints one JSON line: bytes per message by ``tracemalloc`` and by
RSS (Linux), objects the GC tracks per message, and the time of a full
``gc.collect()`` with the messages queued and before filling.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

from .config import BenchConfig, parse_groups
from .fmt import g_label, n_label
from .progress import Progress
from .workloads import State

__all__ = ["child_env", "memory_child", "run_memory"]


def _rss_bytes() -> Optional[int]:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def memory_child(impl: str, n: int, g: int) -> Dict[str, Any]:
    """In a fresh interpreter: memory, GC objects and ``gc.collect()`` time
    for ``n`` queued messages in ``g`` groups."""
    import tracemalloc

    def fill() -> Any:
        return State(impl, n, g, "main", groups).t

    groups = [f"g{i}" for i in range(g)]
    gc.collect()
    empty = []
    for _ in range(3):
        t0 = time.perf_counter()
        gc.collect()
        empty.append(time.perf_counter() - t0)
    rss0 = _rss_bytes()
    objs0 = len(gc.get_objects())
    gc.disable()
    t = fill()
    gc.enable()
    gc.collect()
    rss1 = _rss_bytes()
    objs1 = len(gc.get_objects())
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        gc.collect()
        times.append(time.perf_counter() - t0)
    held = len(t) if impl != "queue" else t.qsize()
    del t
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    t = fill()
    traced = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    del t
    return {
        "impl": impl,
        "n": n,
        "groups": g,
        "held": held,
        "tracemalloc_bytes_per_msg": traced / n,
        "rss_bytes_per_msg": (rss1 - rss0) / n if rss0 is not None and rss1 is not None else None,
        "gc_tracked_objects": objs1 - objs0,
        "gc_tracked_per_msg": (objs1 - objs0) / n,
        "gc_collect_s": statistics.median(times),
        "gc_collect_empty_s": statistics.median(empty),
    }


def run_memory(cfg: BenchConfig, impls: List[str], progress: Progress) -> List[Dict[str, Any]]:
    """One child interpreter per (G spec, implementation) at ``cfg.memory_n``."""
    out: List[Dict[str, Any]] = []
    if not cfg.memory_n:
        return out
    n = cfg.memory_n
    for spec in cfg.memory_groups:
        g = parse_groups(spec, n)
        for impl in impls:
            progress.step(f"memory N={n_label(n)} G={g_label(spec, n)}", impl)
            cmd = [sys.executable, "-m", "leasequeue.bench", "--memory-child", impl, str(n), str(g)]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=child_env())
            if proc.returncode != 0:
                err = proc.stderr.strip()[-500:]
                out.append({"impl": impl, "n": n, "groups": g, "groups_spec": spec, "error": err})
                continue
            rec = json.loads(proc.stdout.strip().splitlines()[-1])
            rec["groups_spec"] = spec
            out.append(rec)
    return out


def child_env() -> Dict[str, str]:
    """The environment for child interpreters: the parent's, with this
    package importable the same way (``sys.path`` of the parent)."""
    env = dict(os.environ)
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = here + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env
