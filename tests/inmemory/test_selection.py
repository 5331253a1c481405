"""Which implementation ``import leasequeue`` picks, and that the choice is
loud and checkable (yarl's pattern): this test FAILS when the extension
should have loaded but did not, instead of silently testing the pure twin.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import leasequeue
from leasequeue.testing import ManualClock

NO_EXTENSIONS = bool(os.environ.get("LEASEQUEUE_NO_EXTENSIONS"))

PROBE = """
import json, leasequeue
t = leasequeue.InMemoryTransport()
t.publish("g", "e")
print(json.dumps({
    "implementation": leasequeue.IMPLEMENTATION,
    "transport": leasequeue.InMemoryTransport.__module__,
    "lease": leasequeue.Lease.__module__,
    "lease_is_class_of_leases": type(t.claim("w", 1)) is leasequeue.Lease,
    "stats": type(t.stats()) is leasequeue.TransportStats,
}))
"""


def probe(no_extensions: str | None) -> dict[str, Any]:
    """Import leasequeue in a fresh interpreter with the variable set (or not)."""
    env = dict(os.environ)
    env.pop("LEASEQUEUE_NO_EXTENSIONS", None)
    if no_extensions is not None:
        env["LEASEQUEUE_NO_EXTENSIONS"] = no_extensions
    package_root = str(Path(leasequeue.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([package_root, env.get("PYTHONPATH", "")])
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    return json.loads(out.stdout)


def compiled_module() -> ModuleType:
    try:
        return importlib.import_module("leasequeue._backends.inmemory.transport_c")
    except ImportError as exc:
        pytest.fail(f"the Cython extension should have loaded but did not: {exc!r}")


def test_extension_is_selected_unless_disabled() -> None:
    if NO_EXTENSIONS:
        assert leasequeue.IMPLEMENTATION == "python"
        pure = importlib.import_module("leasequeue._backends.inmemory.transport_py")
        assert leasequeue.InMemoryTransport is pure.InMemoryTransport
        return
    compiled = compiled_module()
    assert leasequeue.IMPLEMENTATION == "cython"
    assert leasequeue.InMemoryTransport is compiled.InMemoryTransport
    assert leasequeue.Lease is compiled.Lease


def test_environment_variable_forces_pure() -> None:
    for value in ("1", "yes", "0"):  # any non-empty value
        result = probe(value)
        assert result["implementation"] == "python", value
        assert result["transport"] == result["lease"] == "leasequeue._backends.inmemory.transport_py"
        assert result["lease_is_class_of_leases"] and result["stats"]


def test_empty_environment_variable_does_not_force_pure() -> None:
    if NO_EXTENSIONS:
        pytest.skip("pure-only run: the extension is not expected")
    compiled_module()
    for value in (None, ""):
        result = probe(value)
        assert result["implementation"] == "cython", repr(value)
        assert result["transport"] == result["lease"] == "leasequeue._backends.inmemory.transport_c"
        assert result["lease_is_class_of_leases"] and result["stats"]


def test_public_lease_is_the_class_of_the_public_transports_leases() -> None:
    t = leasequeue.InMemoryTransport(clock=ManualClock())
    t.publish("g", "e")
    lease = t.claim("w", 1)
    assert type(lease) is leasequeue.Lease
    assert type(t.stats()) is leasequeue.TransportStats
    assert type(t.extend(lease, 5)) is leasequeue.Lease


def test_public_names() -> None:
    for name in ("InMemoryTransport", "Lease", "LeaseLost", "TransportStats", "IMPLEMENTATION", "__version__"):
        assert name in leasequeue.__all__ and hasattr(leasequeue, name)
    assert leasequeue.IMPLEMENTATION in ("cython", "python")


def test_lease_lost_caught_for_both_implementations(impl: ModuleType) -> None:
    assert impl.LeaseLost is leasequeue.LeaseLost
    assert issubclass(leasequeue.LeaseLost, leasequeue.LeaseQueueError)
    t = impl.InMemoryTransport(clock=ManualClock())
    t.publish("g", "e")
    lease = t.claim("w", 1)
    t.ack(lease)
    for op in (t.ack, t.nack, lambda x: t.extend(x, 1)):
        try:
            op(lease)
        except leasequeue.LeaseLost as exc:
            assert type(exc) is leasequeue.LeaseLost
        else:
            pytest.fail("no LeaseLost")


def _run_copy(tmp_path: Any, broken: bool) -> "subprocess.CompletedProcess[str]":
    """Import a copy of the package whose extension is missing, or broken."""
    import shutil

    src = Path(leasequeue.__file__).resolve().parent
    dst = tmp_path / "leasequeue"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("transport_c*", "__pycache__"))
    if broken:
        (dst / "_backends" / "inmemory" / "transport_c.py").write_text('raise ImportError("simulated ABI mismatch")\n')
    env = {k: v for k, v in os.environ.items() if k != "LEASEQUEUE_NO_EXTENSIONS"}
    env["PYTHONPATH"] = str(tmp_path)
    code = "import leasequeue; print(leasequeue.IMPLEMENTATION)"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)


def test_broken_extension_falls_back_loudly(tmp_path: Any) -> None:
    out = _run_copy(tmp_path, broken=True)
    assert out.stdout.strip() == "python"
    assert "RuntimeWarning" in out.stderr and "simulated ABI mismatch" in out.stderr


def test_missing_extension_falls_back_quietly(tmp_path: Any) -> None:
    out = _run_copy(tmp_path, broken=False)
    assert out.stdout.strip() == "python"
    assert "Warning" not in out.stderr
