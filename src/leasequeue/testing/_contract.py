"""``TransportContract``: the contract as a pytest test class to subclass.

Needs pytest (imported here and in the ``_rules_*`` modules it is made of;
``leasequeue.testing`` itself imports without it).
"""

from __future__ import annotations

from ._rules_ack_and_claim import AckAndClaimRules
from ._rules_attempts import AttemptRules
from ._rules_bad_input import BadInputRules, Part5BadInputRules
from ._rules_batches import BatchRules
from ._rules_control import ControlPlaneRules
from ._rules_core import CoreRules
from ._rules_later import LaterRules
from ._rules_once import OnceRules
from ._rules_quarantine import QuarantineRules
from ._rules_transactions import TransactionRules
from ._rules_waiting import WaitingRules

__all__ = ["TransportContract"]


class TransportContract(
    CoreRules,
    BadInputRules,
    WaitingRules,
    ControlPlaneRules,
    BatchRules,
    QuarantineRules,
    AckAndClaimRules,
    LaterRules,
    OnceRules,
    AttemptRules,
    Part5BadInputRules,
    TransactionRules,
):
    """One test per rule of leasequeue's transport contract, for any transport.

    Subclass it in a test module under a name pytest collects (``Test...``),
    override ``make_transport(self, clock)`` to return a new, empty
    transport of yours that reads the time from ``clock``, and set the flags
    for what your transport does not promise::

        from leasequeue.testing import TransportContract

        class TestMyTransport(TransportContract):
            preserves_identity = False      # events are stored serialised
            supports_batches = False        # no publish_many / claim_many yet

            def make_transport(self, clock):
                return MyTransport(clock=clock)

    Flags (class attributes, True by default; a test of a capability
    that is switched off is *skipped*, with the flag named in the reason):

    * ``preserves_identity``: ``lease.event is`` the published object.  With
      False, events are compared with ``==`` and the identity tests skip.
    * ``supports_waiting``: ``claim(timeout=)``, ``aclaim``, ``closed``, and
      ``close()`` waking waiters (SPEC Part 2, "Waiting for work").
    * ``supports_control_plane``: ``pause``/``resume``/``purge``/
      ``set_priority``/``group``/``groups`` (Part 2, "Control plane").
    * ``supports_batches``: ``publish_many``/``claim_many``/``ack_many``.
    * ``supports_quarantine``: ``bury``/``skip``/``peek``, ``resume``
      lifting a bury, ``GroupInfo.reason``, ``stats().buried`` (SPEC Part 4,
      "Quarantine").
    * ``supports_ack_and_claim``: ``ack_and_claim`` (a job's ack and the
      next claim in one call; docs/contract.md, "ack_and_claim").
    * ``supports_later``: ``publish(..., delay=)`` and ``publish_many(...,
      delay=)``, the ``"scheduled"`` state, ``GroupInfo.due_at``,
      ``stats().scheduled``, ``Message.due_at`` (SPEC Part 5, "Later").
    * ``supports_once``: ``publish(..., key=)``, keyed ``publish_many``
      items, ``Message.key`` and the constructor's ``dedup_window``
      (Part 5, "Once").  Its window rules call ``make_transport(clock,
      dedup_window=w)``: with this flag, ``make_transport`` must accept
      that keyword and hand it to the transport.
    * ``supports_release``: ``release(lease, delay=0.0)``, ``retry(group_id)``
      and fencing by delivery: a lease of a closed delivery never becomes
      current again, even when a later delivery carries its ``attempt``
      (Part 5, "Honest attempts").
    * ``usable_after_close``: calls still work after ``close()`` (the
      in-memory transports); False when ``close()`` releases a connection:
      then a claim with a non-zero timeout (and ``aclaim``) returns None at
      once and every other call raises ``LeaseQueueError``.

    And flags that are False by default:

    * ``accepts_rebuilt_leases``: a lease is named by its fields, so one
      rebuilt from them (or issued by another instance on the same store)
      is current where they name the open delivery (a durable backend).
    * ``supports_transactions``: ``publish``, ``publish_many``, ``ack``,
      ``ack_many``, ``nack``, ``bury`` and ``release`` take ``conn=``, the
      application's database connection, and run inside its transaction
      (SPEC Part 5, "With the application's data").  The subclass then
      implements ``open_app_connection(transport)`` (a context manager
      yielding a new connection of the application's kind to the
      transport's database) and, for connections that are not DB-API ones,
      ``app_begin(conn)``, ``app_commit(conn)``, ``app_rollback(conn)``.
    * ``transactions_block_writers``: with ``supports_transactions``, an
      open application transaction blocks the transport's own writes
      (SQLite): the rules then look only through ``len`` and ``peek`` while
      it is open.

    Hooks: ``make_transport(clock, *, dedup_window=0.0)`` (required; an
    override taking ``clock`` alone serves every rule but the window rules
    of ``supports_once``) and ``close_transport(t)``
    (default ``t.close()``), called for every transport a test made when
    the test ends.  ``liveness_timeout`` (seconds a test waits for something
    that must happen) and ``settle_seconds`` (how long a waiting test lets a
    claim fall asleep) can be raised for a slow backend.

    Fixtures available to your own extra tests: ``clock`` (a ``ManualClock``
    at 1000.0), ``transport`` (``make_transport(clock)``), ``new_transport``
    (a factory taking a clock; everything it made is closed at the end).
    """
