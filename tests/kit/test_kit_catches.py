"""The conformance kit can fail: it catches each deliberately broken transport.

``broken_transports.py`` holds the pure twin with one known bug each.  A
generated test module subclasses ``TransportContract`` for every one of
them (and for the unbroken twin, as the control), and pytest runs it in a
subprocess; its JUnit report says which contract tests failed and why.
Each bug must fail the contract tests that state the rule it breaks, with
the assertion about that rule (not an error of the broken transport), and
the unbroken twin must pass everything.  ``check_differential`` must catch
each Part 1 bug too, and each ``ack_and_claim`` bug whose results differ.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

import broken_transports
from broken_transports import ACK_AND_CLAIM_BUGS, PART1_BUGS, PART5_BUGS, QUARANTINE_BUGS

import leasequeue.testing
from leasequeue._backends.inmemory.transport_py import InMemoryTransport as Pure

HERE = Path(__file__).resolve().parents[1]  # tests/, where broken_transports.py is


def _has_part5() -> bool:
    """Whether the pure twin has SPEC Part 5 (delay, key, dedup_window, release, retry)."""
    if not (hasattr(Pure, "release") and hasattr(Pure, "retry")):
        return False
    try:
        Pure(dedup_window=0.0).publish("probe", None, delay=0.0, key=None)
    except TypeError:
        return False
    return True


#: The pure twin has Part 5: its rules run on it and on the broken transports.
PART5 = _has_part5()

#: (class, test) -> (outcome, the failure's message and text)
Outcomes = Dict[Tuple[str, str], Tuple[str, str]]

#: What the failure of each expected test must say: the rule's own check.
REASONS = {
    "test_stale_ack_does_not_delete_the_new_holders_message": "DID NOT RAISE",
    "test_fencing_stale_lease_raises_lease_lost_and_changes_nothing[ack-expired-and-reclaimed]": "DID NOT RAISE",
    "test_round_robin_order[group-by-group-frozen-clock]": "At index 4 diff: 'a' != 'b'",  # a served twice
    "test_fifo_within_group": "assert {'a'",
    "test_ack_forgets_round_robin_position": "At index 1 diff: 'd' != 'a'",  # a kept its old place
    "test_priority_floor": "group_id='high'",
    "test_expiry_recovery_after_crash": "attempt=2) is None",
    "test_park_blocks_group": "is None",
    "test_waiting_claim_is_woken[publish-thread]": "did not return within",
    # the buried group's next message (seq 2) was served at the group's own level
    "test_bury_holds_the_group_and_every_other_group_goes_on": "seq=2, group_id='g'",
    "test_skip_refuses_a_head_under_a_live_lease[live]": "assert True is False",
    "test_skip_refuses_a_head_under_a_live_lease[at-expires_at]": "assert True is False",
    # ack_and_claim: the claim before the ack served b, not a's next message (seq 2)
    "test_ack_and_claim_is_ack_then_claim[the-acked-groups-next-message]": "At index 0 diff: 3 != 2",
    "test_ack_and_claim_serves_the_acked_group_again_when_it_is_the_only_eligible": "assert [('g', 1, 1)] ==",
    # the claim half ran on LeaseLost: h leased to the caller's worker
    "test_ack_and_claim_of_a_stale_lease_changes_nothing[expired-and-reclaimed]":
        "('h', 0, 1, 'leased', False, 3, 'w9'",
    "test_ack_and_claim_of_a_forged_or_foreign_lease_changes_nothing[forged]":
        "(3, 2, 2, 0, 0, 0, 0) != (3, 2, 1, 0, 0, 0, 0)",
    # acked before the bad argument (or the failing clock) was seen: 4 messages held, not 5
    "test_ack_and_claim_bad_input_changes_nothing[worker_id-int]": "At index 0 diff: 4 != 5",
    "test_ack_and_claim_bad_input_changes_nothing[visibility-nan]": "At index 0 diff: 4 != 5",
    "test_ack_and_claim_reads_the_clock_before_the_lease_is_looked_at[current-raises]": "At index 0 diff: 4 != 5",
    "test_a_waiting_claim_gets_what_ack_and_claim_leaves": "the caller's next message went to the waiting claim",
    "test_ack_and_claim_returns_none_when_nothing_is_eligible_and_the_ack_stands": "where 1 = len(",
    "test_ack_and_claim_keeps_the_round_robin": "At index 1 diff: 'a2' != 'b1'",
    "test_ack_and_claim_keeps_the_priority_floor": "min_priority=6",
    "test_ack_and_claim_applies_expiry_at_its_now": "('g', 4, 1) == ('x', 1, 2)",
    "test_event_finaliser_publishing_to_the_same_transport_on_ack_and_claim[False]": "assert [] == [3]",
    "test_event_finaliser_publishing_to_the_same_transport_on_ack_and_claim[True]": "assert [] == [3]",
    # Part 5: a held key burnt a seq (two held publishes: 5, not 3; one: 5, not 4)
    "test_once_a_held_key_returns_the_holders_seq_and_changes_nothing": "assert 5 == 3",
    "test_once_a_key_belongs_to_its_group": "assert 5 == 4",
    # the released lease named the next delivery (same seq and attempt)
    "test_release_no_aba_a_released_delivery_is_never_current_again[ack-same-worker]": "DID NOT RAISE",
    "test_release_no_aba_a_released_delivery_is_never_current_again[nack-other-worker]": "DID NOT RAISE",
    "test_release_no_aba_a_released_delivery_is_never_current_again[extend-same-worker]": "DID NOT RAISE",
    "test_release_no_aba_whoever_redelivers[claim]": "DID NOT RAISE",
    "test_retry_keeps_a_pause": "('ready', False, None, None) == ('paused', True, None, None)",
    "test_later_earlier_messages_of_the_group_are_not_delayed":
        "a message published before a scheduled one was held back by it",
    # the head due at 1010 was leased at 1010
    "test_later_scheduled_until_strictly_past_due": "expires_at=1040.0, attempt=1) is None",
    # the retried groups (b, then a) went behind c
    "test_retry_keeps_the_round_robin_place": "assert ['d', 'c', 'b', 'a'] == ['d', 'a', 'b', 'c']",
    # the released delivery counted: the next one is attempt 2, not 1
    "test_release_is_nack_whose_delivery_does_not_count[0]": "the released delivery was counted",
    "test_release_is_nack_whose_delivery_does_not_count[5]": "the released delivery was counted",
    "test_release_hands_the_same_attempt_again_each_time": "assert 2 == 1",
}

CLASS_TEMPLATE = '''
class Test{name}(TransportContract):
    supports_waiting = {waiting}
    supports_control_plane = {control}
    supports_batches = {batches}
    supports_quarantine = {quarantine}
    supports_ack_and_claim = {ack_and_claim}
    supports_later = {later}
    supports_once = {once}
    supports_release = {release}
    liveness_timeout = {liveness}

    def make_transport(self, clock, **options):
        return {factory}(clock=clock, **options)
'''


def run_contract(tmp_path: Path, classes: Dict[str, str], *, waiting: bool, select: str = "") -> Outcomes:
    """Run ``TransportContract`` for each ``{name: factory}`` in a pytest
    subprocess; return every test's outcome."""
    source = [
        "from leasequeue.testing import TransportContract",
        "from leasequeue._backends.inmemory.transport_py import InMemoryTransport",
        "import broken_transports",
    ]
    for name, factory in classes.items():
        source.append(
            CLASS_TEMPLATE.format(
                name=name,
                factory=factory,
                waiting=waiting,
                control=hasattr(Pure, "pause"),
                batches=hasattr(Pure, "publish_many"),
                quarantine=hasattr(Pure, "bury"),
                ack_and_claim=hasattr(Pure, "ack_and_claim"),
                later=PART5,
                once=PART5,
                release=PART5,
                liveness=3.0 if waiting else 20.0,
            )
        )
    (tmp_path / "test_broken.py").write_text("\n".join(source))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    report = tmp_path / "report.xml"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE)] + [p for p in sys.path if p and Path(p).is_dir()])
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
               "--rootdir", str(tmp_path), str(tmp_path / "test_broken.py")]
    if select:
        command += ["-k", select]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800)
    assert report.exists(), f"pytest did not run:\n{done.stdout}\n{done.stderr}"
    outcomes: Outcomes = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        outcome, detail = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                detail = f"{child.get('message', '')}\n{child.text or ''}"
        outcomes[(case.get("classname", "").rsplit(".", 1)[-1], case.get("name", ""))] = (outcome, detail)
    assert outcomes, f"no test ran:\n{done.stdout}\n{done.stderr}"
    return outcomes


