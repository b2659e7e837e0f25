"""The main job end to end: write a realistic rollout cache, crash a writer, reload, report.

``python -m zarr_skip.demo --out demo_cache`` (what ``make demo`` runs):

1. writes steps 1..5 of synthetic GRPO rollouts with random tokens (jagged responses,
   log-probs, tags, keys; the benchmark's shapes), each as 4 mini-batches, the way a
   separate-async trainer samples them, into a cache of their own beside OUT
   (``OUT_random``);
2. starts a second writer process for step 6 and kills it (SIGKILL) after 2 of its 4
   mini-batches, leaving a partial step as a crashed run would;
3. reopens that cache read-only, prints the status table and a summary of one step, and
   checks a few values against what was written;
4. writes readable rollouts into OUT, its only experiment (so commands need no ``-e``):
   maths problems with worked answers, right and wrong, scored, tokenized with the project's
   own tokenizer, which the experiment records as a trainer's SkipManager would; prints one
   decoded rollout and one GRPO group, then the commands to try.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from zarr_skip import open_cache
from zarr_skip.cli._text import badges, render_rollout
from zarr_skip.format.specs import jagged_tensor
from zarr_skip.synthetic import TOKENIZER_PATH, Preset, as_mapping, jagged_payload, text_rollouts
from zarr_skip.views.display import human_bytes
from zarr_skip.views.records import max_response_length, rollouts, rows_of_uid

FINGERPRINT = {
    "experiment_name": "demo",
    "project_name": "zarr_skip",
    "gen_batch_size": 64,
    "n": 8,
    "max_prompt_length": 512,
    "max_response_length": 2048,
    "role": "rollout_tq",
}
PRESET = Preset(rows=128, max_prompt=512, max_response=2048, n=8)
MINIBATCHES = 4
#: the readable rollouts: 16 maths prompts, 8 answers each, responses of at most 96 tokens
TEXT_N = 8
TEXT_FINGERPRINT = {
    **FINGERPRINT,
    "n": TEXT_N,
    "gen_batch_size": 16,
    "max_prompt_length": 128,
    "max_response_length": 96,
    "role": "rollout",
}
TEXT_GROUPS = 16
#: steps of readable rollouts (enough for the report's and compare's lines)
TEXT_STEPS = range(1, 6)


def random_location(out: Path) -> Path:
    """Where the random-token steps (and the crashed writer) go: a cache beside ``out``."""
    return out.with_name(out.name + "_random")


def _command() -> str:
    """How to call the CLI from here: the venv's ``zarr-skip`` (relative when below the current
    directory), else the bare name."""
    exe = Path(sys.executable).parent / "zarr-skip"
    if not exe.exists():
        return "zarr-skip"
    rel = os.path.relpath(exe)
    return rel if not rel.startswith("..") else str(exe)


def minibatches(step: int) -> list[dict[str, Any]]:
    """One step's 4 mini-batches (a separate-async trainer samples them one by one)."""
    payload = as_mapping(jagged_payload(PRESET, seed=0, step=step, non_tensor=True))
    rows = len(payload["keys"])
    cuts = np.linspace(0, rows, MINIBATCHES + 1).astype(int)
    out = []
    for a, b in zip(cuts[:-1], cuts[1:], strict=True):
        mb = {}
        for name, value in payload.items():
            if hasattr(value, "is_nested") and value.is_nested:
                off = value.offsets()
                mb[name] = jagged_tensor(value.values()[int(off[a]) : int(off[b])].clone(), off[a : b + 1] - off[a])
            else:
                mb[name] = value[a:b]
        out.append(mb)
    return out


def write_steps(location: Path, steps: range) -> None:
    cache = open_cache(location, FINGERPRINT)
    for step in steps:
        for mb in minibatches(step):
            cache.write(step, mb, expected=MINIBATCHES, meta_info={"global_steps": step})


def crashed_writer(location: Path, step: int) -> None:
    """Child process: write 2 of 4 mini-batches of ``step``, then wait to be killed."""
    cache = open_cache(location, FINGERPRINT)
    for mb in minibatches(step)[:2]:
        cache.write(step, mb, expected=MINIBATCHES, meta_info={"global_steps": step})
    print("ready", flush=True)
    time.sleep(600)


def write_text_steps(location: Path, steps: range) -> str:
    """Readable rollouts in their own experiment; returns its name."""
    cache = open_cache(location, TEXT_FINGERPRINT)
    # what a SkipManager records from the trainer config (actor_rollout_ref.model.tokenizer_path)
    cache.set_attributes({"tokenizer": str(TOKENIZER_PATH)})
    for step in steps:
        batch = text_rollouts(TEXT_GROUPS, TEXT_N, seed=0, step=step, max_response=96)
        cache.write(step, batch, meta_info={"global_steps": step})
    assert cache.experiment is not None
    return cache.experiment


