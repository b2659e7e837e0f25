"""`make demo`'s job runs end to end (a real child process is killed mid-step)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "demo_cache"
    done = subprocess.run(
        [sys.executable, "-m", "zarr_skip.demo", "--out", str(out)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "6 abandoned          2/4" in done.stdout
    assert "ok: " in done.stdout
