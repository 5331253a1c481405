"""``leasequeue queue`` for SPEC Part 5: ``retry G`` (a fresh budget),
``skip G --seq N`` (only if N is the head), ``skip`` confirmed as ``purge`` is,
and ``resume`` of a buried group saying that a worker buries it again.

On every transport of the worker's tests: the durable ones through the real
command line (``main``), the in-memory twins through the same command code
(``_queue_command``) with arguments parsed by the real parser."""

from __future__ import annotations

import io
import json
import sys
from typing import Any, Tuple

import pytest

from leasequeue.__main__ import build_parser, main
from leasequeue._cli import CliError as _CliError
from leasequeue._cli import _queue_command


@pytest.fixture
def q(backend: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Any:
    """``q("retry", "g", stdin="y\\n") -> (status, stdout, stderr)``, in this process."""

    def run(*args: str, stdin: Any = "") -> Tuple[int, str, str]:
        if isinstance(stdin, str):
            stdin = io.StringIO(stdin)
        capsys.readouterr()
        if backend.durable:
            monkeypatch.setattr(sys, "stdin", stdin)
            status = main(["queue", *backend.cli_args(), *args])
        else:
            ns = build_parser().parse_args(["queue", "--sqlite", "unused.db", *args])
            try:
                status = _queue_command(backend.make(), ns, stdin)
            except _CliError as exc:
                sys.stderr.write(f"leasequeue queue: {exc}\n")
                status = exc.status
        out, err = capsys.readouterr()
        return status, out, err

    return run


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"not one line: {err!r}"
    return lines[0]


def bury_head(t: Any, group_id: str, deliveries: int) -> Any:
    """Claim ``group_id``'s head ``deliveries`` times (nacking the others'
    messages back), burying it at the last: its attempt is ``deliveries``."""
    for n in range(1, deliveries + 1):
        lease = t.claim("operator-test", 30.0)
        while lease.group_id != group_id:
            t.nack(lease, 0.0)
            lease = t.claim("operator-test", 30.0)
        assert lease.attempt == n
        if n < deliveries:
            t.nack(lease, 0.0)
    t.bury(lease, f"ValueError: bad (attempt {deliveries} of {deliveries})")
    return lease


def test_retry_gives_a_buried_head_a_fresh_budget(backend: Any, q: Any) -> None:
    t = backend.make()
    t.publish("poison", "bad")
    t.publish("poison", "after")
    bury_head(t, "poison", 3)
    assert t.group("poison").state == "buried" and t.peek("poison")[0].attempt == 3
    status, out, err = q("retry", "poison")
    assert status == 0 and "retried poison" in out and err == ""
    info = t.group("poison")
    assert info.state == "ready" and info.reason is None and info.messages == 2
    assert t.peek("poison")[0].attempt == 0
    lease = t.claim("w", 30.0)
    assert (lease.event, lease.attempt) == ("bad", 1)
    t.ack(lease)
    status, out, _ = q("retry", "poison", "--json")
    assert status == 0 and json.loads(out) == {"group_id": "poison", "retried": True}


@pytest.mark.parametrize("case", ["unknown", "leased"])
def test_a_refused_retry_exits_1_with_one_line(backend: Any, q: Any, case: str) -> None:
    t = backend.make()
    t.publish("g", "x")
    if case == "leased":
        held = t.claim("busy", 30.0)
        status, out, err = q("retry", "g")
        assert "refused" in one_line(err) and "lease" in err
        assert t.group("g").state == "leased" and t.peek("g")[0].attempt == 1
        t.ack(held)  # the lease is still current: nothing changed it
    else:
        status, out, err = q("retry", "nope")
        assert "no group 'nope'" in one_line(err)
    assert status == 1 and out == ""
    assert one_line(err).startswith("leasequeue queue:")


def test_skip_with_seq_skips_only_that_head(backend: Any, q: Any) -> None:
    t = backend.make()
    first = t.publish("g", "head")
    second = t.publish("g", "next")
    status, out, err = q("skip", "g", "--seq", str(second), "--yes")
    assert status == 1 and out == "" and f"is seq {first}, not {second}" in one_line(err)
    assert [m.seq for m in t.peek("g", 5)] == [first, second]
    status, out, _ = q("skip", "g", "--seq", str(first), "--yes", "--json")
    assert status == 0 and json.loads(out) == {"group_id": "g", "skipped_seq": first}
    assert [m.seq for m in t.peek("g", 5)] == [second]


def test_skip_asks_for_confirmation(backend: Any, q: Any) -> None:
    t = backend.make()
    first = t.publish("g", "head")
    second = t.publish("g", "next")
    for answer in ("", "n\n", "no\n"):  # an empty stdin (non-interactive) refuses too
        status, out, err = q("skip", "g", stdin=answer)
        assert status == 1 and out == "" and "not skipped" in err and "--yes" in err
        assert f"seq {first}" in err  # the question names the head it would remove
        assert [m.seq for m in t.peek("g", 5)] == [first, second]
    status, out, _ = q("skip", "g", stdin="y\n")
    assert status == 0 and f"skipped seq {first} of g" in out
    status, out, _ = q("skip", "g", "--seq", str(second), stdin="yes\n")
    assert status == 0 and f"skipped seq {second}" in out and t.group("g") is None


def test_a_head_that_changed_while_asking_is_not_skipped(backend: Any, q: Any) -> None:
    """The question named seq A; a worker finished A while the operator
    answered: the skip is refused and B, the new head, stays."""
    t = backend.make()
    first = t.publish("g", "head")
    second = t.publish("g", "next")

    class AnswersAfterAWorkerAcks:
        def readline(self) -> str:
            lease = t.claim("worker", 30.0)
            assert lease.seq == first
            t.ack(lease)
            return "y\n"

    status, out, err = q("skip", "g", stdin=AnswersAfterAWorkerAcks())
    assert status == 1 and out == ""
    assert f"is seq {second}, not {first}" in err.strip().splitlines()[-1]
    assert [m.seq for m in t.peek("g", 5)] == [second]


def test_skip_of_a_held_or_empty_head_is_refused(backend: Any, q: Any) -> None:
    t = backend.make()
    t.publish("g", "x")
    held = t.claim("busy", 30.0)
    status, out, err = q("skip", "g", "--seq", str(held.seq), "--yes")
    assert status == 1 and "refused" in one_line(err) and "lease" in err
    assert t.peek("g")[0].seq == held.seq
    t.ack(held)
    t.pause("g")  # an empty paused group is kept
    status, out, err = q("skip", "g", "--yes")
    assert status == 1 and "holds no message" in one_line(err)


def test_resume_of_a_buried_group_says_a_worker_buries_it_again(backend: Any, q: Any) -> None:
    t = backend.make()
    t.publish("poison", "bad")
    bury_head(t, "poison", 2)
    status, out, err = q("resume", "poison", "--json")
    assert status == 0 and json.loads(out) == {"group_id": "poison", "resumed": True}
    note = one_line(err)
    assert "attempt 3" in note and "buries it again" in note and "retry poison" in note
    assert t.group("poison").state == "ready" and t.peek("poison")[0].attempt == 2
    t.pause("poison")
    status, out, err = q("resume", "poison")  # only paused: no note
    assert status == 0 and "resumed poison" in out and err == ""


def test_help_names_the_new_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["queue", "--help"])
    out = capsys.readouterr().out
    assert "retry" in out and "skip order-17 --seq" in out and "fresh budget" in out
    with pytest.raises(SystemExit):
        build_parser().parse_args(["queue", "--sqlite", "x", "skip", "--help"])
    out = capsys.readouterr().out
    assert "--seq N" in out and "--yes" in out
