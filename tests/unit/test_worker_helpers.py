"""The worker-side helpers: graceful exit, progress beats, rescaling (checkpoints elsewhere)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nodeagent.channel import beats
from nodeagent.worker import GracefulExit, rescale

torch = pytest.importorskip("torch")


def test_graceful_exit_only_sets_a_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODEAGENT_STOP_GRACE_S", "12")
    with GracefulExit() as guard:
        assert not guard.should_stop() and guard.time_left() == 12
        os.kill(os.getpid(), signal.SIGTERM)
        assert guard.should_stop() and guard.signal is signal.SIGTERM
        assert 0 < guard.time_left() <= 12
        assert guard.should_stop_all()  # no process group: this rank's own flag
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


@pytest.mark.parametrize(
    ("policy", "expected"),
    [("linear", (0.2, 32)), ("keep_global_batch", (0.1, 64))],
)
def test_rescale(policy: str, expected: tuple[float, int]) -> None:
    result = (
        rescale(0.1, 32, old_world=4, new_world=8)
        if policy == "linear"
        else rescale(0.1, 128, old_world=4, new_world=8, policy=policy)
    )
    assert (round(result.lr, 6), result.per_rank_batch) == expected


def test_rescale_errors_and_callbacks() -> None:
    with pytest.raises(ValueError, match="unknown policy"):
        rescale(0.1, 1, 1, 2, policy="magic")
    with pytest.raises(ValueError, match=">= 1"):
        rescale(0.1, 1, 0, 2)
    from nodeagent.worker import Rescaled

    assert rescale(1.0, 8, 2, 3, policy=lambda lr, b, o, n: Rescaled(lr * 2, b)).lr == 2.0


def test_corrupt_progress_file_reads_as_none(tmp_path: Path) -> None:
    path = tmp_path / "p"
    path.write_bytes(b"garbage" * 5)
    assert beats.read(path) is None
    assert beats.read(tmp_path / "missing") is None


def test_first_beat_makes_sigusr1_dump_stacks(tmp_path: Path) -> None:
    """Beating opts into hang detection; SIGUSR1 must then dump stacks, not kill the rank."""
    import subprocess
    import sys

    path = tmp_path / "p"
    beats.create(path)
    code = (
        "import os, signal, time\nfrom nodeagent.worker import beat\nbeat(1)\n"
        "os.kill(os.getpid(), signal.SIGUSR1)\ntime.sleep(0.2)\nprint('alive')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "NODEAGENT_PROGRESS_FILE": str(path)},
    )
    assert result.returncode == 0 and "alive" in result.stdout
    assert "most recent call first" in result.stderr
    assert beats.read(path) is not None and beats.read(path).step == 1  # type: ignore[union-attr]


def test_compute_time_is_stored_at_once_and_version_1_still_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nodeagent.worker import progress

    path = tmp_path / "rank-0.progress"
    beats.create(path)
    monkeypatch.setenv(progress.ENV, str(path))
    monkeypatch.setattr(progress._Default, "resolved", False)
    monkeypatch.setattr(progress._Default, "writer", None)
    with progress.compute():
        time.sleep(0.02)
    stored = beats.read(path)  # at once, and no beat: the rank did its part, it waits
    assert stored is not None and (stored.beats, stored.step, stored.waiting) == (0, -1, True)
    assert stored.compute_s is not None and stored.compute_s >= 0.02
    progress.beat(7)
    read = beats.read(path)
    assert read is not None and read.step == 7 and read.compute_s is not None
    assert not read.waiting  # a beat ends the wait
    assert read.compute_s >= 0.02
    # a file an older worker package wrote: no compute time, the rest as before
    path.write_bytes(beats.LAYOUTS[1].pack(beats.MAGIC, 1, 3, 9, 1.5))
    assert beats.read(path) == beats.Beat(3, 9, 1.5, None)
    # garbage compute time (negative, NaN) is no beat
    path.write_bytes(beats.LAYOUTS[2].pack(beats.MAGIC, 2, 3, 9, 1.5, float("nan")))
    assert beats.read(path) is None


def test_finished_reaches_the_agent_and_an_older_file_is_written_in_its_own_version(
    tmp_path: Path,
) -> None:
    """Issue 62: `finish()` sets version 3's `finished`, keeping the last beat. A version 2
    file (an older agent's) is written as version 2 (it has no room for the flag), and a
    version 2 writer (an older worker package) in the agent's version 3 file still reads."""
    path = tmp_path / "rank-0.progress"
    beats.create(path)
    writer = beats.BeatWriter(path)
    writer.beat(41)
    assert beats.read(path) == beats.Beat(1, 41, beats.read(path).wall_time, 0.0)  # type: ignore[union-attr]
    assert writer.finish() is True
    read = beats.read(path)
    assert read is not None and (read.beats, read.step, read.finished) == (1, 41, True)
    writer.close()

    # an agent of version 3 (no `waiting`): version 3 is written, `finished` with it
    three = tmp_path / "rank-3.progress"
    three.write_bytes(beats.LAYOUTS[3].pack(beats.MAGIC, 3, 0, -1, 0.0, 0.0, 0))
    writer = beats.BeatWriter(three)
    writer.computed(0.5)
    writer.beat(5)
    assert writer.finish() is True
    assert three.stat().st_size == beats.LAYOUTS[3].size
    read = beats.read(three)
    assert read is not None and (read.step, read.compute_s, read.finished) == (5, 0.5, True)
    assert not read.waiting
    writer.close()

    older = tmp_path / "rank-1.progress"
    older.write_bytes(beats.LAYOUTS[2].pack(beats.MAGIC, 2, 0, -1, 0.0, 0.0))
    writer = beats.BeatWriter(older)
    writer.beat(3)
    assert writer.finish() is False
    assert older.stat().st_size == beats.LAYOUTS[2].size
    read = beats.read(older)
    assert read is not None and (read.step, read.finished) == (3, False)
    writer.close()

    beats.create(path)
    with open(path, "r+b") as f:  # an older worker's writer: its version in the first 40 bytes
        f.write(beats.LAYOUTS[2].pack(beats.MAGIC, 2, 5, 12, 2.5, 1.0))
    assert beats.read(path) == beats.Beat(5, 12, 2.5, 1.0, False)


def test_the_failing_exit_is_put_in_place_once_even_after_every_question_was_forgotten(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A second `train()` asks again after the first forgot its question: still one excepthook
    over the original, one atexit handler."""
    import atexit
    import sys

    from nodeagent.worker import graceful

    seen: list[BaseException] = []
    registered: list[object] = []
    monkeypatch.setattr(sys, "excepthook", lambda kind, value, tb: seen.append(value))
    monkeypatch.setattr(atexit, "register", registered.append)
    monkeypatch.setattr(graceful, "_installed", False)
    monkeypatch.setattr(graceful, "_asked", [])
    monkeypatch.setattr(graceful, "_failed", [])

    def first() -> bool:
        return False

    def second() -> bool:
        return True

    graceful.exit_at_once_when_failing(first)
    graceful.no_longer_exit_at_once(first)
    graceful.exit_at_once_when_failing(second)
    assert registered == [graceful._exit_if_failed]
    error = RuntimeError("Connection closed by peer")
    sys.excepthook(RuntimeError, error, None)
    assert seen == [error]  # the original hook, once
    assert graceful._failed == [error]


ENDED = """
import atexit, os, sys
import torch.distributed as dist
from nodeagent.worker import ending
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[1], rank=0, world_size=1)
atexit.register(lambda: print("initialized at the end:", dist.is_initialized(), flush=True))
getattr(ending, sys.argv[2])()
getattr(ending, sys.argv[2])()  # once, however many times
"""


@pytest.mark.parametrize("called", ["training_ended", "destroy_group_at_exit"])
def test_a_rank_that_ended_or_stopped_destroys_its_group_at_exit(
    tmp_path: Path, called: str
) -> None:
    """What the integrations call once a rank's training returned (issue 62): the group is gone
    before the interpreter's finalization (the handler registered before it runs after it),
    whether it ended or stopped at SIGTERM; the progress file says finished only when it ended."""
    path = tmp_path / "rank-0.progress"
    beats.create(path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = subprocess.run(
        [sys.executable, "-c", ENDED, str(port), called],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NODEAGENT_PROGRESS_FILE": str(path)},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["initialized at the end: False"]
    read = beats.read(path)
    assert read is not None and read.finished == (called == "training_ended")
