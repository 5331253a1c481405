"""Pure-Python ``InMemoryTransport``: the readable twin of the Cython core.

This module is where a reader learns the algorithm; ``transport_c.pyx``
implements the same structures over C arrays and must behave identically.
The contract is ``docs/contract.md``; ``docs/decisions.md`` pins what it leaves open.

How a claim stays O(log G) (G = groups), whatever the number of messages:

* Each group keeps its messages in a FIFO (a list with a moving head).  Only a
  group's *head* message can ever be leased or parked (a group is served only
  when nothing of it is in flight, and then its oldest message is taken), so
  the lock state -- holder, expiry, attempt count -- lives on the group.
* A group is *ready* when it holds messages and nothing of it is locked.
  Ready groups sit in a heap per distinct priority, keyed by their
  round-robin key: never-claimed groups ``first seq - 2**62`` (so they come
  first, oldest first), claimed groups the number of the claim that last
  served them (so the group served longest ago comes first).
* The priority levels form a treap ordered by priority; every node knows the
  smallest ready key in its subtree, so "the smallest key among levels with
  priority >= p" is one walk from the root: O(log L), L <= G levels.
* Locked groups with a finite expiry sit in a lazy min-heap keyed by expiry;
  a claim first pops every entry that has expired and makes its group ready
  again with its old key (its place in the round-robin is kept).  Entries
  made stale by ack/nack/extend are skipped, and the heap is compacted when
  stale entries outnumber live ones, so memory stays O(G) (plus one entry
  per waiting claim: a direct hand-off to a claim leaves that check to the
  claim, which made it before it waited).
* The control plane works on the same structures: a paused group is simply
  never made ready (it keeps its key, so ``resume`` puts it back where it
  was), ``set_priority`` moves a group to another level with its key, and
  ``purge`` forgets a group with its messages.  A paused group outlives its
  messages (``_idle`` counts the empty ones); ``groups()`` lists the group
  table, whose order is creation order.  The batches are the single
  operations in a loop under one lock.
* The quarantine too: a buried group (``bury``) is, like a paused one, just
  not in the ready set; its head keeps its attempt count and the group its
  key, and ``group.reason`` (None unless buried) says why.  So publish,
  claim and ack never look at it.  ``skip`` removes a head as ``ack``
  does, whatever its lock, unless a live lease holds it; ``peek`` slices
  the group's FIFO: O(1 + k).

SPEC Part 5 ("Later", "Once", "Honest attempts") adds three things, each
paid for only by the messages and calls that use it (a publish, claim and
ack without a delay or a key pay two identity tests and one branch):

* **Fencing by delivery.**  A delivery is numbered by the claim counter:
  the claim that makes it sets its group's round-robin key to that number,
  and the lease carries it (``Lease._delivery``).  ``group.open`` says
  whether that delivery is still open, so a lease is current exactly while
  ``group.open and group.key == lease._delivery`` (``_current``): a lease
  of a closed delivery (acked, nacked, released, buried, skipped, retried,
  or expired and claimed again) never is, whatever its ``attempt``.
  ``release`` is ``nack`` that then sets the attempt count back to
  ``lease.attempt - 1``; ``retry`` resets it to 0, lifts a bury, ends a
  park and closes an expired lease's open delivery.
* **Later.**  A message published with a delay has a *due*.  Its FIFO entry
  is ``(seq, event, due, key)`` instead of ``(seq, event)`` (as is a keyed
  one's; ``_extras`` counts those held, so code on the hot path tests one
  counter).  A scheduled *head* is modelled like a park: the group's lock
  is ``_SCHEDULED`` with ``expires_at = due`` and an entry in the expiry
  heap, so whatever ends a park (a claim's expiry pop, ``_advance``, the
  expiry timer of waiting claims) makes it ready once ``due < now`` -- but
  it has no holder, no delivery, and is not counted as parked.  A message
  becomes the head when it is published into a group holding nothing, or
  when an ack, skip (or batch form) takes the message before it; if it has
  a due, its group then takes the scheduled state, even if the due has
  passed (the next operation that reads the clock frees it).  A message
  behind the head just carries its due.  ``stats().scheduled`` counts every
  held message with ``due >= now``: ``_sched`` maps their seqs to their due,
  and ``_sched_heap`` (``(due, seq)``, lazy) lets ``stats`` drop the ones
  whose due has passed; a message that leaves drops its own, and the heap
  is rebuilt from ``_sched`` when stale entries outnumber live ones.  So a
  scheduled message costs its entry plus a heap entry and a ``_sched``
  slot, as a parked one costs its entry plus an expiry entry.
* **Once.**  ``_keys`` maps ``(group_id, key)`` to the ``_KeyHold`` of the
  message holding it (see "The idempotency keys" in the storage section):
  one dict lookup per keyed publish, nothing for the others.


The sections below come in the order in which ``transport_c.pyx`` includes
its ``.pxi`` files, each under a banner named after its file, so the two can
be read side by side (``tests/inmemory/test_parity.py`` checks the banners):

=================  ====================================================
``lease.pxi``      ``Lease``
``validation.pxi`` argument checks (shared with the durable backends)
``ids.pxi``        the group-id table (here a dict)
``ready.pxi``      the ready heaps and the level treap
``expiry.pxi``     the expiry heap of locked groups
``storage.pxi``    message and group storage
``waiters.pxi``    the waiting claims (sleeping and waking: ``waiting.py``)
``batch.pxi``      a ``publish_many`` batch's plan (nothing to plan here)
=================  ====================================================

Then the transport, whose internal methods follow the same order.

Thread safety: one ``threading.Lock``.  No user code runs under it: the clock
is read before taking it, ``str`` subclasses are converted to ``str`` before
it, leases and exceptions are built after releasing it, and the transport's
reference to an acked event is dropped after releasing it (the event's
``__del__`` may publish to this very transport).
"""

from __future__ import annotations

import math
import random
import threading
import time
from bisect import insort
from collections import deque
from heapq import heapify, heappop, heappush
from typing import Any, Callable, ClassVar, Deque, Dict, Iterable, List, Optional, Tuple, TypeVar

from . import waiting as _waiting
from ..._errors import LeaseLost
from ..._types import PARKED, GroupInfo, Message, TransportStats
from ..._validation import (
    INT64_MAX as _INT64_MAX,
    INT64_MIN as _INT64_MIN,
    check_count as _check_count,
    check_duration as _check_duration,
    check_id as _check_id,
    check_key as _check_key,
    check_keyed_item as _check_keyed_item,
    check_priority as _check_priority,
    check_reason as _check_reason,
    check_time as _check_time,
    check_timeout as _check_timeout,
    check_worker as _check_worker,
)
from .waiting import CLOSED as _W_CLOSED
from .waiting import HANDED as _W_HANDED
from .waiting import IDLE as _W_IDLE
from .waiting import WAITING as _W_WAITING


_Self = TypeVar("_Self")  # what __enter__ returns: the transport itself (a subclass's too)

__all__ = ["PARKED", "InMemoryTransport", "Lease", "TransportStats"]

# Never-claimed groups are keyed by ``first seq - _NEVER_CLAIMED`` so every
# one of them sorts before every claimed group (keyed by claim number >= 1).
# A group created by ``pause`` holds no message yet: keyed ``-_NEVER_CLAIMED``
# until its first message arrives.  A key < 0 means "never claimed".
_NEVER_CLAIMED = 2**62

# Lock states of a group's head message.
_FREE = 0  # not locked (possibly an expired lease whose delivery is still open)
_LEASED = 1
_PARKED = 2
_SCHEDULED = 3  # a head published with a delay, not yet seen due: no holder, not counted as parked

_INF = math.inf

# The default ``timeout`` of ``claim``: compared by identity first, so that a
# claim that does not wait pays one test for the argument.
_NO_WAIT = 0.0
# The default ``delay`` of ``publish``, compared by identity likewise: a
# publish without delay or key pays two identity tests.
_NO_DELAY = 0.0


_osetattr = object.__setattr__


# ------------------------------------------------------------ lease.pxi: Lease


class Lease:
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

    __slots__ = ("seq", "group_id", "event", "worker_id", "expires_at", "attempt", "_owner", "_delivery")

    seq: int
    group_id: str
    event: Any
    worker_id: str
    expires_at: float
    attempt: int
    _owner: object
    # The number of the delivery it names (docs/decisions.md, "Fencing by
    # delivery"); None on a lease built by hand.
    _delivery: Optional[int]

    def __init__(
        self,
        seq: int,
        group_id: str,
        event: Any,
        worker_id: str,
        expires_at: float,
        attempt: int,
    ) -> None:
        _osetattr(self, "seq", seq)
        _osetattr(self, "group_id", group_id)
        _osetattr(self, "event", event)
        _osetattr(self, "worker_id", worker_id)
        _osetattr(self, "expires_at", expires_at)
        _osetattr(self, "attempt", attempt)
        _osetattr(self, "_owner", None)
        _osetattr(self, "_delivery", None)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        raise TypeError("Lease cannot be subclassed")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Lease is immutable: cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"Lease is immutable: cannot delete {name!r}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Lease):
            return NotImplemented
        return (
            self.seq == other.seq
            and self.group_id == other.group_id
            and self.event is other.event
            and self.worker_id == other.worker_id
            and self.expires_at == other.expires_at
            and self.attempt == other.attempt
        )

    def __hash__(self) -> int:
        return hash((self.seq, self.group_id, self.worker_id, self.expires_at, self.attempt))

    def __repr__(self) -> str:
        return (
            f"Lease(seq={self.seq!r}, group_id={self.group_id!r}, event={self.event!r}, "
            f"worker_id={self.worker_id!r}, expires_at={self.expires_at!r}, "
            f"attempt={self.attempt!r})"
        )

    def __reduce__(self) -> Any:
        raise TypeError("a Lease cannot be pickled or copied: it is only valid in its transport")

    def __copy__(self) -> "Lease":
        return self

    def __deepcopy__(self, memo: Any) -> "Lease":
        return self


class _LeaseBuilder:
    """Same slot layout as ``Lease`` but writable: ``_issue`` fills one in and
    then re-labels it ``Lease`` (``__class__`` assignment between layout-
    compatible classes), which is ~3x faster than seven ``object.__setattr__``
    calls on the hot path."""

    __slots__ = Lease.__slots__

    seq: int
    group_id: str
    event: Any
    worker_id: str
    expires_at: float
    attempt: int
    _owner: object
    _delivery: Optional[int]


def _durable_lease(
    seq: int, group_id: str, event: Any, worker_id: str, expires_at: float, attempt: int, delivery: int
) -> Lease:
    """A lease with no owner token (as the public constructor builds it:
    the durable backends accept it by its fields) naming delivery ``delivery``."""
    return _issue(seq, group_id, event, worker_id, expires_at, attempt, None, delivery)


def _issue(
    seq: int,
    group_id: str,
    event: Any,
    worker_id: str,
    expires_at: float,
    attempt: int,
    owner: object,
    delivery: Optional[int],
) -> Lease:
    """Build a lease stamped with its transport's owner token, naming delivery ``delivery``."""
    lease = _LeaseBuilder()
    lease.seq = seq
    lease.group_id = group_id
    lease.event = event
    lease.worker_id = worker_id
    lease.expires_at = expires_at
    lease.attempt = attempt
    lease._owner = owner
    lease._delivery = delivery
    lease.__class__ = Lease  # type: ignore[assignment]
    return lease  # type: ignore[return-value]


def _lost_message(lease: Lease) -> str:
    return (
        f"lease of message {lease.seq} in group {lease.group_id!r} (attempt {lease.attempt}) "
        "is not current: it was acked, nacked, re-delivered, or issued by another transport"
    )



# --------------------------------------------- validation.pxi: argument checks
#
# The argument checks are ``_validation.py``'s, shared with the other
# backends (the Cython twin's are ``validation.pxi``).


def _check_lease(lease: Any) -> Lease:
    # The exact type (Lease cannot be subclassed): isinstance() would consult
    # a forged ``__class__``, and its attributes could run user code.
    if type(lease) is not Lease:
        raise TypeError(f"expected a Lease, not {type(lease).__name__}")
    return lease


# ------------------------------------------------- ids.pxi: the group-id table
#
# Group id -> group: the transport's dict ``_groups`` (the Cython twin's
# ``IdTable`` in ``ids.pxi``, an open-addressing table of slots).


# ---------------------------------- ready.pxi: ready heaps and the level treap
#
# The Cython twin's ``ReadySet`` (``ready.pxi``).  Here a level's
# heap is lazy: a group leaving it only goes stale (``_Group.ready_key``),
# and stale entries are skipped or compacted away.


class _Level:
    """A treap node: one distinct priority with the heap of its ready groups.

    ``best`` is the smallest heap entry ``(key, group)`` of the subtree, or
    None when no group of the subtree is ready.
    """

    __slots__ = ("priority", "weight", "left", "right", "heap", "best", "groups", "stale")

    def __init__(self, priority: int, weight: float) -> None:
        self.priority = priority
        self.weight = weight
        self.left: Optional[_Level] = None
        self.right: Optional[_Level] = None
        self.heap: List[Tuple[int, _Group]] = []
        self.best: Optional[Tuple[int, _Group]] = None
        self.groups = 0  # groups of this priority (any state)
        self.stale = 0  # about how many heap entries are stale (for compaction)


def _treap_pull(node: _Level) -> None:
    """Recompute ``node.best`` from its own heap top and its children."""
    heap = node.heap
    best = heap[0] if heap else None
    child = node.left
    if child is not None and child.best is not None and (best is None or child.best[0] < best[0]):
        best = child.best
    child = node.right
    if child is not None and child.best is not None and (best is None or child.best[0] < best[0]):
        best = child.best
    node.best = best


def _treap_split(node: Optional[_Level], priority: int) -> Tuple[Optional[_Level], Optional[_Level]]:
    """Split a treap into (< priority, > priority); ``priority`` is absent."""
    if node is None:
        return None, None
    if node.priority < priority:
        low, high = _treap_split(node.right, priority)
        node.right = low
        _treap_pull(node)
        return node, high
    low, high = _treap_split(node.left, priority)
    node.left = high
    _treap_pull(node)
    return low, node


def _treap_merge(low: Optional[_Level], high: Optional[_Level]) -> Optional[_Level]:
    """Merge two treaps where every priority of ``low`` < every one of ``high``."""
    if low is None:
        return high
    if high is None:
        return low
    if low.weight > high.weight:
        low.right = _treap_merge(low.right, high)
        _treap_pull(low)
        return low
    high.left = _treap_merge(low, high.left)
    _treap_pull(high)
    return high


