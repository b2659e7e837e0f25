"""One preset's measurements as a verdict and a report.

:func:`score` adds the ratios zarr_skip / baseline, the pass/fail verdict of each target in
:data:`TARGETS` and the information floor (:mod:`benchmarks.floor`) to the result of
:func:`benchmarks.runners.bench_preset`; :func:`markdown` renders a whole run (machine,
physical limits, data, results table, status(), floor, targets, errors) as the
``<preset>.md`` file; :func:`verdict_line` is a target's line on the console.
"""

from __future__ import annotations

import statistics
from typing import Any

from . import load
from .baseline import DEFINITION
from .formats import COMPARISONS, OPS, STEP

OP_LABEL = {
    "write": "write",
    "write_next": "write, a later step",
    "write_fsync": "write + fsync",
    "read_cold": "full read, cold",
    "read_warm": "full read, warm",
    "column_cold": "one column (responses), cold",
    "column_warm": "one column (responses), warm",
    "rows64_cold": "64 rows of responses, cold",
    "rows64_warm": "64 rows of responses, warm",
}
FORMAT_LABEL = {
    "torch_save_jagged": "torch.save jagged (tq_batch.pt)",
    "zarr_skip_jagged": "zarr_skip jagged",
    "pickle_padded": "pickle padded (gen_batch.dp)",
    "zarr_skip_padded": "zarr_skip padded",
    "tq_batch_realistic": "verl tq_batch.pt (TensorDict, NonTensorStack)",
    "plain_dump_realistic": "plain torch.save dump",
    "zarr_skip_realistic": "zarr_skip",
}

# (shape, metric, max ratio zarr_skip / baseline)
TARGETS: dict[str, list[tuple[str, str, float]]] = {
    "small": [("jagged", "write", 2.0), ("jagged", "read_cold", 2.0)],
    "medium": [
        ("realistic", "write", 0.5),
        ("realistic", "read_cold", 0.5),
        ("realistic_vs_dump", "write", 1.2),
        ("realistic_vs_dump", "read_cold", 1.0),
        ("realistic", "floor", 1.10),
        ("jagged", "write", 0.8),
        ("jagged", "read_cold", 0.8),
        ("jagged", "bytes", 0.20),
        ("jagged", "column_cold", 0.20),
        ("jagged", "rows64_cold", 0.10),
        ("padded", "write", 0.4),
        ("padded", "read_cold", 0.3),
        ("padded", "bytes", 0.10),
    ],
    "large": [
        ("realistic", "write", 0.5),
        ("realistic", "read_cold", 0.5),
        ("realistic_vs_dump", "write", 1.2),
        ("realistic_vs_dump", "read_cold", 1.0),
        ("realistic", "floor", 1.10),
        ("jagged", "write", 0.5),
        ("jagged", "read_cold", 0.5),
        ("jagged", "bytes", 0.20),
        ("jagged", "column_cold", 0.15),
        ("jagged", "rows64_cold", 0.03),
    ],
}
STATUS_TARGET_S = 1.0


# --------------------------------------------------------------------------- ratios and targets


def _metric(res: dict[str, Any], metric: str) -> float | None:
    if metric in ("bytes", "files"):
        disk = res.get("write", {}).get("disk")
        if not disk:
            return None
        return float(disk["bytes_allocated"] if metric == "bytes" else disk["files"])
    if metric.startswith("rss:"):
        return res.get(metric[4:], {}).get("peak_rss_bytes")
    return res.get(metric, {}).get("median_s")


METRICS = list(OPS) + ["bytes", "files"]


