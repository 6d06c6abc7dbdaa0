"""The control channel's layout, seqlock and error handling (nodeagent.channel.control)."""

from __future__ import annotations

import multiprocessing
import stat
import struct
import threading
import time
from pathlib import Path

import pytest

from nodeagent.channel import control, restore
from nodeagent.channel.control import Assignment, ControlFile, ControlFileError, Leave, Report

A = Assignment(4, 3, 1, 8, 2, 1, 4, "node-17.cluster.example", 29500, 2)
B = Assignment(5, 0, 0, 1, 1, 0, 1, "10.0.0.1", 41000, 3)
ORDER = "memory:120@4 persistent:100@3 script start"
C = Assignment(6, 3, 1, 8, 2, 1, 4, "10.0.0.1", 41000, 3, restore=ORDER)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    path = tmp_path / "gen-1" / "rank-0.control"
    control.create(path)
    return path


def test_a_new_file_holds_no_assignment_and_no_report(path: Path) -> None:
    channel = ControlFile(path)
    assert channel.sequence() == 0 and channel.message() == (0, None)
    assert channel.report() == Report(left_generation=-1, committed_step=-1)
    assert stat.S_IMODE(path.stat().st_mode) == control.MODE == 0o660
    assert path.stat().st_size == control.SIZE == 344


def test_assignments_and_reports_round_trip_between_two_mappings(path: Path) -> None:
    agent, worker = ControlFile(path), ControlFile(path)
    assert agent.assign(A) == 1 and worker.sequence() == 1
    assert worker.message() == (1, A)
    agent.assign(B)
    assert worker.sequence() == 2 and worker.message() == (2, B)
    worker.report_step(41)
    worker.report_left(4)
    worker.report_step(42)
    assert agent.report() == Report(left_generation=4, committed_step=42)
    assert agent.finished_generation() == -1
    worker.report_finished(5)
    worker.report_step(43)
    agent.assign(B)  # neither area is the other's
    assert agent.finished_generation() == 5
    assert agent.report() == Report(left_generation=4, committed_step=43)
    assert worker.message() == (3, B)


def test_leave_and_assignments_share_the_message_area(path: Path) -> None:
    agent, worker = ControlFile(path), ControlFile(path)
    agent.assign(A)
    assert agent.leave(4) == 2 and worker.message() == (2, Leave(4))
    agent.assign(B)  # the next generation's assignment replaces the leave
    assert worker.message() == (3, B)


def test_a_leave_with_values_in_its_unused_fields_is_garbage(path: Path) -> None:
    channel = ControlFile(path)
    channel.leave(3)
    _overwrite(path, control.MESSAGE_AT + control.SEQ.size + 12, struct.pack("<i", 1))
    with pytest.raises(ControlFileError, match="a leave with values in its unused fields"):
        channel.message()
    with pytest.raises(ValueError, match="generation -1 < 0"):
        channel.leave(-1)


def test_an_assignment_carries_the_restore_order_and_clears_an_older_one(path: Path) -> None:
    agent, worker = ControlFile(path), ControlFile(path)
    agent.assign(C)
    assert worker.message() == (1, C)
    assert C.environment()[restore.RESTORE_ENV] == ORDER
    agent.assign(B)  # a generation without tiers: its environment clears the order
    assert worker.message() == (2, B) and B.environment()[restore.RESTORE_ENV] == ""


def test_environment_is_torchruns_variables() -> None:
    env = A.environment()
    assert env["RANK"] == "3" and env["ROLE_RANK"] == "3" and env["WORLD_SIZE"] == "8"
    assert env["GROUP_RANK"] == "1" and env["GROUP_WORLD_SIZE"] == "4"
    assert env["MASTER_ADDR"] == "node-17.cluster.example" and env["MASTER_PORT"] == "29500"
    assert env["TORCHELASTIC_RESTART_COUNT"] == "2" and env["NODEAGENT_GENERATION"] == "4"


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"rank": 8}, "rank 8 outside world 8"),
        ({"local_rank": -1}, "local rank -1 outside 2"),
        ({"group_rank": 4}, "group rank 4 outside 4"),
        ({"master_port": 0}, "master port 0"),
        ({"master_addr": "x" * 65}, "over 64 bytes"),
        ({"master_addr": ""}, "empty"),
        ({"generation": -1}, "generation -1"),
        ({"restore": "memory:1@1 " * 20}, "over 192 bytes"),
        ({"restore": "mémoire:1"}, "not ASCII"),
    ],
)
def test_an_impossible_assignment_is_never_written(
    path: Path, change: dict[str, object], problem: str
) -> None:
    bad = Assignment(**{**A.__dict__, **change})
    channel = ControlFile(path)
    with pytest.raises(ValueError, match=problem):
        channel.assign(bad)
    assert channel.sequence() == 0


