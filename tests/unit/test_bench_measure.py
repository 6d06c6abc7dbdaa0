"""bench/recovery.py's measurement: recovery phases from the workload's own log lines."""

from __future__ import annotations

from typing import Any

import pytest

from bench.recovery import measure


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
