"""pytest plugin: branch coverage of the pure twin, with a floor (issue 14).

On in CI: ``.ci/run`` sets ``LEASEQUEUE_COVERAGE=1`` for its run of the
README's test command, so every CI run measures and enforces the floor.
Elsewhere it is opt-in (``tools/coverage.sh``, or ``LEASEQUEUE_COVERAGE=1``
on any pytest run).  Only the tests that can execute the measured modules
are traced: the Cython variants (``impl`` = ``cython``), the SQLite and
PostgreSQL tests and the build tests run with the tracer paused
(``pytest_runtest_protocol`` below), and their children are not measured.
Tracing everything had made the whole suite about three times slower
(421 s without it, and 736 s of CPU half way through with it, when this was
first measured), which is why it was opt-in until then; tracing only the
pure variants costs about 2.7x on those tests alone (CPU time of the
pure variants of test_differential.py, test_edges.py and
test_control_plane.py: 3.0 s -> 8.0 s).
Configuration, the floor (``fail_under``) included, is
``[tool.coverage.*]`` in ``pyproject.toml``.

* What is measured: the pure twin ``_inmemory_py`` and the modules it
  imports (``_waiting``, ``_validation``, ``_types``, ``_errors``, the
  package ``__init__``); not the SQLite and PostgreSQL backends, the CLI,
  the bench package or the conformance kit (``omit`` in pyproject).
* Coverage starts when this plugin is imported, before the suite imports
  ``leasequeue``.  It measures the installed package as well as ``src/``
  (``[tool.coverage.paths]`` maps both, and the copies some tests import in
  a child process, to ``src/leasequeue`` where that exists).
* Subprocesses: tests that run Python code in a child process (the
  MemoryError and garbage-collector tests) start it with
  ``helpers.python_argv``, which starts coverage there from
  ``COVERAGE_PROCESS_START``; every process writes its own data file
  (``parallel = true``) into a private temporary directory, combined at the
  end.  Threads are measured too (``concurrency = ["thread"]``).
* The floor is enforced only on a whole run (no test paths, ``-k``, ``-m``,
  ``--deselect``, ``--lf`` ..., no ``--ignore`` but of ``tests/postgres``,
  whose backend is not measured; no failures) on Linux, where every test
  runs (the MemoryError subprocess tests need ``RLIMIT_AS``): a focused run,
  or one elsewhere, prints the figure and carries on.  Below the floor, the
  run fails.
* Without the ``coverage`` package, or on an interpreter other than CPython
  (PyPy's tracer is slow, and the figure is CPython's), it is off even when
  asked for, and says so.

``conftest.py`` imports this module before anything else (so it has no
assertions to rewrite: PYTEST_DONT_REWRITE).
"""

from __future__ import annotations

import io
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Generator, Optional

import pytest

CONFIG = Path(__file__).resolve().parent.parent / "pyproject.toml"


def _off_because() -> Optional[str]:
    if os.environ.get("LEASEQUEUE_COVERAGE", "0") != "1":
        return "opt-in: tools/coverage.sh (or LEASEQUEUE_COVERAGE=1)"
    if sys.implementation.name != "cpython":
        return f"not measured on {sys.implementation.name}"
    if not CONFIG.exists():
        return f"no {CONFIG}"
    try:
        import coverage
    except ImportError:
        return "the coverage package is not installed (it is in the [test] extra)"
    if coverage.Coverage.current() is not None:
        return "coverage is already running (coverage run / pytest-cov): it reports"
    return None


class _Measurement:
    def __init__(self) -> None:
        import coverage

        self.dir = tempfile.mkdtemp(prefix="leasequeue-coverage-")
        # pyproject's data_file is ${LEASEQUEUE_COVERAGE_DATA-.coverage}: this
        # process and every child started with COVERAGE_PROCESS_START write here.
        os.environ["LEASEQUEUE_COVERAGE_DATA"] = os.path.join(self.dir, ".coverage")
        os.environ["COVERAGE_PROCESS_START"] = str(CONFIG)
        self.cov = coverage.Coverage(config_file=str(CONFIG))
        self.cov.start()
        self.total: Optional[float] = None
        self.text = ""

    def pause(self) -> None:
        """Stop tracing (this process, its threads, the children it starts)."""
        self.cov.stop()
        os.environ.pop("COVERAGE_PROCESS_START", None)

    def resume(self) -> None:
        os.environ["COVERAGE_PROCESS_START"] = str(CONFIG)
        self.cov.start()

    def finish(self) -> float:
        self.cov.stop()
        self.cov.save()
        os.environ.pop("COVERAGE_PROCESS_START", None)
        self.cov.combine(data_paths=[self.dir], keep=False)
        # The package this run imported (installed, or src/) and the source tree
        # the others map to; not a copy a test made elsewhere, where there is no
        # source tree to map it to (tests run away from a checkout).
        import leasequeue

        include = [os.path.join(os.path.dirname(os.path.abspath(leasequeue.__file__)), "*"),
                   os.path.join(str(CONFIG.parent), "src", "leasequeue", "*")]
        out = io.StringIO()
        self.total = self.cov.report(file=out, include=include)
        self.text = out.getvalue()
        shutil.rmtree(self.dir, ignore_errors=True)
        return self.total


