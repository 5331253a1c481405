"""A waiting claim on the main thread ends promptly on an interrupt.

``_thread.interrupt_main()`` only sets the signal flag (it does not
interrupt a blocked wait: the waiting side cuts main-thread waits into
slices for it); a real SIGINT interrupts the wait itself.  Either way the
claim raises ``KeyboardInterrupt`` and leaves nothing leased and nothing
queued.  Each case runs in a fresh interpreter with a hard timeout, so a
claim that fails to end cannot hang the test run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from types import ModuleType

import pytest

from helpers import package_root

#: Signals and a promptness bound: never beside another serial test (tests/conftest.py).
pytestmark = pytest.mark.serial(reason="SIGINT and interrupt_main, and how promptly the claim ends")

SCRIPT = r"""
import _thread, importlib, os, signal, sys, threading, time
# A test run started in the background (`cmd &` in a script) passes SIGINT
# on ignored, and Python then leaves it ignored: handle it as usual.
signal.signal(signal.SIGINT, signal.default_int_handler)
mod = importlib.import_module(sys.argv[1])
how, wait_kind = sys.argv[2], sys.argv[3]
t = mod.InMemoryTransport()
t.publish("busy", 1)
held = t.claim("x", 300.0)  # a lease to watch: the expiry timer is armed too

def fire():
    while t._waiting_count() < 1:
        time.sleep(0.005)
    time.sleep(0.2)
    if how == "interrupt_main":
        _thread.interrupt_main()
    else:
        os.kill(os.getpid(), signal.SIGINT)

threading.Thread(target=fire, daemon=True).start()
start = time.monotonic()
try:
    if wait_kind == "none":
        t.claim("w", 30.0, timeout=None)
    else:
        t.claim("w", 30.0, timeout=600.0)
except KeyboardInterrupt:
    elapsed = time.monotonic() - start
    waiting, leased = t._waiting_count(), t.stats().leased
    t.publish("g", 2)
    after = t.claim("y", 1.0)
    print("interrupted", elapsed, waiting, leased, after.group_id)
else:
    print("not interrupted")
"""


@pytest.mark.skipif(sys.platform == "win32", reason="os.kill(SIGINT) is not a console interrupt on Windows")
@pytest.mark.parametrize("how", ["interrupt_main", "sigint"])
@pytest.mark.parametrize("wait_kind", ["none", "deadline"])
def test_an_interrupt_ends_a_waiting_claim_on_the_main_thread(impl: ModuleType, how: str, wait_kind: str) -> None:
    env = dict(os.environ)
    src = package_root(impl)  # the build under test, installed or in place
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, impl.__name__, how, wait_kind],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    words = proc.stdout.split()
    assert words and words[0] == "interrupted", proc.stdout + proc.stderr
    elapsed, waiting, leased, after = float(words[1]), int(words[2]), int(words[3]), words[4]
    assert elapsed < 30.0  # promptly: the wait was for 600 s or forever
    assert (waiting, leased, after) == (0, 1, "g")  # only the lease held before