def _overwrite(path: Path, at: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(data)


@pytest.mark.parametrize(
    ("at", "data", "message"),
    [
        (0, b"NAPB", "magic b'NAPB'"),
        (4, struct.pack("<I", 1), "version 1"),  # the layout before the leave message
    ],
)
def test_a_foreign_file_is_refused(path: Path, at: int, data: bytes, message: str) -> None:
    _overwrite(path, at, data)
    with pytest.raises(ControlFileError, match=message):
        ControlFile(path)


def test_a_file_of_another_size_is_refused(path: Path) -> None:
    _overwrite(path, control.SIZE, b"\0")
    with pytest.raises(ControlFileError, match="345 bytes, a control file has 344"):
        ControlFile(path)


@pytest.mark.parametrize(
    ("body_at", "data", "message"),
    [
        (12, struct.pack("<i", 99), "rank 99 outside world 8"),  # the rank field
        (52, b"\xff\xfe", "not UTF-8"),  # the address field
        (52 + 30, b"junk", "not NUL-padded"),
        (108, b"\xff\xfe", "restore order .* is not UTF-8"),  # the restore field
        (108 + 30, b"junk", "restore order field .* not NUL-padded"),
        (8, struct.pack("<i", 7), "message kind 7, expected 1 or 2"),  # the kind field
    ],
)
def test_garbage_in_the_assignment_is_a_clear_error(
    path: Path, body_at: int, data: bytes, message: str
) -> None:
    channel = ControlFile(path)
    channel.assign(A)
    _overwrite(path, control.MESSAGE_AT + control.SEQ.size + body_at, data)
    with pytest.raises(ControlFileError, match=message):
        channel.message()


def test_garbage_before_any_assignment_is_a_clear_error(path: Path) -> None:
    _overwrite(path, control.MESSAGE_AT + 20, b"\x01")
    with pytest.raises(ControlFileError, match="no message written but the area is not empty"):
        ControlFile(path).message()


def test_a_write_in_progress_is_never_read(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An odd seq: the reader waits for the writer, and gives up on one that died mid-write."""
    channel = ControlFile(path)
    channel.assign(A)
    _overwrite(path, control.MESSAGE_AT, control.SEQ.pack(3))  # a write of B begins...
    _overwrite(path, control.MESSAGE_AT + control.SEQ.size, control.encode(B)[:20])
    monkeypatch.setattr(control, "READ_PATIENCE_S", 0.05)
    with pytest.raises(ControlFileError, match="a write began and never finished"):
        channel.message()
    monkeypatch.setattr(control, "READ_PATIENCE_S", 5.0)
    seen: list[tuple[int, control.Message | None]] = []
    reader = threading.Thread(target=lambda: seen.append(channel.message()))
    reader.start()
    time.sleep(0.05)
    assert not seen  # still waiting on the odd seq
    _overwrite(path, control.MESSAGE_AT + control.SEQ.size, control.encode(B))
    _overwrite(path, control.MESSAGE_AT, control.SEQ.pack(4))  # ...and ends
    reader.join(timeout=5)
    assert seen == [(2, B)]


def test_a_writer_cut_short_by_its_own_death_carries_on(path: Path) -> None:
    channel = ControlFile(path)
    channel.assign(A)
    _overwrite(path, control.MESSAGE_AT, control.SEQ.pack(3))  # the agent died mid-write
    assert ControlFile(path).assign(B) == 2
    assert channel.message() == (2, B)


def _hammer(path: str, seconds: float) -> None:
    channel = ControlFile(Path(path))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        channel.assign(A)
        channel.assign(B)


def test_each_seq_is_an_aligned_word() -> None:
    assert control.SEQ.size == 8
    assert control.MESSAGE_AT % 8 == 0 and control.REPORT_AT % 8 == 0


def test_a_reader_never_sees_a_torn_assignment(path: Path) -> None:
    """Another process writes A and B in turn as fast as it can while this one reads. (Storing
    seq with struct.pack_into, which zeroes the field first, made this fail now and then.)"""
    channel = ControlFile(path)
    channel.assign(A)
    writer = multiprocessing.get_context("spawn").Process(target=_hammer, args=(str(path), 1.5))
    writer.start()
    try:
        while channel.sequence() < 10:  # wait for the writer to start writing
            time.sleep(0.001)
        reads = [channel.message()[1] for _ in range(20_000)]
    finally:
        writer.join(timeout=10)
    assert writer.exitcode == 0
    assert set(reads) == {A, B}
