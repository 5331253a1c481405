"""tools/mutate.py, the project's mutation tool (issue 14), on real mutants.

Each run copies the tree and runs pytest on a mutated copy, so these tests
pick a few mutants by what they change (their ids move when the code does)
and a one-file test subset: a mutant a test kills, one listed as equivalent,
and one whose endless loop ``--test-timeout`` ends as a timeout.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import List

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, "tools", "mutate.py")

pytestmark = pytest.mark.skipif(not os.path.exists(TOOL), reason="tools/ is not in this tree (an installed package)")


def mutate(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    # the tool forces the pure twin in its copies; CI's coverage and strict
    # extension settings are for this run, not the tool's
    unset = ("COVERAGE_PROCESS_START", "PYTEST_ADDOPTS", "LEASEQUEUE_REQUIRE_EXTENSIONS", "LEASEQUEUE_COVERAGE")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=ROOT, check=False)


def mutant_line(listing: str, text: str) -> str:
    """The listing line of the one mutant whose line contains ``text``."""
    found: List[str] = [line for line in listing.splitlines() if text in line]
    assert len(found) == 1, (text, found)
    return found[0]


def test_the_mutants_are_listed_with_the_equivalents_marked() -> None:
    out = mutate("--list")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    total = re.fullmatch(r"(\d+) of (\d+) mutants \(\d+ duplicates dropped\)", lines[-1])
    assert total and total.group(1) == total.group(2) and int(total.group(1)) > 1000, lines[-1]
    listing = re.compile(r"\s*\d+ src/leasequeue/_backends/inmemory/transport_py.py:\d+\s+\w+\s+\S")
    assert all(listing.match(line) for line in lines[:-1])
    assert any(line.endswith("[equivalent]") for line in lines)
    assert not all(line.endswith("[equivalent]") for line in lines[:-1])


def test_a_run_tells_killed_equivalent_and_hung_mutants_apart() -> None:
    listing = mutate("--list").stdout
    killed = mutant_line(listing, "InMemoryTransport.stats: self._settle()  ->  pass").split()[0]  # stays busy
    listed = mutant_line(listing, "InMemoryTransport._make_ready: while node is not None:  ->  while True:")
    assert listed.endswith("[equivalent]")
    equivalent = listed.split()[0]
    hung = mutant_line(listing, "InMemoryTransport._expire: heappop(expiry)  ->  pass").split()[0]  # loops for ever
    out = mutate("--mutant", killed, "--mutant", equivalent, "--mutant", hung, "--all-tests",
                 "--test-timeout", "5", "--timeout", "300",
                 "--pytest-args", '-x -q -p no:cacheprovider -p no:coverage_floor -k "python and near_zero" '
                                  "tests/inmemory/test_edges.py")
    report = out.stdout
    assert re.search(rf"\. #{killed} .*\(killed, all tests, .*FAILED tests/inmemory/test_edges.py::", report), report
    assert re.search(rf"e #{equivalent} .*\(equivalent, ", report), report
    assert re.search(rf"T #{hung} .*\(timeout, all tests, .* ran over 5 s\)", report), report
    assert "3 mutants: 1 killed, 1 timeout, 1 equivalent, 0 survived, 0 not-applicable" in report, report
    assert out.returncode == 0, report  # nothing survived that is not listed
