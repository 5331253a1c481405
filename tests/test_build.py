"""The build paths, with a real compiler and real virtual environments.

* A strict build (CI, ``.ci/run``, cibuildwheel: ``LEASEQUEUE_REQUIRE_EXTENSIONS``
  set) must have produced an install that really uses the compiled transport.
* On a free-threaded interpreter, importing the extension keeps the GIL off.
* Building from source without a working compiler (``CC=false``) installs the
  pure twin and says so loudly in the build output; with
  ``LEASEQUEUE_REQUIRE_EXTENSIONS=1`` the same build fails.
* ``LEASEQUEUE_NO_EXTENSIONS=1`` builds a pure ``py3-none-any`` wheel.
* A strict wheel build holds every compiled module (the transport, the
  bench's floor stub, the thread runner's fast path) and their sources, and
  its install runs the compiled fast path; the pure install runs the pure one.

The build tests need the source tree next to ``tests/`` (they are skipped
where only the tests were copied, as when cibuildwheel tests an installed
wheel) and a C toolchain driven by ``CC`` (not MSVC).  They build with
``--no-build-isolation`` in a fresh venv that gets the build requirements
(setuptools >= 77, Cython >= 3.1) from the package index or pip's cache: the
interpreter running the tests may have an older setuptools than
``pyproject.toml`` requires.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import pytest

ROOT = Path(__file__).resolve().parent.parent
HAS_SOURCE_TREE = (ROOT / "setup.py").is_file() and (
    ROOT / "src" / "leasequeue" / "_backends" / "inmemory" / "transport_c.pyx"
).is_file()
BUILD_REQUIREMENTS = ["setuptools>=77", "Cython>=3.1", "wheel"]
#: A line of setup.py's fallback banner (FALLBACK_WARNING).
FALLBACK_BANNER = "could not be built"
#: Environment variables that would change what a build or an import does.
BUILD_SWITCHES = ("LEASEQUEUE_NO_EXTENSIONS", "LEASEQUEUE_REQUIRE_EXTENSIONS", "CIBUILDWHEEL")

needs_source_tree = pytest.mark.skipif(
    not HAS_SOURCE_TREE, reason="needs the source tree (setup.py, src/) next to tests/"
)
needs_cc_toolchain = pytest.mark.skipif(
    sys.platform == "win32", reason="CC=false does not disable MSVC; the fallback path is exercised on POSIX"
)


#: Runs three jobs through a thread Worker in memory; prints which fast path
#: ran them, their events and how many succeeded.
WORKER_PROBE = (
    "import leasequeue\n"
    "from leasequeue.worker.runners import fastpath\n"
    "t = leasequeue.InMemoryTransport()\n"
    "for i in range(3):\n"
    "    t.publish('g', i)\n"
    "seen = []\n"
    "def handler(job):\n"
    "    seen.append(job.event)\n"
    "    if len(seen) == 3:\n"
    "        w.stop()\n"
    "w = leasequeue.Worker(t, handler, signals=False)\n"
    "w.run()\n"
    "print('pure' if fastpath.COMPILED is None else 'compiled', seen, w.counts['succeeded'])\n"
)


def clean_env(**overrides: str) -> Dict[str, str]:
    """The current environment without the build switches, PYTHONPATH or an active venv."""
    env = {k: v for k, v in os.environ.items() if k not in BUILD_SWITCHES}
    for name in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"):
        env.pop(name, None)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(overrides)
    return env


def run(cmd: List[str], *, env: Dict[str, str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``cmd``, capturing stdout and stderr together as text."""
    return subprocess.run(
        cmd, env=env, cwd=str(cwd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout
    )


def venv_python(venv_dir: Path) -> Path:
    if sys.platform == "win32":
        return venv_dir / "Scripts" / "python.exe"
    return venv_dir / "bin" / "python"


class BuildVenv:
    """A fresh venv with the build requirements, and a private copy of the source tree."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.python = venv_python(root / "venv")
        self.source = root / "source"

    def pip(self, *args: str, env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
        return run([str(self.python), "-m", "pip", *args], env=env or clean_env(), cwd=self.root)

    def python_c(self, code: str) -> subprocess.CompletedProcess:
        """Run ``python -c code`` in the venv, away from the source tree."""
        return run([str(self.python), "-c", code], env=clean_env(), cwd=self.root)

    def uninstall(self) -> None:
        self.pip("uninstall", "-y", "leasequeue")


def copy_source_tree(dest: Path) -> None:
    """Copy what a build needs, without build products of the working tree.

    A private copy keeps the test from writing ``build/``, ``*.egg-info`` or the
    generated C file into a working tree that other builds may be using.
    """
    products = shutil.ignore_patterns("*.so", "*.pyd", "*.c", "__pycache__", "*.egg-info", "build", "dist", ".*")

    def ignore(folder: str, names: List[str]) -> "set[str]":
        # Cython's annotated *.html are build products; the dashboard's templates are sources.
        skipped = set(products(folder, names))
        if Path(folder).name != "templates":
            skipped.update(n for n in names if n.endswith(".html"))
        return skipped

    dest.mkdir(parents=True)
    for item in ROOT.iterdir():
        if item.is_file() and item.name in ("setup.py", "pyproject.toml", "README.md", "LICENSE", "MANIFEST.in"):
            shutil.copy2(item, dest / item.name)
    shutil.copytree(ROOT / "src", dest / "src", ignore=ignore)


@pytest.fixture(scope="module")
def build_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BuildVenv]:
    """A venv with setuptools>=77 and Cython, shared by the build tests of this module."""
    root = tmp_path_factory.mktemp("build")
    bv = BuildVenv(root)
    created = run([sys.executable, "-m", "venv", str(root / "venv")], env=clean_env(), cwd=root)
    assert created.returncode == 0, created.stdout
    got = bv.pip("install", "--quiet", *BUILD_REQUIREMENTS)
    if got.returncode != 0:
        # Not a defect of this project: the index (and pip's cache) could not
        # provide the build tools.
        pytest.skip(f"could not install the build requirements {BUILD_REQUIREMENTS}:\n{got.stdout[-2000:]}")
    copy_source_tree(bv.source)
    yield bv
    shutil.rmtree(root, ignore_errors=True)


# --------------------------------------------------------------------------
# Fast checks of the install the tests are running against.


def test_strict_build_uses_the_extension() -> None:
    """Where the build was strict, the installed package must be the compiled one.

    This is what makes a silently missing extension (msgpack issues 437, 481)
    fail CI, ``.ci/run`` and every cibuildwheel test run.
    """
    if not os.environ.get("LEASEQUEUE_REQUIRE_EXTENSIONS") or os.environ.get("LEASEQUEUE_NO_EXTENSIONS"):
        pytest.skip("only meaningful when LEASEQUEUE_REQUIRE_EXTENSIONS is set (CI, .ci/run, wheel tests)")
    import leasequeue
    import leasequeue._backends.inmemory.transport_c as compiled

    import leasequeue.worker.runners._fastpath as compiled_fast_path
    from leasequeue.worker.runners import fastpath

    assert leasequeue.IMPLEMENTATION == "cython"
    assert leasequeue.InMemoryTransport is compiled.InMemoryTransport
    assert fastpath.COMPILED is compiled_fast_path.run  # the thread runner's loop in C
    # Compiled modules, not stray .py files.
    for module in (compiled, compiled_fast_path):
        assert Path(module.__file__ or "").suffix in (".so", ".pyd"), module.__file__


@pytest.mark.skipif(not sysconfig.get_config_var("Py_GIL_DISABLED"), reason="needs a free-threaded CPython")
def test_free_threaded_import_keeps_the_gil_disabled() -> None:
    """The extensions are declared free-threading compatible: importing them must not re-enable the GIL."""
    if os.environ.get("LEASEQUEUE_NO_EXTENSIONS"):
        pytest.skip("the extension is disabled by LEASEQUEUE_NO_EXTENSIONS")
    code = (
        "import sys, warnings\n"
        "warnings.simplefilter('error')\n"
        "import leasequeue._backends.inmemory.transport_c, leasequeue.worker.runners._fastpath, leasequeue\n"
        "print(leasequeue.IMPLEMENTATION, sys._is_gil_enabled())\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    env.pop("PYTHON_GIL", None)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert out.returncode == 0, out.stdout
    assert out.stdout.split()[-2:] == ["cython", "False"], out.stdout


# --------------------------------------------------------------------------
# Slow: real builds in a fresh venv.


@pytest.mark.slow
@needs_source_tree
@needs_cc_toolchain
def test_build_without_compiler_falls_back_loudly(build_venv: BuildVenv) -> None:
    """``CC=false``: the install succeeds, prints the banner, and runs the pure twin."""
    build_venv.uninstall()
    built = build_venv.pip(
        "install",
        "-v",
        "--no-build-isolation",
        "--no-deps",
        str(build_venv.source),
        env=clean_env(CC="false", CXX="false"),
    )
    assert built.returncode == 0, built.stdout[-4000:]
    assert FALLBACK_BANNER in built.stdout, built.stdout[-4000:]
    assert "LEASEQUEUE_REQUIRE_EXTENSIONS=1" in built.stdout  # the banner says how to make it an error

    probe = build_venv.python_c(
        "import importlib.util, leasequeue\n"
        "t = leasequeue.InMemoryTransport(clock=lambda: 100.0)\n"
        "t.publish('g', 'e')\n"
        "lease = t.claim('w', 5.0)\n"
        "t.ack(lease)\n"
        "compiled = importlib.util.find_spec('leasequeue._backends.inmemory.transport_c')\n"
        "print(leasequeue.IMPLEMENTATION, compiled is None,\n"
        "      lease.event, len(t), leasequeue.__file__)\n"
    )
    assert probe.returncode == 0, probe.stdout
    implementation, no_extension, event, remaining, location = probe.stdout.split()
    assert (implementation, no_extension, event, remaining) == ("python", "True", "e", "0")
    assert Path(location).resolve().is_relative_to(build_venv.root.resolve())
    assert not Path(location).resolve().is_relative_to(ROOT)
    # The worker's thread runner runs its pure fast path there.
    ran = build_venv.python_c(WORKER_PROBE)
    assert ran.returncode == 0, ran.stdout
    assert ran.stdout.split() == ["pure", "[0,", "1,", "2]", "3"], ran.stdout


@pytest.mark.slow
@needs_source_tree
def test_strict_wheel_holds_every_compiled_module(build_venv: BuildVenv) -> None:
    """``LEASEQUEUE_REQUIRE_EXTENSIONS=1``: the wheel holds the three
    compiled modules and their Cython sources, and installed, the worker's
    thread runner runs the compiled fast path."""
    # A source copy of its own: a build leaves compiled objects in its
    # source (build/, the generated C) that would let a later build there
    # skip the compiler.
    source = build_venv.root / "strict-source"
    copy_source_tree(source)
    out_dir = build_venv.root / "strictwheel"
    built = build_venv.pip(
        "wheel",
        "--no-build-isolation",
        "--no-deps",
        "-w",
        str(out_dir),
        str(source),
        env=clean_env(LEASEQUEUE_REQUIRE_EXTENSIONS="1"),
    )
    assert built.returncode == 0, built.stdout[-4000:]
    wheels = list(out_dir.glob("*.whl"))
    assert len(wheels) == 1, wheels
    with zipfile.ZipFile(wheels[0]) as zf:
        names = zf.namelist()
    for module in ("_backends/inmemory/transport_c", "bench/_floor", "worker/runners/_fastpath"):
        assert [n for n in names if n.startswith(f"leasequeue/{module}.") and n.endswith((".so", ".pyd"))], module
        assert f"leasequeue/{module}.pyx" in names, module
    assert "leasequeue/worker/runners/_fastpath.pyi" in names
    build_venv.uninstall()
    installed = build_venv.pip("install", "--no-deps", str(wheels[0]))
    assert installed.returncode == 0, installed.stdout[-4000:]
    ran = build_venv.python_c(WORKER_PROBE)
    assert ran.returncode == 0, ran.stdout
    assert ran.stdout.split() == ["compiled", "[0,", "1,", "2]", "3"], ran.stdout
    build_venv.uninstall()


@pytest.mark.slow
@needs_source_tree
@needs_cc_toolchain
def test_strict_build_without_compiler_fails(build_venv: BuildVenv) -> None:
    """``CC=false`` with ``LEASEQUEUE_REQUIRE_EXTENSIONS=1``: the build fails and nothing is installed."""
    build_venv.uninstall()
    built = build_venv.pip(
        "install",
        "-v",
        "--no-build-isolation",
        "--no-deps",
        str(build_venv.source),
        env=clean_env(CC="false", CXX="false", LEASEQUEUE_REQUIRE_EXTENSIONS="1"),
    )
    assert built.returncode != 0, built.stdout[-4000:]
    # It failed at the compiler (`false`), not somewhere unrelated.  The wording
    # depends on the setuptools version: "Command '['false', ...]' returned
    # non-zero exit status 1" or "command '/usr/bin/false' failed with exit code 1".
    compiler_failed = re.search(r"false'.*(non-zero exit status|failed with exit code)", built.stdout)
    assert compiler_failed, built.stdout[-4000:]
    assert FALLBACK_BANNER not in built.stdout
    probe = build_venv.python_c("import leasequeue")
    assert probe.returncode != 0 and "ModuleNotFoundError" in probe.stdout, probe.stdout


@pytest.mark.slow
@needs_source_tree
def test_no_extensions_builds_a_pure_wheel(build_venv: BuildVenv) -> None:
    """``LEASEQUEUE_NO_EXTENSIONS=1`` builds a ``py3-none-any`` wheel with no compiled module."""
    out_dir = build_venv.root / "purewheel"
    built = build_venv.pip(
        "wheel",
        "--no-build-isolation",
        "--no-deps",
        "-w",
        str(out_dir),
        str(build_venv.source),
        env=clean_env(LEASEQUEUE_NO_EXTENSIONS="1"),
    )
    assert built.returncode == 0, built.stdout[-4000:]
    wheels = list(out_dir.glob("*.whl"))
    assert len(wheels) == 1, wheels
    assert wheels[0].name.endswith("-py3-none-any.whl"), wheels[0].name
    with zipfile.ZipFile(wheels[0]) as zf:
        names = zf.namelist()
    assert "leasequeue/py.typed" in names
    assert "leasequeue/_backends/inmemory/transport_py.py" in names
    # The dashboard's templates and static files are package data (tests/dashboard).
    for name in ("templates/base.html", "templates/group.html", "static/dashboard.js", "static/dashboard.css"):
        assert f"leasequeue/dashboard/{name}" in names, name
    assert not [n for n in names if n.endswith((".so", ".pyd", ".dylib"))], names
