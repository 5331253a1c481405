"""``leasequeue queue`` against a real SQLite file and the suite's PostgreSQL:
every command, as a table and as ``--json`` (parsed), and the error exits
(an unknown group, a refused action, bad arguments) with one line on stderr."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from typing import Any, List, Tuple

import pytest

from leasequeue.__main__ import main


@pytest.fixture
def q(durable: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Any:
    """``q("groups", "--json") -> (status, stdout, stderr)``, in this process."""

    def run(*args: str, stdin: str = "") -> Tuple[int, str, str]:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
        capsys.readouterr()
        status = main(["queue", *durable.cli_args(), *args])
        out, err = capsys.readouterr()
        return status, out, err

    return run


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"not one line: {err!r}"
    return lines[0]


def test_every_command(durable: Any, q: Any) -> None:
    t = durable.make()
    for i in range(3):
        t.publish("alpha", {"n": i})
    t.publish("beta", "b")
    t.publish("poison", "bad")
    t.publish("poison", "after")
    lease = t.claim("someone", 30.0)
    while lease.group_id != "poison":
        t.nack(lease, 0.0)
        lease = t.claim("someone", 30.0)
    t.bury(lease, "ValueError: bad (attempt 5 of 5)")

    status, out, _ = q("stats")
    assert status == 0 and "messages" in out and "buried" in out
    status, out, _ = q("stats", "--json")
    stats = json.loads(out)
    assert status == 0 and stats["messages"] == 6 and stats["groups"] == 3 and stats["buried"] == 1

    status, out, _ = q("groups")
    assert status == 0 and all(g in out for g in ("alpha", "beta", "poison")) and "attempt 5 of 5" in out
    status, out, _ = q("groups", "--json")
    groups = {g["group_id"]: g for g in json.loads(out)}
    assert set(groups) == {"alpha", "beta", "poison"}
    assert groups["poison"]["state"] == "buried" and groups["poison"]["reason"].startswith("ValueError")
    assert groups["alpha"]["messages"] == 3
    status, out, _ = q("groups", "--state", "buried", "--json")
    assert [g["group_id"] for g in json.loads(out)] == ["poison"]
    status, out, _ = q("groups", "--state", "paused")
    assert status == 0 and "(no groups)" in out

    status, out, _ = q("group", "poison")
    assert status == 0 and "buried" in out and "reason" in out
    status, out, _ = q("group", "alpha", "--json")
    assert json.loads(out)["head_seq"] == groups["alpha"]["head_seq"]

    status, out, _ = q("peek", "alpha", "-n", "2", "--json")
    assert [m["event"] for m in json.loads(out)] == [{"n": 0}, {"n": 1}]
    status, out, _ = q("peek", "poison")
    assert status == 0 and "'bad'" in out and "seq" in out

    status, out, _ = q("pause", "beta")
    assert status == 0 and "paused beta" in out and t.group("beta").paused
    status, _, err = q("pause", "beta")
    assert status == 1 and "already paused" in one_line(err)
    status, out, _ = q("resume", "beta", "--json")
    assert status == 0 and json.loads(out) == {"group_id": "beta", "resumed": True}
    status, _, err = q("resume", "beta")
    assert status == 1 and "nothing to resume" in one_line(err)

    status, out, _ = q("skip", "poison", "--json", stdin="y\n")
    assert status == 0 and json.loads(out)["skipped_seq"] == groups["poison"]["head_seq"]
    info = t.group("poison")
    assert info.state == "ready" and info.messages == 1 and [m.event for m in t.peek("poison")] == ["after"]

    held = t.claim("busy-worker", 30.0)
    status, _, err = q("skip", held.group_id, "--yes")
    assert status == 1 and "refused" in one_line(err) and "lease" in err
    assert t.group(held.group_id).messages >= 1

    status, _, err = q("purge", "alpha", stdin="n\n")
    assert status == 1 and "not purged" in err and t.group("alpha") is not None
    status, out, _ = q("purge", "alpha", stdin="y\n")
    assert status == 0 and "3 message(s) removed" in out and t.group("alpha") is None
    status, out, _ = q("purge", "beta", "--yes", "--json")
    assert status == 0 and json.loads(out) == {"group_id": "beta", "removed": 1}


@pytest.mark.parametrize(
    "args",
    [("group", "nope"), ("peek", "nope"), ("skip", "nope"), ("purge", "nope", "--yes"), ("resume", "nope")],
)
def test_an_unknown_group_exits_1_with_one_line(durable: Any, q: Any, args: Tuple[str, ...]) -> None:
    durable.make().publish("real", 1)
    status, out, err = q(*args)
    assert status == 1 and out == ""
    assert "nope" in one_line(err) and one_line(err).startswith("leasequeue queue:")


def test_bad_arguments_exit_2(durable: Any, capsys: pytest.CaptureFixture[str]) -> None:
    durable.make()
    bad: List[List[str]] = [
        ["groups", "--state", "bogus"],
        ["peek", "g", "-n", "-1"],
        ["frobnicate"],
        [],
    ]
    for args in bad:
        with pytest.raises(SystemExit) as exc:
            main(["queue", *durable.cli_args(), *args])
        assert exc.value.code == 2, args
    if durable.name == "sqlite":
        assert main(["queue", *durable.cli_args(), "--queue", "x", "stats"]) == 2
        assert "--queue" in capsys.readouterr().err


def test_a_missing_sqlite_file_is_not_created(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "typo.db"
    assert main(["queue", "--sqlite", str(path), "stats"]) == 1
    assert "no such file" in capsys.readouterr().err and not path.exists()


def test_the_console_script_runs_and_has_help_with_examples(sqlite_backend: Any) -> None:
    t = sqlite_backend.make()
    t.publish("g", "x")
    r = subprocess.run([sys.executable, "-m", "leasequeue", "queue", "--sqlite", sqlite_backend.path, "stats",
                        "--json"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and json.loads(r.stdout)["messages"] == 1
    r = subprocess.run([sys.executable, "-m", "leasequeue", "queue", "--help"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and "examples:" in r.stdout and "groups --state buried" in r.stdout
