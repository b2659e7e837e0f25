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
