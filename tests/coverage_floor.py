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
* Under pytest-xdist (tests run in worker processes, see ``conftest.py``)
  each worker measures the tests it runs, as a serial run does (same
  pauses), and saves its data file into the directory of the process that
  started the run (``LEASEQUEUE_COVERAGE_WORKERS_DIR``, set before the
  workers start); that process, the controller, measures nothing itself
  (it starts the workers without ``COVERAGE_PROCESS_START``, or coverage's
  own start-up hook would trace all of them), and combines every file,
  reports and enforces the floor once all workers are done.  The workers
  tell it what they deselected (``workeroutput``), so a whole run is told
  from a partial one as without xdist.  ``-n 0`` or ``-p no:xdist`` runs
  everything in this one process, as before.
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

#: Set by the process that owns the measurement when it starts xdist workers:
#: the directory where each of them saves its data file.
WORKERS_DIR = "LEASEQUEUE_COVERAGE_WORKERS_DIR"


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
    if os.environ.get("PYTEST_XDIST_WORKER") and not os.environ.get(WORKERS_DIR):
        return "an xdist worker of a run whose controller measures nothing"
    return None


def _workers_dir() -> Optional[str]:
    """In an xdist worker of a measured run: the controller's data directory."""
    if os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get(WORKERS_DIR):
        return os.environ[WORKERS_DIR]
    return None


class _Measurement:
    def __init__(self) -> None:
        import coverage

        #: An xdist worker writes into the controller's directory and leaves
        #: combining, reporting and removing it to the controller.
        self.worker = _workers_dir() is not None
        self.dir = _workers_dir() or tempfile.mkdtemp(prefix="leasequeue-coverage-")
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

    def save(self) -> None:
        """Stop and write this process's data file (a worker's last step)."""
        self.cov.stop()
        self.cov.save()
        os.environ.pop("COVERAGE_PROCESS_START", None)

    def finish(self) -> float:
        self.save()
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


def _starts_workers(config: pytest.Config) -> bool:
    """This process is pytest-xdist's controller: it will start workers."""
    return config.pluginmanager.has_plugin("dsession")


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    # Before xdist's own pytest_sessionstart (trylast) starts the workers.
    if _MEASUREMENT is None or _MEASUREMENT.worker or not _starts_workers(session.config):
        return
    # The tests run in the workers, each measuring itself into this directory;
    # here nothing is traced, and the workers must not start coverage from
    # COVERAGE_PROCESS_START (coverage's .pth hook would trace all of them).
    _MEASUREMENT.pause()
    os.environ[WORKERS_DIR] = _MEASUREMENT.dir


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """xdist's controller, as a worker ends: what it deselected (each
    worker collects the whole run, so the largest count is the run's)."""
    output = getattr(node, "workeroutput", None) or {}
    _deselected[0] = max(_deselected[0], int(output.get("leasequeue_deselected", 0)))


#: Test files that run no measured code in this process or in a child it
#: measures: the SQLite and PostgreSQL backends (omitted from the measurement,
#: and their crash tests' worker processes are not started with coverage),
#: the build tests (compilers and fresh virtual environments).
_UNMEASURED_FILES = ("test_sqlite_", "test_build.py")
_UNMEASURED_DIRS = ("postgres",)


def _unmeasured(item: pytest.Item) -> bool:
    """A test that cannot execute the measured modules runs untraced: the
    Cython variants (the ``impl`` fixture's ``cython`` parameter) and the
    backends' tests; tracing them would only make the run slower.  So does a
    test marked ``untraced`` (with its reason), which a tracer would change."""
    callspec = getattr(item, "callspec", None)
    if callspec is not None and callspec.params.get("impl") == "cython":
        return True
    if item.get_closest_marker("untraced") is not None:
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
    if _MEASUREMENT.worker:  # the controller combines, reports and enforces
        _MEASUREMENT.save()
        session.config.workeroutput["leasequeue_deselected"] = _deselected[0]  # type: ignore[attr-defined]
        return
    os.environ.pop(WORKERS_DIR, None)
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
