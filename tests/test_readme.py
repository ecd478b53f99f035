"""The README's example is examples/quickstart.py, and it runs as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_readme_example_is_the_quickstart_file() -> None:
    readme = (ROOT / "README.md").read_text()
    [block] = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    assert block == (ROOT / "examples" / "quickstart.py").read_text()


def test_quickstart_runs_and_delivers_durably(tmp_path: Path) -> None:
    script = ROOT / "examples" / "quickstart.py"
    first = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert first.returncode == 0, first.stderr
    assert "accepted" in first.stdout
    assert "agent acme/chat-1 got: 'Hello, agent!'" in first.stdout
    assert "still queued: []" in first.stdout
    # A second run on the same data dir finds the dedupe marker: the accept was durable.
    second = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert second.returncode == 0, second.stderr
    assert "already accepted as" in second.stdout
    assert "got:" not in second.stdout  # and it is not delivered twice
