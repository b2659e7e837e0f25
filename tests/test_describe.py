"""A store other tools can read: array documents describe themselves; the recipes of
docs/format.md ("Reading with plain zarr", "Reading with xarray") run as written."""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import assert_equal, make_batch, unpack_to_tree

import zarr_skip as zs
from zarr_skip.format.describe import ARRAY_ATTR

DOC = Path(__file__).parent.parent / "docs" / "format.md"


def _recipe(heading: str) -> str:
    """The python code block under ``heading`` in docs/format.md."""
    text = DOC.read_text()
    section = text.split(f"### {heading}\n", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1, heading
    return blocks[0]


@pytest.fixture
def written(tmp_path: Path, fingerprint: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    batch = make_batch(8)
    batch["uid"] = [f"uid-{i // 4}" for i in range(8)]  # repeats: dictionary-encoded
    cache = zs.open_cache(tmp_path / "c", fingerprint, chunk_bytes=64)
    cache.write(1, batch)
    assert "codes" in cache.load(1)._parts[0].arrays["uid"]
    return tmp_path / "c", batch


def _array_docs(root: Path) -> dict[str, dict[str, Any]]:
    """Every array document, of the packed data files' members and of files."""
    docs = {}
    for meta in root.rglob("zarr.json"):
        doc = json.loads(meta.read_text())
        if doc["node_type"] == "array":
            docs[str(meta.parent.relative_to(root))] = doc
    for file in root.rglob("*.zip"):
        with zipfile.ZipFile(file) as zf:
            for name in zf.namelist():
                if name.endswith("zarr.json") and (doc := json.loads(zf.read(name)))["node_type"] == "array":
                    docs[f"{file.relative_to(root)}/{name.rpartition('/')[0]}"] = doc
    return docs


def test_every_array_names_its_column_role_dims_and_logical_dtype(written: tuple[Path, dict[str, Any]]) -> None:
    root, _ = written
    docs = _array_docs(root)
    assert len(docs) == 14
    by = {(d["attributes"][ARRAY_ATTR]["column"], d["attributes"][ARRAY_ATTR]["role"]): d for d in docs.values()}
    for doc in docs.values():
        about = doc["attributes"][ARRAY_ATTR]
        assert len(doc["dimension_names"]) == len(doc["shape"])
        assert all(n.startswith(about["column"] + ".") for n in doc["dimension_names"])
        assert about["stored_dtype"] == doc["data_type"] and about["description"]
    bf16 = by["bf16", "data"]
    assert bf16["attributes"][ARRAY_ATTR]["dtype"] == "bfloat16" and bf16["data_type"] == "uint16"
    ids = by["input_ids", "data"]
    assert (ids["attributes"][ARRAY_ATTR]["dtype"], ids["data_type"]) == ("int64", "uint32")
    assert ids["dimension_names"] == ["input_ids.row", "input_ids.dim1"]
    resp = by["responses", "values"]
    assert resp["dimension_names"] == ["responses.value"]
    assert resp["attributes"][ARRAY_ATTR]["dtype"] == "int64"
    assert by["responses", "lengths"]["dimension_names"] == ["responses.row"]
    assert by["raw_prompt", "values"]["attributes"][ARRAY_ATTR]["content"].startswith("utf-8 JSON")
    assert by["uid", "codes"]["dimension_names"] == ["uid.row"]
    assert by["uid", "dictionary_lengths"]["dimension_names"] == ["uid.entry"]
    assert by["uid", "dictionary_values"]["attributes"][ARRAY_ATTR]["dtype"] == "str"


def test_the_plain_zarr_recipe_of_the_format_doc_reads_rows(written: tuple[Path, dict[str, Any]]) -> None:
    root, batch = written
    ns: dict[str, Any] = {"location": str(root)}
    exec(compile(_recipe("Reading with plain zarr"), str(DOC), "exec"), ns)  # noqa: S102 - our own doc
    assert [r.tolist() for r in ns["responses"]] == [r.tolist() for r in batch["responses"].unbind()]
    assert all(r.dtype == np.int64 for r in ns["responses"])
    assert ns["uid"] == batch["uid"]
    assert ns["raw_prompt"] == list(batch["raw_prompt"])
    assert np.array_equal(ns["bf16_bits"].view(np.int16), batch["bf16"].view(torch.int16).numpy())


def test_the_xarray_recipe_of_the_format_doc_opens_a_minibatch(written: tuple[Path, dict[str, Any]]) -> None:
    root, batch = written
    ns: dict[str, Any] = {"location": str(root)}
    exec(compile(_recipe("Reading with plain zarr"), str(DOC), "exec"), ns)  # noqa: S102
    exec(compile(_recipe("Reading with xarray"), str(DOC), "exec"), ns)  # noqa: S102
    assert np.array_equal(ns["lengths"], batch["responses"].offsets().diff().numpy())
    assert np.array_equal(ns["input_ids"].values, batch["input_ids"].numpy())
    assert ns["logical"] == "int64"
    tree = ns["tree"]
    assert set(tree.children) == {"responses", "uid", "tags", "raw_prompt"}
    uid = tree["uid"]
    codes = uid["codes"].values
    assert codes.tolist() == [0, 0, 0, 0, 1, 1, 1, 1] and uid["lengths"].dims == ("uid.entry",)


def test_caches_without_self_description_still_read(written: tuple[Path, dict[str, Any]]) -> None:
    root, batch = written
    assert unpack_to_tree(root)  # as format 3 laid it out: array documents as files
    for meta in root.rglob("zarr.json"):
        doc = json.loads(meta.read_text())
        if doc["node_type"] == "array":  # as zarr_skip wrote them before: no names, no attributes
            doc.pop("dimension_names")
            doc["attributes"] = {}
            meta.write_text(json.dumps(doc))
    cache = zs.open_cache(root)
    assert_equal(cache.load(1).to_dict(), batch)
    assert cache.verify().problems == ()
