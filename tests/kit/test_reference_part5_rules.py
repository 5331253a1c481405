"""The contract's Part 5 rules ("Later", "Once", "Honest attempts") on the
referee: it is the oracle of every differential test, so it must state
them too (docs/decisions.md, "Part 5 ... pinned").  The referee never waits:
the waiting rules run on the real transports only.
"""

from __future__ import annotations

from typing import Any, Callable

from leasequeue.testing import ReferenceTransport
from leasequeue.testing._rules_attempts import AttemptRules
from leasequeue.testing._rules_later import LaterRules
from leasequeue.testing._rules_once import OnceRules


class TestTheReferee(LaterRules, OnceRules, AttemptRules):
    """Every Part 5 rule, on the in-memory transports' referee."""

    supports_waiting = False

    def make_transport(self, clock: Callable[[], float], **options: Any) -> Any:
        return ReferenceTransport(clock, **options)


class TestTheRefereeOfADurableBackend(LaterRules, OnceRules, AttemptRules):
    """The same with the durable backends' rules (rebuilt leases, unusable after close)."""

    supports_waiting = False
    accepts_rebuilt_leases = True
    usable_after_close = False

    def make_transport(self, clock: Callable[[], float], **options: Any) -> Any:
        return ReferenceTransport(clock, accepts_rebuilt_leases=True, usable_after_close=False, **options)
