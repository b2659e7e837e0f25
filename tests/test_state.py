"""Pure logic without I/O: naming, step states, resolution."""

from __future__ import annotations

from typing import Any

import pytest

from zarr_skip.errors import ConfigError
from zarr_skip.format import layout
from zarr_skip.format.state import HOST, PartRecord, RunRecord, resolve, step_info

NOW = 1_000_000.0


def run(name: str, started: float, expected: int = 2, host: str = "far") -> RunRecord:
    return RunRecord(name, started, started, expected, host, 1)


def part(run_: str, index: int, state: str = "complete", heartbeat: float = NOW, host: str = "far") -> PartRecord:
    return PartRecord(run_, index, state, host, 1, heartbeat, rows=3, nbytes=10, raw_nbytes=30)


@pytest.mark.parametrize(
    ("step", "action", "done", "want"),
    [
        (3, "cache", [1, 3, 5], 3),
        (4, "cache", [1, 3, 5], None),
        (4, "repeat", [1, 3, 5], 3),
        (0, "repeat", [1, 3, 5], 1),
        (9, "repeat", [1, 3, 5], 5),
        (2, "repeat", [], None),
        (2, "cache", [], None),
        (5, "repeat", [5], 5),
    ],
)
def test_resolve_table(step: int, action: str, done: list[int], want: int | None) -> None:
    assert resolve(step, action, done) == want


def test_resolve_rejects_unknown_action() -> None:
    with pytest.raises(ConfigError, match="'cache' or 'repeat'"):
        resolve(1, "random", [])


def test_complete_needs_every_index_of_the_owner() -> None:
    runs = [run("a", 1.0)]
    info = step_info(1, runs, [part("a", 0), part("a", 1)], now=NOW, lease=60)
    assert info.complete and (info.done, info.rows, info.nbytes_stored, info.nbytes, info.ratio) == (2, 6, 20, 60, 3.0)
    info = step_info(1, runs, [part("a", 1)], now=NOW, lease=60)
    assert not info.complete and info.done == 1


def test_only_the_newest_run_counts() -> None:
    runs = [run("old", 1.0), run("new", 2.0)]
    parts = [part("old", 0), part("new", 0)]
    info = step_info(1, runs, parts, now=NOW, lease=60)
    assert not info.complete and info.run == "new" and info.stale_runs == ("old",)


def test_a_complete_run_owns_the_step_until_a_newer_one_completes_it() -> None:
    runs = [run("old", 1.0), run("new", 2.0), run("newest", 3.0)]
    done = [part("old", 0), part("old", 1)]
    info = step_info(1, runs, [*done, part("new", 0), part("newest", 1)], now=NOW, lease=60)
    assert info.complete and info.run == "old" and info.stale_runs == ("new", "newest")
    assert (info.done, info.rows) == (2, 6)
    info = step_info(1, runs, [*done, part("new", 0), part("new", 1)], now=NOW, lease=60)
    assert info.complete and info.run == "new" and info.stale_runs == ("newest", "old")


def test_writing_versus_abandoned() -> None:
    runs = [run("a", NOW - 500)]
    fresh = [part("a", 0), part("a", 1, "writing", heartbeat=NOW - 5)]
    stale = [part("a", 0, heartbeat=NOW - 500), part("a", 1, "writing", heartbeat=NOW - 500)]
    assert step_info(1, runs, fresh, now=NOW, lease=60).state == "writing"
    assert step_info(1, runs, stale, now=NOW, lease=60).state == "abandoned"
    # a writer on this host whose process is gone is abandoned at once, heartbeat or not
    gone = 2**22 + 12345  # above pid_max: no such process
    local_run = [RunRecord("a", NOW, NOW, 2, HOST, gone)]
    local_part = [PartRecord("a", 0, "writing", HOST, gone, NOW)]
    assert step_info(1, local_run, local_part, now=NOW, lease=60).state == "abandoned"


