"""``leasequeue.testing.ManualClock``: the clock tests inject and move by hand."""

from __future__ import annotations

import math
import threading

import pytest

from leasequeue.testing import ManualClock


def test_moves_only_when_told() -> None:
    clock = ManualClock()
    assert clock() == 1000.0 and clock() == 1000.0 and type(clock()) is float
    assert clock.advance(2.5) == 1002.5
    assert clock.advance(-10) == 992.5  # back
    clock.set(7)
    assert clock() == 7.0 and clock.now == 7.0
    clock.now = 9.5  # an alias of set()
    clock.now += 1
    assert clock() == 10.5
    assert ManualClock(start=3)() == 3.0
    assert repr(ManualClock(5.0)) == "ManualClock(5.0)"


def test_counts_reads_but_not_now() -> None:
    clock = ManualClock()
    clock()
    clock()
    _ = clock.now
    clock.advance(1)
    assert clock.reads == 2


@pytest.mark.parametrize("outcome", [math.nan, "noon", None, True, 10**400, -5.0])
def test_misbehave_returns_the_outcome(outcome: object) -> None:
    clock = ManualClock()
    with clock.misbehave(outcome):
        assert clock() is outcome
        assert clock() is outcome
        clock.advance(5)  # time still moves underneath
    assert clock() == 1005.0
    assert clock.reads == 3


def test_misbehave_raises_an_exception_and_is_restored_after_an_error() -> None:
    clock = ManualClock()
    error = RuntimeError("clock broke")
    with pytest.raises(KeyError):
        with clock.misbehave(error):
            with pytest.raises(RuntimeError) as raised:
                clock()
            assert raised.value is error
            raise KeyError("leave the block by an error")
    assert clock() == 1000.0
    with clock.misbehave(1):
        with clock.misbehave(2):
            assert clock() == 2
        assert clock() == 1  # nested blocks restore the outer outcome
    assert clock() == 1000.0


def test_thread_safe_advance() -> None:
    clock = ManualClock(0.0)

    def work() -> None:
        for _ in range(10_000):
            clock.advance(1)
            clock()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert clock() == 40_000.0
    assert clock.reads == 40_001
