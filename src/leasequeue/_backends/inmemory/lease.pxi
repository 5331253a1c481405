# The Lease class of the Cython transport (included by transport_c.pyx): the
# value a claim hands out, and ``_issue``, which stamps one with the issuing
# transport's token, the group slot it was issued for (so ``ack`` finds the
# group without a lookup) and the number of its delivery (the claim number
# of the claim that made it: fencing by delivery, docs/decisions.md).  The
# pure twin's counterpart is the top of ``transport_py`` (``Lease``,
# ``_issue``, ``_lost_message``).


@cython.final
@cython.auto_pickle(False)
@cython.freelist(256)  # a claim makes one and an ack usually drops it; a batch, up to 256 (GIL builds only)
cdef class Lease:
    """One delivery of one message: the handle for ``ack``/``nack``/``extend``.

    An immutable value.  ``seq``, ``group_id`` and ``event`` are the seed's
    three fields; ``worker_id``, ``expires_at`` (clock seconds) and
    ``attempt`` (1 on a message's first delivery, +1 at each later claim)
    follow.  ``event`` is the very object that was published.

    Leases compare equal when all fields but ``event`` are equal and the
    events are the same object; the hash ignores the event (it may be
    unhashable).  A ``Lease`` built by hand is never accepted by a transport:
    only leases a transport issued are current there.
    """

    cdef readonly object group_id
    cdef readonly object event
    cdef readonly object worker_id
    # The issuing transport's token; None on a lease built by hand.
    cdef object _owner
    # A hand-built lease keeps the objects it was given; an issued one keeps
    # C values (no int/float objects are made unless the fields are read).
    cdef object _seq
    cdef object _expires_at
    cdef object _attempt
    cdef int64_t _cseq
    cdef int64_t _cattempt
    cdef double _cexpires_at
    cdef int32_t _slot
    # The lease names a delivery (a durable backend's, see ``_durable_lease``)
    # though it has no owner; an issued lease always names one.
    cdef uint8_t _named
    # The number of the delivery it names: the claim number of the claim
    # that made it (an issued lease), or the durable store's (``_named``).
    cdef int64_t _cdelivery

    def __init__(
        self,
        seq: int,
        group_id: str,
        event: Any,
        worker_id: str,
        expires_at: float,
        attempt: int,
    ) -> None:
        self._seq = seq
        self.group_id = group_id
        self.event = event
        self.worker_id = worker_id
        self._expires_at = expires_at
        self._attempt = attempt
        self._owner = None

    @property
    def _delivery(self):
        """The number of the delivery this lease names, or None (built by hand)."""
        if self._owner is not None or self._named:
            return self._cdelivery
        return None

    @property
    def seq(self):
        return self._seq if self._owner is None else self._cseq

    @property
    def expires_at(self):
        return self._expires_at if self._owner is None else self._cexpires_at

    @property
    def attempt(self):
        return self._attempt if self._owner is None else self._cattempt

    cdef inline object _get_seq(self):
        return self._seq if self._owner is None else self._cseq

    cdef inline object _get_expires_at(self):
        return self._expires_at if self._owner is None else self._cexpires_at

    cdef inline object _get_attempt(self):
        return self._attempt if self._owner is None else self._cattempt

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Lease is immutable: cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"Lease is immutable: cannot delete {name!r}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Lease):
            return NotImplemented
        cdef Lease o = <Lease>other
        return (
            self._get_seq() == o._get_seq()
            and self.group_id == o.group_id
            and self.event is o.event
            and self.worker_id == o.worker_id
            and self._get_expires_at() == o._get_expires_at()
            and self._get_attempt() == o._get_attempt()
        )

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self) -> int:
        return hash((self._get_seq(), self.group_id, self.worker_id, self._get_expires_at(), self._get_attempt()))

    def __repr__(self) -> str:
        return (
            f"Lease(seq={self._get_seq()!r}, group_id={self.group_id!r}, event={self.event!r}, "
            f"worker_id={self.worker_id!r}, expires_at={self._get_expires_at()!r}, "
            f"attempt={self._get_attempt()!r})"
        )

    def __reduce__(self) -> Any:
        raise TypeError("a Lease cannot be pickled or copied: it is only valid in its transport")

    def __copy__(self) -> "Lease":
        return self

    def __deepcopy__(self, memo: Any) -> "Lease":
        return self


cdef inline Lease _issue(
    int64_t seq, object group_id, object event, object worker_id,
    double expires_at, int64_t attempt, object owner, int32_t slot, int64_t delivery,
):
    """Build a lease stamped with its transport's owner token, naming
    delivery ``delivery``."""
    cdef Lease lease = Lease.__new__(Lease)
    lease.group_id = group_id
    lease.event = event
    lease.worker_id = worker_id
    lease._owner = owner
    lease._cseq = seq
    lease._cexpires_at = expires_at
    lease._cattempt = attempt
    lease._slot = slot
    lease._cdelivery = delivery
    return lease


def _durable_lease(seq, group_id, event, worker_id, expires_at, attempt, delivery):
    """A lease with no owner token (as the public constructor builds it: the
    durable backends accept it by its fields) naming delivery ``delivery``."""
    cdef Lease lease = Lease(seq, group_id, event, worker_id, expires_at, attempt)
    if delivery is not None:
        lease._cdelivery = delivery  # an int (durable stores number deliveries in 64 bits)
        lease._named = 1
    return lease


cdef str _lost_message(Lease lease):
    return (
        f"lease of message {lease._get_seq()} in group {lease.group_id!r} (attempt {lease._get_attempt()}) "
        "is not current: it was acked, nacked, re-delivered, or issued by another transport"
    )


# One claim of ``claim_many``, recorded under the lock; its lease is built
# after the lock (a Lease is an object the garbage collector tracks).  The
# references are owned.
ctypedef struct Claimed:
    PyObject *group_id
    PyObject *event
    int64_t seq
    int64_t attempt
    int64_t delivery
    int32_t slot
