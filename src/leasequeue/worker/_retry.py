"""The retry policy and the decision it makes.

:class:`Retry` is the policy (attempts, backoff, which errors, what happens
when exhausted); :class:`~leasequeue.RetryLater` and :class:`~leasequeue.worker.CrashLoop` are the errors
that steer it.  :func:`decide` turns a finished run of a handler into a
:class:`Decision` (what to tell the transport), and :func:`crash_loop` the
claim of a message beyond its budget: pure functions of the policy, the
job's attempt and the error, tested without threads or transports.  The
recorder (``_record.py``) carries a decision out.
"""

from __future__ import annotations

import enum
import logging
import math
import random
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from ._checks import check_exceptions, check_int, check_number, error_name

if TYPE_CHECKING:
    from ._job import Job

__all__ = ["MAX_REASON", "Action", "CrashLoop", "Decision", "Outcome", "Retry", "RetryLater", "crash_loop",
           "decide", "reason"]

#: A bury reason is kept with the group: bounded.
MAX_REASON = 500

_logger = logging.getLogger("leasequeue.worker")


class Outcome(str, enum.Enum):
    """What a job reached (a hook's, a middleware's and a metric's name for it).

    A ``str``: ``Outcome.SUCCEEDED == "succeeded"``, so ``hooks={"succeeded": f}``
    and ``worker.counts["succeeded"]`` keep working.
    """

    STARTED = "started"
    SUCCEEDED = "succeeded"
    RETRIED = "retried"
    BURIED = "buried"
    SKIPPED = "skipped"
    LOST = "lost"
    HANDED_BACK = "handed_back"

    def __str__(self) -> str:
        return self.value


class Action(enum.Enum):
    """What the worker tells the transport about a delivery."""

    ACK = "ack"                  #: ``ack``: the handler returned
    RETRY = "retry"              #: ``nack(delay)``: a failure, retried after ``delay`` (it counts)
    DEFER = "defer"              #: ``release(delay)``: ``RetryLater`` (it does not count)
    BURY = "bury"                #: ``bury(reason)``: exhausted, not retryable, a crash loop, undecodable
    SKIP = "skip"                #: ``dead_letter(job, error)``, then ``ack``
    HANDBACK = "handback"        #: ``release(delay)``: handed back at shutdown, not started or cancelled
    RETURN = "return"            #: ``nack(0)``: the handler raised SystemExit/KeyboardInterrupt (it ran: it counts)


@dataclass(frozen=True)
class Decision:
    """An :class:`Action` with its delay (``RETRY``, ``DEFER``, ``HANDBACK``)
    or its reason (``BURY``)."""

    action: Action
    delay: float = 0.0
    reason: str = ""


ACK = Decision(Action.ACK)
SKIP = Decision(Action.SKIP)
HANDBACK = Decision(Action.HANDBACK)
RETURN = Decision(Action.RETURN)


class RetryLater(Exception):
    """Raise from a handler to run it again after ``delay`` seconds, without
    counting a failure (a rate limit, a resource not ready yet).

    The worker hands the message back with ``transport.release(lease,
    delay)``: it is parked at its group's head for ``delay`` seconds (the
    group's later messages wait behind it, in order; other groups go on),
    the worker's slot is free at once, and the next delivery (to this worker
    or another) carries the same ``attempt``: ``max_attempts`` is not used up.

    On a transport without ``release`` (a backend written before 0.6) the
    worker keeps the lease (its heartbeat extends it) and runs the handler
    again on the same slot after the delay, as before 0.6: a ``nack`` would
    count the wait as a failed attempt.
    """

    def __init__(self, delay: float, reason: str = "") -> None:
        self.delay = check_number(delay, "delay")
        self.reason = reason
        super().__init__(delay, reason)

    def __str__(self) -> str:
        return f"retry in {self.delay:g} s" + (f": {self.reason}" if self.reason else "")


