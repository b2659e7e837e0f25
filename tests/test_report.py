"""The HTML report: one self-contained file, checked as text and in headless Chromium.

The browser test loads the file in Debian's Chromium (driven over the DevTools protocol, see
``tests/_browser.py``), in the light and the dark colour scheme, checks the DOM (steps, rollout
cards, decoded text, plots loaded, the theme's colours), that nothing was logged to the console
and that no resource failed to load, and keeps full-page screenshots under the test's tmp_path.
"""

from __future__ import annotations

import html
import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _browser import Browser, missing
from test_signals import expected_signals, uneven_groups

import zarr_skip as zs
from zarr_skip.cli.main import main
from zarr_skip.notebook.report import report_html, write_report
from zarr_skip.synthetic import TOKENIZER_PATH, text_rollouts

pytest.importorskip("matplotlib")
pytest.importorskip("tokenizers")

HOSTILE = '<img src=x onerror="alert(1)">'
FP = {
    "experiment_name": "e",
    "project_name": "p",
    "gen_batch_size": 4,
    "n": 4,
    "max_prompt_length": 128,
    "max_response_length": 96,
}
GROUPS, N = 4, 4
VOID = {"meta", "img", "br", "hr", "input", "link", "source"}


class Checker(HTMLParser):
    """Balanced tags (void elements aside), and every ``src`` / ``href`` that is not inline."""

    def __init__(self) -> None:
        super().__init__()
        self.open: list[str] = []
        self.outside: list[str] = []
        self.handlers: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for k, v in attrs:
            if k in ("src", "href") and not (v or "").startswith(("data:", "#")):
                self.outside.append(f"{tag} {k}={v}")
            if k.startswith("on"):
                self.handlers.append(f"{tag} {k}={v}")
        if tag not in VOID:
            self.open.append(tag)

    def handle_endtag(self, tag: str) -> None:
        assert self.open and self.open.pop() == tag, tag


def write_cache(location: Path) -> zs.Cache:
    """Steps 1-3 of readable GRPO rollouts; step 2's prompts, uids and sources are hostile."""
    cache = zs.open_cache(location, FP)
    for step in (1, 2, 3):
        batch = text_rollouts(GROUPS, N, seed=step, step=step)
        if step == 2:
            batch["data_source"] = [HOSTILE] * len(batch["data_source"])
            batch["uid"] = [f"{u}{HOSTILE}" for u in batch["uid"]]
            batch["raw_prompt"] = [
                [{"role": "user", "content": HOSTILE + m[0]["content"]}] for m in batch["raw_prompt"]
            ]
        cache.write(step, batch, meta_info={"global_steps": step})
    return cache


@pytest.fixture
def cache(tmp_path: Path) -> zs.Cache:
    write_cache(tmp_path / "cache")
    return zs.open_cache(tmp_path / "cache")


def decoded(cache: zs.Cache, step: int, row: int) -> str:
    return cache.load(step).text(rows=[row], tokenizer=TOKENIZER_PATH)[0]


def test_the_report_is_one_self_contained_file(cache: zs.Cache, tmp_path: Path) -> None:
    path = write_report(cache, tmp_path / "report.html", [1, 2], tokenizer=TOKENIZER_PATH)
    page = path.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    checker = Checker()
    checker.feed(page)
    assert checker.open == ["html"] or not checker.open  # html closes last
    assert checker.outside == [] and checker.handlers == []
    for banned in ("<script src", "<link", "@import", "url(", "http://", "https://"):
        assert banned not in page, banned
    assert page.count("<script>") == 1  # the optional sorting and filtering, inline
    assert HOSTILE not in page and html.escape(HOSTILE) in page
    # the step table lists every step; rollouts of the chosen ones, whole groups
    assert re.findall(r'<section class="zs-step" id="step-(\d+)"', page) == ["1", "2"]
    assert page.count('class="zs-card') == 2 * GROUPS * N
    assert page.count('<div class="zs-group"') == 2 * GROUPS
    assert html.escape(decoded(cache, 1, 0)) in page and html.escape(decoded(cache, 2, 5)) in page
    assert "★ best" in page and "✗ worst" in page and "truncated at 96" in page
    # plots: 4 signals per step, 4 per data source (when there are several), mini-batches; light and dark
    sources = {str(x) for s in (1, 2, 3) for x in cache.load(s)["data_source"][:]}
    plots = 4 + (4 if len(sources) > 1 else 0) + 1
    assert len(re.findall(r"<figure data-plot=", page)) == plots
    assert (
        len(re.findall(r'<img class="zs-plot-(light|dark)" alt="[^"]+" src="data:image/png;base64,', page)) == 2 * plots
    )
    # what an RL team reads first comes first; the storage details (mini-batches, bytes) last
    order = [page.index(f'id="{key}"') for key in ("signals", "sources", "step-1", "step-2", "storage")]
    assert order == sorted(order)
    assert page.index("rows per mini-batch") > page.index('id="storage"')
    assert "<script>" not in report_html(cache, [1], plots=False, script=False)


