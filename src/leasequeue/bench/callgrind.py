"""The fixed cycle that ``benchmarks/callgrind.py`` runs under valgrind.

``python -m leasequeue.bench --callgrind-child IMPL N G K KMAX [BATCH | ack_and_claim]``
prefills N messages in G groups, then runs K full cycles -- or, with BATCH,
K // BATCH batched cycles of BATCH messages (``publish_many`` +
``claim_many`` + ``ack_many``), or with ``ack_and_claim`` K cycles of a
worker that acks each job with its next claim (``publish`` +
``ack_and_claim``, the lease carried into the next cycle).  The driver runs it twice (K1 and K2) and
takes the difference, so start-up, imports and prefill cancel.
"""

from __future__ import annotations

import gc

from .impls import IMPLS
from .workloads import EVENT, VISIBILITY, WORKER, State

__all__ = ["callgrind_child"]


def callgrind_child(
    impl: str, n: int, g: int, k: int, kmax: int, batch: int = 0, ack_and_claim: bool = False
) -> None:
    """Prefill, then ``k`` full cycles (``batch``: ``k // batch`` batched
    cycles; ``ack_and_claim``: publish + ack_and_claim cycles).  The publish
    targets are always built for ``kmax`` cycles, so their cost cancels in
    the difference of two runs."""
    gc.disable()
    st = State(impl, n, g, "main")
    targets = st.group_seq(kmax)
    t, ev, w, vis = st.t, EVENT, WORKER, VISIBILITY
    if batch:
        batches = [[(gid, ev) for gid in targets[i:i + batch]] for i in range(0, kmax - batch + 1, batch)]
        pm, cm, am = t.publish_many, t.claim_many, t.ack_many
        for items in batches[: k // batch]:
            pm(items)
            am(cm(w, vis, batch))
        return
    seq = targets[:k]
    if ack_and_claim:
        pub, cl, aac = t.publish, t.claim, t.ack_and_claim
        lease = cl(w, vis)  # in both runs: cancels
        for gid in seq:
            pub(gid, ev)
            lease = aac(lease, w, vis)
        return
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
