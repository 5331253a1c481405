"""pytest plugin for tools/mutate.py: which test executes which line.

Loaded with ``-p _mutate_contexts`` in the unmutated baseline run.  It starts
coverage (line data only, for the files in ``MUTATE_CONTEXTS_FILES``, an
``os.pathsep``-separated list) before the suite imports anything, switches
coverage's dynamic context to each test's node id, records which tests
start a subprocess (what runs there is not measured in this process), and
measures those subprocesses too when they start coverage from
``COVERAGE_PROCESS_START`` (``helpers.python_argv`` does), and writes
``MUTATE_CONTEXTS_OUT`` as JSON::

    {"order": [node ids in the order they ran],
     "subprocess": [node ids of tests that started a subprocess not measured],
     "lines": {file: {line: [node ids, "" for code run outside any test]}}}

tools/mutate.py then runs, for each mutant, only the tests that execute its
lines, plus every test that starts a subprocess it could not measure.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
from typing import Any, Dict, Generator, List, Set

import coverage
import pytest

_FILES = [f for f in os.environ.get("MUTATE_CONTEXTS_FILES", "").split(os.pathsep) if f]
_COV = coverage.Coverage(data_file=None, include=_FILES, config_file=False)
_COV.start()

# Children: the same files, the test's node id as the (static) context.
_CHILD_DIR = os.path.join(os.path.dirname(os.environ["MUTATE_CONTEXTS_OUT"]), "children")
os.makedirs(_CHILD_DIR, exist_ok=True)
_CHILD_CONFIG = os.path.join(_CHILD_DIR, "coverage.ini")
with open(_CHILD_CONFIG, "w", encoding="utf-8") as _f:
    _f.write("[run]\nparallel = True\ncontext = ${MUTATE_CONTEXT}\n")
    _f.write(f"data_file = {os.path.join(_CHILD_DIR, '.coverage')}\n")
    _f.write("include =\n" + "".join(f"    {path}\n" for path in _FILES))
os.environ["COVERAGE_PROCESS_START"] = _CHILD_CONFIG
os.environ["MUTATE_CONTEXT"] = ""

_order: List[str] = []
_spawning: Set[str] = set()
_current = [""]

_popen_init = subprocess.Popen.__init__


def _recording_init(self: Any, *args: Any, **kwargs: Any) -> None:
    if _current[0]:
        _spawning.add(_current[0])
    _popen_init(self, *args, **kwargs)


subprocess.Popen.__init__ = _recording_init  # type: ignore[method-assign]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Any) -> Generator[None, None, None]:
    _order.append(item.nodeid)
    _current[0] = item.nodeid
    os.environ["MUTATE_CONTEXT"] = item.nodeid
    _COV.switch_context(item.nodeid)
    yield
    _current[0] = ""
    os.environ["MUTATE_CONTEXT"] = ""
    _COV.switch_context("")


def pytest_unconfigure(config: pytest.Config) -> None:
    _COV.stop()
    lines: Dict[str, Dict[int, Set[str]]] = {}
    measured_children: Set[str] = set()

    def merge(data: coverage.CoverageData, child: bool) -> None:
        for path in data.measured_files():
            into = lines.setdefault(os.path.realpath(path), {})
            for line, contexts in data.contexts_by_lineno(path).items():
                into.setdefault(line, set()).update(contexts)
                if child:
                    measured_children.update(contexts)

    merge(_COV.get_data(), child=False)
    for name in glob.glob(os.path.join(_CHILD_DIR, ".coverage.*")):
        child = coverage.CoverageData(basename=name)
        child.read()
        merge(child, child=True)
    out = {
        "order": _order,
        "subprocess": sorted(_spawning - measured_children),
        "lines": {path: {line: sorted(ctx) for line, ctx in by_line.items()} for path, by_line in lines.items()},
    }
    with open(os.environ["MUTATE_CONTEXTS_OUT"], "w", encoding="utf-8") as f:
        json.dump(out, f)