def test_the_report_shows_whole_groups_up_to_rows_and_ids_without_a_tokenizer(cache: zs.Cache) -> None:
    page = report_html(cache, [3], rows=5, plots=False)
    assert page.count('class="zs-card') == 2 * N  # the group that reaches 5 rows is kept whole
    assert "no tokenizer: token ids shown" in page and "<figure" not in page
    assert "showing 8 (2 groups)" in page
    with pytest.raises(zs.ConfigError, match=r"steps \[7\]: not complete"):  # a ZarrSkipError
        report_html(cache, [7])


def test_the_report_shows_padded_steps_steps_without_uids_and_without_responses(tmp_path: Path) -> None:
    cache = zs.open_cache(tmp_path / "cache", FP)
    cache.write(1, text_rollouts(2, N, seed=0, padded=True))
    cache.write(2, {k: v for k, v in text_rollouts(2, N, seed=1).items() if k != "uid"})
    cache.write(3, {"x": np.arange(4)})
    page = report_html(cache, [1, 2, 3], tokenizer=TOKENIZER_PATH, plots=False)
    step1, step2, step3 = page.split('<section class="zs-step"')[1:]
    assert step1.count('class="zs-card') == 2 * N and "truncated at 96" in step1
    assert html.escape(decoded(cache, 1, 0)) in step1  # padding dropped: the same text as StepView.text
    assert step2.count('<details class="zs-rollout"') == 2 * N and 'class="zs-card' not in step2
    assert "no responses column (columns: x)" in step3


@pytest.fixture(scope="module")
def browser() -> Any:
    reason = missing()
    if reason:
        pytest.skip(reason)
    with Browser() as b:
        yield b


@pytest.mark.slow
def test_the_browser_sees_console_errors_and_failed_loads(browser: Browser, tmp_path: Path) -> None:
    page = tmp_path / "bad.html"
    page.write_text('<!DOCTYPE html><img src="missing.png"><script>console.error("boom")</script>')
    browser.open(page)
    browser.evaluate("1")
    problems = browser.problems()
    assert any("console.error: boom" in p for p in problems), problems
    assert any("missing.png" in p for p in problems), problems


JS_STATE = """(() => {
  const shown = el => getComputedStyle(el).display !== 'none';
  const imgs = [...document.images];
  const cells = key => [...document.querySelectorAll(`table[data-table="${key}"] tbody tr`)].map(
    r => [...r.cells].map(c => (c.dataset.v !== undefined ? c.dataset.v : c.textContent)));
  return {
    steps: [...document.querySelectorAll('section.zs-step')].map(s => s.dataset.step),
    cards: document.querySelectorAll('.zs-card').length,
    best: document.querySelectorAll('.zs-card.zs-best').length,
    text: document.body.innerText,
    loaded: imgs.every(i => i.complete && i.naturalWidth > 0),
    light: imgs.filter(i => i.classList.contains('zs-plot-light') && shown(i)).length,
    dark: imgs.filter(i => i.classList.contains('zs-plot-dark') && shown(i)).length,
    background: getComputedStyle(document.querySelector('.zs-page')).backgroundColor,
    colour: getComputedStyle(document.querySelector('.zs-page')).color,
    storage: document.querySelectorAll('#storage table.zs-table tbody tr').length,
    signals: cells('steps'),
    list: cells('rollouts-1'),
    visible: [...document.querySelectorAll('table[data-table="rollouts-1"] tbody tr')].filter(r => !r.hidden).length,
    filters: document.querySelectorAll('.zs-filter').length,
    plotsTop: document.querySelector('#signals figure').getBoundingClientRect().top,
  };
})()"""
PLOTS = 9  # 4 signals per step, 4 per data source, rows per mini-batch


