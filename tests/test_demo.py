"""`make demo`'s job runs end to end (a real child process is killed mid-step)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import zarr_skip as zs
from zarr_skip.views import tokenizer_for


@pytest.mark.slow
def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "demo_cache"
    done = subprocess.run(
        [sys.executable, "-m", "zarr_skip.demo", "--out", str(out)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "6 abandoned          2/4" in done.stdout
    assert "ok: " in done.stdout
    # one decoded rollout, then its GRPO group with right and wrong answers
    text = done.stdout.split("one rollout of step 1", 1)[1]
    assert re.search(r"user:\n    \S.*\?", text)
    assert re.search(r"response:\n    .*\n    The answer is \\boxed\{\d+\}", text)
    group = re.findall(r"^  row +\d+ \[\d+/96 tokens\].*$", text, re.M)
    assert len(group) == 8 and any("[correct]" in g for g in group) and any("[wrong]" in g for g in group)
    assert "<|im_end|>" not in text
    reader = zs.open_cache(out, experiment="demo_zarr_skip/GBS16_N8_in128_out96/rollout")
    assert reader.steps() == [1, 2] and tokenizer_for(reader) is not None