def failures(outcomes: Outcomes, cls: str) -> List[str]:
    return sorted(test for (c, test), (outcome, _) in outcomes.items() if c == cls and outcome != "passed"
                  and outcome != "skipped")


def assert_caught_for_the_right_reason(outcomes: Outcomes, cls: str, expected: List[str]) -> None:
    for test in expected:
        outcome, detail = outcomes[(cls, test)]
        assert outcome == "failed", f"{cls}: the contract's {test} did not catch the bug ({outcome})"
        assert REASONS[test] in detail, f"{cls}: {test} failed, but not on its rule:\n{detail[:3000]}"


@pytest.fixture(scope="module")
def part1_outcomes(tmp_path_factory: pytest.TempPathFactory) -> Outcomes:
    classes = {name: f"broken_transports.{name}" for name in PART1_BUGS}
    classes["UnbrokenPureTwin"] = "InMemoryTransport"
    return run_contract(tmp_path_factory.mktemp("contract"), classes, waiting=False)


def test_the_unbroken_twin_passes_the_whole_contract(part1_outcomes: Outcomes) -> None:
    """The control: the same generated run passes on the real pure twin, so
    every failure below is the bug's doing."""
    ran = [test for (cls, test) in part1_outcomes if cls == "TestUnbrokenPureTwin"]
    assert len(ran) > 150
    assert failures(part1_outcomes, "TestUnbrokenPureTwin") == []


