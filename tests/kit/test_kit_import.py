"""``leasequeue.testing`` imports without pytest; only ``TransportContract``
needs it, and says so when it is used."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)


def test_testing_package_imports_without_pytest() -> None:
    done = run(
        """
        import sys
        sys.modules["pytest"] = None  # import pytest -> ImportError
        import leasequeue.testing as kit
        clock = kit.ManualClock()
        clock.advance(5)
        assert clock() == 1005.0
        assert "pytest" not in [m for m in sys.modules if sys.modules[m] is not None]
        try:
            kit.TransportContract
        except ImportError as exc:
            print("ImportError:", exc)
        else:
            raise SystemExit("TransportContract loaded without pytest")
        """
    )
    assert done.returncode == 0, done.stderr
    assert "needs pytest" in done.stdout


def test_transport_contract_is_loaded_on_use() -> None:
    done = run(
        """
        import sys
        import leasequeue.testing as kit
        assert "leasequeue.testing._contract" not in sys.modules
        assert "TransportContract" in dir(kit)
        from leasequeue.testing import TransportContract
        assert TransportContract.__module__ == "leasequeue.testing._contract"
        try:
            kit.NoSuchThing
        except AttributeError:
            print("ok")
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_every_rules_module_has_its_asserts_rewritten() -> None:
    """A ``_rules_*`` module missing from ``_CONTRACT_MODULES`` still runs,
    but its failing rules say only ``AssertionError``, not what they
    compared (the kit-catches tests then cannot tell why a rule failed)."""
    from pathlib import Path

    import leasequeue.testing as kit

    here = Path(kit.__file__).parent
    modules = {f"leasequeue.testing.{p.stem}" for p in here.glob("_rules_*.py")} | {
        "leasequeue.testing._contract", "leasequeue.testing._contract_base"}
    assert modules == set(kit._CONTRACT_MODULES)
