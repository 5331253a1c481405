"""Build script: the Cython extension, and the optional/strict build switch.

* ``LEASEQUEUE_NO_EXTENSIONS=1``: build no extension at all (the pure wheel).
* ``LEASEQUEUE_REQUIRE_EXTENSIONS=1`` (or running under cibuildwheel): a
  failed compile is an error.
* Otherwise a failed compile (no compiler, no headers) installs the pure-Python
  twin and prints a loud warning.
"""

from __future__ import annotations

import glob
import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

NO_EXTENSIONS = bool(os.environ.get("LEASEQUEUE_NO_EXTENSIONS"))
REQUIRE_EXTENSIONS = bool(
    os.environ.get("LEASEQUEUE_REQUIRE_EXTENSIONS") or os.environ.get("CIBUILDWHEEL")
)

CYTHON_DIRECTIVES = {
    "language_level": "3",
    "embedsignature": True,
    "freethreading_compatible": True,
}

FALLBACK_WARNING = """
**********************************************************************
* WARNING: leasequeue's Cython extension {name} could not be built:
*     {error}
* leasequeue will be installed with its pure-Python implementation,
* which behaves identically but is several times slower.
* Check with:  python -c "import leasequeue; print(leasequeue.IMPLEMENTATION)"
* To make this an error, set LEASEQUEUE_REQUIRE_EXTENSIONS=1.
**********************************************************************
"""


class OptionalBuildExt(build_ext):
    """build_ext that falls back to pure Python, loudly, unless strict."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - any toolchain failure
            if REQUIRE_EXTENSIONS:
                raise
            self._warn("(all)", exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001 - any toolchain failure
            if REQUIRE_EXTENSIONS:
                raise
            self._warn(ext.name, exc)

    @staticmethod
    def _warn(name: str, exc: BaseException) -> None:
        sys.stderr.write(FALLBACK_WARNING.format(name=name, error=exc))
        sys.stderr.flush()


def extensions() -> list[Extension]:
    if NO_EXTENSIONS:
        return []
    try:
        from Cython.Build import cythonize
    except ImportError as exc:
        if REQUIRE_EXTENSIONS:
            raise
        OptionalBuildExt._warn("leasequeue._backends.inmemory.transport_c", exc)
        return []
    # The transport's .pyx includes its data structures from .pxi files, and
    # both modules use the platform header (the bench's floor stub finds it
    # through include_dirs).  cythonize() finds these from the include/extern
    # statements itself; they are listed too so that an edit to any of them
    # rebuilds the module whatever tool drives the build.
    inmemory = "src/leasequeue/_backends/inmemory"
    headers = [f"{inmemory}/lq_platform.h", f"{inmemory}/lq_build.h"]
    transport_pxi = sorted(glob.glob(f"{inmemory}/*.pxi"))
    exts = [
        Extension(
            "leasequeue._backends.inmemory.transport_c",
            [f"{inmemory}/transport_c.pyx"],
            depends=[*transport_pxi, *headers],
        ),
        Extension(
            "leasequeue.bench._floor",
            ["src/leasequeue/bench/_floor.pyx"],
            depends=headers,
            include_dirs=[inmemory],
        ),
        # The thread runner's fast path loop in C (worker/runners/fastpath.py
        # picks it; the pure ThreadRunner.fast where it was not built).
        Extension(
            "leasequeue.worker.runners._fastpath",
            ["src/leasequeue/worker/runners/_fastpath.pyx"],
        ),
    ]
    return cythonize(exts, compiler_directives=CYTHON_DIRECTIVES)


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
