"""Waiting claims use no CPU while they wait (SPEC: no polling loop).

64 threads and 64 asyncio tasks wait for a second, with a lease held (so
the expiry timer is armed and sleeps too), while the main thread itself
waits in a claim (its waits are cut into slices, the only periodic wake-up).
The whole process must use under 50 ms of CPU time in that second:
``time.process_time()``, a resource check, not a speed threshold.  In a
fresh interpreter, so that nothing else of the test run is counted.
"""

from __future__ import annotations

import os
import subprocess
import sys
from types import ModuleType

import pytest

from helpers import package_root

#: A CPU bound: never beside another serial test (tests/conftest.py).
pytestmark = pytest.mark.serial(reason="measures the CPU time of idle waiting against a bound")

SCRIPT = r"""
import asyncio, importlib, sys, threading, time
mod = importlib.import_module(sys.argv[1])
t = mod.InMemoryTransport()
t.publish("busy", 1)
t.claim("x", 600.0)
threads = [threading.Thread(target=t.claim, args=(f"w{i}", 30.0), kwargs={"timeout": None}, daemon=True)
           for i in range(64)]
for th in threads:
    th.start()

async def tasks():
    return await asyncio.gather(*(t.aclaim(f"a{i}", 30.0) for i in range(64)))

results = []
loop_thread = threading.Thread(target=lambda: results.append(asyncio.run(tasks())), daemon=True)
loop_thread.start()
deadline = time.monotonic() + 60
while t._waiting_count() < 128:
    if time.monotonic() > deadline:
        sys.exit("the waiters did not all queue")
    time.sleep(0.01)
time.sleep(0.3)  # let thread start-up settle
cpu0 = time.process_time()
wall0 = time.monotonic()
assert t.claim("main", 30.0, timeout=1.0) is None  # the main thread waits too
cpu = time.process_time() - cpu0
wall = time.monotonic() - wall0
t.close()
for th in threads:
    th.join(30)
loop_thread.join(30)
print(cpu, wall, results == [[None] * 64], sum(th.is_alive() for th in threads))
"""


def test_128_waiting_claims_use_no_cpu_while_idle(impl: ModuleType) -> None:
    env = dict(os.environ)
    src = package_root(impl)  # the build under test, installed or in place
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, impl.__name__], capture_output=True, text=True,
                          env=env, timeout=180, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cpu, wall, closed_all, alive = proc.stdout.split()
    assert float(wall) >= 0.99
    assert float(cpu) < 0.050, f"{float(cpu) * 1000:.1f} ms of CPU in {float(wall):.2f} s of waiting"
    assert closed_all == "True" and alive == "0"  # close() woke every one of them
