"""The complete example of ``docs/testing-your-backend.md`` runs as the page
says: the toy backend passes the contract, the features it lacks skip with
their flag named."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "testing-your-backend.md"


def test_the_guide_example_passes_the_contract(tmp_path: Path) -> None:
    if not GUIDE.exists():
        pytest.skip("docs/ is not next to tests/ (the installed-wheel test run copies tests/ only)")
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)
    example = [block for block in blocks if "class TestPickledTransport" in block]
    assert len(example) == 1, "the guide's complete example is missing"
    (tmp_path / "test_pickled_backend.py").write_text(example[0])
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and Path(p).is_dir())
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "test_pickled_backend.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]
    summary = done.stdout.strip().splitlines()[-1]
    passed = int(re.search(r"(\d+) passed", summary).group(1))  # type: ignore[union-attr]
    skipped = int(re.search(r"(\d+) skipped", summary).group(1))  # type: ignore[union-attr]
    assert passed > 150 and skipped > 50, summary
    for flag in ("preserves_identity", "supports_waiting", "supports_control_plane", "supports_batches"):
        assert f"TestPickledTransport.{flag} is False" in done.stdout
