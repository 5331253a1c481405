"""Every link in the repository's Markdown files resolves (``tools/check_links.py``).

The first test runs the checker on the repository, so the README's test
command (and CI) fails on a dead link, a missing heading anchor or an
absolute address nobody has checked.  The others show the checker can fail:
a small tree with each kind of dead link.  The tests need the source tree
(a wheel's test run has only ``tests/``), and skip with that reason without it.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "check_links.py"

pytestmark = pytest.mark.skipif(
    not (TOOL.is_file() and (ROOT / "README.md").is_file()),
    reason="needs the source tree (tools/check_links.py and the Markdown files)",
)


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_links", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_link_in_the_repository_resolves() -> None:
    proc = _run()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all resolve" in proc.stdout


def test_the_contract_is_linked_from_the_readme(tool: ModuleType) -> None:
    targets = [t for _, t in tool.links((ROOT / "README.md").read_text(encoding="utf-8"))]
    assert "docs/contract.md" in targets


def test_dead_links_are_caught(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "guide.md").write_text(
        "# Guide\n\n## Part 2 — waiting for work\n\n## `claim(timeout=)`, exactly\n\n## Part 2 — waiting for work\n",
        encoding="utf-8",
    )
    (tmp_path / "code.py").write_text("x = 1\n", encoding="utf-8")
    (tmp_path / "README.md").write_text(
        "\n".join(
            [
                "# Readme",
                "[fine](docs/guide.md) [fine anchor](docs/guide.md#part-2--waiting-for-work)",
                "[repeat](docs/guide.md#part-2--waiting-for-work-1) [code](docs/guide.md#claimtimeout-exactly)",
                "[self](#readme) [line](code.py#L1) [dir](docs/)",
                "[missing file](docs/nope.md)",
                "[missing anchor](docs/guide.md#part-3)",
                "[bad line anchor](code.py#top)",
                "[invented](https://github.com/nobody/nothing) <https://example.invalid/x>",
                "see https://bare.example.invalid/page.",
                "[ref]: ../outside.md",
                "```",
                "[in a code block](not/checked.md) https://not.checked.invalid",
                "```",
                "`[in a code span](not/checked.md)`",
            ]
        )
        + "\n",
        encoding="utf-8",
    )
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\n\n[project.urls]\nHomepage = "https://github.com/nobody/x"\n', encoding="utf-8"
    )
    proc = _run("--root", str(tmp_path))
    assert proc.returncode == 1, proc.stdout
    errors = [line for line in proc.stdout.splitlines() if line.startswith(("README.md:", "pyproject.toml:"))]
    expected = [
        "README.md:5: docs/nope.md: no such file",
        "README.md:6: docs/guide.md#part-3: no heading or anchor #part-3",
        "README.md:7: code.py#top: #top is not an anchor",
        "README.md:8: absolute address https://github.com/nobody/nothing",
        "README.md:8: absolute address https://example.invalid/x",
        "README.md:9: absolute address https://bare.example.invalid/page ",
        "README.md:10: ../outside.md points outside the repository",
        "pyproject.toml:5: absolute address https://github.com/nobody/x",
    ]
    assert len(errors) == len(expected), proc.stdout
    for line, prefix in zip(errors, expected):
        assert line.startswith(prefix), (line, prefix)
    assert "not.checked" not in proc.stdout


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("Performance goals", "performance-goals"),
        ("Part 2 — waiting for work", "part-2--waiting-for-work"),
        ("`leasequeue.testing`: the kit", "leasequeuetesting-the-kit"),
        ("What **bad input** does (and `__parked__`)", "what-bad-input-does-and-__parked__"),
        ("[Linked](x.md) heading", "linked-heading"),
        ("A. Decisions: validation order", "a-decisions-validation-order"),
    ],
)
def test_github_heading_anchors(tool: ModuleType, heading: str, anchor: str) -> None:
    assert anchor in tool.anchors(f"# {heading}\n")
