"""The fence keeper's pure parts: its decision, its orders, process identity, bounded calls."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from nodeagent.coord.bounded import BoundedCalls
from nodeagent.errors import CoordinationError
from nodeagent.supervisor import cgroups
from nodeagent.supervisor.fence import Due, Group, Orders, due, kill_leftovers, start_ticks

G = (Group(100, 5),)
TERM, KILL = signal.SIGTERM, signal.SIGKILL


@pytest.mark.parametrize(
    ("orders", "now", "sent", "expected"),
    [
        (Orders(10.0, 20.0, ()), 30.0, None, Due(None, None)),  # no groups: nothing to fence
        (Orders(10.0, 20.0, G), 5.0, None, Due(None, 10.0)),  # wait for term_at
        (Orders(10.0, 20.0, G), 10.0, None, Due(TERM, 20.0)),  # term due
        (Orders(10.0, 20.0, G), 12.0, TERM, Due(None, 20.0)),  # termed: wait for kill_at
        (Orders(10.0, 20.0, G), 20.0, TERM, Due(KILL, None)),  # kill due
        (Orders(10.0, 20.0, G), 25.0, None, Due(KILL, None)),  # late: straight to KILL
        (Orders(10.0, 20.0, G), 25.0, KILL, Due(None, None)),  # done until new orders
        (Orders(None, None, G), 99.0, None, Due(None, None)),  # no lease: only EOF fences
    ],
)
def test_keeper_decision(
    orders: Orders, now: float, sent: signal.Signals | None, expected: Due
) -> None:
    assert due(orders, now, sent) == expected


def test_orders_round_trip_as_one_line() -> None:
    orders = Orders(1.5, 2.25, (Group(10, 3), Group(11, 4)))
    line = orders.to_line()
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert Orders.from_line(line) == orders
    assert Orders.from_line(Orders(goodbye=True).to_line()).goodbye


def test_start_ticks_reads_field_22_past_a_command_with_spaces(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    rest = " ".join(str(n) for n in range(4, 22))  # fields 4..21, then 22 = starttime
    (tmp_path / "42" / "stat").write_text(f"42 (a) b (c)) S {rest} 777 0 0\n")
    assert start_ticks(42, tmp_path) == 777
    assert start_ticks(43, tmp_path) is None


def test_leftovers_record_that_is_garbage_is_removed_and_kills_nothing(tmp_path: Path) -> None:
    record = tmp_path / "n.workers.json"
    record.write_text("{not json")
    assert kill_leftovers(record, tmp_path) == []
    assert not record.exists()
    assert kill_leftovers(tmp_path / "missing.json", tmp_path) == []


def test_leftovers_are_killed_unless_the_pid_was_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group is signalled when its leader is gone or still the same process (same start
    time); a leader with another start time is someone else's process."""
    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(
        "nodeagent.supervisor.fence.os.killpg", lambda pgid, sig: sent.append((pgid, sig))
    )
    for pid, started in ((4242, 999), (4343, 5)):
        (tmp_path / str(pid)).mkdir()
        rest = " ".join(["0"] * 18)
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (x) S {rest} {started} 0\n")
    record = tmp_path / "n.workers.json"
    record.write_text('{"groups": [[4242, 1], [4343, 5], [4444, 7]]}')
    assert [g.pgid for g in kill_leftovers(record, tmp_path)] == [4343, 4444]
    assert sent == [(4343, signal.SIGKILL), (4444, signal.SIGKILL)]


def test_bounded_call_returns_its_result_and_its_error() -> None:
    calls = BoundedCalls()
    assert calls.run(lambda: 7, time.monotonic() + 5, "x") == 7

    def fail() -> int:
        raise CoordinationError("down")

    with pytest.raises(CoordinationError, match="down"):
        calls.run(fail, time.monotonic() + 5, "x")


def test_bounded_call_gives_up_at_its_deadline_and_blocks_nothing_behind_it() -> None:
    calls = BoundedCalls()
    release = threading.Event()
    with pytest.raises(CoordinationError, match="no reply from Redis within"):
        calls.run(release.wait, time.monotonic() + 0.05, "heartbeat")
    with pytest.raises(CoordinationError, match="earlier Redis call has had no reply"):
        calls.run(lambda: 1, time.monotonic() + 5, "heartbeat")
    release.set()
    deadline = time.monotonic() + 5
    while True:  # the stuck call returns; calls go through again
        try:
            assert calls.run(lambda: 2, time.monotonic() + 5, "heartbeat") == 2
            break
        except CoordinationError:
            assert time.monotonic() < deadline
            time.sleep(0.01)