def test_indices_beyond_expected_do_not_count() -> None:
    info = step_info(1, [run("a", 1.0, expected=1)], [part("a", 1)], now=NOW, lease=60)
    assert not info.complete and info.done == 0


def test_experiment_names() -> None:
    fp = {
        "experiment_name": "e x",
        "project_name": "p/q",
        "gen_batch_size": 128,
        "n": 8,
        "max_prompt_length": 1024,
        "max_response_length": 4096,
    }
    assert layout.experiment_name(fp) == "e-x_p-q/GBS128_N8_in1024_out4096"
    assert layout.experiment_name(dict(fp, role="rollout_tq")).endswith("/rollout_tq")
    generic = layout.experiment_name({"a": 1, "b": [1, 2]})
    assert generic.startswith("fp-") and generic == layout.experiment_name({"b": [1, 2], "a": 1})
    with pytest.raises(ConfigError, match="fingerprint"):
        layout.experiment_name({})
    with pytest.raises(ConfigError, match="JSON-able"):
        layout.experiment_name({"a": object()})


def test_step_and_run_names() -> None:
    assert layout.step_name(12) == "12" and layout.is_step_name("12") and not layout.is_step_name("012")
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ConfigError, match="step"):
            layout.step_name(bad)  # type: ignore[arg-type]
    assert layout.check_run_id("run-1.a") == "run-1.a"
    for bad in ("", "1abc", "a/b", "x" * 200, "r1\n"):  # "$" let a trailing newline through
        with pytest.raises(ConfigError, match="run_id"):
            layout.check_run_id(bad)
    assert not layout.is_step_name("7\n")
    for bad in ("exp\n", "a/b\n"):
        with pytest.raises(ConfigError, match="experiment"):
            layout.check_experiment_name(bad)
    rid = layout.new_run_id(0.0)
    assert rid.startswith("r19700101T000000-") and layout.check_run_id(rid)
    assert layout.chunk_key("a/b", 3, 2) == "a/b/c/3/0"
    assert layout.chunk_key("a/b", 3, 2, ".") == "a/b/c.3.0"


def test_doc_checksum_ignores_its_own_field() -> None:
    doc = {"a": 1, "b": [1.5, None]}
    c = layout.doc_checksum(doc)
    assert layout.doc_checksum(dict(doc, checksum=c)) == c
    assert layout.doc_checksum(dict(doc, a=2)) != c


def test_a_container_names_its_pid_namespace_in_its_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """Writers in two containers that share the machine's name (host networking) do not see
    each other's pids: judged by pid, a live one would be dead and its step abandoned (gc
    removes it). With the namespace in the host they are judged by heartbeat."""
    import os
    import socket

    from zarr_skip.format import state

    real = os.stat

    def namespace(ino: int) -> Any:
        def stat(path: Any, *args: Any, **kwargs: Any) -> Any:
            if str(path) == "/proc/self/ns/pid":
                return os.stat_result((0, ino, 0, 0, 0, 0, 0, 0, 0, 0))
            return real(path, *args, **kwargs)

        return stat

    name = socket.gethostname()
    monkeypatch.setattr(os, "stat", namespace(0xEFFFFFFC))
    assert state.host_name() == name  # the machine's own namespace: its name alone
    monkeypatch.setattr(os, "stat", namespace(4026532999))
    here = state.host_name()
    assert here == f"{name} (pid namespace 4026532999)"
    monkeypatch.setattr(state, "HOST", here)
    dead = 2**22 + 12345  # beyond pid_max: no such process here
    other = f"{name} (pid namespace 4026533000)"  # a writer in the other container
    assert state.writer_alive(other, dead, heartbeat=100.0, now=110.0, lease=60.0)  # its heartbeat counts
    assert not state.writer_alive(other, dead, heartbeat=100.0, now=200.0, lease=60.0)
    assert not state.writer_alive(here, dead, heartbeat=100.0, now=110.0, lease=60.0)  # ours: by pid
