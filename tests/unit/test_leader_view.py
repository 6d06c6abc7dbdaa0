"""LeaderView folds the leader's pages into what it plans from (coord/view.py)."""

from __future__ import annotations

from nodeagent.coord.replies import NodeLease, Snapshot, ViewPage
from nodeagent.coord.view import LeaderView

NOW = 1_000_000


def page(
    *leases: NodeLease,
    seq: int = 10,
    reached: int = 10,
    expired: tuple[NodeLease, ...] = (),
    next_deadline: int | None = NOW + 500,
    gone: tuple[str, ...] = (),
    leader: str = "a 1",
) -> Snapshot:
    return Snapshot(
        now_ms=NOW,
        leader=leader,
        rev=1,
        record=None,
        leases=leases,
        gone=gone,
        page=ViewPage(seq, reached, False, expired, next_deadline, "0"),
    )


def deadlines(view: LeaderView) -> dict[str, int]:
    return {lease.name: lease.deadline_ms for lease in view.leases(NOW)}


def test_a_lease_not_read_again_is_live_until_at_least_the_earliest_deadline() -> None:
    view = LeaderView()
    assert not view.start(page(NodeLease("a", NOW + 900, None), NodeLease("b", NOW + 100, None)))
    assert view.cursor == 0  # a new term: read everything from 0 first
    view.add(page(reached=10))
    assert view.start(page(NodeLease("a", NOW + 1900, None), next_deadline=NOW + 300))
    # b was not read again and is not expired: its deadline is at least the earliest live one.
    # a's is the one just read.
    assert deadlines(view) == {"a": NOW + 1900, "b": NOW + 300}


def test_expired_leases_are_exact_and_keep_their_reports() -> None:
    view = LeaderView()
    view.start(page(NodeLease("b", NOW + 100, None)))
    view.add(page(reached=10))
    view.start(page(expired=(NodeLease("b", NOW - 5, None),)))
    assert deadlines(view) == {"b": NOW - 5}


def test_gone_and_forgotten_leases_leave_the_view() -> None:
    view = LeaderView()
    view.start(page(NodeLease("b", NOW + 100, None), NodeLease("c", NOW + 100, None)))
    view.start(page(gone=("b",)))
    view.forget(["c"])
    assert deadlines(view) == {}


def test_no_live_lease_left_means_the_unread_ones_hold_none() -> None:
    view = LeaderView()
    view.start(page(NodeLease("b", NOW + 100, None)))
    view.start(page(next_deadline=None))
    assert deadlines(view) == {}


def test_a_new_term_or_a_counter_below_the_cursor_starts_over() -> None:
    view = LeaderView()
    view.start(page(NodeLease("b", NOW + 100, None)))
    view.add(page(reached=50))
    assert view.start(page(seq=60)) and view.cursor == 50
    assert not view.start(page(seq=40)) and view.cursor == 0
    view.add(page(reached=45))
    assert not view.start(page(seq=60, leader="b 2")) and view.cursor == 0
