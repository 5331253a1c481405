"""``leasequeue.worker.decide``: the retry policy's decision as a pure
function of the policy, the job's attempt and the error, every branch,
without threads or transports (a stand-in job with ``attempt`` and
``group_id`` is all it reads)."""

from __future__ import annotations

import logging
from dataclasses import FrozenInstanceError
from typing import Any, List

import pytest

from leasequeue import Retry, RetryLater
from leasequeue.worker import Action, CrashLoop, Decision, Outcome, decide
from leasequeue.worker._retry import MAX_REASON, crash_loop, crash_loop_decision


class FakeJob:
    def __init__(self, attempt: int, group_id: str = "g") -> None:
        self.attempt = attempt
        self.group_id = group_id


def policy(**kw: Any) -> Retry:
    kw.setdefault("jitter", 0.0)
    return Retry(**kw)


def test_a_returned_handler_is_acked() -> None:
    assert decide(policy(), FakeJob(1), None) == Decision(Action.ACK)


def test_retry_later_defers_whatever_the_attempt() -> None:
    for attempt in (1, 5, 99):
        d = decide(policy(max_attempts=5), FakeJob(attempt), RetryLater(2.5))
        assert d == Decision(Action.DEFER, delay=2.5)


def test_a_retryable_error_below_the_budget_is_retried_with_the_backoff() -> None:
    p = policy(max_attempts=4, backoff=0.5, factor=3.0, max_delay=100.0)
    assert [decide(p, FakeJob(n), ValueError("x")) for n in (1, 2, 3)] == [
        Decision(Action.RETRY, delay=0.5), Decision(Action.RETRY, delay=1.5), Decision(Action.RETRY, delay=4.5)]


def test_the_last_attempt_buries_with_the_error_and_the_attempt() -> None:
    d = decide(policy(max_attempts=3), FakeJob(3), ValueError("could not convert"))
    assert d == Decision(Action.BURY, reason="ValueError: could not convert (attempt 3 of 3)")


def test_a_reason_is_bounded() -> None:
    d = decide(policy(max_attempts=1), FakeJob(1), ValueError("x" * 2000))
    assert d.action is Action.BURY and len(d.reason) == MAX_REASON and d.reason.endswith("…")


def test_a_non_retryable_error_is_exhausted_at_once() -> None:
    p = policy(max_attempts=5, retry_on=(OSError,), give_up_on=(FileNotFoundError,))
    assert decide(p, FakeJob(1), KeyError("k")).action is Action.BURY
    assert decide(p, FakeJob(1), FileNotFoundError("f")).action is Action.BURY  # give_up_on wins
    assert decide(p, FakeJob(1), ConnectionError("c")).action is Action.RETRY


def test_exhausted_skip() -> None:
    p = policy(max_attempts=1, exhausted="skip", dead_letter=lambda job, error: None)
    assert decide(p, FakeJob(1), ValueError()) == Decision(Action.SKIP)


@pytest.mark.parametrize("verdict, expected", [
    ("bury", Decision(Action.BURY, reason="ValueError: v (attempt 2 of 2)")),
    ("skip", Decision(Action.SKIP)),
    (None, Decision(Action.SKIP)),
    (7, Decision(Action.RETRY, delay=7.0)),
    (0.25, Decision(Action.RETRY, delay=0.25)),
])
def test_an_exhausted_callable_decides(verdict: Any, expected: Decision) -> None:
    seen: List[Any] = []

    def exhausted(job: Any, error: BaseException) -> Any:
        seen.append((job.attempt, str(error)))
        return verdict

    assert decide(policy(max_attempts=2, exhausted=exhausted), FakeJob(2), ValueError("v")) == expected
    assert seen == [(2, "v")]


@pytest.mark.parametrize("verdict", [True, -1, "drop", object()])
def test_an_exhausted_callable_returning_nonsense_buries(verdict: Any, caplog: Any) -> None:
    with caplog.at_level(logging.ERROR, logger="leasequeue.worker"):
        d = decide(policy(max_attempts=1, exhausted=lambda job, error: verdict), FakeJob(1), ValueError("v"))
    assert d == Decision(Action.BURY, reason="ValueError: v (attempt 1 of 1)")
    assert "burying" in caplog.text


def test_an_exhausted_callable_that_raises_buries_naming_both(caplog: Any) -> None:
    def exhausted(job: Any, error: BaseException) -> Any:
        raise OSError("store down")

    with caplog.at_level(logging.ERROR, logger="leasequeue.worker"):
        d = decide(policy(max_attempts=1, exhausted=exhausted), FakeJob(1, "g7"), ValueError("v"))
    assert d == Decision(Action.BURY, reason="ValueError: v (attempt 1 of 1); exhausted callable raised "
                                             "OSError: store down")
    assert "'g7'" in caplog.text


