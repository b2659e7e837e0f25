"""Import cost and torch's noise: heavy modules load when first needed, torch logs nothing.

Each check runs in a fresh interpreter: what a process has imported, and torch's one-time
warnings, depend on everything that ran in it before.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

HEAVY = ("torch", "tensordict", "pandas", "matplotlib", "tokenizers", "pyarrow", "transformers")


def _run(code: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _loaded(after: str) -> list[str]:
    out = _run(f"""
        import json, sys
        {after}
        print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))
        """)
    return json.loads(out.splitlines()[-1])


def test_import_zarr_skip_loads_no_heavy_module() -> None:
    assert _loaded("import zarr_skip") == []
    assert _loaded("import zarr_skip.plots, zarr_skip.cli") == []


def test_cli_help_loads_no_heavy_module() -> None:
    code = """
        import contextlib, io
        from zarr_skip.cli.main import main
        for argv in (["--help"], ["ls", "--help"], ["show", "--help"], ["import", "--help"]):
            with contextlib.redirect_stdout(io.StringIO()):
                assert main(argv) == 0
        """
    assert _loaded(code) == []


def test_reading_a_numpy_step_loads_no_torch(tmp_path: object) -> None:
    code = f"""
        import numpy as np
        import zarr_skip as zs
        fp = {{"experiment_name": "e", "project_name": "p", "gen_batch_size": 2, "n": 1,
              "max_prompt_length": 4, "max_response_length": 4}}
        cache = zs.open_cache({str(tmp_path)!r}, fp)
        cache.write(1, {{"scores": np.arange(3.0), "uid": ["a", "b", "c"]}})
        view = cache.load(1)
        assert view["scores"][:].tolist() == [0.0, 1.0, 2.0] and list(view["uid"]) == ["a", "b", "c"]
        view.to_dict()
        """
    assert _loaded(code) == []


def test_no_torch_warning_on_jagged_paths_and_logger_levels_untouched(tmp_path: object) -> None:
    """Writing, reading, iterating and converting jagged columns (and the CLI showing them)
    logs nothing from torch; torch's loggers keep their levels. The harness does see torch's
    warning when torch's own constructor is called last (the warning fires once per process)."""
    code = f"""
        import contextlib, io, logging
        records = []
        class Keep(logging.Handler):
            def emit(self, record):
                records.append(record)
        import numpy as np
        import torch
        for name in ("", "torch"):  # torch's loggers do not propagate to the root
            logging.getLogger(name).addHandler(Keep(logging.DEBUG))
        import zarr_skip as zs
        from zarr_skip.cli.main import main
        from zarr_skip.synthetic import Preset, as_mapping, jagged_payload

        fx = logging.getLogger("torch.fx._symbolic_trace")
        levels = {{name: logging.getLogger(name).level for name in ("torch", "torch.fx", fx.name, "")}}
        fp = {{"experiment_name": "e", "project_name": "p", "gen_batch_size": 4, "n": 2,
              "max_prompt_length": 64, "max_response_length": 64}}
        cache = zs.open_cache({str(tmp_path)!r}, fp)
        cache.write(1, as_mapping(jagged_payload(Preset(8, 64, 64, 2))))
        view = cache.load(1)
        col = view["responses"]
        col[:].unbind(), col[1], col[[0, 2]], col[1:3], list(col)
        view.to_dict(), view.to_tensordict(), view.to_dataproto()
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["show", {str(tmp_path)!r}, "1", "--rows", "2"]) == 0
        assert {{name: logging.getLogger(name).level for name in levels}} == levels
        noisy = [r.getMessage() for r in records if r.name.startswith("torch")]
        assert noisy == [], noisy
        torch.nested.nested_tensor_from_jagged(torch.arange(3), offsets=torch.tensor([0, 3]))
        assert any("is_fx_tracing" in r.getMessage() for r in records), "the harness missed torch's warning"
        print("ok")
        """
    assert _run(code).strip().endswith("ok")