@pytest.mark.parametrize("name", sorted(PART1_BUGS))
def test_the_contract_catches(part1_outcomes: Outcomes, name: str) -> None:
    assert_caught_for_the_right_reason(part1_outcomes, f"Test{name}", PART1_BUGS[name])


def test_a_frozen_clock_is_what_exposes_the_timestamp_round_robin(part1_outcomes: Outcomes) -> None:
    """The seed's key is the order of claims whenever the clock moves: the
    moving-clock case passes, only the frozen one fails."""
    for published in ("interleaved", "group-by-group"):
        test = f"test_round_robin_order[{published}-moving-clock]"
        assert part1_outcomes[("TestTimestampRoundRobin", test)][0] == "passed"


def test_the_contract_catches_a_lost_wake_up(tmp_path: Path) -> None:
    if not hasattr(Pure, "aclaim"):
        pytest.skip("the pure twin has no waiting claims yet (SPEC Part 2): nothing to lose a wake-up in")
    outcomes = run_contract(
        tmp_path,
        {"LostWakeUp": "broken_transports.LostWakeUp", "UnbrokenPureTwin": "InMemoryTransport"},
        waiting=True,
        select="test_waiting_claim_is_woken and (publish or ack-exposes-next)",
    )
    assert failures(outcomes, "TestUnbrokenPureTwin") == []
    assert_caught_for_the_right_reason(outcomes, "TestLostWakeUp", ["test_waiting_claim_is_woken[publish-thread]"])


@pytest.mark.parametrize("name", sorted(PART1_BUGS))
def test_the_differential_catches(name: str) -> None:
    check_differential = leasequeue.testing.check_differential
    broken = getattr(broken_transports, name)
    with pytest.raises(AssertionError):
        for seed in range(20):
            check_differential(lambda clock: broken(clock=clock), ops=3000, seed=seed)


@pytest.mark.parametrize("name", sorted(QUARANTINE_BUGS))
def test_the_contract_catches_a_broken_quarantine(tmp_path: Path, name: str) -> None:
    if not hasattr(Pure, "bury"):
        pytest.skip("the pure twin has no bury/skip/peek yet (SPEC Part 4): nothing to break")
    outcomes = run_contract(
        tmp_path,
        {name: f"broken_transports.{name}", "UnbrokenPureTwin": "InMemoryTransport"},
        waiting=True,
        select="bury or skip or peek or quarantine",
    )
    ran = [test for (cls, test) in outcomes if cls == "TestUnbrokenPureTwin"]
    assert len(ran) > 40
    assert failures(outcomes, "TestUnbrokenPureTwin") == []
    assert_caught_for_the_right_reason(outcomes, f"Test{name}", QUARANTINE_BUGS[name])


