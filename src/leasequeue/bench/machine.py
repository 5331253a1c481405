"""The machine description at the head of every report."""

from __future__ import annotations

import os
import platform
import sys
from typing import Any, Dict, Optional

__all__ = ["machine"]


def machine() -> Dict[str, Any]:
    """CPU, cores, Python, platform, GIL, Cython and leasequeue versions."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        import Cython  # noqa: F401

        cython_version: Optional[str] = Cython.__version__
    except ImportError:
        cython_version = None
    from .. import __version__

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "python_build": " ".join(platform.python_build()),
        "platform": platform.platform(),
        "gil_enabled": getattr(sys, "_is_gil_enabled", lambda: True)(),
        "cython": cython_version,
        "leasequeue": __version__,
    }
