"""PostgresTransport benchmarks, side by side with procrastinate and PGQueuer.

A thin wrapper: the measurement lives in the package
(``leasequeue.bench.postgres``, so it runs from an installed wheel) and is
``leasequeue bench --postgres``.  This script takes the same options::

    python benchmarks/postgres_bench.py [--quick | --smoke] [--conninfo DSN] [--sync on|off|both]
"""

from __future__ import annotations

import sys

from leasequeue.bench.postgres import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
