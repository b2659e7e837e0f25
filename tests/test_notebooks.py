"""Every notebook runs headless from top to bottom on a fixture cache given by its parameter
(``$ZARR_SKIP_CACHE``); its outputs are checked from here (the notebooks hold no asserts) and its
figures are saved as PNG files.

The figures go to ``$ZARR_SKIP_FIGURES`` (default ``notebooks/figures/``), one file per image
output, named ``{notebook}-cell{NN}-{k}.png``, so they can be looked at after a test run.
"""

from __future__ import annotations

import base64
import os
import sys
from pathlib import Path
from typing import Any

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
FIGURES = Path(os.environ.get("ZARR_SKIP_FIGURES") or ROOT / "notebooks" / "figures")
#: image outputs a notebook must produce (a figure that silently disappears fails the test)
EXPECTED_FIGURES = {"browse_cache": 6}
#: text its HTML outputs must hold (the objects' _repr_html_ was used, not their text repr)
EXPECTED_HTML = {
    "browse_cache": [
        ">complete</span>",
        "meta_info",
        # the readable views: a rollout's tokens by log-prob, a group's marks, a search, a page
        'class="zs-t zs-p0"',
        "token probability under the sampling policy",
        "★ best",
        "truncated at 96",
        "step 3: rows with truncated=True",
        "step 3: rows with score=0, text=&quot;\\\\boxed\\{\\d+\\}&quot;",  # the pattern as typed
        "step 3: page 1 of 16 (rows 8–15 of 128)",
    ],
}
#: the last cell, added here: proves the kernel runs the interpreter running the tests
WHICH_PYTHON = "import sys; print(sys.prefix, end='')"


def outputs(nb: Any, kind: str) -> list[tuple[int, int, Any]]:
    return [
        (i, j, out)
        for i, cell in enumerate(nb.cells)
        for j, out in enumerate(cell.get("outputs", []))
        if out.get("output_type") == kind or kind in out.get("data", {})
    ]


def save_figures(nb: Any, stem: str) -> list[Path]:
    FIGURES.mkdir(parents=True, exist_ok=True)
    for old in FIGURES.glob(f"{stem}-cell*.png"):
        old.unlink()
    saved = []
    for i, j, out in outputs(nb, "image/png"):
        path = FIGURES / f"{stem}-cell{i:02d}-{j}.png"
        path.write_bytes(base64.b64decode(out["data"]["image/png"]))
        saved.append(path)
    return saved


def _transparent_corner(png: Path) -> bool:
    from PIL import Image

    with Image.open(png) as img:
        return img.mode == "RGBA" and img.getpixel((1, 1))[3] == 0


def _signal_lines(nb: Any) -> list[str]:
    return [
        line
        for _, _, out in outputs(nb, "stream")
        if out.get("name") == "stdout"
        for line in out["text"].splitlines()
        if line.split()[:2][-1:] == ["all"]
    ]


def test_the_notebook_is_a_starting_point() -> None:
    nb = nbformat.read(ROOT / "notebooks" / "browse_cache.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert not [c.source for c in code if "assert " in c.source]  # the checks live here
    first = code[0]
    assert first.metadata.get("tags") == ["parameters"]
    assert 'LOCATION = os.environ.get("ZARR_SKIP_CACHE", "../demo_cache")' in first.source
    assert "follow_theme()" in code[1].source


def test_find_titles_show_strings_as_typed(tmp_path: Path) -> None:
    import zarr_skip as zs
    from zarr_skip import demo

    demo.write_text_steps(tmp_path / "c", range(1, 2))
    view = zs.open_cache(tmp_path / "c").load(1)
    assert view.find(text=r"\boxed\{", regex=True).title == 'step 1: rows with text="\\boxed\\{"'


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_and_saves_its_figures(path: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from zarr_skip import demo
    from zarr_skip import open_cache as open_
    from zarr_skip.views.signals import step_signals

    # the kernel (and the processes it starts) import zarr_skip from this checkout
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    demo.write_text_steps(tmp_path / "cache", range(1, 4))  # the parameter: the notebook opens this cache
    monkeypatch.setenv("ZARR_SKIP_CACHE", str(tmp_path / "cache"))
    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(WHICH_PYTHON))
    # "python3" is the kernel ipykernel provides to the interpreter running this test; jupyter_client
    # starts it with sys.executable, checked by the last cell
    client = nbclient.NotebookClient(
        nb, kernel_name="python3", timeout=120, resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError, with the cell and traceback, on any error

    which = nb.cells.pop()
    assert "".join(o.get("text", "") for o in which.outputs) == sys.prefix
    stderr = [out["text"] for _, _, out in outputs(nb, "stream") if out.get("name") == "stderr"]
    assert not stderr, f"{path.name} wrote to stderr:\n" + "\n".join(stderr)
    page = "".join(out["data"]["text/html"] for _, _, out in outputs(nb, "text/html"))
    for text in EXPECTED_HTML.get(path.stem, []):
        assert text in page, text
    saved = save_figures(nb, path.stem)
    if path.stem in EXPECTED_FIGURES:
        assert len(saved) == EXPECTED_FIGURES[path.stem], [p.name for p in saved]
    for png in saved:
        assert png.read_bytes().startswith(b"\x89PNG") and png.stat().st_size > 5000, png
        assert _transparent_corner(png), f"{png.name}: not transparent, so it stays white in a dark theme"
    if path.stem == "browse_cache":
        cache = open_(tmp_path / "cache")
        lines = _signal_lines(nb)
        assert [int(line.split()[0]) for line in lines] == cache.steps()
        for line in lines:
            s = step_signals(cache.load(int(line.split()[0])))[0]
            assert line.split()[2:5] == [str(s.rows), f"{s.score_mean:.1f}", f"{s.accuracy:.0%}"]
        report = (tmp_path / "report.html").read_text()
        assert 'id="signals"' in report and 'id="step-1"' in report and 'id="step-3"' in report


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebooks_are_stored_without_outputs(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in nb.cells if c.cell_type == "code")
