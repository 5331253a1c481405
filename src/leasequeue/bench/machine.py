"""The machine description at the head of every report."""

from __future__ import annotations

import importlib
import os
import platform
import sys
from typing import Any, Dict, Optional

__all__ = ["compiled_with", "machine"]


def compiled_with() -> Optional[str]:
    """The Cython version that compiled the extension, as recorded at build
    time in its ``CYTHON_VERSION`` attribute; None when no compiled module
    imports.  (The Cython importable at run time, if any, says nothing about
    an installed wheel.)"""
    for name in ("leasequeue._backends.inmemory.transport_c", "leasequeue.bench._floor"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        version = getattr(module, "CYTHON_VERSION", None)
        if version:
            return str(version)
    return None


def machine() -> Dict[str, Any]:
    """CPU, cores, Python, platform, GIL, the Cython that compiled the extension, leasequeue."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    from .. import __version__

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "python_build": " ".join(platform.python_build()),
        "platform": platform.platform(),
        "gil_enabled": getattr(sys, "_is_gil_enabled", lambda: True)(),
        "cython": compiled_with(),
        "leasequeue": __version__,
    }
