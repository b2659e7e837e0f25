"""Nothing a cache holds reaches the reader's terminal as a control sequence (issue 26,
point 3): ESC / OSC / CSI / C1 bytes in response text, uid, data_source, chat roles, column and
experiment names are printed escaped by every command that is not ``--json``; ``--json``
keeps the values exact (JSON escapes them)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import zarr_skip as zs
from zarr_skip.cli._format import terminal_safe
from zarr_skip.cli.main import main
from zarr_skip.synthetic import TOKENIZER_PATH, shipped_tokenizer, text_rollouts

pytest.importorskip("tokenizers")

#: window title, OSC 52 clipboard write, clear screen, a C1 CSI, a bell, a carriage return
PAYLOAD = "\x1b]0;owned\x07\x1b]52;c;ZWNobyBoaQ==\x07\x1b[2J\x9b31m\r\x08"
#: what a terminal would act on (newline and tab are shown as they are)
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
COLUMN = "notes\x1b[2J"
EXPERIMENT = "exp"  # names are checked on write (letters, digits, '._=+-'); -e below quotes one
FP = {"n": 2}


def _hostile_batch() -> dict[str, Any]:
    batch = text_rollouts(2, 2, seed=3, max_response=32)
    ids = shipped_tokenizer().encode("ok " + PAYLOAD, add_special_tokens=False).ids
    responses = [torch.tensor(ids)] + [batch["responses"][i] for i in range(1, 4)]
    batch["responses"] = torch.nested.nested_tensor(responses, layout=torch.jagged)
    batch["uid"] = ["g" + PAYLOAD] * 2 + list(batch["uid"][2:])
    batch["data_source"] = np.array(["src" + PAYLOAD] + list(batch["data_source"][1:]), dtype=object)
    prompt = [dict(m) for m in batch["raw_prompt"][0]]
    prompt[0]["role"] = "user" + PAYLOAD
    batch["raw_prompt"] = np.array([prompt] + list(batch["raw_prompt"][1:]) + [None], dtype=object)[:4]
    batch[COLUMN] = ["note" + PAYLOAD] * 4
    return batch


@pytest.fixture(scope="module")
def loc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hostile") / "cache"
    cache = zs.open_cache(root, FP, experiment=EXPERIMENT)
    cache.write(1, _hostile_batch())
    cache.set_attributes({"tokenizer": str(TOKENIZER_PATH)})
    return root


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


COMMANDS = [
    ("ls",),
    ("ls", "--steps"),
    ("show", "1"),
    ("show", "1", "--rows", "4"),
    ("show", "1", "--text"),
    ("show", "1", "--text", "--uid", "g" + PAYLOAD),
    ("show", "99"),  # an error message naming the experiment
    ("show", "1", "--text", "--uid", "nope" + PAYLOAD),  # an error quoting the argument
    ("verify",),
    ("ls", "-e", "exp" + PAYLOAD),  # an error quoting an experiment name
]


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: " ".join(a)[:30].replace("\x1b", "ESC"))
def test_no_command_prints_a_raw_control_character(loc: Path, capsys: Any, argv: tuple[str, ...]) -> None:
    cmd, *rest = argv
    code, out, err = _run(capsys, cmd, str(loc), *rest)
    assert out or err
    for stream in (out, err):
        assert not RAW.findall(stream), (argv, RAW.findall(stream), stream[:2000])


def test_the_hostile_values_are_shown_escaped(loc: Path, capsys: Any) -> None:
    code, out, err = _run(capsys, "show", str(loc), "1", "--text", "--rows", "2")
    assert code == 0, err
    shown = terminal_safe(PAYLOAD)
    assert shown.startswith("\\x1b]0;owned\\x07")
    for text in ("ok " + shown.split("\\x0d")[0], "g" + shown, "src" + shown, "user" + shown):
        assert text in out, text
    code, out, err = _run(capsys, "show", str(loc), "1", "--rows", "4")
    assert code == 0, err
    assert terminal_safe(COLUMN) in out and '"note\\u001b]0;owned' in out  # rows as JSON text
    code, out, err = _run(capsys, "ls", str(loc))
    assert code == 0 and "exp" in out
    code, out, err = _run(capsys, "ls", str(loc), "-e", "x" + PAYLOAD)
    assert code == 2 and "x\\x1b]0;owned" in err


def test_json_output_keeps_the_values_exact(loc: Path, capsys: Any) -> None:
    code, out, err = _run(capsys, "show", str(loc), "1", "--text", "--json")
    assert code == 0, err
    assert not RAW.findall(out)  # JSON escapes them itself
    docs = json.loads(out)
    records = docs["rollouts"] if isinstance(docs, dict) and "rollouts" in docs else docs
    assert records[0]["uid"] == "g" + PAYLOAD and records[0][COLUMN] == "note" + PAYLOAD


def test_a_library_warning_is_printed_escaped(loc: Path, capsys: Any, tmp_path: Path) -> None:
    bad = tmp_path / ("tok" + PAYLOAD)
    bad.mkdir()
    zs.open_cache(loc, FP, experiment=EXPERIMENT).set_attributes({"tokenizer": str(bad)})
    try:
        code, out, err = _run(capsys, "show", str(loc), "1", "--text", "--rows", "1")
    finally:
        zs.open_cache(loc, FP, experiment=EXPERIMENT).set_attributes({"tokenizer": str(TOKENIZER_PATH)})
    assert not RAW.findall(out) and not RAW.findall(err), err
    assert "tok\\x1b" in err


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("plain text\n\tindented", "plain text\n\tindented"),
        ("\x1b[31mred", "\\x1b[31mred"),
        ("\x00\x07\x08\x0b\x0c\r\x7f", "\\x00\\x07\\x08\\x0b\\x0c\\x0d\\x7f"),
        ("\x80\x9b\x9f\xa0é", "\\x80\\x9b\\x9f\xa0é"),
        ("bad\ud800", "bad\\ud800"),
        ("", ""),
    ],
)
def test_terminal_safe(text: str, shown: str) -> None:
    assert terminal_safe(text) == shown
    assert not RAW.findall(terminal_safe(text))


@pytest.fixture(scope="module")
def drawn(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """What a Python or IPython prompt prints for a cache, a step, a column and the rollout
    views of a hostile step (meta_info with control characters and a lone surrogate too)."""
    from IPython.lib.pretty import pretty

    root = tmp_path_factory.mktemp("hostile_views") / "cache"
    cache = zs.open_cache(root, FP, experiment=EXPERIMENT)
    cache.write(1, _hostile_batch(), meta_info={"note" + PAYLOAD: "bad\ud800" + PAYLOAD})
    cache.set_attributes({"tokenizer": str(TOKENIZER_PATH)})
    view = zs.open_cache(root, experiment=EXPERIMENT).load(1)
    return {
        "pretty(cache)": pretty(cache),
        "pretty(view)": pretty(view),
        "pretty(column)": pretty(view[COLUMN]),
        "pretty(data_source)": pretty(view["data_source"]),
        "repr(rollout)": repr(view.rollout(0)),
        "repr(group)": repr(view.group(row=0)),
        "repr(page)": repr(view.page(0)),
        "repr(find)": repr(view.find()),
    }


@pytest.mark.parametrize(
    "what",
    ["pretty(cache)", "pretty(view)", "pretty(column)", "pretty(data_source)"]
    + ["repr(rollout)", "repr(group)", "repr(page)", "repr(find)"],
)
def test_views_as_text_show_stored_values_escaped(drawn: dict[str, str], what: str) -> None:
    """``view.rollout(0)`` (or a group, a page, a step) at a Python prompt printed the stored
    uid, data source, chat role, meta_info and response with their control characters raw (a
    window title set, the screen cleared), and a lone surrogate made the print raise
    UnicodeEncodeError; they are shown escaped, as the CLI shows them."""
    text = drawn[what]
    assert not RAW.findall(text), (RAW.findall(text), text[:2000])
    text.encode("utf-8")  # no lone surrogate: the terminal can print it