def ratios(out: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    r: dict[str, dict[str, float | None]] = {}
    for shape, (zs_fmt, base_fmt) in COMPARISONS.items():
        if zs_fmt not in out["formats"] or base_fmt not in out["formats"]:
            continue
        r[shape] = {}
        for m in METRICS + [f"rss:{op}" for op in OPS]:
            a = _metric(out["formats"][zs_fmt], m)
            b = _metric(out["formats"][base_fmt], m)
            r[shape][m] = (a / b) if (a is not None and b) else None
    return r


def paired(out: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per comparison and timed operation, the median of each repetition's own ratio: the
    zarr_skip sample over the baseline's of the same repetition, measured right before or
    after it. Drifts of the machine from one repetition to the next cancel out, which a ratio
    of medians keeps when the machine alternates between speeds. Only for measurements with a
    sample in every repetition."""
    r: dict[str, dict[str, float]] = {}
    for shape, (zs_fmt, base_fmt) in COMPARISONS.items():
        zs_res, base_res = out["formats"].get(zs_fmt, {}), out["formats"].get(base_fmt, {})
        for op in OPS:
            a, b = zs_res.get(op, {}), base_res.get(op, {})
            if "errors" in a or "errors" in b or not a.get("samples") or len(a["samples"]) != len(b.get("samples", ())):
                continue
            pairs = zip(a["samples"], b["samples"], strict=True)
            r.setdefault(shape, {})[op] = statistics.median([x / y for x, y in pairs])
    return r


def check_targets(name: str, out: dict[str, Any], baseline_only: bool) -> list[dict[str, Any]]:
    res = []
    for shape, metric, limit in TARGETS.get(name, []):
        val = out["ratios"].get(shape, {}).get(metric)
        if baseline_only:
            verdict = "SKIP"
        elif val is None:
            verdict = "FAIL (no value)"
        else:
            verdict = "PASS" if val <= limit else "FAIL"
        res.append({"target": f"{name} {shape} {metric} ratio <= {limit}", "value": val, "verdict": verdict})
    status = out.get("status")
    st = (status or {}).get("status_cold", {}).get("median_s")
    label = f"status() of {(status or {}).get('steps', 1000)} steps, cold, < {STATUS_TARGET_S} s"
    if baseline_only or status is None:
        res.append({"target": label, "value": None, "verdict": "SKIP"})
    else:
        res.append(
            {
                "target": label,
                "value": st,
                "verdict": "FAIL (no value)" if st is None else ("PASS" if st < STATUS_TARGET_S else "FAIL"),
            }
        )
    return res


def score(out: dict[str, Any], baseline_only: bool) -> None:
    """Add ``ratios``, ``targets`` and ``floor`` to the measurements ``out`` of one preset."""
    from zarr_skip.synthetic import PRESETS

    from .floor import jagged_floor

    name = out["preset"]
    out["ratios"] = ratios(out)
    out["paired"] = paired(out)
    floor = jagged_floor(PRESETS[name], out["seed"], STEP)  # untimed, after every measurement
    base = _metric(out["formats"].get("torch_save_jagged", {}), "bytes")
    floor["ratio"] = floor["bytes"] / base if base else None
    out["floor"] = floor
    if "zarr_skip_realistic" in out["formats"]:
        real = jagged_floor(PRESETS[name], out["seed"], STEP, payload="realistic")
        ours = _metric(out["formats"]["zarr_skip_realistic"], "bytes")
        real["ratio"] = ours / real["bytes"] if ours else None  # zarr_skip's bytes / the floor
        out["floor_realistic"] = real
        out["ratios"].setdefault("realistic", {})["floor"] = real["ratio"]
    out["targets"] = check_targets(name, out, baseline_only)


# --------------------------------------------------------------------------- markdown


def _fmt_s(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x * 1e3:.1f} ms" if x < 10 else f"{x:.2f} s"


def _fmt_b(x: float | None) -> str:
    if x is None:
        return "n/a"
    for unit, k in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if x >= k:
            return f"{x / k:.1f} {unit}"
    return f"{x:.0f} B"


def _fmt_r(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x:.4f}" if abs(x) < 0.1 else f"{x:.3f}"


def _cell(res: dict[str, Any] | None, metric: str) -> str:
    if res is None:
        return "-"
    if metric in ("bytes", "files"):
        if "error" in res.get("write", {}):
            return "error"
        v = _metric(res, metric)
        return _fmt_b(v) if metric == "bytes" else ("n/a" if v is None else f"{v:.0f}")
    if metric.startswith("rss:"):
        r = res.get(metric[4:], {})
        return "error" if "error" in r else _fmt_b(r.get("peak_rss_bytes"))
    r = res.get(metric, {})
    if "error" in r:
        return "error"
    return _fmt_s(r.get("median_s")) + (" *" if _noisy(r) else "")


def _noisy(r: dict[str, Any]) -> bool:
    """Spread (max - min) over the repetitions larger than half the median."""
    med = r.get("median_s")
    return bool(med and len(r.get("samples", [])) > 1 and (r["max_s"] - r["min_s"]) > 0.5 * med)


def markdown(run: dict[str, Any]) -> str:
    """The report of one run of bench.py, section by section."""
    m = run["machine"]
    lines = [f"# zarr_skip benchmark: preset `{run['result']['preset']}`", ""]
    git = (m.get("git_commit") or "no commit") + (" + local changes" if m.get("git_dirty") else "")
    lines.append(f"Run {run['started']} (git {git}), command: `{run['command']}`")
    lines += ["", load.line(run["result"].get("load"))]
    lines += _machine_section(m, run.get("limits") or {})
    res = run["result"]
    lines += _data_section(res)
    lines += _results_section(res, m)
    lines += _status_section(res.get("status"))
    lines += _floor_section(res.get("floor"), res.get("floor_realistic"))
    lines += _targets_and_errors(res)
    return "\n".join(lines) + "\n"


def _machine_section(m: dict[str, Any], lim: dict[str, Any]) -> list[str]:
    lines = ["", "## Machine", ""]
    d = m.get("disk", {})
    lines.append(
        f"- CPU: {m.get('cpu_model')} ({m.get('cpu_count')} cores, affinity "
        f"{m.get('cpu_affinity')}, torch threads {m.get('torch_threads')})"
    )
    lines.append(f"- RAM: {m.get('ram_GiB')} GiB")
    lines.append(
        f"- Disk: {d.get('device')} ({d.get('fstype')}, model {d.get('model')}, "
        f"rotational {d.get('rotational')}, size {d.get('size_GB')} GB), "
        f"work dir {d.get('workdir')}"
    )
    lines.append(
        f"- Kernel {m.get('kernel')}, Python {m.get('python')}, "
        + ", ".join(f"{k} {v}" for k, v in m.get("versions", {}).items())
    )
    if lim:
        lines.append(
            f"- Physical limits: dd write {lim.get('dd_write_MBps', float('nan')):.0f} MB/s "
            f"({lim.get('dd_write_cmd')}), dd read {lim.get('dd_read_MBps', float('nan')):.0f} "
            f"MB/s ({lim.get('dd_read_cmd')}), memcpy {lim.get('memcpy_GBps', float('nan')):.1f} "
            f"GB/s ({lim.get('memcpy_note')})"
        )
    return lines


def _data_section(res: dict[str, Any]) -> list[str]:
    p, mem = res["params"], res["in_memory"]
    lines = ["", "## Data", ""]
    lines.append(
        f"- {p['rows']} rows (n={p['n']}), max_prompt {p['max_prompt']}, "
        f"max_response {p['max_response']}, seed {res['seed']}, {res['reps']} reps "
        f"(medians)"
    )
    lines.append(
        f"- {mem['prompt_tokens']} prompt + {mem['response_tokens']} response tokens; "
        f"tensors in memory: padded {_fmt_b(mem['padded_tensor_bytes'])}, jagged "
        f"{_fmt_b(mem['jagged_tensor_bytes'])}"
    )
    lines.append(
        f"- cold = page cache dropped before each rep "
        f"({_cold_method(res)}); warm = files read once untimed first; zarr_skip reads "
        f"include `open_cache()`; peak RSS = high-water mark above the RSS at the start "
        f"of the operation (median over reps); each rep runs in a fresh process "
        f"({res.get('isolation')}) after an untimed small warm-up of the same format"
    )
    return lines


def _results_section(res: dict[str, Any], m: dict[str, Any]) -> list[str]:
    F = res["formats"]
    lines = ["", "## Results", ""]
    hdr = ["metric"]
    cols: list[tuple[str, str | None]] = []
    for name in ("jagged", "padded"):
        zs_, base = COMPARISONS[name]
        cols.append((base, None))
        hdr.append(FORMAT_LABEL[base])
        if zs_ in F:
            cols += [(zs_, None), (name, "ratio")]
            hdr += [FORMAT_LABEL[zs_], "ratio"]
    measured = [o for o in OPS if any(o in rr for rr in F.values())]
    lines += _table(res, hdr, cols, measured)
    if "tq_batch_realistic" in F:
        lines += [
            "",
            "## Realistic per-row payload (jagged)",
            "",
            "The jagged step with verl's per-row objects at real sizes (chat `raw_prompt`, `extra_info` "
            "with question and answer, shared by the rows of a group; `zarr_skip.synthetic.payloads`), "
            "against verl's `tq_batch.pt` and a plain `torch.save` of the same tensors and lists "
            f"({DEFINITION}).",
            "",
        ]
        cols = [("tq_batch_realistic", None), ("plain_dump_realistic", None)]
        hdr = ["metric", FORMAT_LABEL["tq_batch_realistic"], FORMAT_LABEL["plain_dump_realistic"]]
        if "zarr_skip_realistic" in F:
            cols += [("zarr_skip_realistic", None), ("realistic", "ratio"), ("realistic_vs_dump", "ratio")]
            hdr += [FORMAT_LABEL["zarr_skip_realistic"], "ratio vs tq_batch.pt", "ratio vs plain dump"]
        lines += _table(res, hdr, cols, measured)

    la0, la1 = res.get("loadavg_start"), res.get("loadavg_end")
    note = (
        "`*`: the spread over repetitions (max - min) exceeds half the median: noisy. "
        f"Load average (1/5/15 min) at start {_fmt_la(la0)}, at end {_fmt_la(la1)} on "
        f"{m.get('cpu_count')} cores."
    )
    lines += ["", note] + _paired_section(res.get("paired") or {})
    ver = [(f, rr["write"]["verify"]) for f, rr in F.items() if "verify" in rr.get("write", {})]
    if ver:
        lines += ["", "Round trip (`load(step).to_dict()` equals what was written):", ""]
        lines += [f"- {FORMAT_LABEL[f]}: {v}" for f, v in ver]
    return lines


def _paired_section(pairs: dict[str, dict[str, float]]) -> list[str]:
    shapes = [s for s in COMPARISONS if s in pairs]
    if not shapes:
        return []
    lines = [
        "",
        "Median of the repetitions' own ratios (zarr_skip / the baseline measured right beside it "
        "in the same repetition; less moved by a machine that changes speed between repetitions "
        "than the ratios of medians above):",
        "",
        "| metric | " + " | ".join(f"{COMPARISONS[s][0]} / {COMPARISONS[s][1]}" for s in shapes) + " |",
        "|---" * (len(shapes) + 1) + "|",
    ]
    for op in OPS:
        if any(op in pairs[s] for s in shapes):
            lines.append(f"| {OP_LABEL[op]} | " + " | ".join(_fmt_r(pairs[s].get(op)) for s in shapes) + " |")
    return lines


def _status_section(st: dict[str, Any] | None) -> list[str]:
    lines: list[str] = []
    if st:
        lines += ["", "## status()", ""]
        if "error" in st.get("setup", {}):
            lines.append(f"- setup failed: {st['setup']['error'].splitlines()[-1]}")
        else:
            lines.append(
                f"- {st['steps']} tiny steps ({st['preset']}), write "
                f"{_fmt_s(st['setup'].get('write_per_step_s'))} per step, "
                f"{st['setup']['disk']['files']} files, "
                f"{_fmt_b(st['setup']['disk']['bytes_allocated'])}"
            )
            for op in ("status_cold", "status_warm"):
                r = st.get(op, {})
                if "error" in r:
                    lines.append(f"- {op}: error {r['error'].splitlines()[-1]}")
                else:
                    lines.append(
                        f"- {op} (open_cache + status()): {_fmt_s(r.get('median_s'))}, "
                        f"{r.get('n_steps')} steps listed, {r.get('n_complete')} complete"
                        f", peak RSS +{_fmt_b(r.get('peak_rss_bytes'))}"
                    )
    return lines


def _floor_section(fl: dict[str, Any] | None, fr: dict[str, Any] | None) -> list[str]:
    lines: list[str] = []
    if fl:
        top = sorted(fl["parts"].items(), key=lambda kv: -kv[1])[:3]
        lines += [
            "",
            "## Information floor (jagged)",
            "",
            f"No lossless format can store this step in fewer than {_fmt_b(fl['bytes'])}"
            f" (ratio {_fmt_r(fl.get('ratio'))} to torch.save): its values are drawn "
            "independently at random (see `benchmarks/floor.py`). Largest parts: "
            + ", ".join(f"{k} {_fmt_b(v)}" for k, v in top)
            + ".",
        ]
    if fr:
        top = sorted(fr["parts"].items(), key=lambda kv: -kv[1])[:3]
        lines += [
            "",
            f"With the realistic per-row payload the floor is {_fmt_b(fr['bytes'])} (repeated per-row "
            "objects count once per distinct value); zarr_skip stores "
            f"{_fmt_r(fr.get('ratio'))} times that. Largest parts: "
            + ", ".join(f"{k} {_fmt_b(v)}" for k, v in top)
            + ".",
        ]
    return lines


def _targets_and_errors(res: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    F = res["formats"]
    errors = [(f, op, r["error"]) for f, rr in F.items() for op, r in rr.items() if "error" in r]
    if res["targets"]:
        lines += ["", "## Targets", "", "| target | value | verdict |", "|---|---|---|"]
        for t in res["targets"]:
            v = t["value"]
            vs = "n/a" if v is None else (_fmt_r(v) if "ratio" in t["target"] else _fmt_s(v))
            lines.append(f"| {t['target']} | {vs} | {t['verdict']} |")
    if errors:
        lines += ["", "## Errors", ""]
        for f, op, e in errors:
            lines.append(f"- {f} {op}: `{e.strip().splitlines()[-1][:300]}`")
    return lines


def _table(res: dict[str, Any], hdr: list[str], cols: list[tuple[str, str | None]], measured: list[str]) -> list[str]:
    """A results table: a row per metric, a column per format (or ratio of a comparison)."""
    lines = ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
    rows = [(OP_LABEL[o], o) for o in measured] + [("bytes on disk (allocated)", "bytes"), ("file count", "files")]
    rows += [(f"peak RSS: {OP_LABEL[o]}", f"rss:{o}") for o in measured]
    for label, metric in rows:
        cells = [label]
        for key, kind in cols:
            if kind == "ratio":
                cells.append(_fmt_r(res["ratios"].get(key, {}).get(metric)))
            else:
                cells.append(_cell(res["formats"].get(key), metric))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _fmt_la(la: Any) -> str:
    return "n/a" if not la else "/".join(f"{x:.1f}" for x in la)


def _cold_method(res: dict[str, Any]) -> str:
    for rr in res["formats"].values():
        for r in rr.values():
            if r.get("cold_method"):
                return r["cold_method"]
    return "n/a"


def verdict_line(target: dict[str, Any]) -> str:
    """One entry of :func:`check_targets` as the line printed on the console."""
    v = target["value"]
    vs = "n/a" if v is None else _fmt_r(v)
    return f"{target['verdict']:16s} {target['target']} (value {vs})"
