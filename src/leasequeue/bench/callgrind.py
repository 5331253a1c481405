"""The fixed cycle that ``benchmarks/callgrind.py`` runs under valgrind.

``python -m leasequeue.bench --callgrind-child IMPL N G K KMAX`` prefills N
messages in G groups, then runs K full cycles.  The driver runs it twice
(K1 and K2) and takes the difference, so start-up, imports and prefill cancel.
"""

from __future__ import annotations

import gc

from .impls import IMPLS
from .workloads import EVENT, VISIBILITY, WORKER, State

__all__ = ["callgrind_child"]


def callgrind_child(impl: str, n: int, g: int, k: int, kmax: int) -> None:
    """Prefill, then ``k`` full cycles.  The list of publish targets is always
    built for ``kmax`` cycles, so its cost cancels in the difference of two runs."""
    gc.disable()
    st = State(impl, n, g, "main")
    seq = st.group_seq(kmax)[:k]
    t, ev, w, vis = st.t, EVENT, WORKER, VISIBILITY
    if IMPLS[impl].kind == "queue":
        put, get = t.put, t.get
        for _gid in seq:
            put(ev)
            get()
    else:
        pub, cl, ack = t.publish, t.claim, t.ack
        for gid in seq:
            pub(gid, ev)
            ack(cl(w, vis))