class CrashLoop(Exception):
    """The error reported with a message buried unrun because it was claimed
    with ``attempt > max_attempts``: its attempt is beyond the retry budget.

    What the worker knows is only that number: its earlier deliveries
    failed, were buried (and the group resumed), or ended without an
    outcome (a crash, a hang past the lease, a lost connection).  Hand-backs
    at a graceful shutdown and ``RetryLater`` use ``release`` and do not
    count.  ``leasequeue queue retry G`` (``transport.retry``) gives the
    message a fresh budget; ``resume`` does not (the worker buries it again).
    """


class Retry:
    """The retry policy: when a handler raises, retry or give up, and how.

    - ``max_attempts``: deliveries a message gets (>= 1).  A handler that
      raises on attempt ``max_attempts`` exhausts it; a message claimed with
      ``attempt > max_attempts`` (its earlier deliveries failed, were buried,
      or ended without an outcome: a crash, a hang past the lease, a lost
      connection) is buried without running (the bury reason is a ``CrashLoop``).
    - ``backoff``, ``factor``, ``max_delay``, ``jitter``: the delay before the
      next delivery after failed attempt ``n`` is ``backoff * factor ** (n - 1)``,
      capped at ``max_delay``, times a random factor in ``[1 - jitter, 1 + jitter]``
      (and capped again).  The message is parked at its group's head
      (``nack(delay)``), so the rest of the group waits behind it, in order,
      and other groups go on.
    - ``retry_on``: the exception classes that are retried (default:
      ``Exception``); ``give_up_on``: classes never retried (checked first).
      Any other error exhausts the message at once.
    - ``exhausted``: what happens then.  ``"bury"`` (the default): the group is
      quarantined (``bury``) with a reason naming the error and the attempt;
      an operator retries it (``retry``: a fresh budget) or skips it.
      ``"skip"``: the message is handed to ``dead_letter(job, error)`` and
      then acked; the group goes on (without ``dead_letter`` it is dropped
      with only a log line, so making such a policy warns: ``UserWarning``).  A
      callable ``f(job, error)``: its return value decides: ``"bury"``,
      ``"skip"`` (or ``None``: acked), or a number: retry after that many
      seconds.  A callable that raises buries the group.
    """

    __slots__ = ("max_attempts", "backoff", "factor", "max_delay", "jitter", "retry_on", "give_up_on",
                 "exhausted", "dead_letter", "_random")

    def __init__(
        self,
        max_attempts: int = 5,
        backoff: float = 1.0,
        factor: float = 2.0,
        max_delay: float = 300.0,
        jitter: float = 0.1,
        *,
        retry_on: Any = (Exception,),
        give_up_on: Any = (),
        exhausted: Union[str, Callable[["Job", BaseException], Any]] = "bury",
        dead_letter: Optional[Callable[["Job", BaseException], Any]] = None,
    ) -> None:
        self.max_attempts = check_int(max_attempts, "max_attempts", 1)
        self.backoff = check_number(backoff, "backoff")
        self.factor = check_number(factor, "factor", minimum=1.0)
        self.max_delay = check_number(max_delay, "max_delay")
        self.jitter = check_number(jitter, "jitter")
        if self.jitter > 1.0:
            raise ValueError(f"jitter must be between 0 and 1, not {jitter!r}")
        self.retry_on = check_exceptions(retry_on, "retry_on")
        self.give_up_on = check_exceptions(give_up_on, "give_up_on")
        if not callable(exhausted) and exhausted not in ("bury", "skip"):
            raise ValueError(f"exhausted must be 'bury', 'skip' or a callable, not {exhausted!r}")
        if dead_letter is not None and not callable(dead_letter):
            raise TypeError(f"dead_letter must be callable, not {type(dead_letter).__name__}")
        if dead_letter is not None and exhausted != "skip":
            raise ValueError("dead_letter is called only with exhausted='skip'")
        if exhausted == "skip" and dead_letter is None:
            warnings.warn("Retry(exhausted='skip') without dead_letter drops exhausted messages (acked, with "
                          "only a log line); pass dead_letter=f to keep them", UserWarning, stacklevel=2)
        self.exhausted = exhausted
        self.dead_letter = dead_letter
        self._random = random.Random()

    def delay(self, attempt: int) -> float:
        """Seconds to park a message after its failed attempt ``attempt``."""
        try:
            base = self.backoff * self.factor ** (max(attempt, 1) - 1)
        except OverflowError:
            base = math.inf
        base = min(base, self.max_delay)
        if self.jitter:
            base *= 1.0 + self.jitter * (2.0 * self._random.random() - 1.0)
        return min(max(base, 0.0), self.max_delay)

    def retryable(self, error: BaseException) -> bool:
        """Whether ``error`` may be retried at all (before counting attempts)."""
        if self.give_up_on and isinstance(error, self.give_up_on):
            return False
        return isinstance(error, self.retry_on)

    def __repr__(self) -> str:
        return (f"Retry(max_attempts={self.max_attempts}, backoff={self.backoff:g}, factor={self.factor:g}, "
                f"max_delay={self.max_delay:g}, jitter={self.jitter:g}, exhausted={self.exhausted!r})")


