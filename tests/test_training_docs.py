"""docs/training.md: the TRL loading example runs as written on files exported here
(skipped, with the reason, when trl or datasets is not installed)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import zarr_skip as zs
from zarr_skip.synthetic import TOKENIZER_PATH, text_rollouts

DOC = Path(__file__).parent.parent / "docs" / "training.md"


def _block(heading: str) -> str:
    section = DOC.read_text().split(f"### {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)[0]


def test_trl_loading_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code = _block("Loading into TRL")
    assert "load_dataset" in code and "is_conversational" in code
    cache = zs.open_cache(tmp_path / "cache", {"experiment_name": "trl"})
    batch = dict(text_rollouts(4, 4, seed=2, step=1))
    batch["score"] = np.tile(np.array([1, 0, 0.5, 0], dtype=np.float32), 4)
    cache.write(1, batch)
    cache.export(tmp_path / "sft.jsonl", format="sft", tokenizer=TOKENIZER_PATH)
    cache.export(tmp_path / "dpo.jsonl", format="dpo", tokenizer=TOKENIZER_PATH)
    assert (tmp_path / "sft.jsonl").stat().st_size and (tmp_path / "dpo.jsonl").stat().st_size
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # read before datasets is imported: nothing is fetched
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    pytest.importorskip("datasets", reason="the TRL example needs the 'datasets' package (not installed)")
    pytest.importorskip("trl", reason="the TRL example needs the 'trl' package (not installed)")
    monkeypatch.chdir(tmp_path)
    exec(compile(code, str(DOC), "exec"), {})
