#!/usr/bin/env python3
"""Mutation testing of leasequeue's pure-Python modules (issue 14).

Makes small deliberate bugs (*mutants*) in a module, one at a time, and runs
a fast subset of the test suite against each: a mutant the suite does not
notice (*survived*) is a behaviour no test pins down, unless it is
*equivalent* (it cannot change behaviour), which a person decides and
records in ``tools/mutate_equivalent.txt`` with the reason.

    python3 tools/mutate.py                       # the pure twin, every mutant
    python3 tools/mutate.py --jobs 2              # two mutants at a time
    python3 tools/mutate.py --list                # the mutants, without running them
    python3 tools/mutate.py --skip-equivalent     # do not re-run the listed equivalents
    python3 tools/mutate.py --changed-since main  # only lines changed since main
    python3 tools/mutate.py --lines 400-480       # only these lines
    python3 tools/mutate.py --mutant 57 --show    # print one mutant's diff
    python3 tools/mutate.py --mutant 57 --pytest-args "tests/inmemory/test_edges.py -x -q -k python"
    python3 tools/mutate.py src/leasequeue/_validation.py   # another pure module
    python3 tools/mutate.py --test-timeout 20     # a test hung 20 s: a timeout, at once

The source tree is never edited: ``src/``, ``tests/``, ``pyproject.toml``,
``README.md`` and ``docs/`` are copied into a temporary directory per job,
each mutant is written into that copy, and pytest runs there with ``PYTHONPATH`` pointing at it (the
suite's subprocess tests import from the same copy).  By default the pure
twin is forced (``LEASEQUEUE_NO_EXTENSIONS=1``), so only the pure variants
of the tests, the conformance kit's contract and the differential against
the kit's reference run (see ``DEFAULT_PYTEST_ARGS``).

Mutation operators (``op`` in the report):

* ``cmp``      comparison swaps: ``<``/``<=``/``>``/``>=`` each to its
               non-strict/strict twin and to the reverse direction,
               ``==``/``!=``, ``is``/``is not``, ``in``/``not in``
* ``cond``     an ``if``/``while``/conditional-expression test, or one
               operand of ``and``/``or``, replaced by ``True`` / ``False``
* ``negate``   ``if c:`` -> ``if not (c):``; ``not x`` -> ``x``
* ``boolop``   ``and`` <-> ``or``
* ``num``      integer constants +1 / -1, float constants +1.0 / -1.0
* ``arith``    ``+`` <-> ``-``, ``*`` -> ``//``, ``//`` and ``/`` -> ``*``,
               ``%`` -> ``//``, ``**`` -> ``*`` (also in ``+=`` etc.);
               unary minus dropped
* ``stmt``     a simple statement (assignment, call, return, raise, del,
               break, continue) replaced by ``pass``
* ``flow``     ``break`` <-> ``continue``
* ``swap``     ``True`` <-> ``False``, and paired names: ``left``/``right``,
               ``low``/``high``, ``_LEASED``/``_PARKED``, ``_leased``/``_parked``,
               ``min``/``max`` (names and attributes)

Not mutated: docstrings, string constants, annotations, imports,
``assert`` statements (type narrowing; they never fail in correct code),
``__all__``, and lines carrying a ``# pragma: no mutate`` comment.

Result per mutant: *killed* (the tests failed), *timeout* (they did not
finish within ``--timeout``, or with ``--test-timeout N`` one test ran over
N seconds: an infinite loop, also counted as detected),
*survived* (they passed), *equivalent* (survived, and listed in the
equivalents file: printed with its reason), or *not applicable* (the mutant
does not compile).  Exit status 1 when a mutant that is not listed as
equivalent survives, 2 when the unmutated baseline fails.

Runs recorded (pure twin after "Merge integ", 2700 mutants in the module,
1663 on lines changed since 0.1.0 = ``--changed-since 5033c03``).  The whole
changed set does not fit a session on a shared 2-core machine (the default
subset's baseline alone ran over 15 minutes under coverage), so the runs
were over the control plane and the batches with the Part 2 test files
first, which is where their mutants die::

    ARGS='-x -q -p no:cacheprovider -p no:coverage_floor --hypothesis-seed=0 -k "not cython"
          tests/inmemory/test_control_plane.py tests/inmemory/test_batches.py tests/inmemory/test_waiting_control.py
          tests/inmemory/test_edges.py tests/inmemory/test_contract_inmemory.py tests/inmemory/test_faults_part2.py'
    python3 tools/mutate.py --jobs 3 --timeout 150 --skip-equivalent \
        --lines 898-1192,1329-1434,1532-1565,1648-1671 --pytest-args "$ARGS"

* pause, resume, purge, set_priority (lines 898-1015): 183 mutants run,
  152 killed, 31 survived; then 12 of those killed by
  test_faults_part2.py::test_finaliser_in_the_middle_of_a_new_operation...,
  15 listed as equivalent, and the last 4 (``self._busy = True`` ->
  ``pass``/``False`` in ``resume`` and ``purge``) killed by
  test_faults_part2.py::test_finaliser_inside_resume_or_purge_is_refused,
  which makes the collection land where they allocate a counted object
  under the lock (purge compacting a heap, resume shrinking the group table).
* Lease .. _view, __init__, publish, claim (not its waiting part), ack,
  nack, extend, stats (``--changed-since 5033c03 --lines 1-439,582-687,
  692-897``; 302 mutants; the subset test_edges, test_inmemory_specifics,
  test_control_plane, test_batches, test_memory_bounds,
  test_contract_inmemory, test_invariants, ``--timeout 60``): 242 killed,
  11 timeouts, 49 survived.  Of the timeouts, 5 are real endless loops,
  ``_NO_WAIT``'s two are killed by test_parity.py (needs the extension) and
  4 are equivalents that ran the whole subset.  Of the survivors, 6 are
  killed by new tests (test_edges.py::test_round_robin_while_priority_levels_come_and_go,
  test_waiting.py::test_the_expiry_timer_starts_only_when_a_waiting_claim_has_a_lock_to_watch,
  test_memory_bounds.py::test_pause_resume_churn_after_many_claims_does_not_grow_memory),
  4 by test_waiting.py (outside the subset), 27 listed as equivalent; 12
  still survive: claim/extend/stats' ``if self._nwaiting:`` -> ``True``
  (differs only while orphan waiter records exist), extend's serving
  (``False``/``not``/``pass``: test_waiting.py's
  test_other_clock_reading_operations_serve_waiters[extend] kills them only
  when the expiry timer does not serve the waiter first) and nack's
  ``now if delay > 0.0 else None`` (6 variants: whether nack(0) reads the
  clock to serve a waiter).  ``_validation.py`` (192), ``_types.py`` (4)
  and ``_waiting.py`` (236 mutants, all changed since 0.1.0) not run yet.
* set_priority's end, group, groups, publish_many, claim_many (lines
  1016-1127, ``--lines 1016-1192`` stopped after 181 of its 278 mutants):
  128 killed, 53 survived; 2 of those then killed by
  test_control_plane.py::test_group_and_groups_expire_the_earliest_lease_among_several,
  51 not yet classified (mostly the clock/expiry fast paths of group/groups
  and claim_many's argument fast paths, which look equivalent like the
  listed ones; group/groups serving waiting claims after an expiry; and
  publish_many's seq give-back after a failed batch, which no test in the
  subset executes).
* claim_many's end, ack_many, aclaim/close and the batch claim/ack helpers
  (``--lines 1128-1264,1386-1432``, 249 mutants) against a narrow subset
  (tests/inmemory/test_batches.py, test_edges.py, test_control_plane.py, pure only):
  143 killed, 4 timeouts, 102 survived, not classified.  Many are aclaim and
  close mutants that only the waiting tests (not in that subset) execute,
  or _ack_current's compaction thresholds (memory only); two behaviour
  changes among them (``head = 0`` -> ``1``/``-1`` after compaction) are now
  killed by test_batches.py::test_ack_many_through_a_long_group_keeps_its_order.
* group .. ack_many and the helpers ``_current`` .. ``_purge`` (lines
  1027-1192 and 1268-1671 at 992ce5c, changed lines only:
  ``--changed-since 5033c03 --lines 1027-1192,1268-1671``, 636 mutants; this
  supersedes the two bullets above for those lines).  137 detected by the
  previous run (``--lines 1128-1264,1386-1432``) and not run again (133
  killed, 4 timeouts); the other 499 with
  the ARGS above but test_faults_part2.py replaced by its profiler-hook test
  (``--jobs 2``; 39 failure-path mutants of claim_many and _add_batch only
  against the new fault tests): 279 killed, 181 survived.  Then the
  survivors against the new tests (``--all-tests`` with
  ``-k "profiler or taken_back_whole or ..."`` over test_faults_part2,
  test_control_plane, test_waiting_control, test_batches): in all 541
  killed, 4 timeouts, 88 listed as equivalent (fast paths, compaction
  thresholds, empty levels left behind: memory only), 3 surviving:
  ``if self._nwaiting:`` -> ``if True:`` in group, groups and claim_many.
  They serve with no claim waiting, which differs only when a waiting
  claim's record was orphaned (ended from user code nested in an
  operation, ``_wait_end``): serving then ends it at once rather than at the
  next serving with a claim waiting (the waiting section's business).
  A profiler hook (``sys.setprofile``) is how the new tests reach inside an
  operation for sure (the busy guards, failures at the k-th item or claim,
  failed allocations); coverage does not trace code run inside a hook, so
  the per-test line selection reports such mutants as "no test executes
  this line": check those with ``--all-tests``.  (That test,
  test_faults_part2.py::test_a_profiler_hook_inside_an_operation_may_only_publish,
  also kills the 4 ``self._busy = True`` survivors of resume and purge
  above.)
* The orphan fix (after the runs above): ``_settle`` now ends the waits
  ended inside the operation when no claim waits, so the ``if
  self._nwaiting:`` -> ``if True:`` mutants of extend, stats, group, groups
  and claim_many are equivalent (listed); ``_settle``'s new line: 10
  mutants, 9 killed by test_waiting_control.py's
  test_a_wait_ended_inside_another_operation_* tests, 1 equivalent.  The
  other survivors of the Part 1 bullet are killed now: nack's six by
  test_waiting.py::test_nack_serving_a_waiting_claim_reads_the_clock_once,
  extend's three by
  test_waiting.py::test_a_clock_reading_operation_serves_what_its_reading_expired
  (the expiry timer kept out, so they die every time).  Still surviving of
  everything run: 1 (``_serve_waiters``' ``if self._nwaiting or False``).
* (Then not run yet: most of the waiting section, ``_validation.py``,
  ``_types.py``, ``_waiting.py``: run in the session recorded in the last
  bullets.)
* The waiting section (branch mutwait): ``--changed-since 5033c03 --lines
  440-555,697-704,740-745,1206-1260,1672-2000`` selects 546 mutants (60 of
  them listed as equivalent).  Run with the ARGS above replaced by
  ``-k "not cython and not keyboard_interrupt_in_a_woken_thread"
  tests/inmemory/test_waiting.py tests/inmemory/test_waiting_control.py
  tests/inmemory/test_faults_part2.py::test_finaliser_in_the_middle_of_serving_waiting_claims
  tests/inmemory/test_faults_part2.py::test_finaliser_in_the_middle_of_a_new_operation_may_only_publish
  tests/inmemory/test_edges.py tests/inmemory/test_batches.py tests/inmemory/test_control_plane.py``,
  ``--jobs 1 --timeout 120 --skip-equivalent``, two runs at once over
  ``--lines 1672-1839`` and ``--lines 1840-2000``, both stopped at the time
  box: 110 mutants, 88 killed, 8 timeouts, 8 survived, 6 skipped as
  equivalent.  Of the survivors 6 are now listed as equivalent, 1 killed
  (``_serve_waiters`` reading the clock again), 1 left: ``if
  self._nwaiting or False`` in ``_serve_waiters`` (an orphan nested in an
  operation and a claim leaving at once).  3 timeouts are probably slow
  survivors (survivors ran 60-95 s for ~80 tests): ``_arm_timer``'s ``if
  expiry and True`` / ``expiry[-1][0]`` / ``expiry[0][1]``.  Earlier,
  shorter runs killed aclaim's argument checks and default floor, close's
  timer poke and the clock-failure paths with the tests added then.  Not
  reached: the rest of ``_serve_locked`` .. ``_dequeue`` and ``_end_locked``
  .. ``_wait_end``, aclaim/close, claim's serving lines.  The baseline
  crawls in test_keyboard_interrupt_in_a_woken_thread_undoes_its_hand_off
  under the coverage tracer (a pending async exception makes every thread
  give up the GIL at each check): 20+ minutes on the loaded machine, hence
  deselected.

* Session of 2026-11-30 evening (``ARGS_W`` = the waiting-section ARGS
  above; ``--jobs 1`` each, several runs side by side; "killed by a new
  test" was checked one mutant at a time with ``--mutant ID --all-tests``):

  - The waiting section's rest, ``--changed-since 5033c03 --lines
    1750-2004 --timeout 50 --skip-equivalent`` with ``ARGS_W``: 346
    mutants, 267 killed, 20 timeouts (endless loops of ``_serve_nested``
    and ``_close_waiters``), 20 skipped as listed, 39 survived: 19 killed by
    new tests, 20 listed as equivalent, 0 left.  (Lines 1731-1749 ran
    first: 35 mutants, 1 survivor, listed.)  The previous runs' 17
    survivors: 5 killed by new tests, 12 listed.
  - ``_validation.py`` and ``_types.py`` (196 mutants; test_edges,
    test_inmemory_specifics, test_control_plane, test_batches,
    test_waiting, test_contract_inmemory): 174 killed, 22 survived: 13
    killed by new tests (the kit had imported the int64 ends from
    ``_validation`` as its own oracle), 9 listed (fast paths), 0 left.
  - ``_waiting.py`` (236 mutants; test_waiting, test_waiting_control,
    test_waiting_idle, test_waiting_signals, test_readme_waiting and the
    serving finaliser test; ``--timeout 50``): 158 killed, 20 timeouts, 58
    survived: 26 killed by new tests, 28 listed (5 of them marked "timing
    only"), 4 left: ``_MAIN_SLICE`` and ``_MAX_TIMER_SLEEP`` made a second
    longer (an interrupt, or a stood-still manual clock, noticed up to a
    second later: only a timing threshold would tell), and ``poke_timer``'s
    re-read under ``_timers_lock`` dropped (two threads starting the first
    timer at once could start two).  ``IDLE``/``CLOSED`` renumbered are
    killed by the Cython variants (``--env LEASEQUEUE_NO_EXTENSIONS=0 -k
    cython``).
  - Lines unchanged since 0.1.0 (never run before; ``--lines`` = the
    complement of ``git diff -U0 5033c03``, 1037 mutants) with ``ARGS_P`` =
    ``-k "not cython"`` over test_edges, test_contract_inmemory,
    test_inmemory_specifics, test_invariants, test_differential,
    test_memory_bounds, test_control_plane, test_batches; ``--timeout``
    40, then 30.  Stopped at the time box after 837 of the 1037 (not
    reached: most of ack/nack/extend/stats, lines 786-895): 638 killed, 13
    skipped as listed, 120 timeouts, 66 survived: 31 killed by new tests or
    by tests outside that subset (test_faults, test_faults_part2), 18
    listed, 17 left.  The left: ``_add``'s MemoryError rollback (6: the
    group entry or the new empty level left behind, the error swallowed),
    publish's seq give-back when something was published meanwhile (2),
    ack's message-list compaction thresholds (7, probably memory only, not
    checked), ack keeping the acked slot's event referenced until the next
    compaction (1), ``_compact`` not repairing ``best`` (1).  The timeouts
    are not classified: many are mutants every test executes (argument fast
    paths, ``__init__`` constants), whose whole-subset run outlasts 30-40 s
    (those of them that are fast paths are listed now), the rest endless
    loops.

* Session of 2026-12-01 (``ARGS_P2`` = ``ARGS_P`` plus test_faults,
  test_faults_part2 and test_leaks, with ``-k "not cython and not
  memory_error and not failed_allocation_anywhere and not
  clock_faults_under_concurrency and not finaliser"``: the RLIMIT
  subprocess tests crawl under the baseline's coverage tracer and the
  collection-landing tests miss their window there, so mutants only they
  kill were checked one at a time against them):

  - The old Part 1 lines' 17 left: all done.  Killed by tests that existed
    outside the subset (test_faults_part2's failing-allocation test: 3 of
    ``_add``'s rollback; test_leaks: ack keeping the acked slot's event),
    by new tests (``_add`` keeping a level that holds a group and leaving
    no empty one, publish's seq give-back, ack's cut of spent slots: a fed
    group's memory and the cut's amortisation), or listed (the cut's
    threshold +-1; ``_compact``'s ``_repair``: the heap top never changes,
    checked by assertion over 2,828 compactions).
  - The 226 old-line mutants not reached last time (``--mutant`` ids,
    ``--jobs 2 --timeout 150 --skip-equivalent``, ``ARGS_P2``): 174 killed,
    6 timeouts, 46 survived.  Then 21 survivors and the 6 timeouts killed
    by new tests or by the finaliser/profiler tests outside the subset (the
    timeouts: the expiry heap's rebuild dropping every entry or skipping
    heapify, ``_forget`` copying the table of groups on every forget
    (quadratic: ended by a 30 s per-test limit), ``_expire`` not popping
    (endless loop)); 25 listed (tuning constants of the table shrink and
    the rebuild, ``_unready`` of a group that is not ready).
  - The 108 timeouts of last time, again with a 20 s per-test limit
    (``--test-timeout`` did not exist yet: the same SIGALRM by a
    temporary plugin) over test_edges, test_contract_inmemory,
    test_inmemory_specifics, test_invariants, test_control_plane,
    test_batches, ``--all-tests``: 21 skipped as listed, 28 killed (in
    runs of 22-41 s: mostly endless loops the limit ended, not told
    apart), 59 survived, all slow survivors rather than loops.  Of those
    21 killed by new tests or by test_faults/test_faults_part2/
    test_leaks_part2 (the busy guards, ``_settle``'s pending publishes,
    ``_unlock``'s tick and counts: the expiry heap's rebuild pacing), 38
    listed (argument and clock fast paths, guards before ``_expire``,
    ``_unlock`` of a free group, ``group.open`` after ack, tuning
    constants, tick numbering).
  - Result for the 1,037 mutants of the lines unchanged since 0.1.0: 841
    killed in a run, 78 killed by new or other tests, 118 listed as
    equivalent, **0 left**.
  - ``_waiting.py``'s 4 left: ``poke_timer``'s re-read killed by
    test_waiting.py::test_two_threads_starting_the_first_expiry_timer_at_once_start_one
    (the test holds ``_timers_lock`` until both threads queue on it);
    ``_MAIN_SLICE``/``_MAX_TIMER_SLEEP`` a second longer listed as timing
    only.  **0 left.**
  - The waiting section's lines that the records above do not show as run
    (``--changed-since 5033c03 --lines
    440-555,697-704,740-745,1206-1260,1672-1749``, 201 mutants, ``ARGS_W``,
    ``--jobs 2 --timeout 60 --skip-equivalent``): 143 killed, 48 skipped as
    listed, 8 timeouts, 2 survived.  The survivors (close not marking the
    transport busy) are killed by the profiler-hook test of
    test_faults_part2, which now gets inside close too.  The timeouts, again
    with ``--test-timeout 20``: aclaim's default floor 1 is killed by
    test_waiting.py::test_aclaim_floor_defaults_to_zero; the other 7
    (``_serve_locked``'s orphan handling and the serving loop's
    ``continue``/``pass``) hang one waiting test each (a claim never woken):
    detected.  **0 left.**
  - Not re-checked: that every mutant of the other changed lines has a
    result on record (the earlier bullets' runs; their logs are gone).

Equivalents file format: blocks separated by blank lines, ``key: value``
lines; ``file``, ``in`` (enclosing function), ``before`` and ``after`` (the
mutated line(s) with comments and surrounding whitespace removed) identify
a mutant whatever its line number; optional ``nth`` picks one of several
identical mutants in the same function; ``why`` is the reason.  The report
prints a ready-to-paste block for every survivor.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import dataclasses
import difflib
import io
import json
import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tokenize
from typing import Dict, List, Optional, Sequence, Set, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_TARGET = "src/leasequeue/_backends/inmemory/transport_py.py"
DEFAULT_EQUIVALENTS = os.path.join("tools", "mutate_equivalent.txt")

#: The fast subset, fastest and most discriminating files first (``-x`` stops
#: at the first failure, so a killed mutant rarely pays for the slow ones).
#: With the pure twin forced (DEFAULT_ENV) every Cython variant skips;
#: ``-k "not cython"`` does not even collect them (nor the pure-vs-Cython
#: differential).  test_stress (threads, minutes of wall time, little that the
#: rest misses), the kit's own tests (the reference, the broken transports)
#: and the build/CLI/selection tests are left out.
DEFAULT_PYTEST_ARGS = [
    "-x", "-q", "-p", "no:cacheprovider", "-p", "no:coverage_floor", "--hypothesis-seed=0",
    "-k", "not cython",
    "tests/inmemory/test_edges.py",
    "tests/inmemory/test_contract_inmemory.py",
    "tests/inmemory/test_inmemory_specifics.py",
    "tests/inmemory/test_invariants.py",
    "tests/inmemory/test_differential.py",
    "tests/inmemory/test_threads.py",
    "tests/inmemory/test_faults.py",
    "tests/inmemory/test_memory_bounds.py",
    "tests/inmemory/test_leaks.py",
    # Part 2: waiting claims, the control plane, the batches.
    "tests/inmemory/test_waiting.py",
    "tests/inmemory/test_waiting_idle.py",
    "tests/inmemory/test_waiting_signals.py",
    "tests/inmemory/test_control_plane.py",
    "tests/inmemory/test_batches.py",
    "tests/inmemory/test_waiting_control.py",
    "tests/inmemory/test_waiting_wake_path.py",
    "tests/inmemory/test_faults_part2.py",
    "tests/inmemory/test_leaks_part2.py",
]

#: Environment of every test run: the pure twin forced, coverage measurement
#: off, fewer differential runs (the hypothesis examples are derandomised by
#: ``--hypothesis-seed``).
DEFAULT_ENV = {
    "LEASEQUEUE_NO_EXTENSIONS": "1",
    "LEASEQUEUE_COVERAGE": "0",
    "LEASEQUEUE_DIFF_REF_SEEDS": "6",
    "LEASEQUEUE_DIFF_EXAMPLES": "100",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONHASHSEED": "0",
}

COPY_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.c", "*.html", "*.egg-info", ".hypothesis")

SWAP_NAMES = {
    "left": "right", "right": "left",
    "low": "high", "high": "low",
    "_LEASED": "_PARKED", "_PARKED": "_LEASED",
    "_leased": "_parked", "_parked": "_leased",
    "min": "max", "max": "min",
}

CMP_SWAPS: Dict[type, Tuple[type, ...]] = {
    ast.Lt: (ast.LtE, ast.Gt),
    ast.LtE: (ast.Lt, ast.GtE),
    ast.Gt: (ast.GtE, ast.Lt),
    ast.GtE: (ast.Gt, ast.LtE),
    ast.Eq: (ast.NotEq,),
    ast.NotEq: (ast.Eq,),
    ast.Is: (ast.IsNot,),
    ast.IsNot: (ast.Is,),
    ast.In: (ast.NotIn,),
    ast.NotIn: (ast.In,),
}

ARITH_SWAPS: Dict[type, type] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.FloorDiv,
    ast.FloorDiv: ast.Mult,
    ast.Div: ast.Mult,
    ast.Mod: ast.FloorDiv,
    ast.Pow: ast.Mult,
}

OP_SYMBOLS = {
    ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=",
    ast.Is: "is", ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in",
    ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//", ast.Div: "/", ast.Mod: "%", ast.Pow: "**",
}

NO_MUTATE = re.compile(r"#\s*pragma:\s*no mutate")


# ---------------------------------------------------------------- mutants


@dataclasses.dataclass
class Mutant:
    id: int
    file: str  # relative to ROOT, with "/" separators
    line: int
    end_line: int
    qualname: str
    op: str
    before: str  # the mutated line(s): comments and surrounding whitespace removed
    after: str
    source: str  # the whole mutated module
    nth: int = 1  # among mutants with the same (file, qualname, before, after)
    count: int = 1  # how many such mutants there are
    lines: Tuple[int, ...] = ()  # the lines whose execution the mutant changes (for test selection)

    def key(self) -> Tuple[str, str, str, str]:
        return (self.file, self.qualname, self.before, self.after)

    def location(self) -> str:
        return f"{self.file}:{self.line}"

    def diff(self, original: str) -> str:
        lines = difflib.unified_diff(
            original.splitlines(keepends=True), self.source.splitlines(keepends=True),
            fromfile=f"a/{self.file}", tofile=f"b/{self.file}", n=2,
        )
        return "".join(lines)


@dataclasses.dataclass
class Edit:
    """Replace the source between two (line, byte column) positions."""

    node: ast.AST
    start: Tuple[int, int]
    end: Tuple[int, int]
    text: str
    op: str


def _span(node: ast.AST) -> Tuple[Tuple[int, int], Tuple[int, int]]:
    return (node.lineno, node.col_offset), (node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined]


class _Finder(ast.NodeVisitor):
    """Collects the edits (one per mutant) of a module, with their enclosing function."""

    def __init__(self) -> None:
        self.edits: List[Tuple[Edit, str]] = []
        self.scope: List[str] = []

    # -- helpers
    def add(self, node: ast.AST, text: str, op: str, span_node: Optional[ast.AST] = None) -> None:
        start, end = _span(span_node or node)
        self.edits.append((Edit(node, start, end, text, op), ".".join(self.scope) or "<module>"))

    def replace_expr(self, node: ast.expr, new: ast.expr, op: str) -> None:
        self.add(node, ast.unparse(new), op)

    # -- scopes and skipped regions
    def _body(self, body: Sequence[ast.stmt]) -> None:
        for i, stmt in enumerate(body):
            if i == 0 and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) \
                    and isinstance(stmt.value.value, str):
                continue  # docstring
            self.visit(stmt)

    def visit_Module(self, node: ast.Module) -> None:
        self._body(node.body)

    def _function(self, node: ast.AST) -> None:
        assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        self.scope.append(node.name)
        args = node.args
        for default in [*args.defaults, *(d for d in args.kw_defaults if d is not None)]:
            self.visit(default)
        self._body(node.body)
        self.scope.pop()

    visit_FunctionDef = _function
    visit_AsyncFunctionDef = _function

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.scope.append(node.name)
        self._body(node.body)
        self.scope.pop()

    def visit_Import(self, node: ast.AST) -> None:
        pass

    visit_ImportFrom = visit_Import
    visit_Assert = visit_Import
    visit_Global = visit_Import
    visit_Nonlocal = visit_Import
    visit_Pass = visit_Import

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is None:
            return  # a declaration: nothing runs
        self.add(node, "pass", "stmt")
        self.visit(node.value)

    def visit_Assign(self, node: ast.Assign) -> None:
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return
        self.add(node, "pass", "stmt")
        for target in node.targets:
            self.visit(target)
        self.visit(node.value)

    def visit_Expr(self, node: ast.Expr) -> None:
        if isinstance(node.value, ast.Constant):
            return  # a bare string or ellipsis
        self.add(node, "pass", "stmt")
        self.visit(node.value)

    def _simple(self, node: ast.stmt) -> None:
        self.add(node, "pass", "stmt")
        self.generic_visit(node)

    visit_Return = _simple
    visit_Raise = _simple
    visit_Delete = _simple

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self.add(node, "pass", "stmt")
        new_op = ARITH_SWAPS.get(type(node.op))
        if new_op is not None:
            self.replace_stmt(node, ast.AugAssign(target=node.target, op=new_op(), value=node.value), "arith")
        self.generic_visit(node)

    def replace_stmt(self, node: ast.stmt, new: ast.stmt, op: str) -> None:
        self.add(node, ast.unparse(new), op)

    def visit_Break(self, node: ast.Break) -> None:
        self.add(node, "pass", "stmt")
        self.add(node, "continue", "flow")

    def visit_Continue(self, node: ast.Continue) -> None:
        self.add(node, "pass", "stmt")
        self.add(node, "break", "flow")

    # -- conditions
    def _condition(self, test: ast.expr, negate: bool = True) -> None:
        self.add(test, "True", "cond")
        self.add(test, "False", "cond")
        if negate:
            if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
                pass  # visit_UnaryOp drops the ``not``
            else:
                self.add(test, f"not ({ast.unparse(test)})", "negate")

    def visit_If(self, node: ast.If) -> None:
        self._condition(node.test)
        self.visit(node.test)
        self._body(node.body)
        self._body(node.orelse)

    def visit_While(self, node: ast.While) -> None:
        self._condition(node.test, negate=False)
        self.visit(node.test)
        self._body(node.body)
        self._body(node.orelse)

    def visit_IfExp(self, node: ast.IfExp) -> None:
        self._condition(node.test, negate=False)
        self.generic_visit(node)

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        other = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        self.replace_expr(node, ast.BoolOp(op=other, values=node.values), "boolop")
        for value in node.values:
            if not (isinstance(value, ast.Constant) and isinstance(value.value, bool)):
                self.add(value, "True", "cond")
                self.add(value, "False", "cond")
        self.generic_visit(node)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> None:
        if isinstance(node.op, ast.Not):
            self.add(node, ast.unparse(node.operand) if not isinstance(node.operand, (ast.BoolOp, ast.IfExp))
                     else f"({ast.unparse(node.operand)})", "negate")
        elif isinstance(node.op, ast.USub):
            if not isinstance(node.operand, ast.Constant):
                self.add(node, f"({ast.unparse(node.operand)})", "arith")
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        for i, op in enumerate(node.ops):
            for new_op in CMP_SWAPS.get(type(op), ()):
                ops = list(node.ops)
                ops[i] = new_op()
                self.replace_expr(node, ast.Compare(left=node.left, ops=ops, comparators=node.comparators), "cmp")
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        new_op = ARITH_SWAPS.get(type(node.op))
        if new_op is not None:
            self.replace_expr(node, ast.BinOp(left=node.left, op=new_op(), right=node.right), "arith")
        self.generic_visit(node)

    # -- leaves
    def visit_Constant(self, node: ast.Constant) -> None:
        value = node.value
        if isinstance(value, bool):
            self.add(node, repr(not value), "swap")
        elif isinstance(value, int):
            self.add(node, repr(value + 1), "num")
            self.add(node, repr(value - 1), "num")
        elif isinstance(value, float):
            self.add(node, repr(value + 1.0), "num")
            self.add(node, repr(value - 1.0), "num")

    def visit_Name(self, node: ast.Name) -> None:
        other = SWAP_NAMES.get(node.id)
        if other is not None:
            self.add(node, other, "swap")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        other = SWAP_NAMES.get(node.attr)
        if other is not None:
            self.add(node, f"{ast.unparse(node.value)}.{other}", "swap")
        self.visit(node.value)

    # annotations are never visited: arguments' and returns' are skipped by
    # _function, AnnAssign's by visit_AnnAssign
    def visit_arg(self, node: ast.arg) -> None:
        pass


def _normal(text: str) -> str:
    """Lines of code as one key: comments, line breaks and runs of whitespace removed."""
    lines = [line.strip() for line in text.split("\n")]
    cut: Dict[int, int] = {}
    try:
        for tok in tokenize.generate_tokens(io.StringIO("\n".join(lines) + "\n").readline):
            if tok.type == tokenize.COMMENT:
                cut[tok.start[0] - 1] = tok.start[1]
    except (tokenize.TokenError, SyntaxError):
        pass  # a fragment (an unclosed bracket): the comments found so far are enough
    parts = [line[: cut[i]] if i in cut else line for i, line in enumerate(lines)]
    return re.sub(r"\s+", " ", " ".join(p.strip() for p in parts if p.strip()))


def _statement_starts(tree: ast.AST) -> Dict[int, int]:
    """line -> first line of the innermost statement (or compound statement header) holding it."""
    out: Dict[int, int] = {}

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):
                body = getattr(child, "body", None)
                last = child.end_lineno if not body else body[0].lineno - 1  # type: ignore[attr-defined]
                for line in range(child.lineno, max(child.lineno, last) + 1):
                    out[line] = child.lineno
            visit(child)

    visit(tree)
    return out


def generate(path: str, rel: str, first_id: int = 1) -> Tuple[List[Mutant], int]:
    """Every mutant of one module; also returns the number of duplicates dropped."""
    with open(path, encoding="utf-8") as f:
        source = f.read()
    tree = ast.parse(source)
    finder = _Finder()
    finder.visit(tree)
    lines = source.splitlines(keepends=True)
    blines = [line.encode("utf-8") for line in lines]
    skip = {i + 1 for i, line in enumerate(lines) if NO_MUTATE.search(line)}
    starts = _statement_starts(tree)
    mutants: List[Mutant] = []
    seen: Set[str] = set()
    dropped = 0
    for edit, qualname in sorted(finder.edits, key=lambda e: (e[0].start, e[0].end, e[0].op, e[0].text)):
        (l1, c1), (l2, c2) = edit.start, edit.end
        if skip.intersection(range(l1, l2 + 1)):
            continue
        prefix = blines[l1 - 1][:c1].decode("utf-8")
        suffix = blines[l2 - 1][c2:].decode("utf-8")
        segment = prefix + edit.text + suffix
        new_source = "".join(lines[: l1 - 1]) + segment + "".join(lines[l2:])
        if new_source == source or new_source in seen:
            dropped += 1
            continue
        seen.add(new_source)
        before = _normal("".join(lines[l1 - 1: l2]))
        after = _normal(segment)
        mutants.append(Mutant(
            id=first_id + len(mutants), file=rel, line=l1, end_line=l2, qualname=qualname,
            op=edit.op, before=before, after=after, source=new_source,
            lines=tuple(sorted({*range(l1, l2 + 1), *(starts[n] for n in range(l1, l2 + 1) if n in starts)})),
        ))
    groups: Dict[Tuple[str, str, str, str], List[Mutant]] = {}
    for m in mutants:
        groups.setdefault(m.key(), []).append(m)
    for same in groups.values():
        for i, m in enumerate(same, 1):
            m.nth, m.count = i, len(same)
    return mutants, dropped


# ---------------------------------------------------------------- equivalents


@dataclasses.dataclass
class Equivalent:
    file: str
    qualname: str
    before: str
    after: str
    nth: Optional[int]
    why: str
    line: int  # in the equivalents file
    used: bool = False

    def matches(self, m: Mutant) -> bool:
        return m.key() == (self.file, self.qualname, self.before, self.after) and self.nth in (None, m.nth)


def load_equivalents(path: str) -> List[Equivalent]:
    if not os.path.exists(path):
        return []
    out: List[Equivalent] = []
    block: Dict[str, str] = {}
    start = 0

    def flush() -> None:
        if not block:
            return
        missing = {"file", "in", "before", "after", "why"} - set(block)
        if missing:
            raise SystemExit(f"{path}:{start}: equivalent entry lacks {', '.join(sorted(missing))}")
        out.append(Equivalent(
            block["file"], block["in"], block["before"], block["after"],
            int(block["nth"]) if "nth" in block else None, block["why"], start,
        ))
        block.clear()

    with open(path, encoding="utf-8") as f:
        for number, raw in enumerate(f, 1):
            line = raw.rstrip("\n")
            if line.startswith("#"):
                continue
            if not line.strip():
                flush()
                continue
            key, sep, value = line.partition(":")
            if not sep or key.strip() not in {"file", "in", "before", "after", "nth", "why", "op"}:
                raise SystemExit(f"{path}:{number}: expected 'key: value', got {line!r}")
            if not block:
                start = number
            block[key.strip()] = value.strip()
    flush()
    return out


def equivalent_stub(m: Mutant) -> str:
    lines = [f"file: {m.file}", f"in: {m.qualname}", f"op: {m.op}", f"before: {m.before}", f"after: {m.after}"]
    if m.count > 1:
        lines.append(f"nth: {m.nth}")
    lines.append("why: ")
    return "\n".join(lines)


# ---------------------------------------------------------------- line selection


def parse_ranges(specs: Sequence[str]) -> List[Tuple[int, int]]:
    out = []
    for spec in specs:
        for part in spec.split(","):
            a, _, b = part.partition("-")
            out.append((int(a), int(b or a)))
    return out


def changed_lines(rel: str, ref: str) -> List[Tuple[int, int]]:
    """Line ranges of ``rel`` (in the working tree) added or changed since this branch left
    ``ref`` (their merge base: what ``ref`` gained since does not count)."""
    base = subprocess.run(
        ["git", "merge-base", ref, "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    diff = subprocess.run(
        ["git", "diff", "-U0", base, "--", rel], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    out = []
    for match in re.finditer(r"^@@ -\S+ \+(\d+)(?:,(\d+))? @@", diff, re.M):
        start, count = int(match.group(1)), int(match.group(2) or "1")
        if count:
            out.append((start, start + count - 1))
    return out


def in_ranges(m: Mutant, ranges: Sequence[Tuple[int, int]]) -> bool:
    return any(m.line <= b and m.end_line >= a for a, b in ranges)


# ---------------------------------------------------------------- running


@dataclasses.dataclass
class Outcome:
    status: str  # killed / timeout / survived / equivalent / not-applicable
    seconds: float
    detail: str = ""  # the first failing test, or the reason
    why: str = ""
    tests: int = 0  # how many tests were selected (0: the whole subset)


class Slot:
    """A private copy of the tree for one job."""

    def __init__(self, base: str, index: int) -> None:
        self.dir = os.path.join(base, f"job{index}")
        os.makedirs(self.dir)
        shutil.copytree(os.path.join(ROOT, "src"), os.path.join(self.dir, "src"), ignore=COPY_IGNORE)
        shutil.copytree(os.path.join(ROOT, "tests"), os.path.join(self.dir, "tests"), ignore=COPY_IGNORE)
        shutil.copy2(os.path.join(ROOT, "pyproject.toml"), self.dir)
        # The README's and docs' examples are tests too (test_readme_*, test_links).
        shutil.copy2(os.path.join(ROOT, "README.md"), self.dir)
        shutil.copytree(os.path.join(ROOT, "docs"), os.path.join(self.dir, "docs"), ignore=COPY_IGNORE)
        self.plugins = os.path.join(self.dir, "plugins")
        os.makedirs(self.plugins)
        for plugin in ("_mutate_contexts.py", "_mutate_hypothesis.py", "_mutate_alarm.py"):
            shutil.copy2(os.path.join(ROOT, "tools", plugin), self.plugins)


def run_tests(slot: Slot, pytest_args: Sequence[str], env_extra: Dict[str, str], timeout: float,
              plugin: bool = False) -> Tuple[str, float, str]:
    """Run pytest in ``slot``: ('passed' | 'failed' | 'timeout', seconds, output)."""
    shutil.rmtree(os.path.join(slot.dir, ".hypothesis"), ignore_errors=True)
    env = dict(os.environ)
    for name in ("COVERAGE_PROCESS_START", "PYTEST_ADDOPTS", "LEASEQUEUE_REQUIRE_EXTENSIONS"):
        env.pop(name, None)
    env.update(env_extra)
    env["PYTHONPATH"] = os.path.join(slot.dir, "src") + os.pathsep + slot.plugins
    # -p no:xdist: one process, the selected tests in order (tests/parallel.py
    # would spread a plain run over every core; the contexts plugin and the
    # alarm need the tests in this process)
    extra = ["-p", "no:xdist", "-p", "_mutate_hypothesis", "-p", "_mutate_alarm",
             *(["-p", "_mutate_contexts"] if plugin else [])]
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", *extra, *pytest_args], cwd=slot.dir, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return "timeout", time.monotonic() - start, out
    seconds = time.monotonic() - start
    return ("passed" if proc.returncode == 0 else "failed"), seconds, out


def first_failure(output: str) -> str:
    for line in output.splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            return line.split(" - ")[0]
    for line in output.splitlines():
        if "Error" in line or "error" in line:
            return line.strip()[:160]
    return output.strip().splitlines()[-1][:160] if output.strip() else "(no output)"


def split_args(pytest_args: Sequence[str]) -> Tuple[List[str], List[str]]:
    """(options, test paths): the paths are what test selection replaces."""
    options, paths = [], []
    for arg in pytest_args:
        if not arg.startswith("-") and os.path.exists(os.path.join(ROOT, arg.split("::")[0])):
            paths.append(arg)
        else:
            options.append(arg)
    return options, paths


class Selector:
    """Which tests execute which lines (from the baseline run under _mutate_contexts)."""

    def __init__(self, data: dict, slot_dir: str) -> None:
        self.order: List[str] = data["order"]
        self.spawning: Set[str] = set(data["subprocess"])
        self.lines: Dict[str, Dict[int, Set[str]]] = {}
        prefix = os.path.realpath(slot_dir) + os.sep
        for path, by_line in data["lines"].items():
            rel = path[len(prefix):].replace(os.sep, "/") if path.startswith(prefix) else path
            self.lines[rel] = {int(line): set(ctx) for line, ctx in by_line.items()}

    def tests_for(self, m: Mutant) -> Optional[List[str]]:
        """The tests to run for ``m`` in baseline order; None: all of them."""
        by_line = self.lines.get(m.file, {})
        wanted = set(self.spawning)
        for line in m.lines:
            contexts = by_line.get(line, set())
            if "" in contexts:  # runs at import (a def, a default, a constant): every test may see it
                return None
            wanted |= contexts
        return [t for t in self.order if t in wanted]


def run_mutant(m: Mutant, slot: Slot, options: List[str], paths: List[str], selector: Optional[Selector],
               env: Dict[str, str], timeout: float) -> Outcome:
    try:
        compile(m.source, m.file, "exec")
    except SyntaxError as exc:
        return Outcome("not-applicable", 0.0, f"does not compile: {exc}")
    tests = selector.tests_for(m) if selector else None
    if tests is not None and not tests:
        return Outcome("survived", 0.0, "no test executes this line")
    target = os.path.join(slot.dir, m.file)
    with open(target, encoding="utf-8") as f:
        original = f.read()
    with open(target, "w", encoding="utf-8") as f:
        f.write(m.source)
    try:
        status, seconds, out = run_tests(slot, [*options, *(paths if tests is None else tests)], env, timeout)
    finally:
        with open(target, "w", encoding="utf-8") as f:
            f.write(original)
    count = 0 if tests is None else len(tests)
    if status == "passed":
        return Outcome("survived", seconds, tests=count)
    if status == "timeout":
        return Outcome("timeout", seconds, f"no result within {timeout:.0f} s", tests=count)
    if "MUTATE-TEST-TIMEOUT" in out:  # _mutate_alarm: one test hung (--test-timeout)
        hung = next(line for line in out.splitlines() if "MUTATE-TEST-TIMEOUT" in line)
        return Outcome("timeout", seconds, hung.split("MUTATE-TEST-TIMEOUT: ", 1)[-1][:160], tests=count)
    return Outcome("killed", seconds, first_failure(out), tests=count)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", default=[DEFAULT_TARGET],
                        help=f"modules to mutate (default {DEFAULT_TARGET})")
    parser.add_argument("--jobs", "-j", type=int, default=1, help="mutants run at once (default 1)")
    parser.add_argument("--test-timeout", type=int, default=0, metavar="SECONDS",
                        help="a timeout when one test of a mutant's run takes longer (SIGALRM; default 0: off)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds per mutant (default: 3x the baseline run + 30)")
    parser.add_argument("--lines", action="append", default=[], metavar="A-B",
                        help="only mutants touching these lines (repeatable; A-B,C-D)")
    parser.add_argument("--changed-since", metavar="REF",
                        help="only mutants on lines changed since the branch left REF (its merge base with HEAD); "
                             "with --lines, only the changed lines within those ranges")
    parser.add_argument("--op", action="append", default=[], help="only these operators (repeatable)")
    parser.add_argument("--mutant", action="append", default=[], type=int, metavar="ID", help="only these mutant ids")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--show", action="store_true", help="print the selected mutants' diffs and exit")
    parser.add_argument("--pytest-args", type=shlex.split, default=DEFAULT_PYTEST_ARGS,
                        help="pytest options and test paths (default: the fast subset, see DEFAULT_PYTEST_ARGS)")
    parser.add_argument("--all-tests", action="store_true",
                        help="run every test of the subset for each mutant, not only those that execute its lines")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="extra environment for the test runs (repeatable)")
    parser.add_argument("--equivalents", default=os.path.join(ROOT, DEFAULT_EQUIVALENTS))
    parser.add_argument("--skip-equivalent", action="store_true",
                        help="do not run the mutants listed as equivalent (they survive by definition; saves time)")
    parser.add_argument("--json", metavar="FILE", help="write every mutant's result as JSON")
    args = parser.parse_args(argv)
    if args.pytest_args is DEFAULT_PYTEST_ARGS:  # files may move (the conformance kit): keep those that exist
        args.pytest_args = [a for a in args.pytest_args
                            if not a.startswith("tests/") or os.path.exists(os.path.join(ROOT, a))]

    mutants: List[Mutant] = []
    originals: Dict[str, str] = {}
    dropped = 0
    for name in args.files:
        path = os.path.abspath(os.path.join(ROOT, name) if not os.path.isabs(name) else name)
        rel = os.path.relpath(path, ROOT).replace(os.sep, "/")
        if not rel.startswith("src/"):
            parser.error(f"{name}: only modules under src/ can be mutated")
        found, dup = generate(path, rel, first_id=len(mutants) + 1)
        mutants += found
        dropped += dup
        with open(path, encoding="utf-8") as f:
            originals[rel] = f.read()
    total = len(mutants)
    ranges = parse_ranges(args.lines)
    changed: Optional[Dict[str, List[Tuple[int, int]]]] = None  # per file
    if args.changed_since:
        changed = {rel: changed_lines(rel, args.changed_since) for rel in originals}
        if not any(changed.values()):
            print(f"no lines changed since {args.changed_since}")
            return 0
    selected = [  # --lines and --changed-since both restrict: a mutant must pass each given
        m for m in mutants
        if (not ranges or in_ranges(m, ranges)) and (changed is None or in_ranges(m, changed[m.file]))
        and (not args.op or m.op in args.op)
        and (not args.mutant or m.id in args.mutant)
    ]
    equivalents = load_equivalents(args.equivalents)
    for m in mutants:  # mark entries that still match some mutant, selected or not
        for e in equivalents:
            if e.matches(m):
                e.used = True

    if args.list or args.show:
        for m in selected:
            nth = f" #{m.nth}" if m.count > 1 else ""
            known = " [equivalent]" if any(e.matches(m) for e in equivalents) else ""
            print(f"{m.id:4d} {m.location():42s} {m.op:7s} {m.qualname}{nth}: {m.before}  ->  {m.after}{known}")
            if args.show:
                print(m.diff(originals[m.file]))
        print(f"{len(selected)} of {total} mutants ({dropped} duplicates dropped)")
        return 0

    env = dict(DEFAULT_ENV)
    for item in args.env:
        name, _, value = item.partition("=")
        env[name] = value
    if args.test_timeout > 0:
        env["MUTATE_TEST_TIMEOUT"] = str(args.test_timeout)
    options, paths = split_args(args.pytest_args)
    try:
        import coverage  # noqa: F401  (the baseline's per-test line data)
        select = not args.all_tests
    except ImportError:
        print("coverage is not installed: every mutant runs the whole subset (slow)")
        select = False
    base = tempfile.mkdtemp(prefix="leasequeue-mutate-")
    slots: "queue.Queue[Slot]" = queue.Queue()
    try:
        for i in range(max(1, args.jobs)):
            slots.put(Slot(base, i))
        slot = slots.get()
        check = subprocess.run(
            [sys.executable, "-c", "import leasequeue._backends.inmemory.transport_py as m; print(m.__file__)"],
            env={**os.environ, **env, "PYTHONPATH": os.path.join(slot.dir, "src")},
            capture_output=True, text=True, check=False,
        )
        if not check.stdout.startswith(slot.dir):
            print(f"the copy is not what gets imported: {check.stdout}{check.stderr}")
            return 2
        contexts = os.path.join(base, "contexts.json")
        env_baseline = dict(env)
        env_baseline.pop("MUTATE_TEST_TIMEOUT", None)  # under coverage tests run slower: no limit
        if select:
            env_baseline["MUTATE_CONTEXTS_OUT"] = contexts
            env_baseline["MUTATE_CONTEXTS_FILES"] = os.pathsep.join(
                os.path.realpath(os.path.join(slot.dir, rel)) for rel in originals)
        print(f"baseline: pytest {' '.join(args.pytest_args)}", flush=True)
        # --timeout is per mutant; the baseline runs under coverage, much slower
        status, seconds, out = run_tests(slot, args.pytest_args, env_baseline, 7200, plugin=select)
        slots.put(slot)
        if status != "passed":
            print(out[-5000:])
            print(f"the unmutated code fails the tests ({status}): fix that first")
            return 2
        selector = None
        if select:
            with open(contexts, encoding="utf-8") as f:
                selector = Selector(json.load(f), slot.dir)
        print(f"baseline passed in {seconds:.1f} s{' (measuring which test runs which line)' if select else ''}",
              flush=True)
        timeout = args.timeout if args.timeout is not None else 3 * seconds + 30

        results: Dict[int, Outcome] = {}
        lock = threading.Lock()
        done = [0]
        started = time.monotonic()

        def work(m: Mutant) -> None:
            known = [e for e in equivalents if e.matches(m)]
            if known and args.skip_equivalent:
                outcome = Outcome("equivalent", 0.0, "not run (--skip-equivalent)", known[0].why)
            else:
                slot = slots.get()
                try:
                    outcome = run_mutant(m, slot, options, paths, selector, env, timeout)
                finally:
                    slots.put(slot)
            if outcome.status == "survived" and known:
                outcome.status, outcome.why = "equivalent", known[0].why
            elif outcome.status in ("killed", "timeout") and known:
                outcome.detail += f" (listed as equivalent at line {known[0].line}: a test tells it apart)"
            with lock:
                results[m.id] = outcome
                done[0] += 1
                mark = {"killed": ".", "timeout": "T", "survived": "S", "equivalent": "e", "not-applicable": "n"}
                elapsed = time.monotonic() - started
                tests = f"{outcome.tests} tests" if outcome.tests else "all tests"
                print(f"[{done[0]}/{len(selected)} {elapsed:.0f}s] {mark[outcome.status]} #{m.id} "
                      f"{m.location()} {m.op}: {m.after}  ({outcome.status}, {tests}, {outcome.seconds:.1f} s"
                      f"{', ' + outcome.detail if outcome.detail else ''})", flush=True)

        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            for future in [pool.submit(work, m) for m in selected]:
                future.result()
    finally:
        shutil.rmtree(base, ignore_errors=True)

    partial = bool(ranges or changed or args.op or args.mutant)
    return report(selected, results, originals, equivalents, partial=partial,
                  json_path=args.json)


def report(selected: List[Mutant], results: Dict[int, Outcome], originals: Dict[str, str],
           equivalents: List[Equivalent], partial: bool, json_path: Optional[str]) -> int:
    counts: Dict[str, int] = {}
    for outcome in results.values():
        counts[outcome.status] = counts.get(outcome.status, 0) + 1
    equivalent = [m for m in selected if results[m.id].status == "equivalent"]
    survivors = [m for m in selected if results[m.id].status == "survived"]
    timeouts = [m for m in selected if results[m.id].status == "timeout"]
    print()
    if equivalent:
        print("Equivalent mutants (survive by design):")
        for m in equivalent:
            print(f"  equivalent ({results[m.id].why})  #{m.id} {m.location()} {m.qualname}: "
                  f"{m.before}  ->  {m.after}")
        print()
    if timeouts:
        print("Timeouts (counted as detected):")
        for m in timeouts:
            print(f"  #{m.id} {m.location()} {m.qualname}: {m.before}  ->  {m.after}")
        print()
    if survivors:
        print("SURVIVED (no test notices; add a test, or list it in the equivalents file with the reason):")
        for m in survivors:
            print(f"\n#{m.id} {m.location()} in {m.qualname} ({m.op})")
            print(m.diff(originals[m.file]).rstrip())
            print("--- equivalents entry, if it cannot change behaviour:")
            print(equivalent_stub(m))
        print()
    stale = [e for e in equivalents if not e.used]
    if stale and not partial:
        print("Equivalents entries that match no mutant any more (remove or update them):")
        for e in stale:
            print(f"  line {e.line}: {e.file} {e.qualname}: {e.before} -> {e.after}")
        print()
    order = ["killed", "timeout", "equivalent", "survived", "not-applicable"]
    summary = ", ".join(f"{counts.get(k, 0)} {k}" for k in order)
    print(f"{len(selected)} mutants: {summary}")
    if json_path:
        with open(json_path, "w", encoding="utf-8") as f:
            json.dump([
                {**{k: v for k, v in dataclasses.asdict(m).items() if k != "source"},
                 **dataclasses.asdict(results[m.id])}
                for m in selected
            ], f, indent=1)
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
