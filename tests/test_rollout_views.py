"""The readable rollout views: one rollout, a GRPO group, finding rows and pages.

Drawn with a tiny fake tokenizer (ids -> words); hostile strings in every place text can come
from (decoded tokens, chat messages, data sources, uids) must come out escaped; a page of a big
step reads only the chunks of its rows.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from typing import Any

import numpy as np
import pytest
import torch
from helpers import CountingStore
from test_display import assert_balanced

import zarr_skip as zs
from zarr_skip.views import _html
from zarr_skip.views.groups import marks
from zarr_skip.views.rollouts import RolloutList, RolloutView

HOSTILE = '<script>alert("x")</script>'
ATTR = '" onmouseover="alert(1)'
SPECIAL = 999  # a special token: skipped when decoding with skip_special_tokens


class FakeDecoder:
    """ids -> words: 1 -> 'w1 ', 666 -> a script tag, 667 -> an attribute breaker."""

    WORDS = {666: HOSTILE, 667: ATTR, 668: "&amp; ", 10: "\n", SPECIAL: "<|im_end|>"}

    def __init__(self) -> None:
        self.decoded = 0

    def tokens(self, ids: Any) -> list[str]:
        return [self.WORDS.get(int(i), f"w{int(i)} ") for i in ids]

    def decode(self, ids: Any, skip_special_tokens: bool = True) -> str:
        self.decoded += 1
        return "".join(
            t for i, t in zip(ids, self.tokens(ids), strict=True) if not (skip_special_tokens and i == SPECIAL)
        )


FP = {"experiment_name": "e", "project_name": "p", "gen_batch_size": 2, "n": 3, "max_prompt_length": 8}
MAX = 6  # the response length limit of these batches


def jagged(rows: list[list[int]]) -> torch.Tensor:
    return torch.nested.nested_tensor_from_jagged(
        torch.tensor([t for r in rows for t in r], dtype=torch.int64),
        offsets=torch.tensor(np.cumsum([0] + [len(r) for r in rows]), dtype=torch.int64),
    )


def floats(rows: list[list[float]]) -> torch.Tensor:
    return torch.nested.nested_tensor_from_jagged(
        torch.tensor([t for r in rows for t in r], dtype=torch.float32),
        offsets=torch.tensor(np.cumsum([0] + [len(r) for r in rows]), dtype=torch.int64),
    )


RESPONSES = [[1, 2, SPECIAL], [666, 667, 668, 3, 4, 5], [7, 10, 8], [1, 1], [2, 2, 2, 2, 2, 2], [3]]
LOGPROBS = [
    [-0.001, -3.0, -0.2],
    [-7.0, -1.0, -0.5, -0.05, -0.3, -2.5],
    [-0.1, -0.1, -0.1],
    [-4.6, -0.01],
    [-1.0] * 6,
    [-9.0],
]


def batch() -> dict[str, Any]:
    """Two GRPO groups of 3 (uids g0 and g1): scores, advantages, chat prompts."""
    scores = np.array([1.0, 0.0, 1.0, 0.5, 0.5, 0.5], dtype=np.float32)
    return {
        "prompts": jagged([[5, 6]] * 3 + [[7]] * 3),
        "responses": jagged(RESPONSES),
        "old_log_probs": floats(LOGPROBS),
        "advantages": floats([[0.7] * len(r) if i < 3 else [0.0] * len(r) for i, r in enumerate(RESPONSES)]),
        "score": scores,
        "uid": ["g0"] * 3 + [HOSTILE] * 3,
        "data_source": ["gsm8k", "gsm8k", "gsm8k", ATTR, ATTR, ATTR],
        "raw_prompt": [[{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}]] * 3
        + [[{"role": "user", "content": HOSTILE}]] * 3,
    }


@pytest.fixture
def view() -> zs.StepView:
    cache = zs.open_cache(CountingStore(), FP)
    cache.write(1, batch())
    return cache.load(1)


class Spans(HTMLParser):
    """Collects the ``title`` and text of every token span, and every script tag."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens: list[tuple[str, str]] = []
        self.scripts = 0
        self._in: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.scripts += tag == "script"
        assert not any(k.startswith("on") for k in a), attrs  # no attribute broke out
        if tag == "span" and "zs-t" in (a.get("class") or "").split() and (a.get("title") or "").startswith("#"):
            self._in = a["title"] or ""
            self.tokens.append((self._in, ""))

    def handle_data(self, data: str) -> None:
        if self._in is not None:
            title, text = self.tokens[-1]
            self.tokens[-1] = (title, text + data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "span":
            self._in = None


def parse(page: str) -> Spans:
    assert_balanced(page)
    spans = Spans()
    spans.feed(page)
    assert spans.scripts == 0
    return spans


def test_one_rollout_shows_messages_badges_and_tokens_by_logprob(view: zs.StepView) -> None:
    shown = view.rollout(1, tokenizer=FakeDecoder(), max_length=MAX)
    assert isinstance(shown, RolloutView)
    page = shown._repr_html_()
    spans = parse(page)
    assert HOSTILE not in page and ATTR not in page
    assert html_escaped(HOSTILE) in page
    # the six tokens, each with its text and exact log-prob on hover
    assert [t for _, t in spans.tokens] == [HOSTILE, ATTR, "&amp; ", "w3 ", "w4 ", "w5 "]
    assert [re.search(r"logprob (-?[\d.]+)", title).group(1) for title, _ in spans.tokens] == [  # type: ignore[union-attr]
        "-7.0000",
        "-1.0000",
        "-0.5000",
        "-0.0500",
        "-0.3000",
        "-2.5000",
    ]
    assert "id 666" in spans.tokens[0][0]
    # least likely token gets the strongest colour; a likely one none
    assert 'class="zs-t zs-p0"' in page and 'class="zs-t" title="#3' in page
    assert "token probability" in page  # the legend
    for text in ("6 tokens", f"truncated at {MAX}", "score 0", "advantage +0.7", html_escaped(ATTR)[:20]):
        assert text in page, text
    assert 'class="zs-msg zs-msg-system"' in page and "be brief" in page and "2+2?" in page
    # the themes: CSS variables with Jupyter's own and a dark scheme
    assert "prefers-color-scheme: dark" in page and "--jp-content-font-color1" in page
    assert 'data-jp-theme-light="false"' in page


def html_escaped(s: str) -> str:
    return _html.esc(s)


def test_special_tokens_are_skipped_in_the_text_not_in_the_tokens(view: zs.StepView) -> None:
    r = view.rollout(0, tokenizer=FakeDecoder(), max_length=MAX).rollout
    assert r.response_text == "w1 w2 " and r.response_tokens == ("w1 ", "w2 ", "<|im_end|>")
    assert not r.truncated and r.length == 3 and r.score == 1.0
    page = view.rollout(0, tokenizer=FakeDecoder(), max_length=MAX)._repr_html_()
    assert "finished" in page and "&lt;|im_end|&gt;" in page


def test_without_a_tokenizer_ids_are_shown_with_the_hint(view: zs.StepView) -> None:
    shown = view.rollout(2)
    page = shown._repr_html_()
    parse(page)
    assert "7 10 8" in page and "pass tokenizer=" in page
    assert "truncated" not in page and "finished" not in page  # jagged, no max_length: unknown
    text = repr(shown)
    assert text.startswith("step 1, row 2, uid g0 · 3 tokens · score 1") and "pass tokenizer=" in text


def test_text_repr_has_the_badges_messages_and_wrapped_response(view: zs.StepView) -> None:
    text = repr(view.rollout(4, tokenizer=FakeDecoder(), max_length=MAX))
    lines = text.splitlines()
    assert (
        lines[0] == f"step 1, row 4, uid {HOSTILE} · 6 tokens · truncated at {MAX} · score 0.5 · advantage +0 · {ATTR}"
    )
    assert lines[1:4] == ["prompt:", "  [user]", f"    {HOSTILE}"]
    assert lines[4:] == ["response:", "  w2 w2 w2 w2 w2 w2"]


def test_rows_out_of_range_are_refused(view: zs.StepView) -> None:
    with pytest.raises(IndexError, match="row 6 out of range for 6 rows"):
        view.rollout(6)
    assert view.rollout(-1).row == 5


def test_a_group_shows_its_responses_side_by_side_best_and_worst_marked(view: zs.StepView) -> None:
    group = view.group("g0", tokenizer=FakeDecoder(), max_length=MAX)
    assert group.rows.tolist() == [0, 1, 2] and group.best == [0, 2] and group.worst == [1]
    page = group._repr_html_()
    parse(page)
    assert page.count('class="zs-card') == 3
    assert page.count("zs-card zs-best") == 2 and page.count("zs-card zs-worst") == 1
    assert "★ best" in page and "✗ worst" in page and "advantage +0.7" in page
    assert page.count("2+2?") == 1  # the shared prompt once
    assert "mean score 0.6667, from 0 to 1" in page
    text = repr(group)
    assert "- row 1: 6 tokens · truncated at 6 · score 0 · advantage +0.7 · gsm8k  ✗ worst" in text
    assert view.group(row=1).uid == "g0"


def test_a_group_whose_scores_tie_marks_nothing(view: zs.StepView) -> None:
    group = view.group(HOSTILE, tokenizer=FakeDecoder())
    assert group.rows.tolist() == [3, 4, 5] and not group.best and not group.worst
    page = group._repr_html_()
    parse(page)
    assert HOSTILE not in page and "every response scored the same" in page
    with pytest.raises(KeyError, match="no row has uid 'nope'"):
        view.group("nope")
    with pytest.raises(TypeError, match="a uid or row="):
        view.group()


def test_marks_without_scores_are_empty() -> None:
    from zarr_skip.views._rows import Rollout

    ids = np.zeros(1, dtype=np.int64)
    assert marks([Rollout(1, 0, ids, 1), Rollout(1, 1, ids, 1)]) == {}
    assert marks([Rollout(1, 0, ids, 1, score=2.0), Rollout(1, 1, ids, 1, score=float("nan"))]) == {}


@pytest.mark.parametrize(
    ("criteria", "rows"),
    [
        ({"uid": "g0"}, [0, 1, 2]),
        ({"uid": ["g0", HOSTILE]}, [0, 1, 2, 3, 4, 5]),
        ({"uid": np.array(["g0", HOSTILE])}, [0, 1, 2, 3, 4, 5]),  # was searched as the array's str: no row
        ({"score": 0.5}, [3, 4, 5]),
        ({"score": (0.4, None)}, [0, 2, 3, 4, 5]),
        ({"score": (None, 0.5), "uid": "g0"}, [1]),
        ({"truncated": True}, [1, 4]),
        ({"truncated": False}, [0, 2, 3, 5]),
        ({"longest": 2}, [1, 4]),
        ({"shortest": 2}, [5, 3]),
        ({"best": 2}, [0, 2]),
        ({"worst": 1}, [1]),
        ({"text": "w2"}, [0, 4]),
        ({"text": "W2", "case": True}, []),
        ({"text": r"w\d w\d", "regex": True}, [0, 1, 3, 4]),
        ({"text": "<script>"}, [1]),
        ({"text": "w2", "truncated": True}, [4]),
    ],
)
def test_find_rows(view: zs.StepView, criteria: dict[str, Any], rows: list[int]) -> None:
    found = view.find(tokenizer=FakeDecoder(), max_length=MAX, limit=None, **criteria)
    assert isinstance(found, RolloutList)
    assert found.rows.tolist() == rows
    page = found._repr_html_()
    parse(page)
    assert page.count('<details class="zs-rollout"') == len(rows)
    assert f"{len(rows)} row" in found.note


def test_find_stops_a_text_search_at_the_limit(view: zs.StepView) -> None:
    decoder = FakeDecoder()
    found = view.find(text="w", tokenizer=decoder, limit=2)
    assert found.rows.tolist() == [0, 1] and "stopped" in found.note
    assert "the first 2 matches" in repr(found)
    found = view.find(score=0.5, limit=1)
    assert found.rows.tolist() == [3] and found.note == "3 rows match; showing the first 1 (limit=None shows all)"


def test_find_says_what_it_needs(view: zs.StepView) -> None:
    with pytest.raises(ValueError, match="needs a tokenizer"):
        view.find(text="w")
    with pytest.raises(ValueError, match="pass max_length="):
        view.find(truncated=True)
    with pytest.raises(TypeError, match="unknown criteria scor "):
        view.find(scor=1)
    with pytest.raises(ValueError, match="one of longest, shortest, best, worst"):
        view.find(longest=2, best=1)
    with pytest.raises(ValueError, match="not a regular expression"):
        view.find(text="(", regex=True, tokenizer=FakeDecoder())
    cache = zs.open_cache(CountingStore(), FP)
    cache.write(1, {k: v for k, v in batch().items() if k not in ("score", "uid")})
    with pytest.raises(KeyError, match="no score column"):
        cache.load(1).find(best=1)
    with pytest.raises(KeyError, match="no 'uid' column"):
        cache.load(1).group("g0")


def test_pages(view: zs.StepView) -> None:
    p = view.page(1, size=4)
    assert p.rows.tolist() == [4, 5] and p.title == "step 1: page 1 of 2 (rows 4–5 of 6)" and p.note == "last page"
    assert view.page(0, size=4).note == "next: .page(1)"
    assert view.page(-1, size=4).rows.tolist() == [4, 5]
    with pytest.raises(IndexError, match="page 2 out of range: 2 pages of 4 rows"):
        view.page(2, size=4)
    text = repr(view.page(0, size=2, tokenizer=FakeDecoder()))
    assert text.splitlines()[2:4] == ["  row      0  3 tokens · score 1 · advantage +0.7 · gsm8k", "          w1 w2"]


def test_a_row_of_a_list_out_of_range_is_a_typed_error(view: zs.StepView) -> None:
    """``page.rollout(k)`` past the page (or not an int) raised numpy's bare IndexError."""
    page = view.page(1, size=4)
    assert page.rollout(-1).row == 5 and page.rollout(0).row == 4
    with pytest.raises(zs.RowIndexError, match="k 2 out of range for 2 rows"):
        page.rollout(2)
    with pytest.raises(zs.ConfigTypeError, match="k: expected an int"):
        page.rollout(1.0)  # type: ignore[arg-type]
    with pytest.raises(zs.RowIndexError, match="k 0 out of range for 0 rows"):
        view.find(uid="nope").rollout(0)


def test_a_padded_batch_drops_its_padding() -> None:
    from zarr_skip.synthetic import padded_batch

    dp = padded_batch(zs_preset(), seed=3)
    cache = zs.open_cache(CountingStore(), FP)
    cache.write(1, dp)
    view = cache.load(1)
    mask = dp.batch["response_mask"].numpy().astype(bool)
    attention = dp.batch["attention_mask"].numpy().astype(bool)
    rows = view.page(0, size=8).rollouts()
    width = dp.batch["responses"].shape[1]
    for r in rows:
        assert r.length == mask[r.row].sum() and r.max_length == width
        assert r.response_ids.tolist() == dp.batch["responses"][r.row][: r.length].tolist()
        assert r.log_probs is not None and len(r.log_probs) == r.length
        prompt = dp.batch["prompts"][r.row].numpy()
        assert r.prompt_ids is not None and r.prompt_ids.tolist() == prompt[attention[r.row, : len(prompt)]].tolist()
        assert r.prompt_messages and r.prompt_messages[0][0] == "user"
    found = view.find(truncated=True, limit=None).rows
    assert found.tolist() == np.flatnonzero(mask.sum(1) >= width).tolist()


def zs_preset() -> Any:
    from zarr_skip.synthetic import Preset

    return Preset(rows=16, max_prompt=16, max_response=12, n=4)


def chunk_keys(store: CountingStore) -> set[str]:
    return {k for k in store.reads if not k.endswith("zarr.json")}


def test_a_page_of_a_big_step_reads_only_its_rows() -> None:
    """10k rows in 4 mini-batches, many chunks per column: a page of 20 rows reads a few of them."""
    rng = np.random.default_rng(0)
    rows, n = 10_000, 8
    lengths = rng.integers(1, 40, rows)
    store = CountingStore()
    cache = zs.open_cache(store, FP, chunk_bytes=2048)
    ids = rng.integers(0, 500, int(lengths.sum()))
    lp = -rng.exponential(1.0, int(lengths.sum())).astype(np.float32)
    off = np.concatenate([[0], np.cumsum(lengths)])
    for m in range(4):
        a, b = m * rows // 4, (m + 1) * rows // 4
        cut = slice(int(off[a]), int(off[b]))
        cache.write(
            1,
            {
                "responses": torch.nested.nested_tensor_from_jagged(
                    torch.from_numpy(ids[cut]), offsets=torch.from_numpy(off[a : b + 1] - off[a])
                ),
                "old_log_probs": torch.nested.nested_tensor_from_jagged(
                    torch.from_numpy(lp[cut]), offsets=torch.from_numpy(off[a : b + 1] - off[a])
                ),
                "score": rng.random(b - a).astype(np.float32),
                "uid": [f"u{i // n}" for i in range(a, b)],
                "raw_prompt": [[{"role": "user", "content": f"question {i // n}"}] for i in range(a, b)],
            },
            expected=4,
        )
    view = zs.open_cache(store).load(1)
    (values,) = [view._parts[2].arrays["responses"]["values"]]
    assert values.shard and len(values.sizes) > 40  # many chunks, one shard per array
    stored = sum(len(v) for k, v in store._store_dict.items() if not k.endswith("zarr.json"))
    store.reads.clear()
    store.bytes_read.clear()
    page = view.page(301, size=20, tokenizer=FakeDecoder())  # rows 6020-6039, in mini-batch 2
    assert not chunk_keys(store)  # making the page reads nothing
    html = page._repr_html_()
    assert html.count('<details class="zs-rollout"') == 20
    assert "question 752" in html and "question 754" in html and "question 755" not in html
    read = chunk_keys(store)
    assert read and all("/2/w-" in k for k in read), sorted(read)  # mini-batch 2 only
    assert sum(store.reads[k] for k in read) <= 40
    assert sum(store.bytes_read[k] for k in read) < 0.02 * stored  # whole chunks of 20 of 10k rows
    # showing it again reads nothing more; one rollout reads its row's chunks only
    store.reads.clear()
    page._repr_html_()
    assert not chunk_keys(store)
    view.rollout(6025, tokenizer=FakeDecoder())._repr_html_()
    assert 0 < sum(store.reads[k] for k in chunk_keys(store)) <= 20


def test_a_groups_summary_leaves_out_scores_that_are_not_finite() -> None:
    from zarr_skip.views._rows import Rollout
    from zarr_skip.views.groups import group_html, group_text

    ids = np.zeros(1, dtype=np.int64)
    group = [Rollout(1, i, ids, 1, score=s) for i, s in enumerate([float("nan"), 1.0, 0.0])]
    head = group_text("g", group).splitlines()[0]  # was: mean score nan, from nan to nan
    assert head.endswith("3 responses; mean score 0.5, from 0 to 1; 1 without a finite score; lengths all 1 tokens")
    assert "mean score 0.5, from 0 to 1; 1 without a finite score" in group_html("g", group)
