"""Readable rollouts: tokenizers of every kind, decoded text read lazily, chat messages."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import CountingStore

import zarr_skip as zs
from zarr_skip.errors import MissingExtraError, TokenizerNotFoundError
from zarr_skip.store import fetching
from zarr_skip.synthetic import TOKENIZER_PATH, shipped_tokenizer, text_rollouts
from zarr_skip.views import Message, chat_messages, load_tokenizer, tokenizer_for
from zarr_skip.views.tokenizers import surface_tokens

tokenizers = pytest.importorskip("tokenizers")
FP = {"experiment_name": "readable", "n": 4, "max_response_length": 96}
TEXT = "Ava buys 3 × 4 cookies: 12 café crêpes.\nThe answer is \\boxed{12}."


class HFLike:
    """What views need of a ``transformers`` tokenizer: ``decode`` and ``batch_decode``."""

    def __init__(self) -> None:
        self.inner = shipped_tokenizer()
        self.batch_calls = 0

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return str(self.inner.decode(ids, skip_special_tokens=skip_special_tokens))

    def batch_decode(self, batch: list[list[int]], skip_special_tokens: bool = False) -> list[str]:
        self.batch_calls += 1
        return [self.decode(ids, skip_special_tokens) for ids in batch]


@pytest.fixture
def ids() -> list[int]:
    tok = shipped_tokenizer()
    return [tok.token_to_id("<|im_start|>"), *tok.encode(TEXT).ids, tok.token_to_id("<|im_end|>")]


# -------------------------------------------------------------------------- tokenizers


@pytest.mark.parametrize("kind", ["file", "directory", "str", "tokenizers", "hf-like"])
def test_every_kind_of_tokenizer_decodes_the_same(kind: str, tmp_path: Path, ids: list[int]) -> None:
    if kind == "directory":
        shutil.copy(TOKENIZER_PATH, tmp_path / "tokenizer.json")
        source: Any = tmp_path
    else:
        source = {
            "file": TOKENIZER_PATH,
            "str": str(TOKENIZER_PATH),
            "tokenizers": tokenizers.Tokenizer.from_file(str(TOKENIZER_PATH)),
            "hf-like": HFLike(),
        }[kind]
    dec = load_tokenizer(source)
    assert dec.decode(ids) == TEXT
    assert dec.decode(ids, skip_special_tokens=False) == f"<|im_start|>{TEXT}<|im_end|>"
    assert load_tokenizer(dec) is dec


def test_tokens_give_each_ids_surface_text(ids: list[int]) -> None:
    dec = load_tokenizer(TOKENIZER_PATH)
    pieces = dec.tokens(ids)
    assert len(pieces) == len(ids)
    assert "".join(pieces) == dec.decode(ids, skip_special_tokens=False)
    assert pieces[0] == "<|im_start|>" and pieces[-1] == "<|im_end|>"
    assert " cookies" in pieces  # the leading space belongs to the token
    # a character split over byte tokens lands on the id that completes it, never as U+FFFD
    assert not any("\ufffd" in p for p in pieces)
    assert any(p.endswith("×") or p.endswith("é") for p in pieces)


def test_surface_tokens_keep_spaces_a_sentencepiece_decoder_drops_at_the_start() -> None:
    vocab = {0: "▁Hello", 1: "▁world", 2: "!"}

    def decode(ids: Any) -> str:  # Metaspace: ▁ is a space, the first one dropped
        return "".join(vocab[i] for i in ids).replace("▁", " ").lstrip(" ")

    assert surface_tokens(decode, [0, 1, 2, 1]) == ["Hello", " world", "!", " world"]


def test_a_name_that_is_not_a_local_path_is_never_downloaded() -> None:
    with pytest.raises(TokenizerNotFoundError, match="never downloads") as info:
        load_tokenizer("Qwen/Qwen2.5-7B-Instruct")
    assert isinstance(info.value, FileNotFoundError)


def test_a_file_that_is_no_tokenizer_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    with pytest.raises(TokenizerNotFoundError, match="not a tokenizer.json"):
        load_tokenizer(bad)
    with pytest.raises(TokenizerNotFoundError, match="no tokenizer.json"):
        load_tokenizer(tmp_path / "..")  # a directory without one (transformers absent or finding none)
    with pytest.raises(TokenizerNotFoundError, match="cannot decode with int"):
        load_tokenizer(3)


def test_without_the_tokenizers_package_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import tokenizers -> ImportError
    with pytest.raises(MissingExtraError, match=r"zarr-skip\[text\]"):
        load_tokenizer(TOKENIZER_PATH)


# -------------------------------------------------------------------------- a cache with text


def write(store: Any, *, padded: bool = False, record: str | None = str(TOKENIZER_PATH)) -> zs.Cache:
    cache = zs.open_cache(store, FP, chunk_bytes=256)
    cache.write(1, text_rollouts(6, 4, seed=1, padded=padded), expected=2)
    cache.write(1, text_rollouts(6, 4, seed=2, padded=padded), expected=2)
    if record is not None:
        cache.set_attributes({"tokenizer": record})
    return cache


def expected_texts(column: str = "responses", skip: bool = True) -> list[str]:
    tok = shipped_tokenizer()
    return [
        tok.decode(row.tolist(), skip_special_tokens=skip)
        for seed in (1, 2)
        for row in text_rollouts(6, 4, seed=seed)[column].unbind()
    ]


@pytest.mark.parametrize("padded", [False, True])
def test_text_decodes_responses_and_prompts_with_the_recorded_tokenizer(padded: bool) -> None:
    store = CountingStore()
    write(store, padded=padded)
    view = zs.open_cache(store).load(1)
    assert view.text() == expected_texts()
    assert view.text("prompts", skip_special_tokens=False) == expected_texts("prompts", skip=False)
    assert view.text(rows=5) == [expected_texts()[5]]
    assert view.text(rows=-1) == [expected_texts()[-1]]
    assert view.text(rows=slice(20, 30)) == expected_texts()[20:30]
    assert view.text(rows=slice(0, 48, 7)) == expected_texts()[0:48:7]
    assert view.text(rows=[30, 2, 30]) == [expected_texts()[i] for i in (30, 2, 30)]
    assert view.text(rows=np.array([1, 3])) == [expected_texts()[1], expected_texts()[3]]
    assert all("<|im_end|>" not in t and "<|endoftext|>" not in t for t in view.text())
    with pytest.raises(IndexError, match="out of range for 48 rows"):
        view.text(rows=[48])


def test_text_reads_only_the_rows_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    # the chunks asked for alone: not the few bytes between them a ranged read steps over
    # (ZIP headers, other members of this tiny step; test_packed pins those holes)
    monkeypatch.setattr(fetching, "MAX_HOLE_BYTES", 0)
    store = CountingStore()
    write(store)
    view = zs.open_cache(store).load(1)
    store.reads.clear()
    store.bytes_read.clear()
    view.text(rows=[1])
    one = {k for k in store.reads if "zarr.json" not in k}
    one_bytes = sum(store.bytes_read.values())
    assert one and all("/responses/" in k for k in one)  # no other column, no mask
    store.reads.clear()
    store.bytes_read.clear()
    view.text()
    every = {k for k in store.reads if "zarr.json" not in k and "/responses/values/" in k}
    assert len(every) > len({k for k in one if "/values/" in k}) >= 1
    assert one_bytes * 4 < sum(store.bytes_read.values())


def test_an_explicit_tokenizer_wins_over_the_recorded_one() -> None:
    store = CountingStore()
    write(store, record="/nowhere/tokenizer.json")
    view = zs.open_cache(store).load(1)
    hf = HFLike()
    assert view.text(rows=[0, 1], tokenizer=hf) == expected_texts()[:2]
    assert hf.batch_calls == 1  # the rows decode in one batch
    assert view.text(rows=[0], tokenizer=str(TOKENIZER_PATH)) == expected_texts()[:1]


def test_without_a_tokenizer_the_error_says_how_to_pass_one() -> None:
    store = CountingStore()
    write(store, record=None)
    view = zs.open_cache(store).load(1)
    assert tokenizer_for(view) is None
    with pytest.raises(TokenizerNotFoundError, match=r"none is recorded.*tokenizer=PATH.*--tokenizer PATH"):
        view.text()
    store2 = CountingStore()
    write(store2, record="/nowhere/tokenizer.json")
    with pytest.raises(TokenizerNotFoundError, match="'/nowhere/tokenizer.json' is not on this machine"):
        zs.open_cache(store2).load(1).text(rows=0)


def test_the_recorded_tokenizer_is_found_from_the_cache_and_from_a_view(tmp_path: Path) -> None:
    cache = write(tmp_path / "c")
    reader = zs.open_cache(tmp_path / "c")
    assert reader.attributes == {"tokenizer": str(TOKENIZER_PATH)}
    assert tokenizer_for(reader) is not None and tokenizer_for(reader.load(1)) is not None
    assert tokenizer_for(None) is None
    model = tmp_path / "model"
    model.mkdir()
    shutil.copy(TOKENIZER_PATH, model / "tokenizer.json")
    cache.set_attributes({"tokenizer": "/not/here", "model": str(model)})  # the model directory, then
    assert zs.open_cache(tmp_path / "c").load(1).text(rows=0) == [expected_texts()[0]]
    assert reader.load(1).minibatches[1].text(rows=0) == [expected_texts()[24]]
    del cache


def test_messages_render_the_chat_prompt() -> None:
    store = CountingStore()
    write(store)
    view = zs.open_cache(store).load(1)
    msgs = view.messages(rows=[0, 4])
    first = text_rollouts(6, 4, seed=1)["raw_prompt"]
    assert msgs == [[Message("user", first[0][0]["content"])], [Message("user", first[4][0]["content"])]]
    role, content = msgs[0][0]
    assert role == "user" and content.endswith("\\boxed{}.")
    assert len(view.messages()) == 48


def test_chat_messages_take_every_shape_verl_stores() -> None:
    parts = [{"role": "user", "content": [{"type": "text", "text": "look: "}, {"type": "image"}]}]
    assert chat_messages(parts) == [Message("user", "look: <image>")]
    assert chat_messages("plain question") == [Message("user", "plain question")]
    assert chat_messages(None) == []
    assert chat_messages(np.array([{"role": "system", "content": "be brief"}], dtype=object)) == [
        Message("system", "be brief")
    ]


# -------------------------------------------------------------------------- experiment attributes


def test_attributes_merge_survive_reopening_and_need_a_writer(tmp_path: Path) -> None:
    cache = zs.open_cache(tmp_path / "c", FP)
    assert cache.attributes == {}
    cache.set_attributes({"model": "/models/a"})
    cache.set_attributes({"tokenizer": "/models/a/tok"})
    assert cache.attributes == {"model": "/models/a", "tokenizer": "/models/a/tok"}
    again = zs.open_cache(tmp_path / "c", FP)  # the fingerprint still matches
    assert again.attributes == {"model": "/models/a", "tokenizer": "/models/a/tok"}
    with pytest.raises(zs.ReadOnlyCacheError):
        zs.open_cache(tmp_path / "c").set_attributes({"model": "x"})


@pytest.mark.parametrize(
    ("values", "error"),
    [
        (None, "values: expected a mapping"),
        ([("model", "x")], "values: expected a mapping"),
        ({1: "x"}, "values: keys must be str"),  # JSON would store "1", the handle kept 1
        ({"score": float("nan")}, "values: not strict JSON"),  # NaN: no JSON reader takes it
        ({"tokenizer": b"/tok"}, "values: not strict JSON"),
        ({"model": object()}, "values: not strict JSON"),
    ],
)
def test_attributes_that_json_does_not_hold_are_refused_before_anything_is_written(
    tmp_path: Path, values: Any, error: str
) -> None:
    cache = zs.open_cache(tmp_path / "c", FP)
    with pytest.raises(zs.ConfigError, match=error):
        cache.set_attributes(values)
    assert not (tmp_path / "c").exists()  # not even the experiment a first record creates
    cache.set_attributes({"model": "/models/a"})
    with pytest.raises(zs.ConfigError, match=error):
        cache.set_attributes(values)
    assert zs.open_cache(tmp_path / "c").attributes == {"model": "/models/a"}
