"""A huge rollout draws a bounded page (issue 26, point 8): one rollout of about 1 MB of text
(900k tokens, log-probs and a 1 MB chat message) rendered 79 MB of HTML, and ``report --tokens``
158 MB for 2 rows; the views now draw at most :mod:`zarr_skip.views.limits` of each text and
token list, with a visible "n more" marker, and at most ``PAGE_CHARS`` per page."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import zarr_skip as zs
from zarr_skip.cli.main import main
from zarr_skip.synthetic import TOKENIZER_PATH, shipped_tokenizer, text_rollouts
from zarr_skip.views import limits
from zarr_skip.views.rollouts import page_html

pytest.importorskip("tokenizers")
TOKENS = 900_000
#: what a page with the huge rollout may weigh (its bounded parts and the other rows)
MB = 1 << 20


def _huge_batch() -> dict[str, Any]:
    batch = text_rollouts(2, 2, seed=1, max_response=16)
    word = shipped_tokenizer().encode(" hello", add_special_tokens=False).ids
    ids = torch.tensor((word * TOKENS)[:TOKENS])
    n = len(ids)
    jagged = ("responses", "response_mask", "old_log_probs", "token_level_scores", "token_level_rewards", "advantages")
    for name in jagged:
        rows = list(batch[name].unbind())
        first = {"responses": ids, "response_mask": torch.ones(n, dtype=rows[0].dtype)}.get(name)
        rows[0] = first if first is not None else torch.full((n,), -0.5, dtype=rows[0].dtype)
        batch[name] = torch.nested.nested_tensor(rows, layout=torch.jagged)
    batch["response_length"][0] = n
    prompt = [dict(m) for m in batch["raw_prompt"][0]]
    prompt[-1]["content"] = "question " * 120_000  # about 1 MB
    batch["raw_prompt"] = [prompt] + list(batch["raw_prompt"][1:])
    return batch


@pytest.fixture(scope="module")
def loc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("huge") / "cache"
    cache = zs.open_cache(root, {"n": 2, "max_response_length": TOKENS})
    cache.write(1, _huge_batch())
    cache.set_attributes({"tokenizer": str(TOKENIZER_PATH)})
    return root


def test_one_huge_rollout_draws_a_bounded_page_with_markers(loc: Path) -> None:
    view = zs.open_cache(loc).load(1)
    html = view.rollout(0)._repr_html_()
    assert len(html) < 1 * MB, len(html)
    assert f"{TOKENS - limits.TOKENS_SHOWN:,} more tokens" in html
    assert "more characters" in html  # the response text and the prompt message
    assert html.count("more characters") == 2
    text = repr(view.rollout(0))
    assert len(text) < 1 * MB and "more characters" in text


@pytest.mark.parametrize("what", ["page", "group", "find"])
def test_lists_and_groups_are_bounded(loc: Path, what: str) -> None:
    view = zs.open_cache(loc).load(1)
    uid = view["uid"][0]
    drawn = {"page": lambda: view.page(0), "group": lambda: view.group(uid), "find": lambda: view.find()}[what]()
    html = drawn._repr_html_()
    assert len(html) < 2 * MB, len(html)
    assert "more characters" in html


def test_a_group_as_text_is_bounded(loc: Path) -> None:
    """``repr(view.group(uid))`` (IPython's text of a group) clipped the texts as the rollout's
    repr does: it printed the 1 MB prompt message and the whole response, 2.2 MB of text."""
    view = zs.open_cache(loc).load(1)
    text = repr(view.group(view["uid"][0]))
    assert len(text) < 1 * MB, len(text)
    assert text.count("more characters") == 2  # the prompt message and the huge response


@pytest.mark.parametrize("tokens", [False, True])
def test_the_report_is_bounded(loc: Path, tmp_path: Path, capsys: Any, tokens: bool) -> None:
    out = tmp_path / "r.html"
    argv = ["report", str(loc), "1", "-o", str(out), *(["--tokens"] if tokens else [])]
    assert main(argv) == 0, capsys.readouterr().err
    size = out.stat().st_size
    assert size < 3 * MB, size
    assert "more characters" in out.read_text()


def test_text_and_columns_still_give_everything(loc: Path) -> None:
    view = zs.open_cache(loc).load(1)
    assert len(view["responses"][0]) == TOKENS
    assert len(view.text(rows=0)[0]) >= TOKENS  # " hello" per token


def test_a_page_past_its_budget_names_the_rows_left_out() -> None:
    drawn = ["x" * 400] * 10
    html = page_html(drawn, list(range(10, 20)), budget=1000)
    assert html.count("x" * 400) == 2
    assert "8 more rows not drawn" in html and "rows 12, 13" in html
    assert page_html(["y" * 5000], [0], budget=1000).count("y") == 5000  # the first row is always drawn
    assert page_html([], []) == ""


def test_clip_text() -> None:
    assert limits.clip_text("abc", 5) == ("abc", "")
    assert limits.clip_text("abcdefgh", 5) == ("abcde", " … 3 more characters")
    assert np.all([limits.TEXT_CHARS > 0, limits.TOKENS_SHOWN > 0, limits.PAGE_CHARS > limits.TEXT_CHARS])
