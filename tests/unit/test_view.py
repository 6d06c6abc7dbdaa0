"""LeaderView folds the leader's pages into what it plans from (coord/view.py)."""

from __future__ import annotations

from nodeagent.coord.view import LeaderView, Lease, ViewPage, ViewRead

NOW = 1_000_000


def page(
    *leases: Lease[str],
    seq: int = 10,
    reached: int = 10,
    expired: tuple[tuple[str, int], ...] = (),
    next_deadline: int | None = NOW + 500,
    gone: tuple[str, ...] = (),
    leader: str = "a 1",
) -> ViewRead[str]:
    return ViewRead(
        leader, leases, gone, page=ViewPage(seq, reached, False, expired, next_deadline, "0")
    )


def deadlines(view: LeaderView[str]) -> dict[str, int]:
    return {lease.name: lease.deadline_ms for lease in view.leases(NOW)}


def test_a_lease_not_read_again_is_live_until_at_least_the_earliest_deadline() -> None:
    view = LeaderView[str]()
    assert not view.start(page(Lease("a", NOW + 900, None), Lease("b", NOW + 100, None)))
    assert view.cursor == 0  # a new term: read everything from 0 first
    view.add(page(reached=10))
    assert view.start(page(Lease("a", NOW + 1900, None), next_deadline=NOW + 300))
    # b was not read again and is not expired: the deadline it read is still ahead, a lower
    # bound of its real one. a's is the one just read.
    assert deadlines(view) == {"a": NOW + 1900, "b": NOW + 100}
    # Once what it read has passed (and b is still not among the expired): the earliest live one.
    view.start(page(next_deadline=NOW + 300))
    assert view.leases(NOW + 200) == (Lease("a", NOW + 1900, None), Lease("b", NOW + 300, None))


def test_expired_leases_are_exact_and_keep_their_reports() -> None:
    view = LeaderView[str]()
    view.start(page(Lease("b", NOW + 100, "b's report")))
    view.add(page(reached=10))
    view.start(page(expired=(("b", NOW - 5),)))
    assert view.leases(NOW) == (Lease("b", NOW - 5, "b's report"),)


def test_gone_and_forgotten_leases_leave_the_view() -> None:
    view = LeaderView[str]()
    view.start(page(Lease("b", NOW + 100, None), Lease("c", NOW + 100, None)))
    view.start(page(gone=("b",)))
    view.forget(["c"])
    assert deadlines(view) == {}


def test_no_live_lease_left_means_the_unread_ones_hold_none() -> None:
    view = LeaderView[str]()
    view.start(page(Lease("b", NOW + 100, None)))
    view.start(page(next_deadline=None))
    assert deadlines(view) == {}


def test_a_new_term_or_a_counter_below_the_cursor_starts_over() -> None:
    view = LeaderView[str]()
    view.start(page(Lease("b", NOW + 100, None)))
    view.add(page(reached=50))
    assert view.start(page(seq=60)) and view.cursor == 50
    assert not view.start(page(seq=40)) and view.cursor == 0
    view.add(page(reached=45))
    assert not view.start(page(seq=60, leader="b 2")) and view.cursor == 0
