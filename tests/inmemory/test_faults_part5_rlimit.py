"""Running out of memory in Part 5's publishes changes nothing (issue 29), under a capped address space.

A publish with a delay or a key allocates everything it needs (the message
and group slots, the mark table's entry, the scheduled heap's, the key
dict's) before it changes anything, and a batch does so for all its items:
so a ``MemoryError`` leaves the transport as it was, no seq used up, no key
held, no message counted as scheduled.  Each case runs in a subprocess
whose address space is capped, next to an untouched twin built the same
way (``test_faults_part2.PRELUDE``): afterwards the two must be the same.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from helpers import CPYTHON_ONLY_REASON, IS_CPYTHON, package_root
from test_faults_part2 import PRELUDE, TESTS, UNDER_ASAN

CASES = {
    # keyed publishes with a delay until memory runs out: a prefix of them
    # went through, and the first that failed holds no key
    "publish": """
        import time
        done = []
        give_up = time.monotonic() + 60
        cap(4 * 2**20)
        outcome = "done"
        try:
            for i in range(2_000_000):
                done.append(a.publish("g%d" % (i % 1000), None, delay=5.0, key="k%d" % i))
                if not i % 64 and time.monotonic() > give_up:
                    # at the limit the interpreter can crawl (small allocations
                    # trickle through page by page) instead of raising
                    outcome = "crawl"
                    break
        except MemoryError:
            outcome = "nomem"
        uncap()
        if outcome == "crawl":
            print(outcome, len(done))
            sys.exit(0)
        # The MemoryError may come from this loop's own bookkeeping (growing
        # ``done``, a new int) after a publish returned: the transport says how
        # many went through, and ``done`` may lack the last of them.
        k = len(a)
        assert done == list(range(1, len(done) + 1)) and len(done) in (k, k - 1), (len(done), k)
        for i in range(k):
            b.publish("g%d" % (i % 1000), None, delay=5.0, key="k%d" % i)
        assert a.stats() == b.stats() and a.stats().scheduled == k
        for t in both:  # the failed one's key is free, the others are held
            assert t.publish("g%d" % (k % 1000), None, key="k%d" % k) == k + 1
            assert t.publish("g0", None, key="k0") == 1
        same()
    """,
    # a batch of keyed items with a delay: everything or nothing
    "publish_many": """
        for t in both:
            for i in range(50_000):
                t.publish("g%d" % (i % 5_000), None, key="old%d" % i)
        # items i and i + 100_000 share group and key: the later ones publish nothing
        items = [("new%d" % (i % 100_000), None, i % 5, "k%d" % (i % 100_000)) for i in range(300_000)]
        before = len(a)
        cap(8 * 2**20)
        try:
            seqs = a.publish_many(items, delay=3.0)
            outcome = "done"
        except MemoryError:
            outcome = "nomem"
        uncap()
        n = len(a)
        assert n in (before, before + 100_000), (n, before)
        if n != before:
            assert b.publish_many(items, delay=3.0) == seqs
        assert a.publish("x", None, key="k0") == b.publish("x", None, key="k0"), "keys or seqs differ"
        assert a.publish("new0", None, key="k0") == b.publish("new0", None, key="k0"), "keys or seqs differ"
        assert a.stats() == b.stats()
        same()
    """,
}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs RLIMIT_AS (Linux)")
@pytest.mark.skipif(UNDER_ASAN, reason="AddressSanitizer reserves terabytes of address space: RLIMIT_AS cannot apply")
@pytest.mark.skipif(not IS_CPYTHON, reason=CPYTHON_ONLY_REASON)
@pytest.mark.parametrize("case", list(CASES))
def test_memory_error_changes_nothing(impl: Any, case: str) -> None:
    code = PRELUDE.format(root=package_root(impl), tests=TESTS, module=impl.__name__)
    code += textwrap.dedent(CASES[case]) + "\nprint(outcome)\n"
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=str(64 * 1024))  # see test_faults_part2
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False,
                             env=env)
    except subprocess.TimeoutExpired:  # a crawl so slow it never reached its own minute's check
        pytest.skip("the interpreter crawled at the memory limit (no answer in 300 s) instead of raising MemoryError")
    assert out.returncode == 0, f"exit {out.returncode}\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    if out.stdout.startswith("crawl"):
        pytest.skip("the interpreter crawled at the memory limit instead of raising MemoryError: " + out.stdout)
    outcome = out.stdout.split()[-1]
    print(f"{impl.__name__} {case}: {outcome}")
    assert outcome == "nomem", "the operation did not run out of memory: the test tests nothing"