def test_dataloader_workers_read_jagged_columns_without_torchs_dispatch_imports(tmp_path: object) -> None:
    """A NestedTensor's ``values()`` and ``layout`` go through torch's dispatcher, whose first
    call in a process imports torch.distributed.tensor and sympy (~0.5 s). DataLoader workers
    forked from a main process that never made a NestedTensor paid it every epoch; reading,
    cutting, collating and sending jagged columns now reads the tensors' fields instead."""
    import zarr_skip as zs
    from zarr_skip.synthetic import Preset, as_mapping, jagged_payload

    fp = {"experiment_name": "e", "project_name": "p", "gen_batch_size": 4, "n": 2}
    cache = zs.open_cache(str(tmp_path), {**fp, "max_prompt_length": 16, "max_response_length": 16})
    for step in (1, 2):  # written here: the process below only reads
        cache.write(step, as_mapping(jagged_payload(Preset(8, 16, 16, 2), step=step)))
    code = f"""
        import functools, json, sys
        import torch
        from torch.utils.data import DataLoader, IterableDataset
        from zarr_skip.data import RolloutDataset, RolloutIterableDataset, collate_rollouts

        DISPATCH = ("sympy", "torch.distributed.tensor")

        class Probe(IterableDataset):  # batches as the DataLoader's worker would make them, then a report
            def __init__(self, inner, size, collate):
                self.inner, self.size, self.collate = inner, size, collate
            def __iter__(self):
                items = []
                for got in self.inner:
                    if self.size is None:
                        yield got
                        continue
                    items.append(got)
                    if len(items) == self.size:
                        yield self.collate(items)
                        items = []
                yield {{"imported": [m for m in DISPATCH if m in sys.modules]}}

        nested = functools.partial(collate_rollouts, jagged="nested")
        made = {{
            "batches": (RolloutIterableDataset({str(tmp_path)!r}, batch_size=4), None, None),
            "nested batches": (RolloutIterableDataset({str(tmp_path)!r}, batch_size=4, jagged="nested"), None, None),
            "items padded": (RolloutIterableDataset({str(tmp_path)!r}, shuffle=True), 4, collate_rollouts),
            "items nested": (RolloutIterableDataset({str(tmp_path)!r}), 4, nested),
        }}
        seen = {{}}
        same = lambda x: x
        for name, (ds, size, collate) in made.items():
            for workers in (0, 2):
                rows = 0
                loader = DataLoader(Probe(ds, size, collate), batch_size=None, num_workers=workers, collate_fn=same)
                for got in loader:
                    if "imported" in got:
                        seen[f"{{name}}, {{workers}} workers"] = got["imported"]
                    else:
                        rows += len(got["row"])
                assert rows == 16, (name, workers, rows)
        ds = RolloutDataset({str(tmp_path)!r})
        for batch in DataLoader(ds, batch_size=4, shuffle=True, num_workers=2, collate_fn=nested):
            assert batch["responses"].is_nested
        seen["main"] = [m for m in DISPATCH if m in sys.modules]
        batch["responses"].values()  # the harness sees torch's import when it happens
        assert all(m in sys.modules for m in DISPATCH)
        print(json.dumps(seen))
        """
    seen = json.loads(_run(code).splitlines()[-1])
    assert len(seen) == 9 and all(v == [] for v in seen.values()), seen


def test_reading_jagged_rows_does_not_import_torchs_nested_dispatch(tmp_path: object) -> None:
    """A row of a jagged column (``view["responses"][5]``, the CLI's ``show``, previews,
    iteration) is cut from the values without torch's dispatcher, whose first call imports
    torch.distributed.tensor and sympy: 0.7 s of ``zarr-skip show``'s 2.8 s."""
    import zarr_skip as zs
    from zarr_skip.synthetic import Preset, as_mapping, jagged_payload

    fp = {"experiment_name": "e", "project_name": "p", "gen_batch_size": 4, "n": 2}
    cache = zs.open_cache(str(tmp_path), {**fp, "max_prompt_length": 16, "max_response_length": 16})
    cache.write(1, as_mapping(jagged_payload(Preset(8, 16, 16, 2), step=1)))  # written here
    code = f"""
        import contextlib, io, json, sys
        import torch
        import zarr_skip as zs
        from zarr_skip.cli.main import main

        view = zs.open_cache({str(tmp_path)!r}).load(1)
        col = view["responses"]
        rows = [col[1], col[-1], *list(col)[:2]]
        assert col[[0, 2]].is_nested
        assert all(r.dim() == 1 and not r.is_nested for r in rows)
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["show", {str(tmp_path)!r}, "1", "--rows", "3"]) == 0
            assert main(["show", {str(tmp_path)!r}, "1", "--row", "2"]) == 0
        html = view._repr_html_() + col._repr_html_() + repr(col)
        print(json.dumps([m for m in ("sympy", "torch.distributed.tensor") if m in sys.modules]))
        """
    assert json.loads(_run(code).splitlines()[-1]) == []
