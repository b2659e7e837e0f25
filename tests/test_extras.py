"""Optional dependencies: every extra is named in the README with what needs it, ``[all]`` holds
them all, and each missing package raises MissingExtraError naming its extra (the package is
hidden from the import system for the test)."""

from __future__ import annotations

import re
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import zarr_skip as zs
from zarr_skip import plots
from zarr_skip.cli.main import main
from zarr_skip.integrations.ray import read_rollouts

ROOT = Path(__file__).resolve().parent.parent
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
FP = {
    "experiment_name": "e",
    "project_name": "p",
    "gen_batch_size": 2,
    "n": 2,
    "max_prompt_length": 8,
    "max_response_length": 8,
}


def test_every_extra_is_in_the_readme_and_in_all() -> None:
    readme = (ROOT / "README.md").read_text()
    named = set(EXTRAS) - {"test", "all"}
    for extra in sorted(named | {"all"}):
        assert re.search(rf"\|\s*`\[{extra}\]`\s*\|", readme), f"README's extras table lacks [{extra}]"
    (bundle,) = EXTRAS["all"]
    inside = set(re.fullmatch(r"zarr-skip\[([\w,-]+)\]", bundle).group(1).split(","))  # type: ignore[union-attr]
    assert inside == named - {"bench"}  # benchmark-only, not a user's


def hide(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """Make ``import NAME`` (and its submodules) fail as if NAME were not installed."""
    for mod in list(sys.modules):
        if any(mod == n or mod.startswith(n + ".") for n in names):
            monkeypatch.delitem(sys.modules, mod)
    for n in names:
        monkeypatch.setitem(sys.modules, n, None)


@pytest.fixture
def cache(tmp_path: Path) -> zs.Cache:
    cache = zs.open_cache(tmp_path / "c", FP)
    cache.write(1, {"responses": torch.arange(8).reshape(2, 4), "score": torch.tensor([0.0, 1.0])})
    return cache


def _read_legacy(tmp_path: Path) -> Any:
    from zarr_skip.legacy.dumps import read_minibatch

    return read_minibatch(tmp_path / "legacy" / "1")


CASES: list[tuple[str, tuple[str, ...], Callable[[zs.Cache, Path], Any]]] = [
    ("notebooks", ("matplotlib",), lambda c, t: plots.plot_scores(c)),
    ("pandas", ("pandas",), lambda c, t: c.table()),
    ("export", ("pyarrow",), lambda c, t: c.export(t / "r.parquet")),
    ("text", ("tokenizers",), lambda c, t: c.load(1).text(tokenizer=t / "tokenizer.json")),
    ("tensordict", ("tensordict",), lambda c, t: _read_legacy(t)),
    ("tensordict", ("tensordict",), lambda c, t: c.load(1).to_tensordict()),
    ("s3", ("obstore", "s3fs"), lambda c, t: zs.open_cache("s3://bucket/cache", FP)),
    ("ray", ("ray",), lambda c, t: read_rollouts(c.location)),
]


@pytest.mark.parametrize(("extra", "modules", "use"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_a_missing_extra_is_named(
    cache: zs.Cache,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    extra: str,
    modules: tuple[str, ...],
    use: Callable[[zs.Cache, Path], Any],
) -> None:
    (tmp_path / "tokenizer.json").write_text("{}")
    if extra == "tensordict":  # a verl dump to import, written while tensordict is there
        from zarr_skip.legacy import _unpickle
        from zarr_skip.legacy.write import write_legacy_dp
        from zarr_skip.synthetic import Preset, padded_batch

        write_legacy_dp(tmp_path / "legacy" / "1", padded_batch(Preset(rows=4, max_prompt=8, max_response=8, n=2)))
        monkeypatch.setattr(_unpickle, "_ALLOWED", {})  # the allowed globals are gathered on first use
    hide(monkeypatch, *modules)
    with pytest.raises(zs.MissingExtraError, match=re.escape(f"pip install 'zarr-skip[{extra}]'")):
        use(cache, tmp_path)


def test_the_report_command_without_matplotlib(
    cache: zs.Cache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    hide(monkeypatch, "matplotlib")
    out = tmp_path / "r.html"
    code = main(["report", str(cache.location), "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 1 and "pip install 'zarr-skip[notebooks]'" in err and "--no-plots" in err, err
    assert "ModuleNotFoundError" not in err and not out.exists()
    assert main(["report", str(cache.location), "-o", str(out), "--no-plots"]) == 0  # the rest needs no extra
    assert out.exists()