def reason(policy: Retry, job: "Job", error: BaseException) -> str:
    """The bury reason of an exhausted job: the error and the attempt, bounded."""
    text = f"{error_name(error)} (attempt {job.attempt} of {policy.max_attempts})"
    return bounded(text)


def bounded(text: str) -> str:
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 1] + "…"


def crash_loop(policy: Retry, job: "Job") -> Optional[CrashLoop]:
    """The error of a message claimed with ``attempt > max_attempts`` (it is
    buried unrun), else ``None``."""
    if job.attempt <= policy.max_attempts:
        return None
    return CrashLoop(
        f"attempt {job.attempt} is beyond the budget of max_attempts {policy.max_attempts}: earlier "
        "deliveries failed, were buried, or ended without an outcome (such as a crash, a hang past the lease "
        "or a lost connection)"
    )


def crash_loop_decision(error: CrashLoop) -> Decision:
    return Decision(Action.BURY, reason=f"not run: {error}; 'retry' gives it a fresh budget")


def decide(policy: Retry, job: "Job", error: Optional[BaseException],
           logger: Optional[logging.Logger] = None) -> Decision:
    """What to do after a run of ``job``'s handler that raised ``error``
    (``None``: it returned).

    - returned: ``ACK``;
    - :class:`~leasequeue.RetryLater`: ``DEFER`` after its delay (not a failure);
    - retryable and ``attempt < max_attempts``: ``RETRY`` after ``policy.delay(attempt)``;
    - otherwise the exhausted action: ``BURY`` (the reason names the error
      and the attempt), ``SKIP``, or what the exhausted callable returns
      (``"bury"``, ``"skip"``/``None``, a delay >= 0: ``RETRY``); a callable
      that raises or returns anything else buries (logged on ``logger``).

    Only the exhausted callable and the jitter's random draw are outside
    the arguments.
    """
    if error is None:
        return ACK
    if isinstance(error, RetryLater):
        return Decision(Action.DEFER, delay=error.delay)
    if policy.retryable(error) and job.attempt < policy.max_attempts:
        return Decision(Action.RETRY, delay=policy.delay(job.attempt))
    exhausted = policy.exhausted
    if exhausted == "skip":
        return SKIP
    if exhausted == "bury":
        return Decision(Action.BURY, reason=reason(policy, job, error))
    log = logger if logger is not None else _logger
    try:
        verdict = exhausted(job, error)  # type: ignore[operator]
    except Exception as exc:
        log.exception("the exhausted callable raised: burying group %r", job.group_id)
        return Decision(Action.BURY, reason=bounded(reason(policy, job, error)
                                                    + f"; exhausted callable raised {error_name(exc)}"))
    if verdict is None or verdict == "skip":
        return SKIP
    if verdict == "bury":
        return Decision(Action.BURY, reason=reason(policy, job, error))
    if not isinstance(verdict, bool) and isinstance(verdict, (int, float)) and verdict >= 0:
        return Decision(Action.RETRY, delay=float(verdict))
    log.error("the exhausted callable returned %r (not 'bury', 'skip', None or a delay): burying", verdict)
    return Decision(Action.BURY, reason=reason(policy, job, error))
