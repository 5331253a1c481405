"""The kit's transaction rules (``supports_transactions``) can fail: each
deliberately broken ``SQLiteTransport`` below breaks one rule of SPEC Part 5,
"With the application's data", and the rules that state it catch it, with
their own assertion; the unbroken transport passes them all.

As ``test_kit_catches.py`` does, a generated test module subclasses
``TransportContract`` once per transport and pytest runs it (the
transaction rules only) in a subprocess; its JUnit report says which tests
failed and why.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

SOURCE = '''
import contextlib
import sqlite3

from leasequeue import SQLiteTransport
from leasequeue.testing import TransportContract


class PublishCommitsAtOnce(SQLiteTransport):
    """publish(conn=) commits the application's transaction at once."""

    def publish(self, *args, conn=None, **kwargs):
        seq = super().publish(*args, conn=conn, **kwargs)
        if conn is not None:
            conn.commit()
        return seq


class AckCommitsAtOnce(SQLiteTransport):
    """ack(conn=) commits the application's transaction at once."""

    def ack(self, lease, *, conn=None):
        super().ack(lease, conn=conn)
        if conn is not None:
            conn.commit()


class AcceptsAnyConn(SQLiteTransport):
    """publish takes anything as conn: what is not a connection is ignored."""

    def publish(self, *args, conn=None, **kwargs):
        if conn is not None and not isinstance(conn, sqlite3.Connection):
            conn = None
        return super().publish(*args, conn=conn, **kwargs)


class Base(TransportContract):
    preserves_identity = False
    usable_after_close = False
    accepts_rebuilt_leases = True
    supports_transactions = True
    transactions_block_writers = True
    liveness_timeout = 5.0
    factory = SQLiteTransport

    @contextlib.contextmanager
    def open_app_connection(self, transport):
        conn = sqlite3.connect(transport.path, timeout=self.liveness_timeout)
        try:
            yield conn
        finally:
            conn.close()

    def app_begin(self, conn):
        conn.execute("BEGIN IMMEDIATE")

    def make_transport(self, clock, **options):
        self.made = getattr(self, "made", 0) + 1
        return type(self).factory(self.directory / f"t{self.made}.db", clock=clock, **options)

    import pytest as _pytest

    @_pytest.fixture(autouse=True)
    def _directory(self, tmp_path):
        self.directory = tmp_path


class TestUnbroken(Base):
    pass


class TestPublishCommitsAtOnce(Base):
    factory = PublishCommitsAtOnce


class TestAckCommitsAtOnce(Base):
    factory = AckCommitsAtOnce


class TestAcceptsAnyConn(Base):
    factory = AcceptsAnyConn
'''

#: class -> {failing test (name prefix ... bracket): what its failure must say}
EXPECTED: Dict[str, Dict[str, str]] = {
    "TestUnbroken": {},
    "TestPublishCommitsAtOnce": {
        "test_tx_publish_exists_for_others_exactly_when_the_application_commits[commit]":
            "a publish was seen before the application's transaction ended",
        "test_tx_publish_exists_for_others_exactly_when_the_application_commits[rollback]":
            "a publish was seen before the application's transaction ended",
        "test_tx_a_waiting_claim_is_woken_at_the_commit_not_before[commit]": "returned before the commit",
        "test_tx_a_waiting_claim_is_woken_at_the_commit_not_before[rollback]": "returned before the commit",
    },
    "TestAckCommitsAtOnce": {
        "test_tx_settling_is_done_when_the_application_commits[ack]": "an ack was seen before the transaction ended",
        "test_tx_settling_rolled_back_leaves_the_lease_current[ack]":
            "after a rolled-back ack, the lease is not current",
    },
    "TestAcceptsAnyConn": {
        f"test_tx_a_conn_of_the_wrong_kind_is_a_type_error_and_changes_nothing[publish-{bad}]": "DID NOT RAISE"
        for bad in ("object", "str", "int")
    },
}

Outcomes = Dict[Tuple[str, str], Tuple[str, str]]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> Outcomes:
    tmp_path = tmp_path_factory.mktemp("broken_transactions")
    (tmp_path / "test_broken_transactions.py").write_text(SOURCE)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    report = tmp_path / "report.xml"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and Path(p).is_dir())
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
               "--rootdir", str(tmp_path), "-k", "tx_", str(tmp_path / "test_broken_transactions.py")]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    assert report.exists(), f"pytest did not run:\n{done.stdout}\n{done.stderr}"
    found: Outcomes = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        outcome, detail = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                detail = f"{child.get('message', '')}\n{child.text or ''}"
        found[(case.get("classname", "").rsplit(".", 1)[-1], case.get("name", ""))] = (outcome, detail)
    assert found, f"no test ran:\n{done.stdout}\n{done.stderr}"
    return found


def _not_passed(outcomes: Outcomes, cls: str) -> List[str]:
    return sorted(test for (c, test), (outcome, _) in outcomes.items() if c == cls and outcome != "passed")


def test_the_unbroken_transport_passes_every_transaction_rule(outcomes: Outcomes) -> None:
    ran = [test for (c, test) in outcomes if c == "TestUnbroken"]
    assert len(ran) >= 40, ran  # every rule ran (none deselected or skipped)
    assert _not_passed(outcomes, "TestUnbroken") == []


@pytest.mark.parametrize("cls", [c for c in EXPECTED if c != "TestUnbroken"])
def test_the_transaction_rules_catch(outcomes: Outcomes, cls: str) -> None:
    expected = EXPECTED[cls]
    assert _not_passed(outcomes, cls) == sorted(expected), f"{cls}: other rules failed (or these passed)"
    for test, reason in expected.items():
        outcome, detail = outcomes[(cls, test)]
        assert outcome == "failed", f"{cls}: {test} ended {outcome}, not on its assertion:\n{detail[:2000]}"
        assert reason in detail, f"{cls}: {test} failed, but not on its rule:\n{detail[:3000]}"
