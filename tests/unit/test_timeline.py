from __future__ import annotations

import pytest

from nodeagent.job.timeline import recovery
from nodeagent.model.job import Event


def ev(kind: str, at: float, gen: int | None = None, **data: object) -> Event:
    return Event(kind, generation=gen, at_ms=int(at * 1000), data=data)


EVENTS = [
    ev("generation_started", 5.0, 1, world_size=3),
    ev("worker_failed", 10.1, 1),
    ev("generation_announced", 10.12, 2),
    ev("node_ready", 10.2, 2),
    ev("node_ready", 10.5, 2),
    ev("generation_started", 10.52, 2, world_size=3),
]


def test_phases_of_a_recovery() -> None:
    r = recovery("worker kill", 10.0, EVENTS, {2: 12.0})
    assert (r.generation, r.world_size) == (2, 3)
    assert r.detection_s == pytest.approx(0.1)
    assert r.stopping_s == pytest.approx(0.4)
    assert r.rendezvous_s == pytest.approx(0.02)
    assert r.startup_s == pytest.approx(1.48)
    assert r.total_s == pytest.approx(2.0)


def test_the_cause_decides_detection_when_symptoms_come_first() -> None:
    """A lost node's peers crash at once; the loss itself is known when its lease expires."""
    events = [
        ev("worker_failed", 10.05, 1),
        ev("generation_announced", 10.06, 2),
        ev("node_ready", 10.1, 2),
        ev("node_lost", 14.9, None),
        ev("generation_started", 14.91, 2, world_size=2),
    ]
    r = recovery("node kill", 10.0, events, {2: 16.0}, cause="node_lost")
    assert r.detection_s == pytest.approx(4.9)
    assert r.stopping_s == 0 and r.rendezvous_s == pytest.approx(0.01)
    assert r.total_s == pytest.approx(6.0)


def test_unfinished_recoveries_say_so() -> None:
    assert recovery("x", 11.0, EVENTS, {}).total_s is None
    partial = recovery("x", 10.0, EVENTS[:3], {})
    assert partial.detection_s == pytest.approx(0.1) and partial.generation is None
    assert recovery("x", 10.0, EVENTS, {}).startup_s is None
