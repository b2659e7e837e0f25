"""`make demo`'s job runs end to end (a real child process is killed mid-step), and the README's
first screen then runs as typed."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import zarr_skip as zs
from zarr_skip.views import tokenizer_for

ROOT = Path(__file__).resolve().parent.parent


def _first_screen() -> list[str]:
    """The commands of the README's first shell block."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.strip()]


@pytest.mark.slow
def test_demo_runs_end_to_end_and_the_readme_commands_then_run(tmp_path: Path) -> None:
    first = _first_screen()
    assert first[0] == "make demo" and "source .venv/bin/activate" in first
    assert "-m zarr_skip.demo --out demo_cache" in (ROOT / "Makefile").read_text()
    done = subprocess.run(
        [sys.executable, "-m", "zarr_skip.demo", "--out", "demo_cache"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
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
    # the readable rollouts are demo_cache's only experiment: no -e needed
    out = tmp_path / "demo_cache"
    reader = zs.open_cache(out)
    assert reader.experiment == "demo_zarr_skip/GBS16_N8_in128_out96/rollout"
    assert reader.steps() == [1, 2, 3, 4, 5] and tokenizer_for(reader) is not None
    assert zs.open_cache(tmp_path / "demo_cache_random").steps() == [1, 2, 3, 4, 5]
    # the README's commands, as typed after `source .venv/bin/activate` (zarr-skip on PATH)
    exe = Path(sys.executable).parent / "zarr-skip"
    commands = [c for c in first if c.startswith("zarr-skip ")]
    assert len(commands) >= 3
    for command in commands:
        ran = subprocess.run(
            [str(exe), *shlex.split(command)[1:]], capture_output=True, text=True, timeout=300, cwd=tmp_path
        )
        assert ran.returncode == 0, (command, ran.stderr)
    assert (tmp_path / "report.html").exists()
    # the commands the demo prints run too
    printed = re.findall(r"^  (\S*zarr-skip .+?)(?:\s+#.*)?$", done.stdout, re.M)
    assert len(printed) == 4
    for command in printed:
        ran = subprocess.run(shlex.split(command), capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert ran.returncode == 0, (command, ran.stderr)
