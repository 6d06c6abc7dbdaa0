"""model/history.py: a job's generations and restarts by cause, from its events."""

from __future__ import annotations

from nodeagent.model.history import Generation, generations, restarts_by_cause
from nodeagent.model.job import Event


def event(kind: str, generation: int, at_ms: int, reason: str, **data: object) -> Event:
    return Event(kind, generation=generation, data={"reason": reason, **data}, at_ms=at_ms)


EVENTS = [
    event("generation_announced", 1, 100, "node_joined"),
    event("generation_started", 1, 200, "node_joined", members=["a", "b"]),
    event("worker_failed", 1, 300, ""),
    event("generation_announced", 2, 310, "worker_failed"),
    event("generation_started", 2, 400, "worker_failed", members=["a", "b"]),
    event("generation_announced", 3, 500, "node_lost"),
    event("generation_announced", 4, 510, "worker_failed"),
    event("generation_started", 4, 600, "worker_failed", members=["a"], members_more=63),
    Event("generation_started", generation=None, data={}),  # not a generation: left out
]


def test_generations_are_the_ones_that_started_with_their_nodes() -> None:
    assert generations(EVENTS) == [
        Generation(1, 200, ("a", "b"), 0, "node_joined"),
        Generation(2, 400, ("a", "b"), 0, "worker_failed"),
        Generation(4, 600, ("a",), 63, "worker_failed"),
    ]


def test_restarts_count_every_announcement_after_the_first_generation_by_its_reason() -> None:
    assert restarts_by_cause(EVENTS) == {"worker_failed": 2, "node_lost": 1}
    assert restarts_by_cause(EVENTS[:3]) == {}


def test_a_reason_nodeagent_did_not_write_is_counted_as_other_as_the_metrics_count_it() -> None:
    """Events come from Redis: text that is no RestartReason is not shown as a cause."""
    odd = [
        event("generation_announced", 2, 100, "x" * 200),
        event("generation_announced", 3, 200, ""),
    ]
    assert restarts_by_cause(odd) == {"other": 2}
