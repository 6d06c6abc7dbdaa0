"""GarbageLog: each piece of garbage is reported once while it stays. Pure."""

from __future__ import annotations

import logging

import pytest

from nodeagent.model.garbage import Garbage, GarbageLog

LEASE = Garbage("leases", "p:{j}:leases", "member evil has deadline inf", "removed")
CURSOR = Garbage("job", "p:{j}:job", "field cursor is past every command", "set to 0-0")
LEADER = Garbage("leader", "p:{j}:leader", "has no TTL", "taken over within lease_ttl")


def test_reported_once_while_it_stays(caplog: pytest.LogCaptureFixture) -> None:
    counted: list[str] = []
    log = GarbageLog("a")
    log.count_with(counted.append)
    with caplog.at_level(logging.WARNING):
        assert log.observe([LEASE], leading=True) == [LEASE]
        assert log.observe([LEASE, CURSOR], leading=True) == [CURSOR]
        assert log.observe([LEASE, CURSOR], leading=True) == []
        assert log.observe([], leading=True) == []  # gone (repaired)...
        assert log.observe([LEASE], leading=True) == [LEASE]  # ...and back: reported again
    assert counted == ["leases", "job", "leases"]
    assert [r.getMessage() for r in caplog.records].count(
        "garbage in Redis: p:{j}:leases: member evil has deadline inf (removed)"
    ) == 2
    events = log.take_events()
    assert [e.data["kind"] for e in events] == ["leases", "job", "leases"]
    assert all(e.type == "redis_garbage" and e.node == "a" for e in events)
    assert log.take_events() == []


def test_followers_send_events_only_for_what_the_leader_cannot_see() -> None:
    log = GarbageLog("b")
    log.observe([LEASE, CURSOR, LEADER], leading=False)
    assert [e.data["kind"] for e in log.take_events()] == ["leader"]


def test_events_of_a_failed_heartbeat_go_with_the_next() -> None:
    log = GarbageLog("a")
    log.observe([LEASE], leading=True)
    pending = log.take_events()
    log.put_back(pending)
    assert log.take_events() == pending


def test_a_new_leader_reports_what_it_saw_as_a_follower() -> None:
    log = GarbageLog("b")
    log.observe([LEASE], leading=False)
    assert log.take_events() == []  # a follower leaves it to the leader...
    assert log.observe([LEASE], leading=True) == [LEASE]  # ...which it now is
    assert [e.data["kind"] for e in log.take_events()] == ["leases"]