def _luminance(css: str) -> float:
    r, g, b = (int(x) for x in re.findall(r"\d+", css)[:3])
    return (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255


def _check_figures(cache: zs.Cache, state: dict[str, Any]) -> None:
    """The page's signal table and rollout list say what ``load()`` gives."""
    assert [int(r[0]) for r in state["signals"]] == [1, 2, 3]
    for row in state["signals"]:
        want = expected_signals(cache.load(int(row[0])))[None]
        for cell, key in ((3, "score_mean"), (5, "accuracy"), (6, "same_score_groups"), (7, "length_mean")):
            assert float(row[cell]) == pytest.approx(want[key], rel=1e-5), key
        for cell, key in ((8, "length_correct"), (9, "length_wrong"), (10, "truncated")):
            assert (row[cell] == "") if want[key] is None else float(row[cell]) == pytest.approx(want[key], rel=1e-5)
    view = cache.load(1)
    truths = [m["ground_truth"] for m in view["reward_model"][:]]
    scores = [float(x) for x in view["score"][:]]
    assert len(state["list"]) == GROUPS * N
    for cells in state["list"]:
        row = int(cells[0])
        assert cells[8] == truths[row] and float(cells[5]) == scores[row]  # the ground truth beside the answer
    for truth in set(truths):
        assert f"ground truth: {truth}" in state["text"]


@pytest.mark.slow
@pytest.mark.parametrize("dark", [False, True], ids=["light", "dark"])
def test_the_report_in_chromium(browser: Browser, cache: zs.Cache, tmp_path: Path, dark: bool) -> None:
    path = write_report(cache, tmp_path / "report.html", [1, 2], tokenizer=TOKENIZER_PATH)
    browser.open(path, dark=dark)
    state = browser.evaluate(JS_STATE)
    shot = browser.screenshot(tmp_path / f"report-{'dark' if dark else 'light'}.png")
    assert browser.problems() == []
    assert state["steps"] == ["1", "2"] and state["cards"] == 2 * GROUPS * N and state["best"] > 0
    assert state["storage"] == 3  # the step table, in the storage section
    for step, row in ((1, 0), (1, 7), (2, 5)):
        assert decoded(cache, step, row).split("\n")[0] in state["text"]
    assert HOSTILE in state["text"]  # shown as text, never run
    assert state["loaded"] and (state["light"], state["dark"]) == ((0, PLOTS) if dark else (PLOTS, 0))
    assert state["plotsTop"] < 900  # the plots start above the fold
    bg, fg = _luminance(state["background"]), _luminance(state["colour"])
    assert (bg < 0.2 and fg > 0.7) if dark else (bg > 0.9 and fg < 0.3), state["background"]
    assert shot.read_bytes().startswith(b"\x89PNG") and shot.stat().st_size > 50_000
    _check_figures(cache, state)
    assert state["filters"] == 2 and state["visible"] == GROUPS * N


JS_SORT = """(() => {
  const table = document.querySelector('table[data-table="rollouts-1"]');
  const th = table.tHead.rows[0].cells[%d];
  th.click();
  const up = [...table.tBodies[0].rows].map(r => r.cells[%d].dataset.v);
  th.click();
  const down = [...table.tBodies[0].rows].map(r => r.cells[%d].dataset.v);
  const steps = document.querySelector('table[data-table="steps"]');
  steps.tHead.rows[0].cells[0].click(); steps.tHead.rows[0].cells[0].click();
  const order = [...steps.tBodies[0].rows].map(r => r.dataset.step);
  return {up, down, order, dir: th.dataset.dir};
})()"""
JS_FILTER = """((kind, text) => {
  const table = document.querySelector('table[data-table="rollouts-1"]');
  const bar = table.previousElementSibling, box = bar.querySelector('input'), pick = bar.querySelector('select');
  pick.value = kind; pick.dispatchEvent(new Event('change'));
  box.value = text; box.dispatchEvent(new Event('input'));
  const rows = [...table.tBodies[0].rows].filter(r => !r.hidden);
  return {rows: rows.map(r => r.dataset.row), correct: rows.map(r => r.dataset.correct), count: bar.innerText};
})"""


def test_the_reports_script_sorts_and_filters(browser: Browser, cache: zs.Cache, tmp_path: Path) -> None:
    path = write_report(cache, tmp_path / "report.html", [1], tokenizer=TOKENIZER_PATH, plots=False)
    browser.open(path)
    for column in (3, 5):  # length, score: numbers sort as numbers
        got = browser.evaluate(JS_SORT % (column, column, column))
        assert [float(v) for v in got["up"]] == sorted(float(v) for v in got["up"])
        assert [float(v) for v in got["down"]] == sorted((float(v) for v in got["up"]), reverse=True)
        assert got["dir"] == "desc" and got["order"] == ["3", "2", "1"]
    scores = [float(x) for x in cache.load(1)["score"][:]]
    wrong = browser.evaluate(JS_FILTER + '("wrong", "")')
    assert sorted(map(int, wrong["rows"])) == [i for i, x in enumerate(scores) if x == 0]
    assert set(wrong["correct"]) == {"no"} and f"{len(wrong['rows'])} of {GROUPS * N} shown" in wrong["count"]
    uid = str(cache.load(1)["uid"][0])
    group = browser.evaluate(JS_FILTER + f'("", "{uid[:8]}")')
    assert sorted(map(int, group["rows"])) == [i for i, u in enumerate(cache.load(1)["uid"][:]) if u == uid]
    assert browser.problems() == []


def test_the_report_is_complete_without_javascript(browser: Browser, cache: zs.Cache, tmp_path: Path) -> None:
    path = write_report(cache, tmp_path / "report.html", [1, 2], tokenizer=TOKENIZER_PATH)
    browser.open(path, scripts=False)
    state = browser.evaluate(JS_STATE)
    assert browser.problems() == []
    assert state["filters"] == 0  # the script did not run: no controls that would do nothing
    assert state["steps"] == ["1", "2"] and state["cards"] == 2 * GROUPS * N
    assert state["loaded"] and state["light"] == PLOTS and state["visible"] == GROUPS * N
    _check_figures(cache, state)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_report_command(cache: zs.Cache, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    loc, out = str(tmp_path / "cache"), tmp_path / "r.html"
    code, stdout, err = run(capsys, "report", loc, "1-2", "-o", str(out), "--tokenizer", str(TOKENIZER_PATH))
    assert code == 0, err
    assert stdout.startswith(f"wrote {out} (") and "rollouts of [1, 2]" in stdout
    page = out.read_text()
    assert html.escape(decoded(cache, 1, 0)) in page and page.count('class="zs-card') == 2 * GROUPS * N
    code, stdout, err = run(capsys, "report", loc, "-o", str(out), "--no-plots", "1", "3")  # steps after options
    assert code == 0 and "rollouts of [1, 3]" in stdout, err
    code, _, err = run(capsys, "report", loc, "-o", str(out), "--bogus")
    assert code == 2 and "unrecognized arguments: --bogus" in err
    code, stdout, err = run(capsys, "report", loc, "-o", str(out), "--json", "--no-plots", "--rows", "4")
    assert code == 0, err
    doc = json.loads(stdout)
    assert doc["steps"] == [3] and doc["decoded"] is False and doc["bytes"] == out.stat().st_size
    assert "no tokenizer given or recorded" in err and "<figure" not in out.read_text()
    assert "zs-tokens" not in out.read_text()
    code, _, err = run(
        capsys, "report", loc, "2", "-o", str(out), "--no-plots", "--tokens", "--tokenizer", str(TOKENIZER_PATH)
    )
    assert code == 0, err
    page = out.read_text()  # each response's tokens, folded, under one legend
    assert page.count("class='zs-text zs-tokens'") == GROUPS * N and page.count("token probability under") == 1


def test_the_report_command_uses_the_recorded_tokenizer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cache = write_cache(tmp_path / "cache")
    cache.set_attributes({"tokenizer": str(TOKENIZER_PATH)})
    out = tmp_path / "r.html"
    code, _, err = run(capsys, "report", str(tmp_path / "cache"), "3", "-o", str(out), "--no-plots")
    assert code == 0 and "no tokenizer" not in err
    assert html.escape(decoded(cache, 3, 0)) in out.read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["9"], "step(s) 9: not complete steps of"),
        (["--rows", "0"], "--rows 0: expected a positive number"),
        (["--tokenizer", "no/such/tokenizer.json"], "is not a local file or directory"),
    ],
)
def test_the_report_command_refuses_bad_input(
    cache: zs.Cache, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    out = tmp_path / "r.html"
    code, _, err = run(capsys, "report", str(tmp_path / "cache"), *args, "-o", str(out))
    assert code == 2 and message in err, err
    assert not out.exists()
    code, _, err = run(capsys, "report", str(tmp_path / "cache"), "-o", str(tmp_path / "nodir" / "r.html"))
    assert code == 2 and "does not exist" in err


def test_write_report_refuses_a_directory_and_leaves_no_partial_file(cache: zs.Cache, tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    with pytest.raises(zs.ConfigError, match="is a directory; name the .html file"):
        write_report(cache, tmp_path / "out", [1], plots=False)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(zs.StorageError, match="afile/r.html'.*cannot write it"):  # was a bare NotADirectoryError
        write_report(cache, tmp_path / "afile" / "r.html", [1], plots=False)
    write_report(cache, tmp_path / "out" / "r.html", [1], plots=False)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["r.html"]  # the temp file is gone


JP_DARK = "--jp-layout-color0:#111111;--jp-content-font-color1:#eeeeee;--jp-ui-font-family:sans-serif"
JP_LIGHT = "--jp-layout-color0:#ffffff;--jp-content-font-color1:#222222;--jp-ui-font-family:sans-serif"
JS_VIEW = """(() => {
  const view = document.querySelector('.zs-r'), hot = document.querySelector('.zs-tokens .zs-t[class*="zs-p"]');
  return {bg: getComputedStyle(view).backgroundColor, fg: getComputedStyle(view).color,
          hot: getComputedStyle(hot).backgroundColor, tokens: document.querySelectorAll('.zs-tokens .zs-t').length,
          title: hot.title};
})()"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("scheme", "body", "dark"),
    [
        ("light", "", False),
        ("dark", "", True),
        ("light", f'data-jp-theme-light="false" style="{JP_DARK}"', True),  # JupyterLab's dark theme
        ("dark", f'data-jp-theme-light="true" style="{JP_LIGHT}"', False),  # a light JupyterLab on a dark system
        ("dark", 'class="vscode-light"', False),
    ],
    ids=["light", "dark", "jupyterlab-dark", "jupyterlab-light-on-dark-os", "vscode-light"],
)
def test_a_rollout_view_follows_the_theme_in_chromium(
    browser: Browser, cache: zs.Cache, tmp_path: Path, scheme: str, body: str, dark: bool
) -> None:
    shown = cache.load(1).rollout(0, tokenizer=TOKENIZER_PATH)
    page = tmp_path / "view.html"
    page.write_text(
        f"<!DOCTYPE html><html><head><meta charset=utf-8></head><body {body}>{shown._repr_html_()}</body></html>"
    )
    browser.open(page, dark=scheme == "dark")
    state = browser.evaluate(JS_VIEW)
    browser.screenshot(tmp_path / f"view-{scheme}.png")
    assert browser.problems() == []
    bg, fg = _luminance(state["bg"]), _luminance(state["fg"])
    assert (bg < 0.2 and fg > 0.7) if dark else (bg > 0.9 and fg < 0.3), state
    if "jp-layout-color0" in body:  # Jupyter's own colours win
        assert state["bg"] == ("rgb(17, 17, 17)" if dark else "rgb(255, 255, 255)"), state
    assert state["hot"] not in ("rgba(0, 0, 0, 0)", "transparent") and "logprob -" in state["title"]
    assert state["tokens"] == shown.rollout.length


def test_a_long_run_folds_its_table_under_the_plots(tmp_path: Path) -> None:
    cache = zs.open_cache(tmp_path / "cache", FP)
    for step in range(1, 13):
        cache.write(step, text_rollouts(2, 2, seed=0, step=step))
    page = report_html(cache, plots=True)
    signals = page[page.index('id="signals"') : page.index('id="sources"')]
    assert signals.index("<figure") < signals.index("<details>")  # plots first, the 12-step table folded
    assert "<details><summary>figures of 12 step(s)</summary>" in signals
    short = report_html(zs.open_cache(tmp_path / "cache"), plots=False)
    assert "<details open><summary>figures of 12" not in short and "rows per mini-batch" not in short


def test_the_report_command_writes_report_html_by_default(
    cache: zs.Cache, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, stdout, err = run(capsys, "report", str(tmp_path / "cache"), "1", "--no-plots", "--no-script")
    assert code == 0, err
    page = (tmp_path / "report.html").read_text()
    assert stdout.startswith("wrote report.html (") and "<script>" not in page and 'id="step-1"' in page


def test_the_same_score_share_names_the_groups_it_is_of(tmp_path: Path) -> None:
    cache = zs.open_cache(tmp_path / "cache", FP)
    cache.write(1, uneven_groups())
    page = report_html(cache, [1], plots=False)
    assert '<td class="zs-num" data-v="0.5">50.0% of 4</td>' in page  # 2 of the 4 groups of 2+ answers, not of 8


def test_a_nan_score_is_neither_correct_nor_wrong_nor_in_the_mean(tmp_path: Path) -> None:
    import torch

    cache = zs.open_cache(tmp_path / "cache", FP)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]])
    scores = torch.tensor([float("nan"), 1.0, 0.0, 1.0])
    cache.write(1, {"responses": mask * 7, "response_mask": mask, "score": scores, "uid": ["a", "a", "b", "b"]})
    page = report_html(cache, [1], plots=False)
    assert "mean score of those shown 0.6667" in page  # was: nan
    assert re.findall(r'<tr data-row="(\d)" data-correct="(\w*)"', page) == [
        ("0", ""),  # the filter's "wrong" took it
        ("1", "yes"),
        ("2", "no"),
        ("3", "yes"),
    ]