@pytest.mark.parametrize("name", sorted(QUARANTINE_BUGS))
def test_the_differential_catches_a_broken_quarantine(name: str) -> None:
    if not hasattr(Pure, "bury"):
        pytest.skip("the pure twin has no bury/skip/peek yet (SPEC Part 4): nothing to break")
    check_differential = leasequeue.testing.check_differential
    broken = getattr(broken_transports, name)
    with pytest.raises(AssertionError):
        for seed in range(20):
            check_differential(lambda clock: broken(clock=clock), ops=3000, seed=seed, quarantine=True)


#: The ack_and_claim bugs whose results differ from the referee's (a kept
#: event changes no result: only the contract's finaliser test sees it).
ACK_AND_CLAIM_DIFFERENTIAL_BUGS = sorted(set(ACK_AND_CLAIM_BUGS) - {"AckAndClaimKeepsTheAckedEvent"})


@pytest.fixture(scope="module")
def ack_and_claim_outcomes(tmp_path_factory: pytest.TempPathFactory) -> Outcomes:
    classes = {name: f"broken_transports.{name}" for name in ACK_AND_CLAIM_BUGS}
    classes["UnbrokenPureTwin"] = "InMemoryTransport"
    return run_contract(tmp_path_factory.mktemp("ack_and_claim"), classes, waiting=True, select="ack_and_claim")


def test_the_unbroken_twin_passes_the_ack_and_claim_rules(ack_and_claim_outcomes: Outcomes) -> None:
    ran = [test for (cls, test) in ack_and_claim_outcomes if cls == "TestUnbrokenPureTwin"]
    assert len(ran) > 40
    assert failures(ack_and_claim_outcomes, "TestUnbrokenPureTwin") == []


@pytest.mark.parametrize("name", sorted(ACK_AND_CLAIM_BUGS))
def test_the_contract_catches_a_broken_ack_and_claim(ack_and_claim_outcomes: Outcomes, name: str) -> None:
    assert_caught_for_the_right_reason(ack_and_claim_outcomes, f"Test{name}", ACK_AND_CLAIM_BUGS[name])


@pytest.mark.parametrize("name", ACK_AND_CLAIM_DIFFERENTIAL_BUGS)
def test_the_differential_catches_a_broken_ack_and_claim(name: str) -> None:
    check_differential = leasequeue.testing.check_differential
    broken = getattr(broken_transports, name)
    with pytest.raises(AssertionError, match="ack_and_claim"):
        for seed in range(20):
            check_differential(lambda clock: broken(clock=clock), ops=3000, seed=seed, ack_and_claim=True)


# -- SPEC Part 5: later, once, honest attempts -----------------------------------------------


@pytest.fixture(scope="module")
def part5_outcomes(tmp_path_factory: pytest.TempPathFactory) -> Outcomes:
    if not PART5:
        pytest.skip("the pure twin has no SPEC Part 5 yet (delay, key, dedup_window, release, retry)")
    classes = {name: f"broken_transports.{name}" for name in PART5_BUGS}
    classes["UnbrokenPureTwin"] = "InMemoryTransport"
    return run_contract(tmp_path_factory.mktemp("part5"), classes, waiting=True,
                        select="later or once or release or retry")


def test_the_unbroken_twin_passes_the_part5_rules(part5_outcomes: Outcomes) -> None:
    ran = [test for (cls, test) in part5_outcomes if cls == "TestUnbrokenPureTwin"]
    assert len(ran) > 90
    assert failures(part5_outcomes, "TestUnbrokenPureTwin") == []


@pytest.mark.parametrize("name", sorted(PART5_BUGS))
def test_the_contract_catches_a_broken_part5(part5_outcomes: Outcomes, name: str) -> None:
    assert_caught_for_the_right_reason(part5_outcomes, f"Test{name}", PART5_BUGS[name])


@pytest.mark.parametrize("name", sorted(PART5_BUGS))
def test_the_differential_catches_a_broken_part5(name: str) -> None:
    if not PART5:
        pytest.skip("the pure twin has no SPEC Part 5 yet (delay, key, dedup_window, release, retry)")
    check_differential = leasequeue.testing.check_differential
    broken = getattr(broken_transports, name)
    with pytest.raises(AssertionError, match="disagrees with reference"):
        for seed in range(20):
            check_differential(lambda clock, dedup_window=0.0: broken(clock=clock, dedup_window=dedup_window),
                               ops=3000, seed=seed, later=True, once=True, release=True)
