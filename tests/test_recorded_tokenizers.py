"""Tokenizers named by a cache are loaded without running its code, and one that does not load
is a warning, not a broken view (issue 26, points 4 and 5).

``transformers`` is replaced by a stub module (``sys.modules``) that records the arguments of
``AutoTokenizer.from_pretrained``: a model directory with an ``auto_map`` is what would make the
real one import and run the directory's code when ``trust_remote_code`` is not False.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import zarr_skip as zs
from zarr_skip.cli.main import main
from zarr_skip.errors import TokenizerNotFoundError
from zarr_skip.synthetic import TOKENIZER_PATH, shipped_tokenizer, text_rollouts
from zarr_skip.views import load_tokenizer, tokenizer_for
from zarr_skip.views import tokenizers as tokenizers_module

pytest.importorskip("tokenizers")
FP = {"experiment_name": "tok", "n": 2}


class _HF:
    """What the stub's from_pretrained hands back: a transformers-like tokenizer."""

    def __init__(self) -> None:
        self.inner = shipped_tokenizer()

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return str(self.inner.decode(ids, skip_special_tokens=skip_special_tokens))


class StubTransformers(types.ModuleType):
    """``transformers`` as far as zarr_skip uses it; ``fail`` makes from_pretrained raise it."""

    def __init__(self) -> None:
        super().__init__("transformers")
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.fail: BaseException | None = None
        stub = self

        class AutoTokenizer:
            @staticmethod
            def from_pretrained(path: str, **kwargs: Any) -> _HF:
                stub.calls.append((path, kwargs))
                if stub.fail is not None:
                    raise stub.fail
                return _HF()

        self.AutoTokenizer = AutoTokenizer


@pytest.fixture
def transformers(monkeypatch: pytest.MonkeyPatch) -> StubTransformers:
    stub = StubTransformers()
    monkeypatch.setitem(sys.modules, "transformers", stub)
    return stub


@pytest.fixture(autouse=True)
def _fresh_warnings() -> Iterator[None]:
    tokenizers_module._WARNED.clear()
    yield
    tokenizers_module._WARNED.clear()


def model_dir(root: Path) -> Path:
    """A model directory whose tokenizer is code of its own (no tokenizer.json)."""
    root.mkdir(parents=True)
    (root / "tokenizer_config.json").write_text(
        json.dumps({"auto_map": {"AutoTokenizer": ["evil.EvilTokenizer", None]}})
    )
    (root / "evil.py").write_text("raise SystemExit('the directory code ran')\n")
    return root


def cache_recording(root: Path, tokenizer: str) -> zs.Cache:
    cache = zs.open_cache(root, FP)
    cache.write(1, text_rollouts(2, 2, seed=1, max_response=16))
    cache.set_attributes({"tokenizer": tokenizer})
    return zs.open_cache(root)


def test_a_recorded_model_directory_is_loaded_with_trust_remote_code_false(
    tmp_path: Path, transformers: StubTransformers
) -> None:
    model = model_dir(tmp_path / "model")
    cache = cache_recording(tmp_path / "c", str(model))
    assert tokenizer_for(cache) is not None
    assert tokenizer_for(cache.load(1), trust_remote_code=True) is not None  # applies to explicit only
    assert transformers.calls == [(str(model), {"local_files_only": True, "trust_remote_code": False})] * 2


def test_an_explicit_directory_may_trust_its_code(tmp_path: Path, transformers: StubTransformers) -> None:
    model = model_dir(tmp_path / "model")
    load_tokenizer(model)
    load_tokenizer(model, trust_remote_code=True)
    assert [kw["trust_remote_code"] for _, kw in transformers.calls] == [False, True]
    with pytest.raises(zs.ConfigTypeError, match="trust_remote_code"):
        load_tokenizer(model, trust_remote_code="yes")


def _not_a_tokenizer(tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    if kind == "passwd":
        return Path("/etc/passwd")
    if kind == "empty dir, no transformers":
        monkeypatch.setitem(sys.modules, "transformers", None)
        (tmp_path / "empty").mkdir()
        return tmp_path / "empty"
    if kind == "transformers refuses":
        stub = StubTransformers()
        stub.fail = ValueError("Unrecognized model in /x. Should have a `model_type` key")
        monkeypatch.setitem(sys.modules, "transformers", stub)
        return model_dir(tmp_path / "model")
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    return bad


KINDS = ["passwd", "empty dir, no transformers", "transformers refuses", "broken tokenizer.json"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_recorded_path_that_does_not_load_falls_back_to_ids_with_one_warning(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = _not_a_tokenizer(tmp_path, kind, monkeypatch)
    cache = cache_recording(tmp_path / "c", str(path))
    view = cache.load(1)
    with caplog.at_level(logging.WARNING, logger="zarr_skip"):
        assert tokenizer_for(view) is None
        assert tokenizer_for(cache) is None
        repr(view)
        view._repr_html_()
        html = view.rollout(0)._repr_html_()
        view.page(0)._repr_html_()
    assert "token ids" in html or "tokens" in html
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and str(path) in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
    assert "tokenizer=" in warnings[0].getMessage() and "--tokenizer PATH" in warnings[0].getMessage()
    with pytest.raises(TokenizerNotFoundError, match=rf"{path}' does not load.*tokenizer=PATH"):
        view.text(rows=0)  # text needs a tokenizer: a typed error saying how to pass one
    with pytest.raises(TokenizerNotFoundError):  # the same path given explicitly stays an error
        tokenizer_for(view, str(path))


@pytest.mark.parametrize("kind", KINDS)
def test_cli_commands_fall_back_too(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _not_a_tokenizer(tmp_path, kind, monkeypatch)
    cache_recording(tmp_path / "c", str(path))
    loc = str(tmp_path / "c")
    assert main(["show", loc, "1", "--text", "--rows", "1"]) == 0
    err = capsys.readouterr().err
    assert "showing token ids" in err and str(path) in err
    assert main(["report", loc, "1", "-o", str(tmp_path / "r.html")]) == 0, capsys.readouterr().err
    assert (tmp_path / "r.html").stat().st_size > 0
    assert main(["show", loc, "1", "--text", "--tokenizer", str(path)]) == 2  # explicit: an error


def test_cli_trust_remote_code_is_for_an_explicit_tokenizer(
    tmp_path: Path, transformers: StubTransformers, capsys: pytest.CaptureFixture[str]
) -> None:
    model = model_dir(tmp_path / "model")
    cache_recording(tmp_path / "c", str(model))
    loc = str(tmp_path / "c")
    assert main(["show", loc, "1", "--text", "--rows", "1"]) == 0
    assert main(["show", loc, "1", "--text", "--rows", "1", "--trust-remote-code"]) == 2
    assert "--tokenizer PATH only" in capsys.readouterr().err
    assert main(["show", loc, "1", "--text", "--rows", "1", "--tokenizer", str(model), "--trust-remote-code"]) == 0
    assert [kw["trust_remote_code"] for _, kw in transformers.calls] == [False, True]


def test_a_recorded_tokenizer_that_loads_is_still_used(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    shutil.copy(TOKENIZER_PATH, model / "tokenizer.json")
    cache = cache_recording(tmp_path / "c", str(model))
    assert tokenizer_for(cache) is not None
    assert cache.load(1).text(rows=0)[0]