def _treap_insert(node: Optional[_Level], new: _Level) -> _Level:
    if node is None:
        return new
    if new.weight > node.weight:
        new.left, new.right = _treap_split(node, new.priority)
        _treap_pull(new)
        return new
    if new.priority < node.priority:
        node.left = _treap_insert(node.left, new)
    else:
        node.right = _treap_insert(node.right, new)
    _treap_pull(node)
    return node


def _treap_delete(node: Optional[_Level], priority: int) -> Optional[_Level]:
    assert node is not None
    if node.priority == priority:
        return _treap_merge(node.left, node.right)
    if priority < node.priority:
        node.left = _treap_delete(node.left, priority)
    else:
        node.right = _treap_delete(node.right, priority)
    _treap_pull(node)
    return node


# ------------------------------------------------- expiry.pxi: the expiry heap
#
# The transport's ``_expiry``: a lazy heapq list of (expires_at, tick, group);
# an entry is live while its tick is its group's ``tick``
# (``InMemoryTransport._lock_group``, ``_schedule``, ``_unlock``,
# ``_expire``).  A lease's or park's end, or a scheduled head's due.  The
# Cython twin's ``ExpiryHeap`` (``expiry.pxi``) is indexed instead.


# ------------------------ marks.pxi: due times and keys of the messages that have them
#
# Here a message published with a delay or a key is stored as the tuple
# ``(seq, event, due, key)`` instead of ``(seq, event)``, so only those
# messages pay.  ``stats().scheduled`` counts ``_sched`` (seq -> due of the
# messages still counted as scheduled), drained through the lazy heap
# ``_sched_heap`` of ``(due, seq)``; the holds of the keys are the dict
# ``_keys`` (``(group_id, key)`` -> ``_KeyHold``), the ones a window keeps
# after their message left dropped lazily in publish order.  The Cython twin
# keeps the same in ``MarkTable`` (seq -> due, key), ``SchedHeap`` and
# ``KeyRing`` (``marks.pxi``).



# -------------------------------------- storage.pxi: message and group storage
#
# One ``_Group`` per group, its messages in a list on it; the Cython twin's
# ``GroupStore``/``MessageStore`` (``storage.pxi``) hold records
# in C arrays by slot.


class _Group:
    """One group: its FIFO of messages and the lock state of its head.

    A group holding no message exists only while paused (``pause`` of an
    unknown group, or its last message acked while paused): then
    ``messages`` is ``[]``.
    """

    __slots__ = (
        "group_id",
        "messages",  # list of (seq, event) or (seq, event, due, key); entries before ``head`` are spent
        "head",
        "level",
        "key",  # round-robin key (see module docstring)
        "ready_key",  # == key while the group sits in its level's heap, else None
        "last_claimed_at",
        "attempt",  # deliveries of the head message so far
        "open",  # the head's latest delivery (the claim numbered ``key``) is still current
        "lock",  # _FREE / _LEASED / _PARKED / _SCHEDULED
        "worker_id",
        "expires_at",  # end of the lease or park, or the scheduled head's due
        "tick",  # id of this group's live expiry-heap entry, 0 if none
        "paused",  # by ``pause()``: never made ready while set
        "reason",  # by ``bury()``: its reason while buried (never made ready), else None
        "buried_by",  # the buried delivery's worker (read only while ``reason`` is set)
    )

    buried_by: Optional[str]  # set by bury only (not by __init__: publish creates groups on the hot path)

    def __init__(self, group_id: str, level: "_Level", seq: int, event: Any) -> None:
        self.group_id = group_id
        self.messages: List[Optional[Tuple[Any, ...]]] = [(seq, event)]
        self.head = 0
        self.level = level
        self.key = seq - _NEVER_CLAIMED
        self.ready_key: Optional[int] = None
        self.last_claimed_at = 0.0
        self.attempt = 0
        self.open = False
        self.lock = _FREE
        self.worker_id: Optional[str] = None
        self.expires_at = 0.0
        self.tick = 0
        self.paused = False
        self.reason: Optional[str] = None


def _paused_group(group_id: str, level: "_Level") -> _Group:
    """A group created by ``pause``: no message, never claimed, paused."""
    group = _Group(group_id, level, 0, None)
    group.messages = []
    group.key = -_NEVER_CLAIMED
    group.paused = True
    return group


def _view(group: _Group) -> Tuple[Any, ...]:
    """The fields of ``GroupInfo`` for ``group`` (expiry already applied, so a
    lock still set is live); the Cython twin's ``group_view``."""
    lock = group.lock
    messages = group.messages
    head = group.head
    reason = group.reason
    expires_at: Optional[float] = None
    due_at: Optional[float] = None
    if reason is not None:  # buried: the buried delivery's worker and attempt, no end
        state = "buried"
        holder: Optional[str] = group.buried_by
        attempt: Optional[int] = group.attempt
    elif lock == _FREE:
        state = "paused" if group.paused else "ready"
        holder = None
        attempt = None
    elif lock == _SCHEDULED:  # the head is not due: below a pause in precedence
        state = "paused" if group.paused else "scheduled"
        holder = None
        attempt = None
        due_at = group.expires_at
    else:
        state = "leased" if lock == _LEASED else "parked"
        holder, expires_at, attempt = group.worker_id, group.expires_at, group.attempt
    return (
        group.group_id,
        group.level.priority,
        len(messages) - head,
        state,
        group.paused,
        messages[head][0] if head < len(messages) else None,  # type: ignore[index]
        holder,
        expires_at,
        attempt,
        group.last_claimed_at if group.key > 0 else None,
        reason,
        due_at,
    )


def _message(entry: Tuple[Any, ...], attempt: int) -> Message:
    """``peek``'s view of one FIFO entry."""
    if len(entry) == 2:
        return Message(entry[0], entry[1], attempt)
    return Message(entry[0], entry[1], attempt, entry[2], entry[3])


# The idempotency keys (SPEC Part 5, "Once"), part of the storage:
# ``InMemoryTransport._keys`` maps ``(group_id, key)`` to
# the ``_KeyHold`` of the message that stored the key: O(1) expected per
# check.  A hold is *held* while its message is (``held``) or, with
# ``dedup_window > 0``, while ``now < at + dedup_window``.  A message that
# leaves (ack, skip, purge) deletes its hold at once when the window is 0
# or already over, else marks it not held; ``_key_order`` (a deque of the
# holds of a finite, non-zero window, in publish order, which is ``at``
# order since the transport's time never runs back) lets each keyed publish
# drop, from its front, the holds whose window is over and whose message
# left.  So memory is O(keys held + keys published within the window).


class _KeyHold:
    """The message holding an idempotency key in its group."""

    __slots__ = ("seq", "at", "held", "name")

    def __init__(self, seq: int, at: float, name: Tuple[str, str]) -> None:
        self.seq = seq  # the holder: what a publish with this key returns
        self.at = at  # the transport time of the storing publish
        self.held = True  # its message is still in the transport
        self.name = name  # (group_id, key): its entry in the table


# --------------------------------------------- waiters.pxi: the waiting claims
#
# Waiting claims (``claim(timeout=...)``, ``aclaim``): the Cython twin's
# ``waiters.pxi``.  Sleeping and waking is ``waiting.py``, shared
# by both twins; the core keeps the queue of waiting claims under its lock
# and serves it there (``InMemoryTransport._serve_locked``).
#
# THE ENTRY POINT.  Every operation that may have made a message claimable
# (publish, ack, nack(0), release(0); the control plane's resume,
# set_priority and retry; the batches publish_many and ack_many), or that
# read the clock and so may have expired locks or pushed an expiry earlier
# than the expiry timer is armed for (claim, stats, extend, nack(delay > 0),
# release(delay > 0), claim_many, group(), groups(), skip, retry, a publish
# with a delay: its due is such an expiry), ends, *after* releasing the
# lock, with
#
#     if self._nwaiting:
#         self._serve_waiters(now)    # its clock reading, or None if it read none
#
# ``resume``, ``set_priority``, ``publish_many`` and ``ack_many`` make that
# call (and so read the clock) only when they made a group claimable: a
# group made ready, a ready group moved to another priority, a non-empty
# batch, an ack done.  ``pause`` and ``purge`` make nothing claimable; a
# purge may drop the expiry the timer is armed for, which then fires, finds
# nothing due and re-arms for the next one (as after an ack).  A publish
# whose key is held publishes nothing and makes no such call: it wakes
# nobody.  A scheduled head becoming due is an expiry like a park's end:
# the timer (armed by the serving that follows the delayed publish, or the
# ack that exposed the head) wakes a waiting claim for it.
#
# With nobody waiting that test is the whole cost.  ``_nwaiting`` is read
# without the lock, which is enough: a waiting claim queues itself and serves
# the queue in one locked step, so either that step sees the operation's
# message, or the operation's read (after its own locked step) sees the
# claim waiting.  ``_serve_waiters`` takes the lock, hands every claimable
# message to the waiting claim it belongs to, and wakes those claims after
# releasing the lock.
#
# ``publish`` is the wake-up path (a producer, a blocked worker), so it goes
# one step further: when it sees claims waiting (the same unlocked read, made
# first), it reads the clock before its locked step and serves inside it
# (``_serve_in``): one lock instead of two, the wake right after.  It still
# ends with the test above, for a claim that came to wait after that first
# read; and it reads the clock once either way.  And when its message
# creates a group while nothing else is claimable for any waiting claim
# (the common case: a worker waits on an empty queue), the group is created
# leased to the claim that gets it (``_hand_new``): what ``_add`` and
# ``_hand_off`` leave, without the ready set in between.  Everything on that
# path that can be done before the claim waits is done then, by the claim
# (``_wait_start``): it makes the group and level records the hand-off will
# fill in (``_spare``, ``_spare_level``: one of each, kept on the transport)
# and compacts the expiry heap, so that the publish that wakes it allocates
# next to nothing and pays for no compaction.
#
# The queue: one FIFO of waiter records per distinct floor (``min_priority``)
# in ``_wqueues``, the floors ascending in ``_wfloors``; each record is
# numbered by arrival.  The floors that admit some ready group are a prefix
# of ``_wfloors`` (a floor admits a subset of what any lower floor admits),
# so the longest waiting claim that some ready group admits is the smallest
# arrival among the heads of that prefix: O(F log L) to find (F floors
# waiting, L priority levels), whatever the number of waiters.
#
# Hand-off (``_hand_off``): a claim on the waiter's behalf, exactly as
# ``claim`` makes it (lease until ``now + visibility``, claim counter,
# attempt + 1, delivery open), of the group that claim would take; the
# record keeps the lease's fields and what the claim changed (the group's
# round-robin key, ``last_claimed_at``, the open flag of the delivery before),
# so that ``_undo`` can take it back exactly when the waiter is interrupted
# before it returns the lease.  The record leaves the queue and is promised
# a wake (``_promise``: at most one outstanding per record, see
# ``waiting.py``); the wakes run after the lock is released (``_wake``).
#
# A waiting claim is woken only when it was served or closed (or by its own
# deadline), never to look at the clock: expiry is watched by the
# transport's expiry timer (``waiting.py``).  Whenever claims wait and the
# earliest expiry is earlier than ``_timer_at`` (the clock time the timer is
# armed for), ``_arm_timer`` lowers it and the timer is poked after the lock
# is released; the timer calls ``_timer_fire`` when that time is due.


class _Waiter:
    """A waiting claim, as the core keeps it (see the section comment)."""

    __slots__ = (
        "worker_id",
        "visibility",
        "floor",  # min_priority
        "wake",  # the waiting side's wake-up primitive (called after the lock)
        "state",  # _waiting.IDLE / WAITING / HANDED / CLOSED
        "pending",  # its wake is promised (or its owner is running): no other
        "arrival",  # order of arrival in the queue
        "prev",  # neighbours in its floor's FIFO
        "next",
        # the lease handed over
        "seq",
        "group_id",
        "event",
        "expires_at",
        "attempt",
        "delivery",  # the claim number of the hand-off
        # what the hand-off changed, for an exact undo
        "prev_key",
        "prev_claimed_at",
        "prev_open",
    )

    def __init__(self, worker_id: str, visibility: float, floor: int, wake: Callable[[], None]) -> None:
        self.worker_id = worker_id
        self.visibility = visibility
        self.floor = floor
        self.wake = wake
        self.state = _W_IDLE
        self.pending = False
        self.arrival = 0
        self.prev: Optional[_Waiter] = None
        self.next: Optional[_Waiter] = None
        self.seq = 0
        self.group_id = ""
        self.event: Any = None
        self.expires_at = 0.0
        self.attempt = 0
        self.delivery = 0
        self.prev_key = 0

        self.prev_claimed_at = 0.0
        self.prev_open = False


class _FloorQueue:
    """The FIFO of the waiter records of one floor (a doubly linked list)."""

    __slots__ = ("head", "tail")

    def __init__(self) -> None:
        self.head: Optional[_Waiter] = None
        self.tail: Optional[_Waiter] = None


# -------------------------------------- batch.pxi: a publish_many batch's plan
#
# The Cython twin works out a ``publish_many`` batch before its lock
# (``BatchPlan``: every item's priority and id hash, the new groups and new
# levels it will create) so that it can allocate everything first.  Here
# ``publish_many`` checks every item first and then publishes them one by one
# under the lock (``InMemoryTransport.publish_many``); a Python list grows
# by itself, so there is nothing to plan.


# --------------------------------------------------------------- the transport


