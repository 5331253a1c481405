"""The ``leasequeue`` command line and its benchmark report.

Runs ``python -m leasequeue bench --smoke`` in a subprocess, as a user would,
and checks the shape of what it prints and writes: every implementation that
can be imported appears in the table and in the JSON, with the expected keys.
No timing is asserted (a unit test must not depend on machine speed).
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Set

import pytest

from helpers import CPYTHON_ONLY_REASON, IS_CPYTHON

SRC = Path(__file__).resolve().parents[2] / "src"


def _env() -> Dict[str, str]:
    env = dict(os.environ)
    # Same import path as the test process (PYTHONPATH=src or an installed wheel).
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "leasequeue", *args],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
    )


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def _expected_impls() -> Set[str]:
    expected = {"pure", "queue", "seed"}
    if _importable("leasequeue._backends.inmemory.transport_c"):
        expected.add("cython")
    if _importable("leasequeue.bench._floor"):
        expected.add("floor")
    return expected


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    out = tmp_path_factory.mktemp("bench")
    json_path = out / "bench.json"
    md_path = out / "bench.md"
    proc = _run("bench", "--smoke", "--no-progress", "--json", str(json_path), "--markdown", str(md_path))
    assert proc.returncode == 0, proc.stderr
    return {
        "stdout": proc.stdout,
        "stderr": proc.stderr,
        "json": json.loads(json_path.read_text()),
        "markdown": md_path.read_text(),
    }


def test_version_names_the_package_and_implementation() -> None:
    import leasequeue

    proc = _run("--version")
    assert proc.returncode == 0, proc.stderr
    assert leasequeue.__version__ in proc.stdout
    assert leasequeue.IMPLEMENTATION in proc.stdout


def test_help_lists_the_bench_command() -> None:
    proc = _run("--help")
    assert proc.returncode == 0, proc.stderr
    assert "bench" in proc.stdout
    proc = _run("bench", "--help")
    assert proc.returncode == 0, proc.stderr
    for option in ("--full", "--plot", "--json"):
        assert option in proc.stdout


def test_unknown_implementation_is_refused() -> None:
    proc = _run("bench", "--smoke", "--no-progress", "--impls", "cython,nosuch")
    assert proc.returncode == 2
    assert "nosuch" in proc.stderr


def test_json_has_every_implementation_and_key(smoke: Dict[str, Any]) -> None:
    report = smoke["json"]
    assert set(report) >= {"meta", "results", "ratios", "batches", "memory", "targets"}
    meta = report["meta"]
    assert set(meta["implementations"]) == _expected_impls()
    assert meta["machine"]["python"] == sys.version.split()[0]
    cycle_impls = {r["impl"] for r in report["results"] if r["workload"] == "cycle"}
    assert cycle_impls == _expected_impls()
    workloads = {r["workload"] for r in report["results"]}
    assert workloads == {"cycle", "publish", "claim_ack", "nack", "expiry", "priority"}
    for r in report["results"]:
        keys = {"workload", "n", "groups", "impl", "median_ns", "min_ns", "max_ns", "samples_ns", "extrapolated"}
        assert keys <= set(r)
        assert r["n"] == 1000
        assert r["min_ns"] <= r["median_ns"] <= r["max_ns"]
        assert r["median_ns"] > 0
    # queue.Queue has no leases: it is never run on the lease-only workloads.
    assert not any(r["impl"] == "queue" and r["workload"] in ("nack", "expiry", "priority") for r in report["results"])


def test_header_names_the_cython_that_compiled_the_extension(smoke: Dict[str, Any]) -> None:
    """The version recorded at build time, not whatever Cython is importable now."""
    machine = smoke["json"]["meta"]["machine"]
    if _importable("leasequeue.bench._floor"):
        version = importlib.import_module("leasequeue.bench._floor").CYTHON_VERSION
        assert re.fullmatch(r"\d+\.\d+\.\d+((a|b|rc)\d+)?", version), version
        assert machine["cython"] == version
        assert f"; Cython {version}; leasequeue " in smoke["stdout"]
    else:
        assert machine["cython"] is None
        assert "no compiled extension" in smoke["stdout"]


def test_ratios_are_relative_to_the_fastest_real_transport(smoke: Dict[str, Any]) -> None:
    report = smoke["json"]
    ref = "cython" if "cython" in _expected_impls() else "pure"
    assert report["meta"]["ratio_reference"] == ref
    ratios: List[Dict[str, Any]] = [r for r in report["ratios"] if r["workload"] == "cycle"]
    assert {r["impl"] for r in ratios} == _expected_impls() - {ref}
    assert all(r["ref"] == ref and r["ratio"] > 0 for r in ratios)


@pytest.mark.skipif(not IS_CPYTHON, reason=CPYTHON_ONLY_REASON)
def test_memory_rows_per_implementation(smoke: Dict[str, Any]) -> None:
    memory = smoke["json"]["memory"]
    assert {m["impl"] for m in memory} == _expected_impls()
    for m in memory:
        assert "error" not in m, m
        assert m["held"] == (0 if m["impl"] == "floor" else 1000)
        assert {"tracemalloc_bytes_per_msg", "rss_bytes_per_msg", "gc_tracked_per_msg", "gc_collect_s"} <= set(m)


def test_markdown_table_names_every_implementation(smoke: Dict[str, Any]) -> None:
    md = smoke["markdown"]
    assert smoke["stdout"].startswith(md.rstrip("\n")[:200])
    labels = {
        "cython": "Cython",
        "floor": "floor stub",
        "pure": "pure Python",
        "queue": "queue.Queue",
        "seed": "seed algorithm",
    }
    header = next(line for line in md.splitlines() if line.startswith("| N | G |"))
    for impl in _expected_impls():
        assert labels[impl] in header
    assert "## cycle" in md and "## Performance goals" in md and "## Memory" in md
    # Each goal says why it is set (no reference to an issue a user cannot see).
    goals = smoke["json"]["targets"]
    assert goals and all(g["why"] for g in goals)
    for g in goals:
        assert f"- {g['target']} {g['goal']}: {g['why']}." in md
    assert "issue" not in md.lower()



def test_batches_and_control_plane_sections(smoke: Dict[str, Any]) -> None:
    """The batched cycle per message (each batch size, next to the single-call
    cycles and the floor) and the control plane per call, in the JSON and
    the Markdown; the two batch goals are judged."""
    batches = smoke["json"]["batches"]
    assert set(batches) == {"cycle", "cycle_ratios", "control", "control_ratios"}
    with_batches = _expected_impls() & {"cython", "pure"}
    measured = {(r["impl"], r["k"]) for r in batches["cycle"]}
    expected = {(i, k) for i in with_batches for k in (0, 1, 16, 64, 256)}
    if "floor" in _expected_impls():
        expected.add(("floor", 0))
    assert measured == expected
    for r in batches["cycle"] + batches["control"]:
        assert r["n"] == 1000 and r["groups"] == 100
        assert 0 < r["min_ns"] <= r["median_ns"] <= r["max_ns"]
    refs = {(r["impl"], r["k"], r["ref"]) for r in batches["cycle_ratios"]}
    assert all((i, k, i) in refs for i, k in expected if k)
    assert {(r["impl"], r["op"]) for r in batches["control"]} == {
        (i, op) for i in with_batches for op in ("claim", "pause+resume", "group")
    }
    assert all(r["ref"] == "claim" and r["ratio"] > 0 for r in batches["control_ratios"])
    md = smoke["markdown"]
    assert "## Batches: publish_many + claim_many + ack_many, per message" in md
    assert "## Control plane, per call" in md
    if "cython" in _expected_impls():
        names = [g["target"] for g in smoke["json"]["targets"]]
        assert "Cython batched (k=64) / Cython single calls" in names
        assert "Cython batched (k=64) / floor single calls" in names


def test_seed_baseline_chooses_what_the_transport_chooses() -> None:
    """The benchmark's seed baseline is the seed's algorithm: with a clock that
    advances between claims (where the seed and the SPEC agree) and only
    current leases acked, it must deliver the same messages in the same
    order as the pure transport, including expired-lease re-deliveries."""
    import itertools
    import random

    from leasequeue.bench import SeedTransport
    from leasequeue._backends.inmemory.transport_py import InMemoryTransport

    rng = random.Random(4)
    seed = SeedTransport(clock=itertools.count(1000.0, 1.0).__next__)
    pure = InMemoryTransport(clock=itertools.count(1000.0, 1.0).__next__)
    held: Dict[int, Any] = {}  # seq -> (seed lease, pure lease) of its latest delivery
    deliveries = redeliveries = nones = 0
    for step in range(1500):
        op = rng.random()
        if op < 0.35:
            group = f"g{rng.randrange(6)}"
            prio = rng.randrange(3)
            assert seed.publish(group, step, prio) == pure.publish(group, step, prio)
        elif op < 0.7 or not held:
            floor = rng.choice((0, 0, 1, 2))
            vis = rng.choice((0.5, 30.0, 30.0))
            a, b = seed.claim("w", vis, floor), pure.claim("w", vis, floor)
            assert (a is None) == (b is None), step
            if a is None:
                nones += 1
                continue
            assert (a.seq, a.group_id, a.event) == (b.seq, b.group_id, b.event), step
            redeliveries += b.attempt > 1
            deliveries += 1
            held[a.seq] = (a, b)
        else:
            a, b = held.pop(rng.choice(sorted(held)))
            if rng.random() < 0.7:
                seed.ack(a)
                pure.ack(b)
            else:
                seed.nack(a, 0.0)
                pure.nack(b, 0.0)
        assert len(seed) == len(pure)
    assert deliveries > 200 and redeliveries > 20 and nones > 5


def test_waiting_measurements_are_reported(smoke: Dict[str, Any]) -> None:
    """Wake-up latency (thread and asyncio) and throughput, with every
    contender that imports, ratios to the baselines and the waiting goals."""
    waiting = smoke["json"]["waiting"]
    lq = {"cython", "pure"} & _expected_impls()
    bridges = {m for m in ("janus", "culsans") if _importable(m)}
    assert {r["impl"] for r in waiting["wake_thread"]} == lq | {"queue"} | bridges
    assert {r["impl"] for r in waiting["wake_async"]} == lq | {"asyncio"} | bridges
    for r in waiting["wake_thread"] + waiting["wake_async"]:
        assert len(r["p50_ns"]) == len(r["p99_ns"]) == waiting["repeats"]
        assert 0 < r["median_p50_ns"] <= r["median_p99_ns"]
    assert {(r["impl"], r["threads"]) for r in waiting["throughput"]} == {
        (i, k) for i in lq | {"queue"} for k in (1, 2)
    }
    assert all(r["median_ops_per_s"] > 0 for r in waiting["throughput"])
    assert {r["impl"] for r in waiting["wake_thread_ratios"]} == lq | bridges
    assert all(r["ref"] == "queue" and r["p50"] > 0 for r in waiting["wake_thread_ratios"])
    md = smoke["markdown"]
    assert "## Waiting for work: wake-up latency" in md and "### thread → asyncio" in md
    # Each leasequeue twin's wake-up next to queue.Queue's, as ratios of its p50 and of its p99.
    assert "| implementation | p50 | p99 | p50 / queue.Queue | p99 / queue.Queue |" in md
    ratios = {r["impl"]: r for r in waiting["wake_thread_ratios"]}
    thread_table = md.split("### thread → thread", 1)[1].split("###", 1)[0]
    for impl, label in (("cython", "Cython"), ("pure", "pure Python")):
        if impl in lq:
            row = next(line for line in thread_table.splitlines() if line.startswith(f"| {label} |"))
            assert row.endswith(f"| {ratios[impl]['p50']:.2f}× | {ratios[impl]['p99']:.2f}× |"), row
    assert "## Waiting for work: throughput" in md
    targets = [t["target"] for t in smoke["json"]["targets"]]
    if "cython" in lq:
        assert "thread wake p50: Cython / queue.Queue" in targets
        assert any(t.startswith("asyncio wake p50: Cython / asyncio.Queue") for t in targets)


def test_waiting_only_and_no_waiting(tmp_path: Path) -> None:
    json_path = tmp_path / "w.json"
    proc = _run("bench", "--smoke", "--no-progress", "--waiting-only", "--json", str(json_path))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(json_path.read_text())
    assert report["results"] == [] and report["memory"] == [] and report["waiting"]["wake_thread"]
    assert report["batches"]["cycle"] == [] and report["batches"]["control"] == []
    assert "## Waiting for work" in proc.stdout
    proc = _run("bench", "--smoke", "--no-progress", "--no-waiting", "--no-memory", "--json", str(json_path))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(json_path.read_text())["waiting"] is None
    assert "Waiting for work" not in proc.stdout
