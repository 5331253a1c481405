"""pytest plugin: the suite on every core (pytest-xdist), serial tests apart.

* ``python -m pytest`` with pytest-xdist installed (it is in the ``test``
  extra) and none of ``-n``, ``--dist``, ``--tx`` given runs on
  ``-n auto`` workers (one per usable CPU; ``PYTEST_XDIST_AUTO_NUM_WORKERS``
  overrides).  It is set here rather than in ``addopts`` so that
  ``-p no:xdist`` still parses.  ``-n 0`` or ``-p no:xdist`` runs the whole
  suite in one process, as before; so do ``--pdb`` and ``--collect-only``.
  Tools that select tests and must stay deterministic (``tools/mutate.py``,
  ``tools/sanitize.sh``) pass ``-p no:xdist``.
* **The rule**: a test marked ``serial`` (``@pytest.mark.serial(reason=...)``,
  or ``pytestmark = pytest.mark.serial(reason=...)`` for a whole module)
  never runs at the same time as another serial test: with ``--dist load``
  (what ``-n`` means) or ``loadgroup`` all of them form one work unit, run
  one after the other on one worker, and sent out first (the largest unit),
  so that it does not end the run alone.  Mark so: what measures time or
  CPU against a bound (latency, idle CPU, a real-clock wait bounded on both
  sides), what sends signals or calls ``interrupt_main`` in the test
  process, and soak runs that keep worker processes busy on every core for
  a fixed time.  Not tests that merely use threads, subprocesses or a real
  clock with wide margins: those run anywhere.  Other tests still run on
  the other workers meanwhile, as they would beside any other load.
* How: xdist's scheduler sees test ids only, so each worker writes the ids
  of the serial tests it collected into a directory the controller made
  (``workerinput``), before it reports its collection; the controller's
  scheduler (``LoadGroupScheduling``, whose ``xdist_group`` groups still
  work where the installed pytest lets xdist rename test ids) puts those
  ids in the unit ``serial``.  (xdist's own ``xdist_group`` marker is not
  used for it: with pytest >= 9.2 and xdist 3.8 it no longer groups.)
* Test ids must be the same in every process: each worker collects the
  suite and xdist refuses to start when their collections differ (no
  ``ids=repr`` of an object whose repr holds an address).
* A worker runs its tests in its main thread, so ``signal`` and
  ``_thread.interrupt_main`` work there as in a serial run.  Each worker
  has its own ``tmp_path`` tree, and ``tests/postgres/conftest.py`` starts
  one throwaway server per worker that needs one (own directory and port).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any, Optional, Set

import pytest

GROUP = "serial"
_DIR_KEY = "leasequeue_serial_dir"


def _xdist(config: pytest.Config) -> bool:
    return config.pluginmanager.has_plugin("xdist")


@pytest.hookimpl(tryfirst=True)  # before xdist turns -n into workers
def pytest_cmdline_main(config: pytest.Config) -> None:
    option = config.option
    if (
        _xdist(config)
        and not hasattr(config, "workerinput")  # a worker: the controller chose
        and getattr(option, "numprocesses", 0) is None
        and getattr(option, "dist", "no") == "no"
        and not getattr(option, "tx", None)
        and not getattr(option, "distload", False)
        and not getattr(option, "collectonly", False)
    ):
        option.numprocesses = "auto"  # xdist makes it 0 under --pdb


# -- the controller ---------------------------------------------------------------


def _serial_dir(config: pytest.Config) -> str:
    path: Optional[str] = getattr(config, "_leasequeue_serial_dir", None)
    if path is None:
        path = tempfile.mkdtemp(prefix="leasequeue-serial-")
        config._leasequeue_serial_dir = path  # type: ignore[attr-defined]
    return path


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    node.workerinput[_DIR_KEY] = _serial_dir(node.config)


def pytest_unconfigure(config: pytest.Config) -> None:
    path = getattr(config, "_leasequeue_serial_dir", None)
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)


@pytest.hookimpl(optionalhook=True, tryfirst=True)  # before xdist's own choice
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") not in ("load", "loadgroup"):
        return None  # another mode asked for by name: xdist's own
    from xdist.scheduler import LoadGroupScheduling

    directory = _serial_dir(config)

    class SerialGroupScheduling(LoadGroupScheduling):  # type: ignore[misc]
        """xdist's groups, and every test marked ``serial`` in the unit ``serial``."""

        def __init__(self, config: pytest.Config, log: Any = None) -> None:
            super().__init__(config, log)
            self.serial: Set[str] = set()

        def schedule(self) -> None:
            if not self.serial:  # every worker has collected by now (and written its list first)
                for name in os.listdir(directory):
                    with open(os.path.join(directory, name), encoding="utf-8") as f:
                        self.serial.update(line for line in f.read().splitlines() if line)
            super().schedule()

        def _split_scope(self, nodeid: str) -> str:
            return GROUP if nodeid in self.serial else super()._split_scope(nodeid)

    return SerialGroupScheduling(config, log)


# -- a worker -----------------------------------------------------------------------


@pytest.hookimpl(tryfirst=True)  # before xdist's worker reports the collection
def pytest_collection_finish(session: pytest.Session) -> None:
    workerinput = getattr(session.config, "workerinput", None)
    if not workerinput or _DIR_KEY not in workerinput:
        return
    ids = [item.nodeid for item in session.items if item.get_closest_marker("serial") is not None]
    path = os.path.join(workerinput[_DIR_KEY], str(workerinput.get("workerid", "worker")))
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write("".join(nodeid + "\n" for nodeid in ids))
    os.replace(path + ".tmp", path)
