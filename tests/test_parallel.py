"""tests/parallel.py, the plugin that spreads the suite over pytest-xdist
workers: a generated suite runs in a pytest subprocess with two workers,
and the tests marked ``serial`` must all run on one of them, one after the
other, while the unmarked ones go wherever there is room; without xdist
(``-p no:xdist``) everything runs in the one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest

pytest.importorskip("xdist", reason="pytest-xdist is not installed (it is in the [test] extra)")

HERE = Path(__file__).resolve().parent  # tests/, where parallel.py is

SUITE = '''
import json, os, time
import pytest

def record(name):
    with open(os.path.join(os.environ["RECORD_DIR"], name + ".json"), "w") as f:
        json.dump({"worker": os.environ.get("PYTEST_XDIST_WORKER", "main"), "pid": os.getpid(),
                   "start": time.monotonic()}, f)
    time.sleep(0.05)
    with open(os.path.join(os.environ["RECORD_DIR"], name + ".json")) as f:
        data = json.load(f)
    data["end"] = time.monotonic()
    with open(os.path.join(os.environ["RECORD_DIR"], name + ".json"), "w") as f:
        json.dump(data, f)

@pytest.mark.serial(reason="test")
@pytest.mark.parametrize("i", range(4))
def test_serial_a(i):
    record(f"serial-a{i}")

@pytest.mark.parametrize("i", range(12))
def test_free(i):
    record(f"free{i}")
'''

MODULE_MARKED = '''
import pytest
from test_suite import record
pytestmark = pytest.mark.serial(reason="a whole module")

@pytest.mark.parametrize("i", range(4))
def test_serial_b(i):
    record(f"serial-b{i}")
'''


def run_suite(tmp_path: Path, *args: str, **extra_env: str) -> Dict[str, Dict[str, Any]]:
    suite = tmp_path / "suite"
    records = tmp_path / "records"
    suite.mkdir()
    records.mkdir()
    (suite / "test_suite.py").write_text(SUITE)
    (suite / "test_module_marked.py").write_text(MODULE_MARKED)
    (suite / "conftest.py").write_text('pytest_plugins = ["parallel"]\n')
    (suite / "pytest.ini").write_text("[pytest]\nmarkers =\n    serial(reason): see tests/parallel.py\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COVERAGE_", "LEASEQUEUE_COVERAGE"))}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(suite)] + [p for p in sys.path if p and Path(p).is_dir()])
    env["RECORD_DIR"] = str(records)
    env.update(extra_env)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--strict-markers",
                           *args], cwd=suite, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "20 passed" in done.stdout, done.stdout[-3000:]
    return {path.stem: json.loads(path.read_text()) for path in records.iterdir()}


def test_a_plain_run_keeps_the_serial_tests_one_after_another_on_one_worker(tmp_path: Path) -> None:
    """No -n given: the plugin asks for -n auto (two workers here), and the
    tests marked serial, in two files, run as one unit."""
    ran = run_suite(tmp_path, PYTEST_XDIST_AUTO_NUM_WORKERS="2")
    assert len(ran) == 20
    serial = sorted((ran[name] for name in ran if name.startswith("serial")), key=lambda r: r["start"])
    assert len(serial) == 8
    workers = {r["worker"] for r in ran.values()}
    assert workers <= {"gw0", "gw1"} and "main" not in workers, workers
    assert len({r["worker"] for r in serial}) == 1, serial
    for before, after in zip(serial, serial[1:]):
        assert before["end"] <= after["start"], (before, after)


def test_without_xdist_everything_runs_in_the_one_process(tmp_path: Path) -> None:
    ran = run_suite(tmp_path, "-p", "no:xdist")
    pids: List[int] = sorted({r["pid"] for r in ran.values()})
    assert len(ran) == 20 and {r["worker"] for r in ran.values()} == {"main"} and len(pids) == 1
