"""Entry points of the child interpreters the benchmark starts.

``python -m leasequeue.bench --memory-child IMPL N G`` (see ``memory.py``)
and ``--callgrind-child IMPL N G K KMAX [BATCH | ack_and_claim]`` (see ``callgrind.py``).  Users run
``python -m leasequeue bench`` instead.
"""

from __future__ import annotations

import json
import sys
from typing import Sequence


def main(argv: Sequence[str]) -> int:
    """Dispatch to a child entry point; 2 on anything else."""
    if len(argv) == 4 and argv[0] == "--memory-child":
        from .memory import memory_child

        print(json.dumps(memory_child(argv[1], int(argv[2]), int(argv[3]))))
        return 0
    if len(argv) in (6, 7) and argv[0] == "--callgrind-child":
        from .callgrind import callgrind_child

        head = (argv[1], int(argv[2]), int(argv[3]), int(argv[4]), int(argv[5]))
        if argv[6:] == ["ack_and_claim"]:
            callgrind_child(*head, ack_and_claim=True)
        else:
            callgrind_child(*head, int(argv[6]) if argv[6:] else 0)
        return 0
    sys.stderr.write("internal entry point; use: python -m leasequeue bench\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
