"""gc's retention policy alone (``maintenance.plan_gc``): records in, removals out, no store."""

from __future__ import annotations

from zarr_skip.format.state import PartRecord, RunRecord
from zarr_skip.maintenance import GcPlan, plan_gc
from zarr_skip.store.catalog import StepScan

NOW = 1_000_000.0
LEASE = 30.0
HOST = "elsewhere"  # another host: a writer is alive while its heartbeat is within the lease


def _run(run: str, started: float, expected: int = 2) -> RunRecord:
    return RunRecord(run=run, started=started, created=started, expected=expected, host=HOST, pid=1)


def _part(run: str, index: int, state: str = "complete", heartbeat: float = NOW - 3600) -> PartRecord:
    return PartRecord(run=run, index=index, state=state, host=HOST, pid=1, heartbeat=heartbeat, rows=1)


def _complete(step: int, run: str = "r1") -> StepScan:
    return StepScan(step, f"e/{step}", runs=[_run(run, 1.0)], parts=[_part(run, 0), _part(run, 1)])


def _paths(plan: GcPlan) -> list[str]:
    return sorted(r.path for r in plan.removals)


def test_complete_steps_are_kept_and_old_ones_retired_except_pins() -> None:
    scans = [_complete(s) for s in (1, 2, 3, 4)]
    assert plan_gc(scans, now=NOW, lease=LEASE).removals == ()
    plan = plan_gc(scans, now=NOW, lease=LEASE, keep_last=1, pins=[2])
    assert _paths(plan) == ["e/1", "e/3"]
    assert {r.reason for r in plan.removals} == {"retention: keep_last=1"}
    assert _paths(plan_gc(scans, now=NOW, lease=LEASE, keep_last=0)) == ["e/1", "e/2", "e/3", "e/4"]


def test_abandoned_steps_go_writing_ones_stay_and_are_reported() -> None:
    abandoned = StepScan(5, "e/5", runs=[_run("r1", 1.0)], parts=[_part("r1", 0, "writing")])
    writing = StepScan(6, "e/6", runs=[_run("r1", NOW - 5)], parts=[_part("r1", 0, "writing", heartbeat=NOW - 5)])
    plan = plan_gc([abandoned, writing], now=NOW, lease=LEASE)
    assert _paths(plan) == ["e/5"] and plan.writing == (6,)
    assert plan_gc([abandoned], now=NOW, lease=LEASE, pins=[5]).removals == ()  # a pin keeps it


def test_displaced_runs_go_unless_a_writer_of_theirs_lives() -> None:
    step = _complete(7, run="new")
    step.runs.insert(0, _run("old", 0.5))
    step.parts.append(_part("old", 0, "writing"))
    plan = plan_gc([step], now=NOW, lease=LEASE)
    assert _paths(plan) == ["e/7/old"] and "displaced by new" in plan.removals[0].reason
    step.parts[-1] = _part("old", 0, "writing", heartbeat=NOW - 1)  # still beating
    assert plan_gc([step], now=NOW, lease=LEASE).removals == ()


def test_surplus_minibatches_of_a_complete_step_go() -> None:
    step = _complete(8)
    step.parts.append(_part("r1", 2))  # beyond the expected two
    assert _paths(plan_gc([step], now=NOW, lease=LEASE)) == ["e/8/r1/2"]


def test_strays_wait_for_their_age_and_damaged_steps_are_kept_whole() -> None:
    stray = _complete(9)
    stray.strays.append("zzz")
    plan = plan_gc([stray], now=NOW, lease=LEASE)
    assert plan.removals == () and [r.path for r in plan.strays] == ["e/9/zzz"]
    damaged = _complete(10)
    damaged.unreadable.append("r2")
    damaged.strays.append("x")
    plan = plan_gc([damaged], now=NOW, lease=LEASE)
    assert plan.removals == () and plan.strays == ()
    # retention retires a complete step whatever else is wrong with it
    assert _paths(plan_gc([damaged, _complete(11)], now=NOW, lease=LEASE, keep_last=1)) == ["e/10"]


def test_a_step_without_any_run_record_waits_for_its_age_like_strays() -> None:
    creating = StepScan(12, "e/12", strays=["r-new"])  # the new run's record is not visible yet
    plan = plan_gc([creating], now=NOW, lease=LEASE)
    assert plan.removals == () and [r.path for r in plan.strays] == ["e/12"]
