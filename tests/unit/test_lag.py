"""replication_behind's verdict (job/checkpoints/lag.py): pure, on a clock the test holds."""

from __future__ import annotations

from nodeagent.job.checkpoints.lag import Saves, behind


def saves(*seen: tuple[int, float]) -> Saves:
    found = Saves()
    for step, when in seen:
        found = found.saw(step, when)
    return found


def test_the_interval_is_learned_from_the_saves_seen_not_from_the_two_slots() -> None:
    seen = saves((10, 0.0), (15, 5.0), (15, 6.0), (20, 10.2))
    assert seen.interval() == (5, 5.0)
    assert saves((10, 0.0)).interval() is None
    assert behind(saves((10, 0.0)), None, 100.0) is None  # one save: nothing to tell yet


def test_copies_that_keep_up_are_not_behind() -> None:
    seen = saves((10, 0.0), (15, 5.0), (20, 10.0))
    assert behind(seen, 20, 11.0) is None
    assert behind(seen, 15, 12.0) is None  # step 20's copies under way: within an interval


def test_a_newest_save_waiting_past_an_interval_means_the_next_was_skipped() -> None:
    """With the committed save pinned the slots hold 15 and 20: 20 - 15 is one interval, yet
    the worker finds no slot for step 25 while 20 is not committed."""
    seen = saves((10, 0.0), (15, 5.0), (20, 10.0))
    assert behind(seen, 15, 17.4) is None
    why = behind(seen, 15, 17.6)
    assert why is not None and "step 20 not committed 7.6s after it was saved" in why


def test_a_commit_more_than_an_interval_back_or_none_is_behind() -> None:
    seen = saves((10, 0.0), (15, 5.0), (20, 10.0))
    assert behind(seen, 10, 10.5) == (
        "step 10 committed, more than one save interval (5 steps) behind 20"
    )
    assert behind(seen, None, 10.5) == (
        "nothing committed, more than one save interval (5 steps) behind 20"
    )


def test_a_restore_that_goes_back_starts_the_count_over() -> None:
    seen = saves((10, 0.0), (15, 5.0), (20, 10.0)).saw(12, 30.0)
    assert seen.seen == ((12, 30.0),) and behind(seen, 10, 100.0) is None
