"""bench/goodput_peers.py's accounting, from step lines: the schedule every system gets, the
steps that count (a step trained again after a restore counts once, at the world that trained
it last), and each fault's pause."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from bench.goodput_peers import KINDS, PERIOD_S, account, costs, schedule


def step(t: float, n: int, world: int = 3, rank: int = 0) -> dict[str, Any]:
    return {"event": "step", "t": t, "step": n, "world": world, "pid": 1 + rank, "rank": rank}


def test_the_schedule_is_the_seeds_and_deals_every_kind_evenly() -> None:
    plan = schedule(64, minutes=5)
    assert plan == schedule(64, minutes=5) and plan != schedule(65, minutes=5)
    assert [at for at, _ in plan] == [5.0 + i * PERIOD_S for i in range(10)]
    assert Counter(kind for _, kind in plan) == dict.fromkeys(KINDS, 2)


def test_a_rollback_counts_a_step_once_and_a_short_world_as_its_share() -> None:
    # Steps 1-10 before the window; in it 11-20 at world 3, a fault, a restore to 15, then
    # 16-20 again at world 2 and 21-25 at world 2: 15 useful steps (11-25).
    steps = [step(i * 0.1, i) for i in range(1, 11)]
    steps += [step(10 + i * 0.1, 10 + i) for i in range(1, 11)]
    steps += [step(20 + i * 0.1, 15 + i, world=2) for i in range(1, 11)]
    steps += [step(30 + i * 0.1, i, world=2, rank=1) for i in range(1, 5)]  # started afresh
    found = account(steps, t0=10.0, end=40.0, clean=0.1)
    assert (found["start_step"], found["end_step"], found["useful_steps"]) == (10, 25, 15)
    assert found["ettr"] == pytest.approx(15 * 0.1 / 30)
    assert found["goodput"] == pytest.approx((5 + 10 * 2 / 3) * 0.1 / 30, abs=1e-4)


def test_a_faults_pause_and_its_whole_world_back() -> None:
    steps = [step(1.0, 1), step(2.5, 2, world=2), step(4.0, 3)]
    played = [{"kind": "hung_worker", "node": "c", "at": 2.0}]
    [cost] = costs(steps, played, end=10.0)
    assert (cost["pause_s"], cost["world_back_s"]) == (0.5, 2.0)
    [never] = costs([step(1.0, 1), step(2.5, 2, world=2)], played, end=10.0)
    assert never["world_back_s"] is None
