"""The agent's hang verdicts (job/watch.py's HangWatch) on real progress files: no progress for
hang_timeout, and a rank stopped by a signal, found in stopped_timeout and named alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeagent.channel import beats
from nodeagent.channel.beats import BeatWriter
from nodeagent.job.watch import Hang, HangWatch


def UNDATED() -> float:
    """A wall clock before every beat: each beat is dated when it is read (the tests' times)."""
    return 0.0


def beating(tmp_path: Path, rank: int, step: int) -> BeatWriter:
    path = tmp_path / f"rank-{rank}.progress"
    beats.create(path)
    writer = BeatWriter(path)
    writer.beat(step)
    return writer


def test_beats_and_hang_watch(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.progress"
    beats.create(path)
    watch = HangWatch(timeout_s=10, wall=UNDATED)
    watch.watch({0: path, 1: tmp_path / "never-beats"}, now=0.0)
    assert watch.hung(now=100.0) == []  # never beat: not watched
    writer = BeatWriter(path)
    writer.beat(41)
    writer.beat(42)
    assert watch.hung(now=100.0) == []  # progress seen at t=100
    assert watch.last_progress()[0].step == 42
    assert watch.next_check() == 110.0
    assert watch.hung(now=109.0) == []
    assert watch.hung(now=110.0) == [Hang(0, False, 10.0)]
    writer.beat(43)
    assert watch.hung(now=111.0) == []
    writer.close()
    off = HangWatch(
        timeout_s=0, wall=UNDATED
    )  # hang detection off: nobody is hung, beats still read
    off.watch({0: path}, now=0.0)
    assert off.hung(now=1e9) == [] and off.last_progress()[0].step == 43


def test_a_rank_that_finished_is_never_hung(tmp_path: Path) -> None:
    """Issue 62: a rank whose training reached its end waits for its exit, or for its peers'
    ends, without beating: not a hang. Its stretch still ends at its last step."""
    path = tmp_path / "rank-0.progress"
    beats.create(path)
    watch = HangWatch(timeout_s=10, stopped_s=0.5, wall=UNDATED)
    watch.watch({0: path}, now=0.0)
    writer = BeatWriter(path)
    writer.beat(7)
    assert watch.hung(now=5.0) == []
    writer.finish()
    assert watch.hung(now=100.0, stopped=lambda rank: True) == [] and watch.next_check() is None
    assert watch.last_progress()[0].finished
    stretch = watch.stretch(0)
    assert stretch is not None and (stretch.last_at, stretch.last_step) == (5.0, 7)
    writer.close()


def test_a_stopped_rank_is_hung_at_stopped_timeout_and_its_waiting_peer_is_not(
    tmp_path: Path,
) -> None:
    """Rank 1 is stopped by a signal; rank 0 waits for it in a collective (asleep, not
    stopped). At 0.5 s without a beat rank 1 alone is hung; rank 0 only at hang_timeout."""
    writers = [beating(tmp_path, rank, 12) for rank in (0, 1)]
    watch = HangWatch(timeout_s=10, stopped_s=0.5, wall=UNDATED)
    watch.watch({rank: tmp_path / f"rank-{rank}.progress" for rank in (0, 1)}, now=0.0)
    asked: list[int] = []

    def stopped(rank: int) -> bool:
        asked.append(rank)
        return rank == 1

    assert watch.hung(now=0.0, stopped=stopped) == [] and asked == []  # beat just read
    assert watch.next_check() == 0.5
    assert watch.hung(now=0.4, stopped=stopped) == [] and asked == []  # not silent long enough
    assert watch.hung(now=0.5, stopped=stopped) == [Hang(1, True, 0.5)]
    assert asked == [0, 1]
    # Rank 0 asleep in its collective is asked again each stopped_s, not at every pass
    assert watch.next_check() == 1.0
    # At hang_timeout both are silent: the stopped one comes first, whichever rank it is
    assert watch.hung(now=10.0, stopped=stopped) == [Hang(1, True, 10.0), Hang(0, False, 10.0)]
    for writer in writers:
        writer.close()


def test_a_slow_step_is_not_a_stopped_rank_and_off_asks_nothing(tmp_path: Path) -> None:
    """A rank silent for seconds in a long step (running, not stopped) is not hung before
    hang_timeout; with stopped_timeout off its process is never asked."""
    writer = beating(tmp_path, 0, 3)
    files = {0: tmp_path / "rank-0.progress"}
    watch = HangWatch(timeout_s=0, stopped_s=0.5, wall=UNDATED)
    watch.watch(files, now=0.0)
    watch.hung(now=0.0)
    assert watch.hung(now=5.0, stopped=lambda rank: False) == []
    assert watch.next_check() == 5.5
    writer.beat(4)
    assert watch.hung(now=6.0) == [] and watch.next_check() == 6.5

    off = HangWatch(timeout_s=0, stopped_s=0, wall=UNDATED)
    off.watch(files, now=0.0)

    def never(rank: int) -> bool:
        raise AssertionError("asked with stopped_timeout off")

    assert off.hung(now=100.0, stopped=never) == [] and off.next_check() is None
    writer.close()


def test_a_beat_is_dated_by_its_wall_time_never_before_the_read_that_missed_it(
    tmp_path: Path,
) -> None:
    """The agent reads the files when it wakes: a beat 0.3 s old when read is dated 0.3 s
    earlier, so a stopped rank is found stopped_s after its last beat, not after the read. A
    wall time from before the last read (a worker's clock is no authority) is clamped to it."""
    writer = beating(tmp_path, 0, 5)
    written = beats.read(tmp_path / "rank-0.progress")
    assert written is not None
    clock = {"wall": written.wall_time + 0.3}
    watch = HangWatch(timeout_s=0, stopped_s=0.5, wall=lambda: clock["wall"])
    watch.watch({0: tmp_path / "rank-0.progress"}, now=10.0)
    watch.hung(now=11.0)
    assert watch.next_check() == pytest.approx(11.2)  # 10.7 + 0.5
    found = watch.hung(now=11.25, stopped=lambda rank: True)
    assert [(h.local_rank, h.stopped, round(h.for_s, 6)) for h in found] == [(0, True, 0.55)]
    writer.beat(6)
    clock["wall"] += 100.0  # a beat that says it is 100 s old, read 1 s after the last read
    found = watch.hung(now=12.25, stopped=lambda rank: True)
    assert [(h.local_rank, round(h.for_s, 6)) for h in found] == [(0, 1.0)]  # from 11.25
    writer.close()


def test_a_rank_waiting_on_its_peers_is_given_the_grace_and_the_one_it_waits_for_is_not(
    tmp_path: Path,
) -> None:
    """A hang while every rank runs: rank 1 did its own part of the next step (its compute
    moved on since its last beat) and waits in the collective; rank 0 never got that far (a
    deadlocked data loader). At hang_timeout rank 0 alone is hung; rank 1 is hung only after
    the grace, when nothing replaced the rank it waits for."""
    stuck, waiting = beating(tmp_path, 0, 5), beating(tmp_path, 1, 5)
    watch = HangWatch(timeout_s=10, wall=UNDATED, waiting_grace_s=3)
    watch.watch({0: tmp_path / "rank-0.progress", 1: tmp_path / "rank-1.progress"}, now=0.0)
    assert watch.hung(now=1.0) == []  # both beats read at t=1
    waiting.computed(0.25)  # step 6's forward: done, then the all-reduce blocks
    assert watch.hung(now=2.0) == []
    assert watch.hung(now=11.0) == [Hang(0, False, 10.0)]
    assert watch.next_check() == 11.0  # rank 0's check comes again; rank 1's at 1 + 10 + 3
    assert watch.hung(now=13.9) == [Hang(0, False, 12.9)]
    assert watch.hung(now=14.0) == [Hang(0, False, 13.0), Hang(1, False, 13.0, waiting=True)]
    waiting.beat(6)  # a beat ends the wait
    stuck.beat(6)
    assert watch.hung(now=15.0) == []
    for writer in (stuck, waiting):
        writer.close()


def test_marked_compute_is_stored_at_once_and_is_no_beat(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.progress"
    writer = beating(tmp_path, 0, 3)
    writer.computed(0.5)
    read = beats.read(path)
    assert read is not None and (read.beats, read.step, read.compute_s) == (1, 3, 0.5)
    assert read.waiting
    writer.close()


def test_a_rank_read_only_after_its_next_compute_is_waiting_too(tmp_path: Path) -> None:
    """The agent reads the files when it wakes: a beat and the next step's compute may both
    come between two reads. The file says the compute ended since the beat (version 4), so the
    rank is still known to wait (comparing compute times across reads took it for stuck)."""
    path = tmp_path / "rank-0.progress"
    beats.create(path)
    watch = HangWatch(timeout_s=10, wall=UNDATED, waiting_grace_s=3)
    watch.watch({0: path}, now=0.0)
    writer = BeatWriter(path)
    writer.beat(9)
    writer.computed(0.1)  # step 10's forward, before the agent woke
    assert watch.hung(now=1.0) == []
    assert watch.hung(now=11.0) == []  # in its grace
    assert watch.hung(now=14.0) == [Hang(0, False, 13.0, waiting=True)]
    writer.close()
