"""Part 5's rows of the bad-input table (``Part5BadInputRules``) on the
referee, in both of its modes, and skipped -- never passed -- with the flag
named on a transport that does not promise Part 5."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable

from leasequeue.testing import ReferenceTransport
from leasequeue.testing._rules_bad_input import Part5BadInputRules


class TestTheReferee(Part5BadInputRules):
    supports_waiting = False

    def make_transport(self, clock: Callable[[], float], **options: Any) -> Any:
        return ReferenceTransport(clock, **options)


class TestTheRefereeOfADurableBackend(Part5BadInputRules):
    supports_waiting = False
    accepts_rebuilt_leases = True
    usable_after_close = False

    def make_transport(self, clock: Callable[[], float], **options: Any) -> Any:
        return ReferenceTransport(clock, accepts_rebuilt_leases=True, usable_after_close=False, **options)


def test_a_transport_without_part5_skips_the_rows_with_the_flag_named(tmp_path: Path) -> None:
    (tmp_path / "test_old.py").write_text(textwrap.dedent('''
        from leasequeue._backends.inmemory.transport_py import InMemoryTransport
        from leasequeue.testing._rules_bad_input import Part5BadInputRules

        class TestOld(Part5BadInputRules):
            supports_later = supports_once = supports_release = False

            def make_transport(self, clock):
                return InMemoryTransport(clock=clock)
    '''))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env_path = ":".join(p for p in sys.path if p and Path(p).is_dir())
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "test_old.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, env={"PYTHONPATH": env_path,
                                                                                           "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "passed" not in done.stdout.strip().splitlines()[-1]
    for flag in ("supports_later", "supports_once", "supports_release"):
        assert f"TestOld.{flag} is False" in done.stdout
