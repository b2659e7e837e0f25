"""Habits the repository keeps: the README's first example runs as written, the hooks run what
``make lint`` runs, the changelog has a section per version, helpers are not fixtures."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


def _first_python_block(text: str) -> str:
    match = re.search(r"^```python\n(.*?)^```", text, re.S | re.M)
    assert match, "README.md has no ```python block"
    return match.group(1)


def test_the_readme_s_first_example_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code = _first_python_block((ROOT / "README.md").read_text())
    monkeypatch.chdir(tmp_path)  # its cache is the relative path runs/cache
    namespace: dict[str, Any] = {"__name__": "readme"}
    exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 - the project's own README
    cache = namespace["cache"]
    assert cache.steps() == [12] and (tmp_path / "runs" / "cache").is_dir()
    assert len(namespace["view"]) == len(namespace["batch_a"]) + len(namespace["batch_b"])


def test_the_pre_commit_hooks_run_what_make_lint_runs() -> None:
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    hooks = {h["id"]: h for repo in config["repos"] for h in repo["hooks"]}
    assert set(hooks) == {"ruff", "ruff-format", "mypy"}
    lint = (ROOT / "Makefile").read_text().split("\nlint:", 1)[1].split("\n\n", 1)[0]
    for hook in hooks.values():
        tool = hook["entry"].split()[0].removeprefix(".venv/bin/")
        assert f"$(VENV)/bin/{tool}" in lint, f"{hook['id']}: make lint does not run {tool}"
    assert hooks["mypy"]["pass_filenames"] is False  # the files of [tool.mypy], as make lint


def test_mypy_is_strict_but_where_verl_is_subclassed() -> None:
    mypy = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert mypy["strict"] is True and mypy["files"] == ["zarr_skip"]  # what make lint and the hook check
    relaxed = {
        module: sorted(k for k, v in override.items() if v is False)
        for override in mypy["overrides"]
        for module in override["module"]
        if False in override.values()
    }
    # verl is untyped and installed only in .venv-verl: the one module that subclasses it
    assert relaxed == {"zarr_skip.integrations._verl_skip": ["disallow_subclassing_any", "warn_unused_ignores"]}


def test_the_changelog_has_an_unreleased_section_and_one_per_version() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    sections = re.findall(r"^## (.+)$", text, re.M)
    assert sections[0] == "Unreleased"
    version = re.search(r'^version = "(.+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert version and version.group(1) in sections


def test_test_modules_import_helpers_not_conftest() -> None:
    offenders = [
        p.name for p in (ROOT / "tests").rglob("*.py") if re.search(r"^from conftest import", p.read_text(), re.M)
    ]
    assert offenders == [], "import shared helpers from tests/helpers.py"


def test_the_verl_environment_installs_zarr_skips_own_dependencies() -> None:
    """zarr_skip goes into .venv-verl with --no-deps: requirements-verl.txt lists what it needs."""
    wanted = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    lines = (ROOT / "requirements-verl.txt").read_text().splitlines()
    listed = {line.split("#")[0].strip() for line in lines}
    assert [d for d in wanted if not d.startswith("torch") and d not in listed] == []
