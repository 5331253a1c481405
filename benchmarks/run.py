#!/usr/bin/env python3
"""Run the benchmark suite from a checkout: the same as ``leasequeue bench``.

    PYTHONPATH=src python3 benchmarks/run.py            # quick mode
    PYTHONPATH=src python3 benchmarks/run.py --full --plot out.png --json out.json

All options are those of ``python -m leasequeue bench --help``; the suite
itself lives in ``src/leasequeue/bench/`` so that it also runs from an
installed wheel.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    if os.path.isdir(os.path.join(src, "leasequeue")) and src not in sys.path:
        sys.path.insert(0, src)
        os.environ["PYTHONPATH"] = src + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")
    from leasequeue.__main__ import main

    sys.exit(main(["bench", *sys.argv[1:]]))