def readable(location: Path, experiment: str, step: int) -> str:
    """One decoded rollout and one GRPO group (one with right and wrong answers) of ``step``."""
    view = open_cache(location, experiment=experiment).load(step)  # decodes with the recorded tokenizer
    limit = max_response_length(view)
    uids, scores = view["uid"][:], view["score"][:]
    by_uid: dict[str, set[float]] = {}
    for u, score in zip(uids, scores, strict=True):
        by_uid.setdefault(u, set()).add(float(score))
    mixed = next(u for u, found in by_uid.items() if len(found) > 1)
    group = rollouts(view, rows_of_uid(view, mixed).tolist())
    lines = [f"one rollout of step {step} ({experiment}):", *render_rollout(group[0], limit), ""]
    lines.append(f"its GRPO group: {len(group)} answers to the same prompt, uid {mixed}")
    for r in group:
        answer = (r["response"].splitlines() or [""])[-1]
        lines.append(f"  row {r['row']:>3} {' '.join(f'[{b}]' for b in badges(r, limit)[1:])}  ...{answer[-32:]}")
    return "\n".join(lines)


def status_table(location: Path) -> str:
    cache = _main_experiment(location)
    lines = [f"{'step':>5} {'state':<10} {'minibatches':>11} {'rows':>6} {'stored':>10} {'ratio':>6}"]
    for i in cache.status():
        lines.append(
            f"{i.step:>5} {i.state:<10} {f'{i.done}/{i.expected}':>11} {i.rows:>6} "
            f"{human_bytes(i.nbytes_stored):>10} {i.ratio:>5.1f}x"
        )
    return "\n".join(lines)


def _main_experiment(location: Path) -> Any:
    return open_cache(location, experiment=open_cache(location, FINGERPRINT, read_only=True).experiment)


def step_summary(location: Path, step: int) -> str:
    view = _main_experiment(location).load(step)
    lines = [
        f"step {step}: {len(view)} rows in {len(view.minibatch_info)} mini-batches, "
        f"{human_bytes(view.nbytes_stored)} stored ({human_bytes(view.nbytes)} raw)"
    ]
    for name, spec in view.schema.items():
        col = view[name]
        lines.append(f"  {name:<15} {spec.kind:<7} {spec.dtype:<8} {human_bytes(col.nbytes_stored):>10}")
    lengths = view["responses"].lengths()
    lines.append(
        f"  response length: median {int(np.median(lengths))}, max {int(lengths.max())}, "
        f"{(lengths == PRESET.max_response).mean():.0%} hit the maximum"
    )
    lines.append(f"  first key: {view['keys'][0]}  tag: {view['tags'][0]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("demo_cache"))
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        crashed_writer(random_location(args.out), args.child)
        return 0
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    bench = random_location(args.out)
    for old in (args.out, bench):
        shutil.rmtree(old, ignore_errors=True)
    t0 = time.perf_counter()
    write_steps(bench, range(1, 6))
    print(
        f"wrote steps 1-5 of random tokens to {bench} ({MINIBATCHES} mini-batches each) "
        f"in {time.perf_counter() - t0:.1f} s"
    )
    child = subprocess.Popen(
        [sys.executable, "-m", "zarr_skip.demo", "--out", str(args.out), "--child", "6"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    if child.stdout.readline().strip() != "ready":
        raise SystemExit("the writer of step 6 did not start")
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    print("killed the writer of step 6 after 2 of 4 mini-batches\n")
    print(status_table(bench), "\n")
    print(step_summary(bench, 3), "\n")
    cache = _main_experiment(bench)
    assert cache.steps() == [1, 2, 3, 4, 5], cache.steps()
    assert cache.status()[-1].state == "abandoned"
    want = minibatches(3)[1]
    got = cache.load(3).minibatches[1]
    assert got["keys"][:] == want["keys"] and (got["responses"][5] == want["responses"].unbind()[5]).all()
    print(f"cache.resolve(6, action='repeat') -> {cache.resolve(6, action='repeat')}  (step 6 is partial)")
    print(f"ok: {bench} holds 5 complete steps and one abandoned step\n")
    experiment = write_text_steps(args.out, TEXT_STEPS)
    print(readable(args.out, experiment, 1), "\n")
    cli = _command()
    print(f"readable rollouts: {args.out} ({experiment}, steps {TEXT_STEPS.start}-{TEXT_STEPS.stop - 1}); try:")
    print(f"  {cli} ls {args.out}")
    print(f"  {cli} show {args.out} 1 --text --rows 5")
    print(f"  {cli} report {args.out} 1 5          # writes report.html")
    print(f"  {cli} export {args.out} all rollouts.parquet --format parquet")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
