"""A stored string holding a lone surrogate (``"bad\\ud800"``, which the format keeps exactly)
goes through every command and view: shown and exported escaped (``\\ud800``), read back
exactly from JSONL, never a UnicodeEncodeError; the stored value is unchanged (issue 26,
point 6)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import zarr_skip as zs
from zarr_skip.cli.main import main
from zarr_skip.format.escapes import utf8_text, utf8_value
from zarr_skip.synthetic import TOKENIZER_PATH, text_rollouts

pytest.importorskip("tokenizers")
BAD = "bad\ud800"
SHOWN = "bad\\ud800"


@pytest.fixture(scope="module")
def loc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("surrogate") / "cache"
    batch = text_rollouts(2, 2, seed=1, max_response=16)
    batch["uid"] = [BAD] * 2 + list(batch["uid"][2:])
    batch["data_source"] = np.array([BAD] * 4, dtype=object)
    batch["note"] = [BAD, "ok", {"k" + BAD: [BAD]}, None]
    cache = zs.open_cache(root, {"n": 2})
    cache.write(1, batch)
    cache.set_attributes({"tokenizer": str(TOKENIZER_PATH)})
    return root


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    for stream in (out.out, out.err):
        stream.encode("utf-8")  # what a terminal would be sent: encodable
    return code, out.out, out.err


@pytest.mark.parametrize(
    "argv",
    [
        ("show", "1"),
        ("show", "1", "--rows", "4"),
        ("show", "1", "--text"),
        ("show", "1", "--text", "--uid", BAD),
        ("show", "1", "--json"),
        ("show", "1", "--text", "--json"),
        ("ls",),
        ("verify",),
    ],
    ids=" ".join,
)
def test_every_command_shows_it_escaped(loc: Path, capsys: Any, argv: tuple[str, ...]) -> None:
    cmd, *rest = argv
    code, out, err = _run(capsys, cmd, str(loc), *rest)
    assert code == 0, err
    if "--json" in argv:
        json.loads(out)  # JSON escapes it itself (\ud800), and reads back
    elif cmd == "show":
        assert SHOWN in out


@pytest.mark.parametrize("tokens", [False, True])
def test_the_report_is_written_with_it_escaped(loc: Path, capsys: Any, tmp_path: Path, tokens: bool) -> None:
    out = tmp_path / "r.html"
    code, _, err = _run(capsys, "report", str(loc), "1", "-o", str(out), *(["--tokens"] if tokens else []))
    assert code == 0, err
    assert SHOWN in out.read_text(encoding="utf-8")


def test_jsonl_export_reads_back_exactly(loc: Path, capsys: Any, tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    code, _, err = _run(capsys, "export", str(loc), "1", str(out), "--format", "jsonl")
    assert code == 0, err
    text = out.read_text(encoding="utf-8")  # valid UTF-8
    records = [json.loads(line) for line in text.splitlines()]
    assert [r["uid"] for r in records][:2] == [BAD, BAD]
    assert [r["note"] for r in records] == [BAD, "ok", {"k" + BAD: [BAD]}, None]


def test_parquet_export_holds_it_escaped(loc: Path, capsys: Any, tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    out = tmp_path / "r.parquet"
    code, _, err = _run(capsys, "export", str(loc), "1", str(out), "--format", "parquet")
    assert code == 0, err
    table = pq.read_table(out).to_pydict()
    assert table["uid"][:2] == [SHOWN, SHOWN] and table["data_source"] == [SHOWN] * 4


def test_views_render_encodable_html_and_the_value_is_unchanged(loc: Path) -> None:
    cache = zs.open_cache(loc)
    view = cache.load(1)
    for html in (view._repr_html_(), view.rollout(0)._repr_html_(), view.page(0)._repr_html_(), repr(view)):
        html.encode("utf-8")
    assert SHOWN in view.rollout(0)._repr_html_()
    assert view["uid"][0] == BAD and view["note"][:] == [BAD, "ok", {"k" + BAD: [BAD]}, None]
    assert cache.verify().ok


def test_step_and_column_html_are_encodable(loc: Path, tmp_path: Path) -> None:
    """A step's HTML (its meta_info) and a JSON column's preview held the lone surrogate raw:
    Jupyter could not encode the output and showed an error instead of the table."""
    view = zs.open_cache(loc).load(1)
    html = view["note"]._repr_html_()
    html.encode("utf-8")
    assert SHOWN in html
    cache = zs.open_cache(tmp_path / "c", {"n": 2})
    cache.write(1, text_rollouts(2, 2, seed=1, max_response=16), meta_info={"m" + BAD: [BAD]})
    html = zs.open_cache(tmp_path / "c").load(1)._repr_html_()
    html.encode("utf-8")
    assert f"m{SHOWN}" in html


def test_utf8_text_and_value() -> None:
    assert utf8_text("plain é") == "plain é"
    assert utf8_text("a\ud800b\udfff") == "a\\ud800b\\udfff"
    assert utf8_value({"k\udc80": ["x\ud800", 1, None, ("y",)]}) == {"k\\udc80": ["x\\ud800", 1, None, ["y"]]}