def test_the_crash_loop_rule() -> None:
    p = policy(max_attempts=3)
    assert crash_loop(p, FakeJob(3)) is None
    error = crash_loop(p, FakeJob(4))
    assert isinstance(error, CrashLoop) and "attempt 4 is beyond the budget of max_attempts 3" in str(error)
    d = crash_loop_decision(error)
    assert d.action is Action.BURY and d.reason.startswith("not run: attempt 4") and "'retry'" in d.reason
    assert "crash" not in d.reason.split(":")[1]  # it claims no crash it cannot know of


def test_a_decision_is_frozen_and_outcomes_are_strings() -> None:
    d = Decision(Action.ACK)
    with pytest.raises(FrozenInstanceError):
        d.delay = 1.0  # type: ignore[misc]
    assert Outcome.SUCCEEDED == "succeeded" and str(Outcome.HANDED_BACK) == "handed_back"
    assert [o.value for o in Outcome] == ["started", "succeeded", "retried", "buried", "skipped", "lost",
                                          "handed_back"]


# --------------------------------------------------- the policy's own rules
# (what the mutation run of worker/_retry.py found untested by decide() alone)


def test_retry_defaults_are_the_documented_ones() -> None:
    r = Retry()
    assert (r.max_attempts, r.backoff, r.factor, r.max_delay, r.jitter, r.exhausted, r.dead_letter) == (
        5, 1.0, 2.0, 300.0, 0.1, "bury", None)


@pytest.mark.parametrize("kw, error", [
    ({"max_attempts": 0}, ValueError),
    ({"factor": 0.999}, ValueError),
    ({"jitter": 1.0001}, ValueError),
    ({"exhausted": "drop"}, ValueError),
    ({"exhausted": "skip", "dead_letter": 3}, TypeError),
    ({"exhausted": "bury", "dead_letter": print}, ValueError),
])
def test_bad_policies_are_refused(kw: Any, error: type) -> None:
    with pytest.raises(error):
        Retry(**kw)


def test_the_boundaries_of_the_policy_are_accepted() -> None:
    r = Retry(max_attempts=1, factor=1.0, jitter=1.0)
    assert (r.max_attempts, r.factor, r.jitter) == (1, 1.0, 1.0)


def test_skip_without_a_dead_letter_warns_and_with_one_does_not(recwarn: Any) -> None:
    with pytest.warns(UserWarning, match="dead_letter"):
        Retry(exhausted="skip")
    recwarn.clear()
    Retry(exhausted="skip", dead_letter=lambda job, error: None)
    Retry(exhausted="bury")
    assert not [w for w in recwarn if issubclass(w.category, UserWarning)]


def test_the_jitter_stays_within_its_bounds_and_varies() -> None:
    r = Retry(backoff=10.0, factor=1.0, max_delay=100.0, jitter=0.5)
    delays = [r.delay(1) for _ in range(400)]
    assert all(5.0 <= d <= 15.0 for d in delays), (min(delays), max(delays))
    assert min(delays) < 7.0 and max(delays) > 13.0  # both sides of the base are used
    assert Retry(backoff=10.0, factor=1.0, jitter=0.0).delay(1) == 10.0


def test_the_delay_counts_from_the_first_attempt_and_is_capped() -> None:
    r = Retry(backoff=2.0, factor=3.0, max_delay=50.0, jitter=0.0)
    assert [r.delay(n) for n in (0, 1, 2, 3, 4, 400)] == [2.0, 2.0, 6.0, 18.0, 50.0, 50.0]


def test_a_reason_of_exactly_the_bound_is_kept_whole() -> None:
    from leasequeue.worker._retry import bounded

    assert bounded("x" * MAX_REASON) == "x" * MAX_REASON
    assert bounded("x" * (MAX_REASON + 1)) == "x" * (MAX_REASON - 1) + "…"


def test_retry_later_says_its_delay_and_reason() -> None:
    assert str(RetryLater(2.5)) == "retry in 2.5 s"
    assert str(RetryLater(3, "the payment is pending")) == "retry in 3 s: the payment is pending"
    with pytest.raises(ValueError):
        RetryLater(-1.0)


def test_an_exhausted_callable_returning_zero_retries_at_once() -> None:
    p = policy(max_attempts=1, exhausted=lambda job, error: 0)
    assert decide(p, FakeJob(1), ValueError("x")) == Decision(Action.RETRY, delay=0.0)