def test_a_containerised_group_names_its_cidfile_and_reads_back() -> None:
    cidfile = "/dev/shm/nodeagent/a.j+run/nodeagent-j-a-g2-rank1.cid"
    orders = Orders(1.0, 2.0, (Group(10, 3), Group(11, 4, cidfile)))
    assert Orders.from_line(orders.to_line()) == orders
    assert f'"groups": [[10, 3], [11, 4, "{cidfile}"]]'.encode() in orders.to_line()


@pytest.mark.parametrize(
    "item",
    [
        [1, 2, "system.slice/sshd.service"],  # not a cidfile
        [1, 2, "/dev/shm/nodeagent/../../etc/x.cid"],
        [1, 2, "relative/w.cid"],
        [1, 2, 3, 4],
        "1 2",
    ],
)
def test_a_group_that_is_not_the_agents_is_refused(item: object) -> None:
    with pytest.raises(ValueError):
        Group.read(item)


@pytest.mark.parametrize(
    "name",
    [
        "system.slice/sshd.service",
        "nodeagent/job/w",
        "nodeagent/libpod-" + "0" * 63,
        "nodeagent/../system.slice/libpod-" + "0" * 64,
        "machine.slice/libpod-" + "0" * 64 + ".scope",  # another parent than the agent's
    ],
)
def test_only_a_container_cgroup_below_the_agents_parent_is_one_to_kill(name: str) -> None:
    with pytest.raises(cgroups.CgroupNameError):
        cgroups.check_name(name)
    assert cgroups.check_name(f"nodeagent/libpod-{'a' * 64}")
    assert cgroups.check_name(f"nodeagent.slice/libpod-{'a' * 64}.scope")


def test_a_cidfile_leads_to_its_containers_cgroup_and_nothing_else(tmp_path: Path) -> None:
    tmp_path.chmod(0o700)
    root = tmp_path / "cgroup"  # a v2 tree as the kernel mounts it
    (root / "cgroup.controllers").parent.mkdir()
    (root / "cgroup.controllers").write_text("")
    cid = "b" * 64
    cidfile = tmp_path / "w.cid"
    assert cgroups.container_cgroup(str(cidfile), root) is None  # not written yet
    cidfile.write_text(cid + "\n")
    assert cgroups.container_cgroup(str(cidfile), root) is None  # not started yet
    (root / "nodeagent.slice" / f"libpod-{cid}.scope").mkdir(parents=True)
    assert cgroups.container_cgroup(str(cidfile), root) == f"nodeagent.slice/libpod-{cid}.scope"
    cidfile.write_text("../../system.slice")  # garbage is no id
    assert cgroups.container_cgroup(str(cidfile), root) is None


def test_only_a_cidfile_the_agent_alone_could_have_written_is_read(tmp_path: Path) -> None:
    """A record outlives a reboot, /dev/shm does not: a user who makes memory_dir first must
    not steer the record's kill at another container, nor hang the agent on a FIFO."""
    memory_dir = tmp_path / "nodeagent"
    run = memory_dir / "a.j+run"
    run.mkdir(parents=True)
    for directory in (tmp_path, memory_dir, run):
        directory.chmod(0o700)
    cid = "c" * 64
    cidfile = run / "w.cid"
    cidfile.write_text(cid)
    assert cgroups.container_id(str(cidfile)) == cid
    memory_dir.chmod(0o777)  # a parent another user may write
    assert cgroups.container_id(str(cidfile)) is None
    memory_dir.chmod(0o755)
    run.chmod(0o770)
    assert cgroups.container_id(str(cidfile)) is None
    run.chmod(0o700)
    os.chown(cidfile, 65534, 65534)  # a file of another user's
    assert cgroups.container_id(str(cidfile)) is None
    cidfile.unlink()
    (run / "real").write_text(cid)
    cidfile.symlink_to(run / "real")
    assert cgroups.container_id(str(cidfile)) is None  # never through a link
    cidfile.unlink()
    os.mkfifo(cidfile)
    assert cgroups.container_id(str(cidfile)) is None  # and never waiting on a FIFO