_OFF = _off_because()
_MEASUREMENT = _Measurement() if _OFF is None else None
_deselected = [0]


def pytest_deselected(items: Any) -> None:
    _deselected[0] += len(items)


#: Test files that run no measured code in this process or in a child it
#: measures: the SQLite and PostgreSQL backends (omitted from the measurement,
#: and their crash tests' worker processes are not started with coverage),
#: the build tests (compilers and fresh virtual environments).
_UNMEASURED_FILES = ("test_sqlite_", "test_build.py")
_UNMEASURED_DIRS = ("postgres",)


def _unmeasured(item: pytest.Item) -> bool:
    """A test that cannot execute the measured modules runs untraced: the
    Cython variants (the ``impl`` fixture's ``cython`` parameter) and the
    backends' tests.  Tracing them would only make the run slower."""
    callspec = getattr(item, "callspec", None)
    if callspec is not None and callspec.params.get("impl") == "cython":
        return True
    path = Path(str(item.fspath))
    return path.name.startswith(_UNMEASURED_FILES) or path.parent.name in _UNMEASURED_DIRS


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Optional[pytest.Item]) -> Generator[None, None, None]:
    if _MEASUREMENT is None or not _unmeasured(item):
        yield
        return
    _MEASUREMENT.pause()
    try:
        yield
    finally:
        _MEASUREMENT.resume()


def _partial(session: pytest.Session) -> Optional[str]:
    """Why this run is not the whole suite (None when it is)."""
    config = session.config
    option = config.option
    if not sys.platform.startswith("linux"):
        return f"not Linux ({sys.platform}): some tests skip here"
    if config.args_source != pytest.Config.ArgsSource.TESTPATHS:
        return "test paths were given"
    for name, flag in (("keyword", "-k"), ("markexpr", "-m"), ("deselect", "--deselect"), ("lf", "--lf"),
                       ("stepwise", "--sw"), ("ignore", "--ignore"), ("collectonly", "--collect-only")):
        value = getattr(option, name, None)
        if name == "ignore" and value:  # the PostgreSQL tests exercise no measured module
            value = [p for p in value if Path(p).resolve() != Path(__file__).resolve().parent / "postgres"]
        if value:
            return f"{flag} was given"
    if _deselected[0]:
        return "tests were deselected"
    if session.testsfailed or session.shouldstop or session.shouldfail:
        return "tests failed or the run stopped early"
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtestloop(session: pytest.Session) -> Generator[None, None, None]:
    yield
    if _MEASUREMENT is None:
        return
    total = _MEASUREMENT.finish()
    floor = float(_MEASUREMENT.cov.config.fail_under)
    partial = _partial(session)
    if partial is not None:
        _MEASUREMENT.text += (
            f"branch coverage {total:.1f}% (the {floor:g}% floor is checked on whole runs only: {partial})\n"
        )
    elif total < floor:
        _MEASUREMENT.text += f"FAIL: branch coverage {total:.1f}% is below the floor of {floor:g}% (pyproject.toml)\n"
        session.testsfailed += 1  # the run's exit status says so
    else:
        _MEASUREMENT.text += f"branch coverage {total:.1f}% >= floor {floor:g}%\n"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _MEASUREMENT is None and os.environ.get("LEASEQUEUE_COVERAGE", "0") != "1":
        return  # not asked for: nothing to say
    terminalreporter.section("coverage of the pure modules (tests/coverage_floor.py)")
    if _MEASUREMENT is None:
        terminalreporter.write_line(f"not measured: {_OFF}")
    elif _MEASUREMENT.total is not None:
        terminalreporter.write(_MEASUREMENT.text)