class InMemoryTransport:
    """In-process message transport with per-group leases.

    Messages are published into groups (one group = one workflow execution).
    At most one message per group is leased or parked at a time, a group's
    messages are delivered in publish order, groups are served round-robin
    (the group claimed least recently first; never-claimed groups first, in
    the order of their oldest message), ``min_priority`` skips groups below a
    priority floor, and an expired lease frees its message for redelivery.
    Events are held by reference, never copied.

    ``clock`` is a zero-argument callable returning the time in seconds as a
    float (default ``time.time``); it is read once by ``claim``,
    ``claim_many``, ``ack_and_claim``, ``extend``, ``stats``, ``group``,
    ``groups``, ``skip``, ``retry``, ``nack(delay > 0)``, ``release(delay >
    0)``, and ``publish`` / ``publish_many`` with ``delay > 0`` or with a key
    and ``dedup_window > 0`` (and by ``publish``, ``ack``, ``nack(0)``,
    ``release(0)``, ``resume``, ``set_priority``, ``publish_many`` and
    ``ack_many`` while a claim waits for work), never while the transport's lock is held.  The
    transport's time never runs backwards: an operation whose clock reading
    is older than a time an earlier operation used (a racing thread, or a
    clock turned back) uses that later time instead.  Every method is atomic
    and thread-safe.

    ``claim(..., timeout=)`` and ``aclaim`` wait for work, in a thread or an
    asyncio event loop; ``close()`` ends every wait.

    ``dedup_window`` (seconds, default ``0.0``; ``+inf`` accepted) is how
    long an idempotency key stays held after the publish that stored it,
    once its message has left (see ``publish``).
    """

    #: A declared capability (the worker reads it): calls never wait beyond a lock, so an
    #: event loop may call them directly.  Durable transports (and those that do not say) block.
    blocking: ClassVar[bool] = False

    def __init__(self, clock: Callable[[], float] = time.time, *, dedup_window: float = 0.0) -> None:
        if not callable(clock):
            raise TypeError(f"clock must be callable, not {type(clock).__name__}")
        window = _check_duration(dedup_window, "dedup_window")
        self._clock = clock
        self._dedup_window = window
        # Re-entrant, so that user code the garbage collector runs in the
        # middle of an operation (a finaliser) can publish without
        # deadlocking; ``_busy`` tells such a nested call apart (see publish).
        self._lock = threading.RLock()
        self._busy = False
        # publishes from nested user code: (seq, group_id, event, priority), or
        # (seq, group_id, event, priority, due, key) for one with a delay or a key
        self._pending: List[Tuple[Any, ...]] = []
        self._owner = object()  # stamped on every lease this transport issues
        self._groups: Dict[str, _Group] = {}
        self._groups_shrink_below = 0  # copy _groups when it drains below this
        self._levels: Dict[int, _Level] = {}
        self._root: Optional[_Level] = None
        self._rng = random.Random(0x1EA5E)
        self._expiry: List[Tuple[float, int, _Group]] = []
        self._live_expiry = 0  # entries of _expiry that are not stale
        self._tick = 0
        # The latest time any operation used: an operation whose clock read
        # is older (another thread got the lock first, or the clock went
        # back) uses this instead, so the transport's time never runs back.
        self._time = -_INF
        self._seq = 0
        self._claims = 0
        self._messages = 0
        self._leased = 0  # groups whose lock is _LEASED (expired or not)
        self._parked = 0  # groups whose lock is _PARKED (expired or not)
        # waiting claims (the waiters section)
        self._closed = False
        self._nwaiting = 0  # queued waiter records
        self._wqueues: Dict[int, _FloorQueue] = {}  # floor -> its FIFO
        self._wfloors: List[int] = []  # the floors of _wqueues, ascending
        self._arrivals = 0
        self._timer_at = _INF  # clock time the expiry timer is armed for
        self._timer: Any = None  # the expiry timer (waiting.py), started on first use
        self._poke = False  # the timer must be poked after the lock is released
        self._orphans: List[_Waiter] = []  # records ended from nested user code (see _wait_end)
        # records for _hand_new, made by a claim before it waits (see _wait_start)
        self._spare: Optional[_Group] = None
        self._spare_level: Optional[_Level] = None
        self._wakeups = [0, 0]  # wakes promised: hand-offs, close (for tests)
        self._paused = 0  # groups paused
        self._idle = 0  # groups holding no message (each one paused)
        self._buried = 0  # groups buried
        # Part 5 (see the module docstring, "Later" and "Once")
        self._extras = 0  # held messages with a due or a key (FIFO entries of four fields)
        self._sched: Dict[int, float] = {}  # seq -> due of the messages counted as scheduled
        self._sched_heap: List[Tuple[float, int]] = []  # (due, seq), lazy: drained by stats
        self._keys: Dict[Tuple[str, str], _KeyHold] = {}  # (group_id, key) -> its hold
        self._key_order: Deque[_KeyHold] = deque()  # holds of a finite window > 0, in publish order

    # -------------------------------------------------------------- public

    def publish(
        self, group_id: str, event: Any, priority: int = 0, *, delay: float = _NO_DELAY, key: Optional[str] = None
    ) -> int:
        """Append ``event`` to group ``group_id``; return its sequence number.

        Sequence numbers are 1, 2, 3, ... and never reused.  ``priority`` is
        taken when the group is created (its first message, or the first after
        it was emptied) and ignored otherwise.

        ``delay > 0`` schedules the message until ``due = now + delay``: it is
        not delivered while ``due >= now``, and while it is its group's oldest
        message and not due its group waits behind it (FIFO holds).  ``key``
        (a ``str``, scoped to the group) makes the publish idempotent: while
        the key is held (its message is in the transport, or was published
        less than ``dedup_window`` seconds ago), a publish with it publishes
        nothing and returns the holder's seq.  The clock is read once when
        ``delay > 0``, or with a key and ``dedup_window > 0``.
        """
        if key is not None or delay is not _NO_DELAY:
            return self._publish_later(group_id, event, priority, delay, key)
        if type(group_id) is not str:
            group_id = _check_id(group_id, "group_id")
        if type(priority) is not int or not _INT64_MIN <= priority <= _INT64_MAX:
            priority = _check_priority(priority, "priority")
        now = error = None
        if self._nwaiting and not self._busy:
            # The wake-up path (the waiters section): the clock is read
            # first, outside the lock, so that the message is added and
            # handed to a waiting claim in one locked step.
            try:
                now = self._clock()
                if type(now) is not float or now - now != 0.0:
                    now = _check_time(now)
            except BaseException as exc:  # noqa: B036 - _serve_waiters re-raises it unless ordinary
                now, error = None, exc
        chain = None
        with self._lock:
            self._seq = seq = self._seq + 1
            if self._busy:
                # Re-entered from user code that ran in the middle of another
                # operation of this transport on this thread (a finaliser the
                # garbage collector started): that operation is half done, so
                # the message is added as soon as it finishes.
                self._pending.append((seq, group_id, event, priority))
                return seq
            self._busy = True
            try:
                try:
                    if now is not None and self._nwaiting:
                        chain = self._hand_new(seq, group_id, event, priority, now)
                    if chain is None:
                        self._add(seq, group_id, event, priority)
                except BaseException:
                    if self._seq == seq:  # nothing published since: the number is free again
                        self._seq = seq - 1
                    raise
                if now is not None:
                    if chain is None:
                        chain = self._serve_in(now)  # added: serve as usual
                    elif self._orphans or self._pending or self._closed:
                        # User code that ran in _hand_new's step (a finaliser): serve what it did.
                        self._serve_nested(self._time, chain)
            finally:
                if self._pending or self._orphans:
                    self._settle()
                else:
                    self._busy = False
        if chain is not None:
            for w in chain:  # _wake, inline
                w.wake()
            if self._poke:
                self._poke = False
                _waiting.poke_timer(self)
            if self._nwaiting and (self._orphans or self._seq != seq):
                # User code run by _settle (a finaliser) ended a wait or
                # published: serve that, as a separate serving would have.
                self._serve_waiters(now)
        elif self._nwaiting:
            # (the claims that waited left meanwhile and new ones came, or
            # the clock failed: then ``error`` tells _serve_waiters not to read it)
            self._serve_waiters(now, error)
        return seq

    def claim(
        self, worker_id: str, visibility: float, min_priority: int = 0, *, timeout: Optional[float] = _NO_WAIT
    ) -> Optional[Lease]:
        """Lease the next message to ``worker_id`` for ``visibility`` seconds.

        First every lease or park whose ``expires_at < now`` expires.  Then,
        among the groups with priority ``>= min_priority`` that hold a free
        message and have nothing leased or parked, the one claimed least
        recently (never-claimed groups first, by their oldest message) has
        its oldest message leased until ``now + visibility``.  Returns the
        ``Lease``, or ``None`` when no group is eligible.

        ``timeout`` (seconds of real time) makes the claim wait, when no
        group is eligible, for a message to become claimable: ``0`` (the
        default) never waits, ``None`` waits with no deadline.  Among waiting
        claims whose ``min_priority`` admits a message, the one that has
        waited longest gets it.  A waiting claim returns ``None`` at its
        deadline, and at once when the transport is closed (``close()``).
        An exception in the waiting thread (``KeyboardInterrupt``) ends the
        wait and leaves nothing leased on its behalf.
        """
        # Fast paths for the common argument types; the _check_* helpers
        # convert or raise for everything else.
        if type(worker_id) is not str or worker_id == PARKED:
            worker_id = _check_worker(worker_id)
        if type(visibility) is not float or not visibility >= 0.0:
            visibility = _check_duration(visibility, "visibility")
        if type(min_priority) is not int or not _INT64_MIN <= min_priority <= _INT64_MAX:
            min_priority = _check_priority(min_priority, "min_priority")
        if timeout is not _NO_WAIT:
            wait = _check_timeout(timeout)
            if wait != 0.0:
                return _waiting.claim_wait(self, worker_id, visibility, min_priority, wait)
        now = self._clock()
        if type(now) is not float or now - now != 0.0:
            now = _check_time(now)
        lease = _LeaseBuilder()  # the result's memory, before anything changes (filled in after the lock)
        with self._lock:
            if self._busy:
                raise _reentered("claim")
            self._busy = True
            try:
                if now < self._time:  # another thread already used a later time
                    now = self._time
                else:
                    self._time = now
                expiry = self._expiry
                if expiry and expiry[0][0] < now:
                    self._expire(now)
                group = None
                root = self._root
                if root is None:
                    pass
                elif root.left is None and root.right is None:
                    # One priority level: its heap top is the answer.
                    heap = root.heap
                    if heap and root.priority >= min_priority:
                        group = heap[0][1]
                        expires_at = now + visibility
                        self._lease_ready(group, worker_id, now, expires_at)
                else:
                    entry = self._find(min_priority)
                    if entry is not None:
                        group = entry[1]
                        expires_at = now + visibility
                        self._lease_ready(group, worker_id, now, expires_at)
                if group is not None:
                    entry = group.messages[group.head]
                    group_id = group.group_id
                    attempt = group.attempt
                    delivery = group.key  # the claim's number
            finally:
                self._settle()
        if self._nwaiting:  # expiry may have freed groups; our lease may expire first
            self._serve_waiters(now)
        if group is None:
            return None
        lease.seq = entry[0]  # type: ignore[index]
        lease.group_id = group_id
        lease.event = entry[1]  # type: ignore[index]
        lease.worker_id = worker_id
        lease.expires_at = expires_at
        lease.attempt = attempt
        lease._owner = self._owner
        lease._delivery = delivery
        lease.__class__ = Lease  # type: ignore[assignment]
        return lease  # type: ignore[return-value]

    def ack(self, lease: Lease) -> None:
        """Done: remove the leased message; its group may serve its next one.

        A group left without messages is forgotten (priority and round-robin
        position included).  Raises ``LeaseLost`` if the lease is not current;
        an expired lease whose message nobody has claimed since is accepted.
        """
        if type(lease) is not Lease:
            _check_lease(lease)
        with self._lock:
            if self._busy:
                raise _reentered("ack")
            self._busy = True
            try:
                group = self._current(lease)
                if group is None:
                    spent = None
                elif self._extras:  # some message has a due or a key: the general way
                    spent = self._ack_current(group)
                else:
                    messages = group.messages
                    head = group.head + 1
                    if head < len(messages) and group.ready_key is None and not group.paused:
                        self._make_ready(group)  # allocates: first, while nothing changed
                    if group.lock != _FREE or group.tick:
                        self._unlock(group)
                    group.open = False
                    group.attempt = 0
                    spent = messages[head - 1]  # dropped after the lock is released
                    messages[head - 1] = None
                    self._messages -= 1
                    if head == len(messages):
                        if group.paused:
                            self._keep_idle(group)
                        else:
                            self._forget(group)
                    else:
                        if head >= 32 and head * 2 >= len(messages):
                            del messages[:head]
                            head = 0
                        group.head = head
            finally:
                self._settle()
        if group is None:
            raise LeaseLost(_lost_message(lease))
        del spent  # the event's __del__ may run here, outside the lock
        if self._nwaiting:
            self._serve_waiters(None)

    def nack(self, lease: Lease, delay: float = 0.0) -> None:
        """Give the message back: retry now (``delay == 0``) or park it.

        ``delay == 0`` frees it for immediate redelivery (it is still its
        group's oldest message, so it comes next for that group, with
        ``attempt + 1``).  ``delay > 0`` parks it until ``now + delay``: while
        parked it blocks its whole group.  The group keeps its round-robin
        position.  Raises ``LeaseLost`` if the lease is not current.
        """
        self._give_back(lease, delay, False)

    def release(self, lease: Lease, delay: float = 0.0) -> None:
        """Hand a delivery back without counting it: ``nack`` that does not spend an attempt.

        Exactly ``nack(lease, delay)`` (the delivery ends; ``delay == 0``
        frees the message now, ``delay > 0`` parks it; same checks, clock
        reading, round-robin position and wake-ups), then the message's
        attempt count goes back to ``lease.attempt - 1``: its next delivery
        carries the same ``attempt`` as this one.  The released lease is
        never current again.  Raises ``LeaseLost`` if the lease is not current.
        """
        self._give_back(lease, delay, True)

    def _give_back(self, lease: Lease, delay: float, release: bool) -> None:
        """``nack`` (``release`` False) or ``release`` (True)."""
        _check_lease(lease)
        delay = _check_duration(delay, "delay")
        now = _check_time(self._clock()) if delay > 0.0 else 0.0
        with self._lock:
            if self._busy:
                raise _reentered("nack")
            self._busy = True
            try:
                group = self._current(lease)
                if group is not None:
                    if delay == 0.0:
                        if group.ready_key is None and not group.paused:
                            self._make_ready(group)
                        self._unlock(group)
                    else:
                        if now < self._time:
                            now = self._time
                        self._lock_group(group, _PARKED, PARKED, now + delay)
                        self._time = now
                        if group.ready_key is not None:
                            self._unready(group)
                    group.open = False
                    if release:
                        group.attempt = lease.attempt - 1
            finally:
                self._settle()
        if group is None:
            raise LeaseLost(_lost_message(lease))
        if self._nwaiting:
            self._serve_waiters(now if delay > 0.0 else None)

    def extend(self, lease: Lease, visibility: float) -> Lease:
        """Heartbeat: lease the same message again until ``now + visibility``.

        Returns a new ``Lease`` (same ``seq``, ``attempt`` and ``worker_id``,
        new ``expires_at``); the old and the new lease name the same
        delivery.  A lease whose time ran out but whose message nobody has
        claimed since may be extended: its group is locked again.  Raises
        ``LeaseLost`` if the lease is not current.
        """
        _check_lease(lease)
        visibility = _check_duration(visibility, "visibility")
        now = _check_time(self._clock())
        with self._lock:
            if self._busy:
                raise _reentered("extend")
            self._busy = True
            try:
                group = self._current(lease)
                if group is not None:
                    if now < self._time:
                        now = self._time
                    expires_at = now + visibility
                    self._lock_group(group, _LEASED, lease.worker_id, expires_at)
                    self._time = now
                    if group.ready_key is not None:
                        self._unready(group)
            finally:
                self._settle()
        if group is None:
            raise LeaseLost(_lost_message(lease))
        if self._nwaiting:
            self._serve_waiters(now)
        return _issue(
            lease.seq, lease.group_id, lease.event, lease.worker_id, expires_at, lease.attempt, self._owner,
            lease._delivery,
        )

    def stats(self) -> TransportStats:
        """Counts now: messages held, groups, live leases, parked messages,
        paused and buried groups, scheduled messages.

        Expired leases and parks (``expires_at < now``) count as neither;
        ``scheduled`` counts the messages published with a delay whose
        ``due >= now``, wherever they stand in their group.
        """
        now = _check_time(self._clock())
        with self._lock:
            if self._busy:
                raise _reentered("stats")
            self._busy = True
            try:
                now = self._advance(now)
                scheduled = self._count_scheduled(now) if self._sched else 0
                counts = (self._messages, len(self._groups) - self._idle, self._leased, self._parked, self._paused,
                          self._buried, scheduled)
            finally:
                self._settle()
        if self._nwaiting:
            self._serve_waiters(now)
        return TransportStats(*counts)

    # -------------------------------------------------------- control plane

    def pause(self, group_id: str) -> bool:
        """Stop serving group ``group_id``; ``True`` if it was not paused.

        A paused group is never served by ``claim`` (like a park with no
        end).  A message already leased stays leased: its worker may ack,
        nack or extend it, and a ``nack(lease, 0)`` or an expiry leaves it in
        the still-paused group.  A group that does not exist is created,
        paused, with priority 0, so that messages published later wait in
        it.  A paused group is not forgotten while paused, even when empty.
        """
        if type(group_id) is not str:
            group_id = _check_id(group_id, "group_id")
        with self._lock:
            if self._busy:
                raise _reentered("pause")
            self._busy = True
            try:
                group = self._groups.get(group_id)
                if group is None:
                    self._add_paused(group_id)
                    changed = True
                else:
                    changed = not group.paused
                    if changed:
                        group.paused = True
                        self._paused += 1
                        if group.ready_key is not None:
                            self._unready(group)
            finally:
                self._settle()
        return changed

    def resume(self, group_id: str) -> bool:
        """Lift a pause and a bury, and end a park; ``True`` if any was there.

        A parked or buried message is claimable at once, its attempt count
        unchanged (its next delivery is ``attempt + 1``).  A schedule stays:
        a group whose head is only scheduled returns ``False``.

        ``resume`` reads no clock: a park whose time ran out is still a park
        until an operation that reads the clock has seen it expire.  The
        group keeps its round-robin position; a group left without messages
        is forgotten.  ``False`` (and nothing created) for a group that does
        not exist.
        """
        if type(group_id) is not str:
            group_id = _check_id(group_id, "group_id")
        with self._lock:
            if self._busy:
                raise _reentered("resume")
            self._busy = True
            try:
                group = self._groups.get(group_id)
                lifted = ready = False
                if group is not None:
                    parked = group.lock == _PARKED
                    buried = group.reason is not None
                    lifted = group.paused or parked or buried
                    if lifted:
                        if group.head == len(group.messages):  # empty, hence paused
                            group.paused = False
                            self._paused -= 1
                            self._idle -= 1
                            self._forget(group)
                        else:
                            lock = group.lock
                            if group.ready_key is None and (lock == _FREE or lock == _PARKED):
                                self._make_ready(group)  # allocates: first, while nothing changed

                            if group.paused:
                                group.paused = False
                                self._paused -= 1
                            if buried:
                                group.reason = None
                                self._buried -= 1
                            if parked:
                                self._unlock(group)  # the park ends; the attempt count stays
                            ready = group.ready_key is not None
            finally:
                self._settle()
        if ready and self._nwaiting:  # the group is claimable now
            self._serve_waiters(None)
        return lifted

    def purge(self, group_id: str) -> int:
        """Remove every message of group ``group_id``; return how many.

        The leased or parked message goes too (its lease is no longer
        current: ``LeaseLost``), and the group is forgotten, pause and
        priority included.  The events are released after the transport's
        lock.  ``0`` for a group that does not exist.
        """
        if type(group_id) is not str:
            group_id = _check_id(group_id, "group_id")
        spent: Optional[List[Any]] = None  # the events: dropped after the lock is released
        with self._lock:
            if self._busy:
                raise _reentered("purge")
            self._busy = True
            try:
                group = self._groups.get(group_id)
                removed = 0
                if group is not None:
                    spent = group.messages
                    removed = len(spent) - group.head
                    self._purge(group)
            finally:
                self._settle()
        del spent  # the events' __del__ may run here, outside the lock
        return removed

    def set_priority(self, group_id: str, priority: int) -> bool:
        """Change group ``group_id``'s priority; ``False`` if there is no such group.

        The group keeps its round-robin position and its pause; no group is
        created.  ``True`` for any existing group, even when the priority
        does not change.
        """
        if type(group_id) is not str:
            group_id = _check_id(group_id, "group_id")
        if type(priority) is not int or not _INT64_MIN <= priority <= _INT64_MAX:
            priority = _check_priority(priority, "priority")
        with self._lock:
            if self._busy:
                raise _reentered("set_priority")
            self._busy = True
            try:
                group = self._groups.get(group_id)
                moved = False
                if group is not None and group.level.priority != priority:
                    self._set_level(group, priority)
                    moved = group.ready_key is not None
            finally:
                self._settle()
        if moved and self._nwaiting:  # a waiting claim's floor may admit it now
            self._serve_waiters(None)
        return group is not None

    def group(self, group_id: str) -> Optional[GroupInfo]:
        """What group ``group_id`` is doing now, or ``None`` if there is no such group.

        Reads the clock and applies expiry first, as ``stats`` does, so the
        state is as of ``now``: ``"buried"`` (``reason`` says why), else
        ``"leased"`` or ``"parked"`` while the head message's lease or park
        has not expired (paused or not), else ``"paused"``, ``"scheduled"``
        (the head was published with a delay and is not due: ``due_at``, also
        reported while paused) or ``"ready"``.
        """
        if type(group_id) is not str:
            group_id = _check_id(group_id, "group_id")
        now = _check_time(self._clock())
        with self._lock:
            if self._busy:
                raise _reentered("group")
            self._busy = True
            try:
                now = self._advance(now)
                group = self._groups.get(group_id)
                view = None if group is None else _view(group)
            finally:
                self._settle()
        if self._nwaiting:  # expiry may have freed groups
            self._serve_waiters(now)
        return None if view is None else GroupInfo(*view)

    def groups(self) -> List[GroupInfo]:
        """Every group now, in the order the groups were created: O(G).

        Reads the clock and applies expiry first, as ``group`` does.  A group
        forgotten and created again comes after the others.
        """
        now = _check_time(self._clock())
        with self._lock:
            if self._busy:
                raise _reentered("groups")
            self._busy = True
            try:
                now = self._advance(now)
                views = [_view(group) for group in self._groups.values()]
            finally:
                self._settle()
        if self._nwaiting:  # expiry may have freed groups
            self._serve_waiters(now)
        return [GroupInfo(*view) for view in views]

    # ------------------------------------------------------------ quarantine

    def bury(self, lease: Lease, reason: str = "") -> None:
        """Set a poison message aside without breaking its group's order.

        The lease's delivery ends (the lease stops being current), the
        message stays at the head of its group, and the group is *buried*:
        no claim serves it, whatever the floor, until ``resume`` (the same
        message again, its next delivery ``attempt + 1``) or ``skip`` (the
        message removed).  Its later messages wait behind it, in order;
        every other group goes on.  ``reason`` (a ``str``) is kept with the
        group (``group().reason``).  Reads no clock.  Raises ``LeaseLost``
        if the lease is not current; an expired lease whose message nobody
        has claimed since is accepted.
        """
        if type(lease) is not Lease:
            _check_lease(lease)
        if type(reason) is not str:
            reason = _check_reason(reason)
        with self._lock:
            if self._busy:
                raise _reentered("bury")
            self._busy = True
            try:
                group = self._current(lease)
                if group is not None:
                    if group.ready_key is not None:  # its lease ran out: expiry made it ready
                        self._unready(group)
                    if group.lock != _FREE or group.tick:
                        self._unlock(group)
                    group.open = False
                    group.buried_by = lease.worker_id
                    group.reason = reason
                    self._buried += 1
            finally:
                self._settle()
        if group is None:
            raise LeaseLost(_lost_message(lease))

    def skip(self, group_id: str) -> bool:
        """Remove group ``group_id``'s head message; ``True`` if it did.

        The head goes whatever its state -- ready, parked (the park ends),
        paused, buried, or under a lease that ran out (which stops being
        current) -- unless a lease that has not expired holds it.  A bury is
        lifted (a pause is not); the next message, if any, becomes the head
        and is claimable unless the group is paused.  A group left without
        messages is forgotten unless paused.  ``False``, and nothing
        changed, for an unknown group, an empty paused group, or a head
        under a live lease.  Reads the clock and applies expiry first, as
        ``group`` does.  The removed event is released after the lock.
        """
        if type(group_id) is not str:
            group_id = _check_id(group_id, "group_id")
        now = _check_time(self._clock())
        spent = None  # the removed (seq, event): dropped after the lock is released
        with self._lock:
            if self._busy:
                raise _reentered("skip")
            self._busy = True
            try:
                now = self._advance(now)
                group = self._groups.get(group_id)
                # after expiry a lock still set is live: a lease holds the head
                if group is not None and group.head < len(group.messages) and group.lock != _LEASED:
                    spent = self._skip_head(group)
            finally:
                self._settle()
        skipped = spent is not None
        del spent  # the event's __del__ may run here, outside the lock
        if self._nwaiting:  # the next message, and whatever expiry freed
            self._serve_waiters(now)
        return skipped

    def peek(self, group_id: str, max_count: int = 1) -> List[Message]:
        """The oldest ``max_count`` messages of group ``group_id``, head first.

        Whatever their state (ready, leased, parked, paused, buried,
        scheduled), as ``Message(seq, event, attempt, due_at, key)`` with the
        event by reference, ``attempt`` the deliveries so far, ``due_at`` the
        due time it was published with (``None`` without a delay) and ``key``
        its idempotency key (or ``None``); ``[]`` for an unknown group.
        ``max_count`` is an ``int >= 0``.  Reads no clock and changes
        nothing: O(1 + max_count).
        """
        if type(group_id) is not str:
            group_id = _check_id(group_id, "group_id")
        if type(max_count) is not int or max_count < 0:
            max_count = _check_count(max_count)
        with self._lock:
            if self._busy:
                raise _reentered("peek")
            self._busy = True
            try:
                group = self._groups.get(group_id)
                if group is None or not max_count:
                    taken: List[Any] = []
                    attempt = 0
                else:
                    head = group.head
                    taken = group.messages[head:head + max_count]
                    attempt = group.attempt
            finally:
                self._settle()
        out = [_message(entry, 0) for entry in taken]  # only the head has been delivered
        if out:
            out[0] = _message(taken[0], attempt)
        return out

    def retry(self, group_id: str) -> bool:
        """The operator's "run it again from scratch": ``True`` if done.

        Reads the clock and applies expiry first, as ``skip`` does.  Unless
        the group is unknown, holds no message, or its head is under a lease
        that has not expired (then ``False``, nothing changed): the head's
        attempt count goes back to 0 (its next delivery is attempt 1), a
        bury is lifted, a park ends, and an expired lease's delivery is
        closed (that lease stops being current); a pause and a schedule
        stay, and so do the round-robin position and ``last_claimed_at``.
        The head is then claimable unless the group is paused or the head
        is scheduled, and wakes a waiting claim.
        """
        if type(group_id) is not str:
            group_id = _check_id(group_id, "group_id")
        now = _check_time(self._clock())
        with self._lock:
            if self._busy:
                raise _reentered("retry")
            self._busy = True
            try:
                now = self._advance(now)
                group = self._groups.get(group_id)
                # after expiry a lock still set is live: a lease holds the head
                done = group is not None and group.head < len(group.messages) and group.lock != _LEASED
                if done:
                    assert group is not None
                    lock = group.lock
                    if group.ready_key is None and not group.paused and (lock == _FREE or lock == _PARKED):
                        self._make_ready(group)  # allocates: first, while nothing changed
                    if lock == _PARKED:
                        self._unlock(group)  # the park ends
                    if group.reason is not None:
                        group.reason = None
                        self._buried -= 1
                    group.open = False  # an expired lease's delivery is closed
                    group.attempt = 0
            finally:
                self._settle()
        if self._nwaiting:  # the head, and whatever expiry freed
            self._serve_waiters(now)
        return done

    # -------------------------------------------------------------- batches

    def publish_many(self, items: Iterable[Tuple[Any, ...]], *, delay: float = 0.0) -> List[int]:
        """Publish ``(group_id, event[, priority[, key]])`` items; return their seqs.

        Every item is checked before any is published (one bad item: its
        error, nothing published), then ``delay``; then they are published
        in order under one lock, leaving the transport exactly as publishing
        them one by one would (``publish(group_id, event, priority,
        delay=delay, key=key)``, with one clock reading for the lot).  An
        item whose key is held, or repeats the key of an earlier item of the
        batch in the same group, publishes nothing and gets the holder's
        seq; the new messages get consecutive seqs in item order.  Items
        must be tuples.
        """
        batch = [_check_keyed_item(item) for item in list(items)]
        if type(delay) is not float or not delay >= 0.0:
            delay = _check_duration(delay, "delay")
        keyed = False
        for item in batch:
            if item[3] is not None:
                keyed = True
                break
        if keyed or (delay > 0.0 and batch):
            return self._publish_many_later(batch, delay, keyed)
        count = len(batch)
        with self._lock:
            if self._busy:
                raise _reentered("publish_many")
            self._busy = True
            try:
                first = self._seq + 1
                self._seq += count  # reserved: a nested publish gets a later seq
                try:
                    self._add_batch(first, batch, None, 0.0)
                except BaseException:
                    if self._seq == first + count - 1:  # nothing published since: free again
                        self._seq = first - 1
                    raise
            finally:
                self._settle()
        if count and self._nwaiting:
            self._serve_waiters(None)
        return list(range(first, first + count))

    def claim_many(self, worker_id: str, visibility: float, max_count: int, min_priority: int = 0) -> List[Lease]:
        """Up to ``max_count`` leases at one ``now``, one per group.

        Exactly what ``max_count`` successive ``claim`` calls at the same
        ``now`` would return, up to the first that finds nothing: one clock
        read and one lock for the lot.  ``max_count`` is an ``int >= 0``.
        Never waits.
        """
        if type(worker_id) is not str or worker_id == PARKED:
            worker_id = _check_worker(worker_id)
        visibility = _check_duration(visibility, "visibility")
        max_count = _check_count(max_count)
        if type(min_priority) is not int or not _INT64_MIN <= min_priority <= _INT64_MAX:
            min_priority = _check_priority(min_priority, "min_priority")
        now = _check_time(self._clock())
        taken: List[Tuple[int, str, Any, int, int]] = []
        with self._lock:
            if self._busy:
                raise _reentered("claim_many")

            self._busy = True
            try:
                now = self._advance(now)
                expires_at = now + visibility
                while len(taken) < max_count:
                    try:
                        claimed = self._claim_next(worker_id, expires_at, min_priority, now)
                    except MemoryError:
                        if not taken:
                            raise  # nothing changed but the expiries
                        break  # the batch ends with the claims made so far
                    if claimed is None:
                        break
                    taken.append(claimed)
            finally:
                self._settle()
        if self._nwaiting:  # expiries it did not claim; its leases may expire first
            self._serve_waiters(now)
        owner = self._owner
        return [_issue(seq, group_id, event, worker_id, expires_at, attempt, owner, delivery)
                for seq, group_id, event, attempt, delivery in taken]

    def ack_many(self, leases: Iterable[Lease]) -> List[Lease]:
        """Ack every current lease, in order; return the ones that were not current.

        Every element is type-checked first (``TypeError``, nothing acked).
        A lease that is not current at its turn (acked before, re-delivered,
        a duplicate in the batch) is returned instead of raising
        ``LeaseLost``: the list holds the very objects passed in, in order.
        The events are released after the transport's lock.
        """
        batch = list(leases)
        for lease in batch:
            if type(lease) is not Lease:
                _check_lease(lease)
        spent: List[Any] = [None] * len(batch)  # events: dropped after the lock is released
        with self._lock:
            if self._busy:
                raise _reentered("ack_many")
            self._busy = True
            try:
                for i, lease in enumerate(batch):
                    group = self._current(lease)
                    if group is not None:
                        spent[i] = self._ack_current(group)
            finally:
                self._settle()
        lost = [lease for lease, gone in zip(batch, spent) if gone is None]
        del spent  # the events' __del__ may run here, outside the lock
        if len(lost) < len(batch) and self._nwaiting:  # an ack may expose a group's next message
            self._serve_waiters(None)
        return lost

    def ack_and_claim(
        self, lease: Lease, worker_id: str, visibility: float, min_priority: int = 0
    ) -> Optional[Lease]:
        """``ack(lease)`` then ``claim(worker_id, visibility, min_priority)``, as one operation.

        Every argument is checked first (as ``ack`` and ``claim`` check
        them), then the clock is read once, then, under one lock: a lease
        that is not current raises ``LeaseLost`` and nothing changes (no
        ack, no claim); else the message is acked exactly as ``ack`` does
        and the claim runs at that ``now`` exactly as ``claim`` does (expiry
        first; the group just acked may be the one served, when it is the
        eligible group claimed least recently).  Returns the claim's
        ``Lease``, or ``None`` when no group is eligible (the ack stands).
        Never waits; waiting claims are served from what the claim leaves.
        The acked event is released after the lock.
        """
        if type(lease) is not Lease:
            _check_lease(lease)
        if type(worker_id) is not str or worker_id == PARKED:
            worker_id = _check_worker(worker_id)
        if type(visibility) is not float or not visibility >= 0.0:
            visibility = _check_duration(visibility, "visibility")
        if type(min_priority) is not int or not _INT64_MIN <= min_priority <= _INT64_MAX:
            min_priority = _check_priority(min_priority, "min_priority")
        now = self._clock()
        if type(now) is not float or now - now != 0.0:
            now = _check_time(now)
        spent: Tuple[Any, ...]  # the acked FIFO entry: dropped after the lock is released
        taken: Optional[Tuple[int, str, Any, int, int]]  # what the claim half leased, if anything
        with self._lock:
            if self._busy:
                raise _reentered("ack_and_claim")
            self._busy = True
            try:
                group = self._current(lease)
                if group is not None:
                    spent = self._ack_current(group)  # a MemoryError here: nothing changed
                    try:
                        now = self._advance(now)
                        expires_at = now + visibility
                        taken = self._claim_next(worker_id, expires_at, min_priority, now)
                    except MemoryError:
                        taken = None  # the ack stands; the claim found nothing (docs/decisions.md)
            finally:
                self._settle()
        if group is None:
            raise LeaseLost(_lost_message(lease))
        del spent  # the event's __del__ may run here, outside the lock
        if self._nwaiting:  # served from what the claim left (the ack's next message, expiries)
            self._serve_waiters(now)
        if taken is None:
            return None
        seq, group_id, event, attempt, delivery = taken
        return _issue(seq, group_id, event, worker_id, expires_at, attempt, self._owner, delivery)

    def __copy__(self) -> "InMemoryTransport":
        raise TypeError("an InMemoryTransport cannot be copied")

    def __deepcopy__(self, memo: Any) -> "InMemoryTransport":
        raise TypeError("an InMemoryTransport cannot be copied")

    def __reduce__(self) -> Any:
        raise TypeError("an InMemoryTransport cannot be pickled")

    def __len__(self) -> int:
        """Messages held: ready + leased + parked."""
        return self._messages

    async def aclaim(
        self, worker_id: str, visibility: float, min_priority: int = 0, *, timeout: Optional[float] = None
    ) -> Optional[Lease]:
        """``claim`` for asyncio: wait in the running event loop, not a thread.

        The arguments are those of ``claim``, checked when the coroutine
        runs; ``timeout`` defaults to ``None`` (no deadline), ``0`` never
        waits.  A publish, ack or nack from any thread, or from another
        event loop, wakes it.  Cancelling the task (or ``asyncio.timeout``)
        ends the wait and leaves nothing leased on its behalf: a message that
        was about to go to it goes to the next waiting claim.
        """
        if type(worker_id) is not str or worker_id == PARKED:
            worker_id = _check_worker(worker_id)
        visibility = _check_duration(visibility, "visibility")
        min_priority = _check_priority(min_priority, "min_priority")
        wait = _check_timeout(timeout)
        if wait == 0.0:
            return self.claim(worker_id, visibility, min_priority)
        return await _waiting.aclaim_wait(self, worker_id, visibility, min_priority, wait)

    def close(self) -> None:
        """End the waiting: every waiting claim returns ``None`` now, and from
        now on a claim with a non-zero ``timeout`` returns ``None`` at once.

        Everything else works as before (``timeout=0`` claims, publish, ack,
        nack...).  Idempotent; ``closed`` tells whether it was called.
        """
        chain: List[_Waiter] = []
        with self._lock:
            self._closed = True
            if self._busy:
                return  # nested in an operation: its _serve_waiters wakes them
            self._busy = True
            try:
                self._close_waiters(chain)
            finally:
                self._settle()
        self._wake(chain)
        if self._timer is not None:
            self._timer.poke()  # it sees the transport closed and ends

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
        return self._closed

    def __enter__(self: "_Self") -> "_Self":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        buried = f" buried={self._buried}" if self._buried else ""
        return (
            f"<{type(self).__module__}.{type(self).__qualname__} "
            f"messages={self._messages} groups={len(self._groups)}{buried}>"
        )

    # ------------------------------------------------------------ internals
    # Everything below runs with self._lock held.

    def _current(self, lease: Lease) -> Optional[_Group]:
        """The lease's group if the lease is current, else None: fencing by
        delivery.  A group's open delivery is the claim numbered ``group.key``
        (claim numbers are never reused), so a lease is current while its
        ``_delivery`` is that number and the delivery is open, whatever its
        ``attempt`` (``release`` and ``retry`` may give a later delivery the
        same one)."""
        if lease._owner is not self._owner:
            return None
        group = self._groups.get(lease.group_id)
        if group is None or not group.open or group.key != lease._delivery:
            return None
        return group

    # -- publishing

    def _add(self, seq: int, group_id: str, event: Any, priority: int) -> None:
        """Append message ``seq`` to its group, creating the group if needed.

        Allocations come before the changes they enable, and a failure undoes
        what was done, so a MemoryError leaves the transport as it was.
        """
        group = self._groups.get(group_id)
        if group is not None:
            messages = group.messages
            if messages:
                messages.append((seq, event))
            else:  # an empty paused group
                self._refill(group, (seq, event))
            self._messages += 1
            return
        level = self._levels.get(priority)
        if level is None:
            level = _Level(priority, self._rng.random())
            self._levels[priority] = level
            self._root = _treap_insert(self._root, level)
        try:
            group = _Group(group_id, level, seq, event)
            self._groups[group_id] = group
            try:
                self._make_ready(group)
            except BaseException:
                del self._groups[group_id]
                raise
        except BaseException:
            if level.groups == 0:  # made for this group alone
                del self._levels[priority]
                self._root = _treap_delete(self._root, priority)
            raise
        level.groups += 1
        self._messages += 1

    def _publish_later(self, group_id: Any, event: Any, priority: Any, delay: Any, key: Any) -> int:
        """``publish`` with a ``delay`` or a ``key`` argument (see its docstring).

        Checks in order (``group_id``, ``priority``, ``delay``, ``key``), then
        one clock reading if ``delay > 0`` or a key meets ``dedup_window >
        0``.  A held key changes nothing but the transport's time and wakes
        nobody; a new message is added by ``_add_x`` (a head with a due takes
        the scheduled state); a delayed one wakes nobody either, but the
        serving that follows arms the expiry timer for its due.
        """
        if type(group_id) is not str:
            group_id = _check_id(group_id, "group_id")
        if type(priority) is not int or not _INT64_MIN <= priority <= _INT64_MAX:
            priority = _check_priority(priority, "priority")
        delay = _check_duration(delay, "delay")
        key = _check_key(key)
        if delay == 0.0 and key is None:
            return self.publish(group_id, event, priority)
        window = self._dedup_window
        now: Optional[float] = None
        if delay > 0.0 or (key is not None and window > 0.0):
            now = _check_time(self._clock())
        with self._lock:
            # The transport's time moves to ``now`` when the publish is done
            # (a held key included), not when it raises.
            if now is not None and now < self._time:  # another thread already used a later time
                now = self._time
            at = 0.0 if now is None else now  # (a key's time matters only with a window, which read the clock)
            due = at + delay if delay > 0.0 else None
            if key is not None:
                holder = self._held(group_id, key, at)
                if holder is not None:
                    if now is not None:
                        self._time = now
                    return holder  # nothing published, nobody woken
            if self._busy:
                # Re-entered from user code in the middle of another operation
                # (see publish): the message is added when that one finishes;
                # its key is held from now on.
                self._seq = seq = self._seq + 1
                if key is not None:
                    self._hold(group_id, key, seq, at)
                self._pending.append((seq, group_id, event, priority, due, key))
                if now is not None:
                    self._time = now
                return seq
            self._busy = True
            try:
                self._seq = seq = self._seq + 1
                try:
                    hold = None if key is None else self._hold(group_id, key, seq, at)
                    try:
                        self._add_x(seq, group_id, event, priority, due, key)
                    except BaseException:
                        if hold is not None:
                            self._unhold(hold.name, seq, True)
                        raise
                except BaseException:
                    if self._seq == seq:  # nothing published since: the number is free again
                        self._seq = seq - 1
                    raise
                if now is not None:
                    self._time = now
                    if key is not None and self._key_order:
                        self._drop_keys(now)  # (allocates nothing)
            finally:
                self._settle()
        if self._nwaiting:  # a message claimable now; or the timer armed for the due
            self._serve_waiters(now)
        return seq

    def _publish_many_later(
        self, batch: List[Tuple[str, Any, int, Optional[str]]], delay: float, keyed: bool
    ) -> List[int]:
        """``publish_many`` of a non-empty batch with a ``delay``, or with keys
        (items checked, ``delay`` too).  Under the lock it first works out
        which items publish (a held key, or one repeated in the batch, gives
        the holder's seq), then adds those as ``_add_batch`` does: all or none."""
        window = self._dedup_window
        now: Optional[float] = None
        if delay > 0.0 or (keyed and window > 0.0):
            now = _check_time(self._clock())
        result = [0] * len(batch)  # the seqs; -1 - i while it is "the i-th new message"
        fresh: List[Tuple[str, Any, int, Optional[str]]] = []
        with self._lock:
            if self._busy:
                raise _reentered("publish_many")
            self._busy = True
            try:
                if now is not None and now < self._time:  # (the time moves when the batch is done)
                    now = self._time
                at = 0.0 if now is None else now
                due = at + delay if delay > 0.0 else None
                firsts: Dict[Tuple[str, str], int] = {}  # (group_id, key) -> index in fresh
                for i, item in enumerate(batch):
                    key = item[3]
                    if key is not None:
                        holder = self._held(item[0], key, at)
                        if holder is not None:
                            result[i] = holder
                            continue
                        name = (item[0], key)
                        j = firsts.get(name)
                        if j is not None:  # repeats an earlier item of the batch
                            result[i] = -1 - j
                            continue
                        firsts[name] = len(fresh)
                    result[i] = -1 - len(fresh)
                    fresh.append(item)
                count = len(fresh)
                first = self._seq + 1
                self._seq += count  # reserved: a nested publish gets a later seq
                try:
                    self._add_batch(first, fresh, due, at)
                except BaseException:
                    if self._seq == first + count - 1:  # nothing published since: free again
                        self._seq = first - 1
                    raise
                if now is not None:
                    self._time = now
                    if keyed and self._key_order:
                        self._drop_keys(now)  # (allocates nothing)
            finally:
                self._settle()
        for i, seq in enumerate(result):
            if seq < 0:
                result[i] = first - 1 - seq
        if count and self._nwaiting:
            self._serve_waiters(now)
        return result

    def _add_x(
        self, seq: int, group_id: str, event: Any, priority: int, due: Optional[float], key: Optional[str]
    ) -> None:
        """``_add`` of a message with a due (None: none) or a key (its hold is
        the caller's): its FIFO entry has four fields, it is counted as
        scheduled while ``due >= now`` (``_sched``), and as its group's head it
        takes the scheduled state.  A MemoryError leaves the transport as it was."""
        entry = (seq, event, due, key)
        if due is not None:
            heappush(self._sched_heap, (due, seq))  # stale unless _sched holds seq with that due
            self._sched[seq] = due
        try:
            group = self._groups.get(group_id)
            if group is not None:
                messages = group.messages
                if messages:
                    messages.append(entry)
                else:  # an empty paused group
                    self._refill(group, entry)
            else:
                level = self._levels.get(priority)
                if level is None:
                    level = _Level(priority, self._rng.random())
                    self._levels[priority] = level
                    self._root = _treap_insert(self._root, level)
                try:
                    group = _Group(group_id, level, seq, event)
                    group.messages[0] = entry
                    self._groups[group_id] = group
                    try:
                        if due is None:
                            self._make_ready(group)
                        else:
                            self._schedule(group, due)
                    except BaseException:
                        del self._groups[group_id]
                        raise
                except BaseException:
                    if level.groups == 0:  # made for this group alone
                        del self._levels[priority]
                        self._root = _treap_delete(self._root, priority)
                    raise
                level.groups += 1
        except BaseException:
            if due is not None:
                del self._sched[seq]
            raise
        self._messages += 1
        self._extras += 1

    def _left(self, entry: Tuple[Any, ...], name: Optional[Tuple[str, str]], undo: bool) -> None:
        """A message with a due or a key (FIFO entry ``entry``; ``name``: its
        ``(group_id, key)``, made by the caller before it changed anything)
        left the transport (``undo``: its publish is being taken back).
        Allocates nothing."""
        self._extras -= 1
        seq = entry[0]
        if entry[2] is not None:
            sched = self._sched
            if sched.pop(seq, None) is not None and len(self._sched_heap) > 2 * len(sched) + 64:
                self._compact_sched()
        if name is not None:
            self._unhold(name, seq, undo)

    def _count_scheduled(self, now: float) -> int:
        """``stats().scheduled`` at ``now``: drop from ``_sched`` the messages
        whose ``due < now`` (for good: the transport's time never runs back)."""
        heap = self._sched_heap
        sched = self._sched
        while heap and heap[0][0] < now:
            due, seq = heappop(heap)
            if sched.get(seq) == due:
                del sched[seq]
        return len(sched)

    def _compact_sched(self) -> None:
        """Rebuild ``_sched_heap`` from ``_sched`` (its stale entries outnumber
        the live ones): amortised O(1).  Best effort out of memory."""
        try:
            fresh = [(due, seq) for seq, due in self._sched.items()]
        except MemoryError:
            return
        heapify(fresh)
        self._sched_heap = fresh

    def _schedule(self, group: _Group, due: float) -> None:
        """Give ``group``'s head (published with a delay) the scheduled state
        until ``due``, replacing any lock and taking the group out of the
        ready set: like a park (an expiry-heap entry, so ``_expire`` makes
        it ready once ``due < now``), but with no holder, not counted as
        parked, and no delivery.  The one allocation (the entry) comes first."""
        tick = 0
        if due != _INF:  # never due: no entry
            tick = self._tick + 1
            heappush(self._expiry, (due, tick, group))  # stale until group.tick == tick
            self._tick = tick
        if group.ready_key is not None:
            self._unready(group)  # all or nothing
        if group.lock != _FREE or group.tick:
            self._unlock(group)
        group.lock = _SCHEDULED
        group.expires_at = due
        if tick:
            group.tick = tick
            self._live_expiry += 1
            try:
                self._maybe_rebuild_expiry(self._live_expiry)
            except MemoryError:  # best effort: the stale entries stay
                pass

    # -- idempotency keys (the storage section's "keys")

    def _held(self, group_id: str, key: str, now: float) -> Optional[int]:
        """The seq of the message holding ``key`` in ``group_id`` at ``now``, or None."""
        hold = self._keys.get((group_id, key))
        if hold is None:
            return None
        if hold.held or now < hold.at + self._dedup_window:
            return hold.seq
        return None  # (its message left and the window is over: a new publish replaces it)

    def _hold(self, group_id: str, key: str, seq: int, at: float) -> _KeyHold:
        """Message ``seq``, published at ``at``, holds ``key`` in ``group_id``."""
        name = (group_id, key)
        hold = _KeyHold(seq, at, name)
        keys = self._keys
        keys[name] = hold
        window = self._dedup_window
        if window > 0.0 and window != _INF:
            try:
                self._key_order.append(hold)
            except BaseException:
                del keys[name]
                raise
        return hold

    def _unhold(self, name: Tuple[str, str], seq: int, undo: bool) -> None:
        """Message ``seq`` holding the key ``name`` (``(group_id, key)``) left
        (``undo``: was never published): its hold goes now, or, while the
        window since its publish lasts, is kept as not held (``_drop_keys``
        drops it later).  Allocates nothing."""
        keys = self._keys
        hold = keys.get(name)
        if hold is None or hold.seq != seq:
            return
        window = self._dedup_window
        if not undo and window > 0.0 and self._time < hold.at + window:
            hold.held = False
        else:
            del keys[name]

    def _drop_keys(self, now: float) -> None:
        """Drop the holds whose window is over at ``now`` and whose message left
        (the front of ``_key_order``); a hold still held leaves the deque and
        goes when its message does (``_unhold``: the window is over then)."""
        order = self._key_order
        keys = self._keys
        window = self._dedup_window
        while order:
            hold = order[0]
            if now < hold.at + window:
                break
            order.popleft()
            if not hold.held and keys.get(hold.name) is hold:
                del keys[hold.name]

    def _add_pending(self) -> None:
        """Add the messages published from nested user code (see ``publish``)."""
        pending = self._pending
        while pending:
            item = pending.pop(0)
            if len(item) == 4:
                self._add(*item)
            else:
                self._add_x(*item)

    def _settle(self) -> None:
        """End an operation: add messages published from nested user code, and
        undo the hand-offs of waits it ended when no claim is left waiting (with
        one waiting, the serving that follows ends them and serves it)."""
        pending = self._pending
        try:
            if pending:
                self._add_pending()

            if self._orphans and not self._nwaiting:
                self._end_orphans([])  # with nobody waiting, nothing to serve or wake
        finally:
            self._busy = False

    def _add_batch(
        self, first: int, batch: List[Tuple[str, Any, int, Optional[str]]], due: Optional[float], now: float
    ) -> None:
        """Add ``batch`` (``(group_id, event, priority, key)`` items) as
        messages ``first``, ``first + 1``, ..., each due at ``due`` (None: no
        delay), its key held from ``now``: all or none.

        A failure (MemoryError) takes back the messages added so far, newest
        first, so the transport is left as it was.
        """
        groups = self._groups
        count = len(batch)
        added: List[Optional[_Group]] = [None] * count  # allocated before any change
        how = [0] * count  # 0: appended, 1: refilled an empty paused group, 2: created the group
        done = 0
        try:
            for group_id, event, priority, key in batch:
                group = groups.get(group_id)
                how[done] = 2 if group is None else 0 if group.messages else 1
                seq = first + done
                if due is None and key is None:
                    self._add(seq, group_id, event, priority)
                else:
                    hold = None if key is None else self._hold(group_id, key, seq, now)
                    try:
                        self._add_x(seq, group_id, event, priority, due, key)
                    except BaseException:
                        if hold is not None:
                            self._unhold(hold.name, seq, True)
                        raise
                added[done] = groups[group_id]
                done += 1
        except BaseException:
            for i in range(done - 1, -1, -1):
                group = added[i]
                assert group is not None
                entry = group.messages.pop()
                assert entry is not None
                self._messages -= 1
                if len(entry) > 2:
                    self._left(entry, None if entry[3] is None else (batch[i][0], entry[3]), True)
                if how[i] and group.lock == _SCHEDULED:  # its head, scheduled: no longer
                    self._unlock(group)
                if how[i] == 2:
                    self._forget(group)
                elif how[i] == 1:
                    self._idle += 1
                    if group.key < 0:
                        group.key = -_NEVER_CLAIMED
            raise

    def _add_paused(self, group_id: str) -> None:
        """Create group ``group_id`` for ``pause``: priority 0, no message, paused."""
        level = self._levels.get(0)
        if level is None:
            level = _Level(0, self._rng.random())
            self._levels[0] = level
            self._root = _treap_insert(self._root, level)
        try:
            self._groups[group_id] = _paused_group(group_id, level)
        except BaseException:
            if level.groups == 0:  # made for this group alone
                del self._levels[0]
                self._root = _treap_delete(self._root, 0)
            raise
        level.groups += 1
        self._paused += 1
        self._idle += 1

    def _refill(self, group: _Group, entry: Tuple[Any, ...]) -> None:
        """The first message (FIFO entry ``entry``) of an empty paused group."""
        group.messages.append(entry)  # allocates: first, while nothing changed
        if len(entry) > 2 and entry[2] is not None:
            try:
                self._schedule(group, entry[2])
            except BaseException:
                group.messages.pop()
                raise
        self._idle -= 1
        if group.key < 0:  # never claimed: placed by its oldest message
            group.key = entry[0] - _NEVER_CLAIMED

    # -- claiming and acking in batches

    def _claim_next(
        self, worker_id: str, expires_at: float, min_priority: int, now: float
    ) -> Optional[Tuple[int, str, Any, int, int]]:
        """One claim of ``claim_many`` or ``ack_and_claim`` (expiry applied):
        ``(seq, group_id, event, attempt, delivery)`` of the message leased, or None."""
        found = self._find(min_priority)
        if found is None:
            return None
        group = found[1]
        self._lease_ready(group, worker_id, now, expires_at)
        entry = group.messages[group.head]
        return entry[0], group.group_id, entry[1], group.attempt, group.key  # type: ignore[index]


    def _skip_head(self, group: _Group) -> Tuple[int, Any]:
        """``skip`` of ``group``'s head (not under a live lease): as an ack of
        it, and the bury lifted.  A never-claimed group is placed by its
        oldest message, which is now the next one: it is re-keyed.  Returns
        the spent ``(seq, event)``; a MemoryError leaves everything as it was."""
        messages = group.messages
        head = group.head + 1
        old_key = group.key
        if old_key < 0 and head < len(messages):
            key = messages[head][0] - _NEVER_CLAIMED  # type: ignore[index]
            if group.ready_key is None:
                group.key = key  # _ack_current makes it ready (unless paused) under it
                try:
                    spent = self._ack_current(group)
                except BaseException:  # its first step, the allocation, failed: nothing else changed
                    group.key = old_key
                    raise
            else:
                self._rekey_ready(group, key)
                spent = self._ack_current(group)
        else:
            spent = self._ack_current(group)
        if group.reason is not None:
            group.reason = None
            self._buried -= 1
        return spent

    def _ack_current(self, group: _Group) -> Tuple[Any, ...]:
        """``ack`` of the current delivery of ``group`` (for ``ack`` when some
        message has a due or a key, ``ack_many``, ``ack_and_claim``,
        ``skip``): returns the spent FIFO entry, which the caller drops after
        the lock.  A next head published with a delay takes the scheduled
        state (even if its due has passed: the next operation that reads the
        clock frees it, as an expired park)."""
        messages = group.messages
        head = group.head + 1
        spent = messages[head - 1]
        due = name = None
        if self._extras:
            if len(spent) > 2 and spent[3] is not None:  # type: ignore[arg-type, index]
                name = (group.group_id, spent[3])  # type: ignore[index]  # allocates: first
            if head < len(messages):
                nxt = messages[head]
                if len(nxt) > 2:  # type: ignore[arg-type]
                    due = nxt[2]  # type: ignore[index]
        if head < len(messages) and due is None and group.ready_key is None and not group.paused:
            self._make_ready(group)  # allocates: first, while nothing changed
        if due is not None:
            self._schedule(group, due)  # replaces any lock; all or nothing
        elif group.lock != _FREE or group.tick:
            self._unlock(group)
        group.open = False
        group.attempt = 0
        messages[head - 1] = None
        self._messages -= 1
        if self._extras and len(spent) > 2:  # type: ignore[arg-type]
            self._left(spent, name, False)  # type: ignore[arg-type]
        if head == len(messages):
            if group.paused:
                self._keep_idle(group)
            else:
                self._forget(group)
        else:
            if head >= 32 and head * 2 >= len(messages):
                del messages[:head]
                head = 0
            group.head = head
        return spent  # type: ignore[return-value]

    # -- ready heaps and the level treap

    def _make_ready(self, group: _Group) -> None:
        """Put a free group in its level's heap under its round-robin key."""
        key = group.key
        entry = (key, group)
        level = group.level
        heap = level.heap
        heappush(heap, entry)  # the only allocation, before anything changes
        group.ready_key = key
        if heap[0] is entry:
            # A new minimum for this level: lower ``best`` on the path to it.
            node = self._root
            priority = level.priority
            while node is not None:
                best = node.best
                if best is None or key < best[0]:
                    node.best = entry
                if priority == node.priority:
                    break
                node = node.left if priority < node.priority else node.right

    def _unready(self, group: _Group) -> None:
        """Take a ready group out of the ready set (lazily: its entry goes stale)."""
        group.ready_key = None
        level = group.level
        heap = level.heap
        if heap and heap[0][1] is group:
            self._take_top(level)
        else:
            level.stale = stale = level.stale + 1
            if stale > 32 and 2 * stale > len(heap):
                self._compact(level)

    def _compact(self, level: _Level) -> None:
        """Rebuild a level's heap from its live entries: O(size), amortised O(1).

        Best effort: out of memory, the stale entries stay (nothing else
        changes), so that taking back a failed batch cannot fail here.
        """
        live = []
        seen = set()
        try:
            for entry in level.heap:
                group = entry[1]
                if group.ready_key == entry[0] and group.level is level and id(group) not in seen:
                    seen.add(id(group))
                    live.append(entry)
        except MemoryError:
            return
        heapify(live)
        level.heap = live
        level.stale = 0
        self._repair(level)

    def _rekey_ready(self, group: _Group, key: int) -> None:
        """Give a ready group another round-robin key (a never-claimed group
        whose oldest message went): the new entry is pushed first (the one
        allocation), then the old one goes stale."""
        level = group.level
        heap = level.heap
        heappush(heap, (key, group))  # stale (ready_key differs) until the switch below
        group.key = group.ready_key = key
        level.stale += 1  # the old entry
        while heap:  # the old entry may have been the top: keep the top live
            top_key, top = heap[0]
            if top.ready_key == top_key and top.level is level:
                break
            heappop(heap)
            level.stale -= 1
        self._repair(level)

    def _take_top(self, level: _Level) -> None:
        """Pop the level's top entry (and any stale ones) and fix ``best``.

        All or nothing: the path to repair is made first, and a pop may need
        memory (a list shrinks), so the top goes back (into the room its pop
        left) if dropping a stale one fails.
        """
        path = self._path_to(level)
        heap = level.heap
        top = heappop(heap)
        top[1].ready_key = None  # first: an older duplicate entry of its group is stale too
        try:
            while heap:
                key, group = heap[0]
                if group.ready_key == key and group.level is level:
                    break
                heappop(heap)
                level.stale -= 1
        except BaseException:
            top[1].ready_key = top[0]
            heappush(heap, top)  # the stale entries dropped were invisible anyway
            raise
        self._pull_path(level, path)

    def _repair(self, level: _Level) -> None:
        """Recompute ``best`` on the path from the root to ``level``."""
        self._pull_path(level, self._path_to(level))

    def _path_to(self, level: _Level) -> List[_Level]:
        """The treap nodes above ``level``, root first (the one allocation of
        a repair: a claim makes it before it changes anything)."""
        priority = level.priority
        node = self._root
        path: List[_Level] = []
        while node is not level:
            assert node is not None  # ``level`` is in the treap
            path.append(node)
            node = node.left if priority < node.priority else node.right
        return path

    @staticmethod
    def _pull_path(level: _Level, path: List[_Level]) -> None:
        """Recompute ``best`` of ``level``, then of each node above it."""
        _treap_pull(level)
        i = len(path)
        while i:  # by index: a reversed() iterator would be an allocation
            i -= 1
            _treap_pull(path[i])

    def _find(self, min_priority: int) -> Optional[Tuple[int, _Group]]:
        """The smallest ready entry among levels with priority >= min_priority."""
        best = None
        node = self._root
        while node is not None:
            if node.priority >= min_priority:
                heap = node.heap
                if heap and (best is None or heap[0][0] < best[0]):
                    best = heap[0]
                right = node.right
                if right is not None:
                    cand = right.best
                    if cand is not None and (best is None or cand[0] < best[0]):
                        best = cand
                node = node.left
            else:
                node = node.right
        return best

    def _set_level(self, group: _Group, priority: int) -> None:
        """Move ``group`` to the level of ``priority`` (a new one if need be),
        keeping its round-robin key and, if it is ready, its readiness."""
        level = self._levels.get(priority)
        if level is None:
            level = _Level(priority, self._rng.random())
            self._levels[priority] = level
            self._root = _treap_insert(self._root, level)
        entry = None
        if group.ready_key is not None:
            entry = (group.key, group)
            try:
                # The only allocation, first; the entry is stale (ignored)
                # until ``group.level`` is ``level``.
                heappush(level.heap, entry)
            except BaseException:
                if level.groups == 0:  # made for this group alone
                    del self._levels[priority]
                    self._root = _treap_delete(self._root, priority)
                raise
            self._unready(group)
        old = group.level
        old.groups -= 1
        if old.groups == 0:
            del self._levels[old.priority]
            self._root = _treap_delete(self._root, old.priority)
        group.level = level
        level.groups += 1
        if entry is not None:
            group.ready_key = entry[0]
            self._repair(level)

    # -- lock state and the expiry heap

    def _lease_ready(self, group: _Group, worker_id: str, now: float, expires_at: float) -> None:
        """Claim ready ``group``'s head for ``worker_id`` until ``expires_at``
        (expiry applied; ``now`` is the claim's time): all or nothing.

        Every new value that needs memory (the counters, the expiry entry)
        is made first; then the group leaves the ready set (``_take_top``,
        all or nothing); then the commit, which allocates nothing.  A ready
        group is never locked, so there is no lock to release first.
        """
        claims = self._claims + 1
        attempt = group.attempt + 1
        leased = self._leased + 1
        tick = live = 0
        if expires_at != _INF:  # an infinite lease never expires: no entry
            tick = self._tick + 1
            live = self._live_expiry + 1
            heappush(self._expiry, (expires_at, tick, group))  # stale until group.tick == tick
            self._tick = tick  # used up even if what follows fails: never given to another entry
        level = group.level
        if level is self._root and level.left is None and level.right is None:
            # One priority level: the heap top is ``best`` (no path to repair).
            heap = level.heap
            top = heappop(heap)
            group.ready_key = None  # first: an older duplicate entry of the group is stale too
            try:
                while heap:  # drop stale entries so the top stays valid
                    key, other = heap[0]
                    if other.ready_key == key:
                        break
                    heappop(heap)
                    level.stale -= 1
            except BaseException:
                group.ready_key = top[0]
                heappush(heap, top)  # into the room its pop left
                raise
            level.best = heap[0] if heap else None
        else:
            self._take_top(level)
        # --- commit: nothing below allocates
        group.lock = _LEASED
        group.worker_id = worker_id
        group.expires_at = expires_at
        self._leased = leased
        if tick:
            group.tick = tick
            self._live_expiry = live
        self._claims = claims
        group.key = claims
        group.last_claimed_at = now
        group.attempt = attempt
        group.open = True
        if tick:
            try:
                self._maybe_rebuild_expiry(live)
            except MemoryError:  # best effort: the stale entries stay
                pass

    def _maybe_rebuild_expiry(self, live: int) -> None:
        """Mostly stale entries (acked/nacked/extended): rebuild, O(live)."""
        expiry = self._expiry
        if len(expiry) > 2 * live + 64:
            fresh = [e for e in expiry if e[2].tick == e[1]]
            heapify(fresh)
            self._expiry = fresh

    def _unlock(self, group: _Group) -> None:
        """Release the group's lock (if any) and stale its expiry entry."""
        lock = group.lock
        if lock == _LEASED:
            self._leased -= 1
        elif lock == _PARKED:
            self._parked -= 1
        group.lock = _FREE
        group.worker_id = None
        if group.tick:
            group.tick = 0
            self._live_expiry -= 1

    def _lock_group(self, group: _Group, lock: int, worker_id: str, expires_at: float) -> None:
        """Lease or park ``group``'s head until ``expires_at``, replacing any lock.

        The one allocation (the expiry entry) comes first, so a MemoryError
        leaves everything as it was.
        """
        expiry = self._expiry
        tick = 0
        if expires_at != _INF:  # an infinite lock never expires: no entry
            tick = self._tick + 1
            heappush(expiry, (expires_at, tick, group))
            self._tick = tick
        self._unlock(group)
        group.lock = lock
        group.worker_id = worker_id
        group.expires_at = expires_at
        if lock == _LEASED:
            self._leased += 1
        else:
            self._parked += 1
        if tick:
            group.tick = tick
            self._live_expiry += 1
            try:
                self._maybe_rebuild_expiry(self._live_expiry)
            except MemoryError:  # best effort: the stale entries stay
                pass

    def _advance(self, now: float) -> float:
        """Under the lock: the transport's time for an operation whose clock
        read ``now`` (never earlier than one an earlier operation used), with
        every lease and park that ended before it expired.  ``claim`` has
        the same inline, on the hot path."""
        if now < self._time:
            now = self._time
        else:
            self._time = now
        expiry = self._expiry
        if expiry and expiry[0][0] < now:
            self._expire(now)
        return now

    def _expire(self, now: float) -> None:
        """Free every lock with ``expires_at < now``; their groups become ready."""
        expiry = self._expiry
        while expiry and expiry[0][0] < now:
            _, tick, group = expiry[0]
            if group.tick == tick:  # else stale: the lock was released or replaced
                if not group.paused:
                    self._make_ready(group)  # allocates: first, while nothing changed
                self._unlock(group)  # the delivery (group.open) stays current
            heappop(expiry)

    # -- storage

    def _forget(self, group: _Group) -> None:
        """Drop an emptied group: priority and round-robin position go too."""
        groups = self._groups
        del groups[group.group_id]
        if len(groups) < self._groups_shrink_below:
            # Dicts never give memory back on deletion: after a big backlog
            # drained, copy the table into one sized for what is left.
            try:
                self._groups = dict(groups)
            except MemoryError:  # keep the big table; nothing is lost
                pass
            self._groups_shrink_below = len(groups) // 8
        elif len(groups) > 8 * self._groups_shrink_below + 1024:
            self._groups_shrink_below = len(groups) // 8
        if group.ready_key is not None:
            self._unready(group)
        level = group.level
        level.groups -= 1
        if level.groups == 0:
            del self._levels[level.priority]
            self._root = _treap_delete(self._root, level.priority)
        # Stale heap entries may still point at this shell until they are
        # popped or compacted away: let it hold nothing of the user's.
        group.messages = []
        group.group_id = ""
        group.level = None  # type: ignore[assignment]

    def _keep_idle(self, group: _Group) -> None:
        """A paused group's last message is gone: it stays, empty."""
        group.messages = []
        group.head = 0
        self._idle += 1

    def _purge(self, group: _Group) -> None:
        """Drop ``group`` and its messages (the caller holds the message list,
        to release the events after the lock)."""
        left = None
        if self._extras:  # the keys' names first: they allocate
            group_id = group.group_id
            left = [(entry, None if entry[3] is None else (group_id, entry[3]))  # type: ignore[index]
                    for entry in group.messages[group.head:] if len(entry) > 2]  # type: ignore[arg-type]
        if group.ready_key is not None:
            self._unready(group)  # all or nothing, while nothing changed
        if left:
            for entry, name in left:
                self._left(entry, name, False)  # type: ignore[arg-type]
        if group.lock != _FREE or group.tick:
            self._unlock(group)
        group.open = False
        group.attempt = 0
        held = len(group.messages) - group.head

        if group.reason is not None:
            group.reason = None
            self._buried -= 1
        if group.paused:
            group.paused = False
            self._paused -= 1
            if not held:
                self._idle -= 1
        self._messages -= held
        self._forget(group)

    # -- waiting claims (the waiters section; waiting.py is the other side)

    def _hand_new(self, seq: int, group_id: str, event: Any, priority: int, now: float) -> Optional[List[_Waiter]]:
        """``publish``'s locked step while claims wait (``now``: its clock
        reading, made before the lock), when its message creates a group and
        nothing else is claimable for any waiting claim (the usual case): the
        group goes straight to the longest waiting claim whose floor admits
        it, created leased to that claim exactly as ``_add`` and then
        ``_hand_off`` would leave it, without entering the ready set and
        leaving it again.  Returns the waiters to wake (that one, dequeued
        and handed), or None when this is not that case and nothing was done
        (``publish`` adds the message, then serves as usual).  The group and
        level records are the spares a waiting claim made (``_wait_start``)
        when there are some.  All or nothing: a MemoryError leaves the
        transport as it was.

        It is the case when the group does not exist, no lock has expired by
        ``now`` and no ready group is admitted by the lowest floor waiting:
        then the new group is what ``_find(floor)`` returns for every floor
        that admits it (and nothing for the others), so ``_serve_locked``
        would hand it to that claim and find nothing more to serve.
        """
        groups = self._groups
        if group_id in groups or self._orphans or self._closed:
            return None
        if now < self._time:
            now = self._time
        else:
            self._time = now
        expiry = self._expiry
        if expiry and expiry[0][0] < now:
            return None  # expiry first (_serve_locked): the groups it frees come before a new one
        floors = self._wfloors
        root = self._root
        if root is not None and root.best is not None and self._find(floors[0]) is not None:
            return None  # something ready is claimable (served next anyway): the general way
        queues = self._wqueues
        w: Optional[_Waiter] = None
        at = i = 0
        for floor in floors:  # ascending: the floors that admit ``priority`` come first
            if floor > priority:
                break
            head = queues[floor].head
            assert head is not None
            if w is None or head.arrival < w.arrival:
                w = head
                at = i
            i += 1
        if w is None:
            return None  # no waiting claim admits it: it is just added
        # Allocations first; the records come from the spares a waiting
        # claim made (see _wait_start) when there are some.
        chain = [w]
        level = self._levels.get(priority)
        if level is None:
            level = self._spare_level
            if level is None:
                level = _Level(priority, self._rng.random())
            else:
                level.priority = priority
            self._levels[priority] = level
            self._spare_level = None
            self._root = _treap_insert(self._root, level)
        group = self._spare
        try:
            if group is None:
                group = _Group(group_id, level, seq, event)
            else:
                group.messages[0] = (seq, event)
                group.group_id = group_id
                group.level = level
            groups[group_id] = group
            expires_at = now + w.visibility
            tick = 0
            if expires_at != _INF:  # an infinite lease never expires: no entry
                tick = self._tick + 1
                try:
                    heappush(expiry, (expires_at, tick, group))
                except BaseException:
                    del groups[group_id]
                    raise
                self._tick = tick
        except BaseException:
            self._spare = None  # it may hold the event now: let it go with the failed publish
            if level.groups == 0:  # made for this group alone
                del self._levels[priority]
                self._root = _treap_delete(self._root, priority)
            raise
        # --- commit: nothing below allocates
        self._spare = None
        level.groups += 1
        self._messages += 1
        self._claims = claims = self._claims + 1
        self._leased += 1
        group.lock = _LEASED
        group.worker_id = w.worker_id
        group.expires_at = expires_at
        group.key = claims
        group.last_claimed_at = now
        group.attempt = 1
        group.open = True
        # the waiter: the lease, what an undo restores (a never-claimed
        # group's key, no claim time, no open delivery), out of its FIFO
        w.prev_key = seq - _NEVER_CLAIMED
        w.prev_claimed_at = 0.0
        w.prev_open = False
        w.seq = seq
        w.event = event
        w.group_id = group_id
        w.expires_at = expires_at
        w.attempt = 1
        w.delivery = claims
        nxt = w.next  # _dequeue of a FIFO's head, inline
        if nxt is None:
            del queues[w.floor]
            del floors[at]
        else:
            queues[w.floor].head = nxt
            nxt.prev = None
            w.next = None
        self._nwaiting -= 1
        w.state = _W_HANDED
        w.pending = True  # _promise (a queued record has none pending)
        self._wakeups[0] += 1
        if tick:
            group.tick = tick
            self._live_expiry += 1
            # No _maybe_rebuild_expiry here: the claim served made that check
            # before it waited (_wait_start), off the wake-up path.
        if self._nwaiting:
            self._arm_timer()  # for the claims still waiting: the new lease may expire first
        return chain

    def _serve_in(self, now: float) -> List[_Waiter]:
        """``publish``'s serving, in its own locked step after its message
        was added (``now``: the clock read before the lock): what
        ``_serve_waiters`` does under the lock.  Returns the waiters to wake."""
        if self._pending:  # as _settle would have before a separate serving
            self._add_pending()
        if now < self._time:
            now = self._time
        else:
            self._time = now
        chain: List[_Waiter] = []
        self._serve_locked(now, chain)
        if self._orphans or self._pending or self._closed:
            self._serve_nested(now, chain)
        return chain

    def _serve_waiters(self, now: Optional[float], error: Optional[BaseException] = None) -> None:
        """THE ENTRY POINT (see the waiters section): serve the waiting claims.

        Call it *after* releasing the lock, when ``self._nwaiting``, at the
        end of any operation that may have made a message claimable or that
        read the clock; ``now`` is that operation's clock reading, or None
        when it read none (the clock is read here then).  If that read fails,
        nothing is handed over and the expiry timer is asked to look for
        itself: the operation does not fail.  ``error``: the clock already
        failed (``publish`` read it before its locked step): do not read it.

        This is the path from a publish to a waiting claim's wake-up: it
        does as little as it can (one ``_find`` per floor looked at, the
        nested-serving and settling work only when there is some, the wakes
        inline), because every step of it runs before the waiter wakes, on
        caches gone cold while the producer slept.
        """
        if now is None and error is None:
            try:
                now = self._clock()
                if type(now) is not float or now - now != 0.0:
                    now = _check_time(now)
            except BaseException as exc:  # noqa: B036 - re-raised below unless an ordinary error
                error = exc
                now = None
        chain: List[_Waiter] = []
        with self._lock:
            if self._busy:
                return  # user code nested in an operation: that operation serves
            self._busy = True
            try:
                if self._nwaiting or self._orphans:
                    if now is None:
                        self._timer_at = -_INF  # the timer looks now, with its own reading
                        self._poke = True
                    else:
                        if now < self._time:
                            now = self._time
                        else:
                            self._time = now
                        self._serve_locked(now, chain)
                        if self._orphans or self._pending or self._closed:
                            self._serve_nested(now, chain)
            finally:
                if self._pending or self._orphans:
                    self._settle()
                else:
                    self._busy = False
        for w in chain:  # _wake, inline
            w.wake()
        if self._poke:
            self._poke = False
            _waiting.poke_timer(self)
        if error is not None and not isinstance(error, Exception):
            raise error  # KeyboardInterrupt and the like: not swallowed

    def _serve_locked(self, now: float, chain: List[_Waiter]) -> None:
        """Hand every claimable message to the waiting claim it belongs to
        (lock held; ``now`` is the transport time), then arm the timer."""
        if self._orphans:
            self._end_orphans(chain)
        if self._closed:
            self._close_waiters(chain)
            return
        expiry = self._expiry
        if expiry and expiry[0][0] < now:
            self._expire(now)
        queues = self._wqueues
        find = self._find
        while self._nwaiting:
            best: Optional[_Waiter] = None
            group: Optional[_Group] = None
            for floor in self._wfloors:
                entry = find(floor)
                if entry is None:
                    break  # nor does any higher floor admit a ready group
                head = queues[floor].head
                assert head is not None
                if best is None or head.arrival < best.arrival:
                    best = head
                    group = entry[1]  # what _find(best.floor) returns: the group it claims
            if best is None:
                break
            assert group is not None
            self._hand_off(best, group, now)
            if not best.pending:  # _promise, inline
                best.pending = True
                chain.append(best)
                self._wakeups[0] += 1
        if self._nwaiting:
            self._arm_timer()

    def _serve_nested(self, now: float, chain: List[_Waiter]) -> None:
        """After ``_serve_locked`` (lock held): user code that the garbage
        collector ran in the middle of it (a finaliser) may have published
        (held in ``_pending`` until the operation ends, see ``publish``),
        closed the transport (see ``close``) or ended a wait (``_orphans``,
        see ``_wait_end``); nobody would serve the waiting claims for that
        afterwards, so serve again until none of it is left."""
        while self._orphans or (self._nwaiting and (self._pending or self._closed)):
            if self._pending:
                self._add_pending()
            self._serve_locked(now, chain)

    def _hand_off(self, w: _Waiter, group: _Group, now: float) -> None:
        """Claim ``group`` (what ``_find(w.floor)`` returns) for ``w`` (queued)
        as ``claim`` would, keep the lease and the undo data on it, take it
        off the queue."""
        w.prev_key = group.key
        w.prev_claimed_at = group.last_claimed_at
        w.prev_open = group.open
        expires_at = now + w.visibility
        self._lease_ready(group, w.worker_id, now, expires_at)
        entry = group.messages[group.head]
        w.seq = entry[0]  # type: ignore[index]
        w.event = entry[1]  # type: ignore[index]
        w.group_id = group.group_id
        w.expires_at = expires_at
        w.attempt = group.attempt
        w.delivery = group.key
        self._dequeue(w)
        w.state = _W_HANDED

    def _undo(self, w: _Waiter) -> bool:
        """Take back the claim ``_hand_off`` made for ``w``, exactly, if that
        delivery is still current: the group is ready again with its old
        round-robin key, attempt count, open flag and ``last_claimed_at``."""
        group = self._groups.get(w.group_id)
        if group is None or not group.open or group.key != w.delivery:
            return False  # re-delivered since (its lease expired): nothing of it left
        if group.ready_key is not None:  # expired: ready under the hand-off's key
            self._unready(group)
        if group.lock != _FREE or group.tick:
            self._unlock(group)
        group.attempt = w.attempt - 1
        group.open = w.prev_open
        group.key = w.prev_key
        group.last_claimed_at = w.prev_claimed_at
        if not group.paused:  # paused meanwhile: it stays out of the ready set until resumed
            self._make_ready(group)
        return True

    def _enqueue(self, w: _Waiter) -> None:
        """Put ``w`` at the end of its floor's FIFO."""
        queue = self._wqueues.get(w.floor)
        if queue is None:
            queue = _FloorQueue()
            insort(self._wfloors, w.floor)
            self._wqueues[w.floor] = queue
        tail = queue.tail
        w.prev = tail
        w.next = None
        if tail is None:
            queue.head = w
        else:
            tail.next = w
        queue.tail = w
        self._arrivals += 1
        w.arrival = self._arrivals
        w.state = _W_WAITING
        self._nwaiting += 1

    def _dequeue(self, w: _Waiter) -> None:
        """Take queued ``w`` out of its FIFO."""
        queue = self._wqueues[w.floor]
        prev, nxt = w.prev, w.next
        if prev is None:
            queue.head = nxt
        else:
            prev.next = nxt
        if nxt is None:
            queue.tail = prev
        else:
            nxt.prev = prev
        w.prev = w.next = None
        if queue.head is None:
            del self._wqueues[w.floor]
            self._wfloors.remove(w.floor)
        w.state = _W_IDLE
        self._nwaiting -= 1

    def _promise(self, w: _Waiter, chain: List[_Waiter]) -> bool:
        """Promise ``w`` a wake (run after the lock); False if one is pending."""
        if w.pending:
            return False
        w.pending = True
        chain.append(w)
        return True

    def _arm_timer(self) -> None:
        """While claims wait, the expiry timer must fire by the earliest expiry."""
        if self._nwaiting:
            expiry = self._expiry
            if expiry and expiry[0][0] < self._timer_at:
                self._timer_at = expiry[0][0]
                self._poke = True

    def _close_waiters(self, chain: List[_Waiter]) -> None:
        """``close()``: every queued record is woken as CLOSED."""
        for floor in self._wfloors:
            w = self._wqueues[floor].head
            while w is not None:
                nxt = w.next
                w.prev = w.next = None
                w.state = _W_CLOSED
                if self._promise(w, chain):
                    self._wakeups[1] += 1
                w = nxt
        self._wqueues.clear()
        self._wfloors.clear()
        self._nwaiting = 0

    def _end_orphans(self, chain: List[_Waiter]) -> None:
        orphans, self._orphans = self._orphans, []
        for w in orphans:
            self._end_locked(w, False, chain)

    def _end_locked(self, w: _Waiter, keep: bool, chain: List[_Waiter]) -> bool:
        """``_wait_end`` under the lock: True if ``w`` keeps a handed lease."""
        state = w.state
        if state == _W_WAITING:
            self._dequeue(w)
        elif state == _W_HANDED:
            w.state = _W_IDLE
            if keep:
                return True
            if self._undo(w) and self._nwaiting:
                self._serve_locked(self._time, chain)
        else:
            w.state = _W_IDLE
        return False

    def _wake(self, chain: List[_Waiter]) -> None:
        """Run the promised wakes and poke the timer (after the lock is released)."""
        for w in chain:
            w.wake()
        if self._poke:
            self._poke = False
            _waiting.poke_timer(self)

    def _lease_of(self, w: _Waiter) -> Lease:
        return _issue(w.seq, w.group_id, w.event, w.worker_id, w.expires_at, w.attempt, self._owner, w.delivery)

    # -- waiting claims: what waiting.py calls (see its docstring)

    def _waiter(self, worker_id: str, visibility: float, min_priority: int, wake: Callable[[], None]) -> _Waiter:
        """A new waiter record (arguments already checked)."""
        return _Waiter(worker_id, visibility, min_priority, wake)

    def _wait_start(self, w: _Waiter) -> Optional[Lease]:
        """Read the clock; claim for ``w`` or queue it (see ``waiting.py``)."""
        now = _check_time(self._clock())
        chain: List[_Waiter] = []
        # The records a direct hand-off of a new group needs (_hand_new), made
        # here, before the wait, so that the publish that wakes a claim
        # allocates next to nothing: a group record (made by the first claim
        # to wait, and by the first after each direct hand-off) and a level.
        # Read without the lock, the tests only save making one that is there.
        spare = _Group("", None, 0, None) if self._spare is None else None  # type: ignore[arg-type]
        spare_level = _Level(0, 0.0) if self._spare_level is None else None
        with self._lock:
            if self._busy:
                raise _reentered("claim")
            self._busy = True
            try:
                if self._closed:
                    w.state = _W_CLOSED
                else:
                    if now < self._time:
                        now = self._time
                    else:
                        self._time = now
                    try:
                        # For the direct hand-offs, which push expiry entries
                        # without this check: at most one per claim waiting.
                        self._maybe_rebuild_expiry(self._live_expiry)
                    except MemoryError:  # best effort: the stale entries stay
                        pass
                    self._enqueue(w)
                    w.pending = True  # its owner is running this: no wake for it
                    self._serve_locked(now, chain)
                    self._serve_nested(now, chain)
                    if w.state == _W_WAITING:
                        w.pending = False
                    if self._spare is None:
                        self._spare = spare
                    if self._spare_level is None and spare_level is not None:
                        spare_level.weight = self._rng.random()
                        self._spare_level = spare_level
            finally:
                self._settle()
        self._wake(chain)
        if w.state == _W_HANDED:
            w.state = _W_IDLE
            return self._lease_of(w)
        return None

    def _timer_fire(self) -> float:
        """For the expiry timer, when the time it is armed for is due: read
        the clock; if claims wait, expire and serve.  Returns the time used."""
        now = _check_time(self._clock())
        chain: List[_Waiter] = []
        with self._lock:
            if self._busy:
                raise _reentered("_timer_fire")
            self._busy = True
            try:
                self._timer_at = _INF
                if self._nwaiting or self._orphans:
                    if now < self._time:
                        now = self._time
                    else:
                        self._time = now
                    self._serve_locked(now, chain)  # arms the timer again if claims still wait
                    self._serve_nested(now, chain)
                self._poke = False  # this is the timer: it knows
            finally:
                self._settle()
        self._wake(chain)
        return now

    def _timer_due(self) -> Tuple[float, float]:
        """For the expiry timer: (the clock time it is armed for, the transport time)."""
        with self._lock:
            return self._timer_at, self._time

    def _wait_end(self, w: _Waiter, keep: bool) -> Optional[Lease]:
        """End ``w``'s wait: its handed lease if ``keep``, else an exact undo
        of the hand-off (the message goes to the next waiter).  Never raises."""
        if keep:
            # The common end, on the wake-up path: a lease was handed over.  A
            # handed record is no longer queued (only its owner touches it),
            # so there is nothing to serve: mark it, build the lease after the
            # lock (_lease_of, inline: this runs before the woken claim returns).
            with self._lock:
                handed = w.state == _W_HANDED and not self._busy
                if handed:
                    w.state = _W_IDLE
            if handed:
                lease = _LeaseBuilder()
                lease.seq = w.seq
                lease.group_id = w.group_id
                lease.event = w.event
                lease.worker_id = w.worker_id
                lease.expires_at = w.expires_at
                lease.attempt = w.attempt
                lease._owner = self._owner
                lease._delivery = w.delivery
                lease.__class__ = Lease  # type: ignore[assignment]
                return lease  # type: ignore[return-value]
        chain: List[_Waiter] = []
        with self._lock:
            if self._busy:
                # From user code nested in an operation (a coroutine finalised
                # by the garbage collector): the next serving ends it.
                self._orphans.append(w)
                return None
            self._busy = True
            try:
                kept = self._end_locked(w, keep, chain)
                self._serve_nested(self._time, chain)
            finally:
                self._settle()
        self._wake(chain)
        return self._lease_of(w) if kept else None

    def _waiting_count(self) -> int:
        """Waiting claims queued now; for tests."""
        return self._nwaiting

    def _wake_counts(self) -> Tuple[int, int]:
        """Wakes promised to waiting claims so far: (hand-offs, close); for tests."""
        with self._lock:
            return (self._wakeups[0], self._wakeups[1])


def _reentered(operation: str) -> RuntimeError:
    return RuntimeError(
        f"InMemoryTransport.{operation}() was called from user code (a finaliser or signal "
        "handler) that ran in the middle of another operation of the same transport on "
        "this thread; only publish() can be called there"
    )
