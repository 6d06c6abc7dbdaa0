"""bench/recovery.py's measurement: recovery phases from the workload's own log lines."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from bench.peers.dlrover_launch import first_notice, log_time
from bench.recovery import measure, survivors_stalled, survivors_stepping


def process(
    pid: int, rank: int, world: int, began: float, steps: range, resumed: int | None = None
) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = [
        {
            "t": began + 3.0,
            "pid": pid,
            "event": "initialized",
            "rank": rank,
            "world": world,
            "began": began,
            "imported": began + 2.0,
        }
    ]
    if resumed is not None:
        lines.append({"t": began + 3.5, "pid": pid, "event": "resumed", "step": resumed})
    lines += [
        {
            "t": began + 4.0 + 0.1 * i,
            "pid": pid,
            "event": "step",
            "step": s,
            "rank": rank,
            "world": world,
        }
        for i, s in enumerate(steps)
    ]
    return lines


OLD = [line for r in range(3) for line in process(100 + r, r, 3, 0.0, range(1, 18))]


def test_phases_are_taken_from_the_slowest_rank_of_the_new_world() -> None:
    t0 = 10.0
    new = process(200, 0, 2, 11.0, range(11, 14), resumed=10) + process(
        201, 1, 2, 11.5, range(11, 14), resumed=10
    )
    row = measure(OLD + new, t0, world=2, noticed=10.2)
    assert row is not None
    assert row["detect_s"] == pytest.approx(0.2)
    assert row["restart_s"] == pytest.approx(1.3)  # the last rank began at 11.5
    assert row["import_s"] == pytest.approx(2.0)
    assert row["init_s"] == pytest.approx(1.0)
    assert row["first_step_s"] == pytest.approx(1.0)
    assert row["total_s"] == pytest.approx(5.5)
    assert row["steps_lost"] == 17 - 10


def test_not_recovered_until_every_rank_of_the_new_world_stepped() -> None:
    new = process(200, 0, 2, 11.0, range(11, 14), resumed=10) + process(201, 1, 2, 11.5, range(0))
    assert measure(OLD + new, 10.0, world=2, noticed=10.2) is None
    old_world_only = process(300, 0, 3, 11.0, range(11, 14)) + process(
        301, 1, 3, 11.0, range(11, 12)
    )
    assert measure(OLD + old_world_only, 10.0, world=2, noticed=10.2) is None


def test_a_launcher_log_after_the_restart_is_not_a_detection() -> None:
    new = process(200, 0, 1, 11.0, range(1, 3))
    row = measure(OLD + new, 10.0, world=1, noticed=12.0)
    assert row is not None and row["detect_s"] is None and row["restart_s"] is None
    assert row["steps_lost"] == 17  # started over: no checkpoint resumed


def synced_process(
    pid: int, rank: int, world: int, began: float, gen: int, resumed: int, steps: range
) -> list[dict[str, Any]]:
    """A process as bench/peers/dlrover_train.py (and torchft_train.py) logs it: "synced" with
    the generation and the step it goes on from once its group is up and its state loaded."""
    lines = process(pid, rank, world, began, range(0))
    lines.append(
        {"t": began + 3.5, "pid": pid, "event": "synced", "rank": rank, "world": world}
        | {"gen": gen, "step": resumed}
    )
    return lines + [
        {"t": began + 4.0 + 0.1 * i, "pid": pid, "event": "step", "step": s}
        | {"rank": rank, "world": world, "gen": gen}
        for i, s in enumerate(steps)
    ]


def test_every_process_restarted_is_measured_from_its_synced_line() -> None:
    """DLRover: every rank restarts after a node loss and loads the memory checkpoint."""
    old = [
        line for r in range(3) for line in synced_process(100 + r, r, 3, 0.0, 0, 0, range(1, 18))
    ]
    new = synced_process(200, 0, 2, 11.0, 1, 15, range(16, 19))
    new += synced_process(201, 1, 2, 11.5, 1, 15, range(16, 19))
    row = measure(old + new, 10.0, world=2, noticed=10.5, in_place=True)
    assert row is not None
    assert row["detect_s"] == pytest.approx(0.5)
    assert row["restart_s"] == pytest.approx(1.0)  # the last began at 11.5
    assert row["import_s"] == pytest.approx(2.0)
    assert row["init_s"] == pytest.approx(1.5)  # imported at 13.5, synced at 15.0
    assert row["first_step_s"] == pytest.approx(0.5)
    assert row["total_s"] == pytest.approx(5.5)
    assert row["steps_lost"] == 17 - 15
    assert row["pids"] == [200, 201]


def _stamp(at: float) -> str:
    return datetime.datetime.fromtimestamp(at).strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]


def test_a_dlrover_log_line_is_read_in_local_time_to_the_millisecond() -> None:
    at = datetime.datetime(2026, 11, 26, 9, 16, 19, 275000).timestamp()
    assert log_time("[2026-11-26 09:16:19,275] [ERROR] [training.py:1202:_invoke_run] x") == at
    assert log_time("E1126 09:18:14.363000 28259 torch/distributed/elastic/api.py:1002] x") is None
    assert log_time("[rank0]: RuntimeError: Connection closed by peer") is None


@pytest.mark.parametrize(
    ("message", "noticed"),
    [
        ("[ERROR] [training.py:1202:_invoke_run] The worker fails with {2: ProcessFailure(", True),
        (
            "[INFO] [training.py:1401:_membership_changed] [dlrover-trainer] Detected 1 new "
            "nodes from group_rank=0; will restart worker group",
            True,
        ),
        ("[INFO] [engine.py:104:wrapper] Local rank 0 execute save_to_memory in 0.009s.", False),
        ("[WARNING] [resource.py:94:get_gpu_stats] Got unexpected error", False),
    ],
)
def test_only_an_agent_line_about_a_fault_is_a_notice(message: str, noticed: bool) -> None:
    t0 = 1_800_000_000.0
    found = first_notice([f"[{_stamp(t0 + 1.0)}] {message}"], t0)
    assert found == (pytest.approx(t0 + 1.0, abs=0.001) if noticed else None)


def test_the_first_notice_at_or_after_the_fault_counts() -> None:
    t0 = 1_800_000_000.0
    fails = "[ERROR] [training.py:1202:_invoke_run] The worker fails with {}"
    lines = [f"[{_stamp(at)}] {fails}" for at in (t0 - 5.0, t0 + 2.0, t0 + 3.0)]
    assert first_notice(lines, t0) == pytest.approx(t0 + 2.0, abs=0.001)
    assert first_notice(lines[:1], t0) is None


def test_survivors_step_again_at_the_smaller_world_before_the_whole_world_is_back() -> None:
    """A warm-up (in place, a cold replacement): survivors 1 and 2 go on at world 2 in
    generation 6 at 0.4 s; the whole world is back in generation 7 at 3.5 s."""
    lines: list[dict[str, Any]] = []
    for pid in (1, 2):
        lines += [
            {"event": "step", "pid": pid, "gen": 5, "t": 99.9, "rank": pid - 1, "world": 3},
            {"event": "synced", "pid": pid, "gen": 6, "t": 100.3},
            {"event": "step", "pid": pid, "gen": 6, "t": 100.3 + pid / 20, "rank": 0, "world": 2},
        ]
    assert survivors_stepping(lines, 100.0, {1, 2}) == pytest.approx(0.4)
    assert survivors_stepping(lines, 100.0, {1, 2, 3}) is None  # 3 never stepped again
    assert survivors_stepping(lines[:3], 100.0, {1, 2}) is None


def test_a_survivor_stalled_for_the_window_less_its_steps_at_its_pace() -> None:
    """Steps every 0.1 s; the fault at 10.0; a stall to 10.5, steps to 12.0, a second stall to
    12.4 (a warm-up's rejoin), steps again; the whole world back at 12.5: window to 13.5."""
    times = [9.0 + i / 10 for i in range(10)]  # 9.0 .. 9.9
    times += [10.5 + i / 10 for i in range(15)]  # 10.5 .. 11.9: 15 steps
    times += [12.4 + i / 10 for i in range(11)]  # 12.4 .. 13.4: 11 steps
    lines = [{"event": "step", "pid": 7, "t": t} for t in times]
    stalled = survivors_stalled(lines, 10.0, {7}, 12.5)
    assert stalled == pytest.approx(3.5 - 26 * 0.1)  # 0.9 s: 0.5 + 0.4 and the rounding
    assert survivors_stalled(lines[10:], 10.0, {7}, 12.5) is None  # no pace before the fault
