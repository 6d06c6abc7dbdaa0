"""The supervisor's in-place re-form against real processes that speak the control channel.

The workers here are a few lines of Python over nodeagent.channel.control (no torch): they report
leaving when told to (unless STUCK, a worker blocked in a collective with a frozen peer) and
print each assignment they take.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from nodeagent.channel.control import Assignment
from nodeagent.supervisor.group import Supervisor
from nodeagent.supervisor.spec import WorkerSpec
from nodeagent.supervisor.status import GroupPhase
from tests.helpers.cluster import wait_for

WORKER = """
import os, time
from pathlib import Path
from nodeagent.channel.control import Assignment, ControlFile, Leave
channel = ControlFile(Path(os.environ["NODEAGENT_CONTROL_FILE"]))
generation, seen = int(os.environ["NODEAGENT_GENERATION"]), 0
print(f"started: generation {generation} rank {os.environ['RANK']}", flush=True)
while True:
    if channel.sequence() != seen:
        seen, message = channel.message()
        if isinstance(message, Leave) and message.generation >= generation:
            if os.environ.get("STUCK") != "1":
                channel.report_left(generation)
        elif isinstance(message, Assignment) and message.generation > generation:
            generation = message.generation
            print(f"assigned: generation {generation} rank {message.rank}", flush=True)
    time.sleep(0.01)
"""


class Harness:
    def __init__(self, tmp_path: Path) -> None:
        self.logs = tmp_path / "logs"
        self.woken = threading.Event()
        self.sup = Supervisor(echo=lambda rank, line: None, wake=self.woken.set)

    def specs(self, generation: int, first_rank: int, stuck: int | None = None) -> list[WorkerSpec]:
        """Two local ranks of `generation`, global ranks first_rank and first_rank + 1."""
        specs = []
        for local in range(2):
            rank = first_rank + local
            directory = self.logs / str(generation)
            env = {
                **os.environ,
                "RANK": str(rank),
                "NODEAGENT_GENERATION": str(generation),
                "NODEAGENT_CONTROL_FILE": str(directory / f"rank-{rank}.control"),
                "NODEAGENT_PROGRESS_FILE": str(directory / f"rank-{rank}.progress"),
                "STUCK": "1" if local == stuck else "0",
            }
            assignment = Assignment(
                generation, rank, local, first_rank + 2, 2, 0, 1, "127.0.0.1", 29500, generation
            )
            specs.append(
                WorkerSpec(
                    rank=rank,
                    local_rank=local,
                    argv=(sys.executable, "-c", WORKER),
                    env=env,
                    cwd=None,
                    log_path=directory / f"rank-{rank}.log",
                    progress_path=directory / f"rank-{rank}.progress",
                    assignment=assignment,
                )
            )
        return specs

    def settle(self, phase: GroupPhase, timeout: float = 15) -> None:
        def done() -> bool:
            self.sup.poll()
            return self.sup.status().phase is phase

        wait_for(done, timeout, f"group {phase.value}")

    def pids(self) -> list[int | None]:
        return [w.pid for w in self.sup.workers()]

    def wait_lines(self, path: Path, text: str) -> None:
        wait_for(lambda: path.exists() and text in path.read_text(), 15, f"{text!r} in {path}")


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path)
    yield harness
    harness.sup.kill()


def test_survivors_leave_park_and_take_their_new_ranks_in_the_same_processes(h: Harness) -> None:
    first = h.specs(1, 0)
    h.sup.start(1, "n", first)
    h.wait_lines(first[1].log_path, "started: generation 1 rank 1")
    pids = h.pids()
    h.sup.release(30)
    h.settle(GroupPhase.PARKED)
    assert [w.state for w in h.sup.workers()] == ["parked", "parked"]
    assert h.sup.status().generation == 1 and not h.sup.status().active

    second = h.specs(2, 4)  # this node is now group 2 of 3: ranks 4 and 5
    started = h.sup.start(2, "n", second)
    assert started.kept == 2 and h.pids() == pids
    h.wait_lines(second[1].log_path, "assigned: generation 2 rank 5")  # its new rank's log
    assert "assigned" not in first[1].log_path.read_text()
    stable = (first[1].log_path.parent.parent / "rank-5.log").read_text()
    assert "generation 2, rank 5" in stable and "assigned: generation 2 rank 5" in stable
    # A survivor keeps the files it was started with: its progress file and its channel.
    assert [s.progress_path for s in started.specs] == [s.progress_path for s in first]
    assert started.specs[0].control_path == first[0].control_path
    status = h.sup.status()
    assert status.phase is GroupPhase.RUNNING and status.generation == 2


def test_a_dead_rank_is_started_anew_beside_the_survivor(h: Harness) -> None:
    h.sup.start(1, "n", h.specs(1, 0))
    h.wait_lines(h.specs(1, 0)[0].log_path, "started")
    survivor, victim = h.pids()
    assert victim is not None
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: h.sup.poll() or h.sup.status().failure, 10, "the failure seen")
    h.sup.release(30)
    h.settle(GroupPhase.PARKED)
    started = h.sup.start(2, "n", h.specs(2, 0))
    assert started.kept == 1
    pids = h.pids()
    assert pids[0] == survivor and pids[1] not in (None, victim)
    h.wait_lines(h.specs(2, 0)[1].log_path, "started: generation 2 rank 1")


def test_a_survivor_that_does_not_leave_is_killed_at_reform_timeout(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    h.sup.start(1, "n", h.specs(1, 0, stuck=1))
    h.wait_lines(h.specs(1, 0)[1].log_path, "started")
    leaver, stuck = h.pids()
    h.sup.release(0.5)
    assert h.sup.status().phase is GroupPhase.RELEASING
    deadline = h.sup.next_deadline()
    assert deadline is not None  # the agent's loop wakes up for it
    exits = []

    def parked() -> bool:
        exits.extend(h.sup.poll())
        return h.sup.status().phase is GroupPhase.PARKED

    wait_for(parked, 15, "the stuck survivor killed, the other parked")
    assert [(e.local_rank, e.signal, e.expected) for e in exits] == [(1, "SIGKILL", True)]
    killed = [r for r in caplog.records if "did not leave generation 1" in r.getMessage()]
    assert len(killed) == 1 and h.sup.next_deadline() is None  # once, and no busy loop
    assert h.sup.status().failure is None  # the generation's replacement, not a new failure
    started = h.sup.start(2, "n", replace_stuck(h.specs(2, 0)))
    assert started.kept == 1 and h.pids()[0] == leaver and h.pids()[1] != stuck


def replace_stuck(specs: list[WorkerSpec]) -> list[WorkerSpec]:
    return [replace(s, env={**s.env, "STUCK": "0"}) for s in specs]


def test_a_hung_rank_is_killed_at_once_and_the_others_are_released(h: Harness) -> None:
    """A hang (or an XID) was found by the agent's watch: that rank would never leave, so it
    is killed when the group is released instead of at reform_timeout."""
    h.sup.start(1, "n", h.specs(1, 0, stuck=0))
    h.wait_lines(h.specs(1, 0)[0].log_path, "started")
    h.sup.mark_failed(0, "hang")
    h.sup.release(30)
    h.settle(GroupPhase.PARKED, timeout=5)  # long before reform_timeout
    assert [w.state for w in h.sup.workers()] == ["failed", "parked"]
    assert h.sup.status().failure is not None  # the hang is still this generation's failure


def test_the_agent_is_woken_when_its_workers_have_left(h: Harness) -> None:
    """Leaving is a write to shared memory, which wakes nobody: the release's watcher wakes the
    agent's loop, which would otherwise see the group parked only at its next heartbeat."""
    h.sup.start(1, "n", h.specs(1, 0))
    h.wait_lines(h.specs(1, 0)[1].log_path, "started")
    h.woken.clear()
    h.sup.release(30)
    assert h.woken.wait(5), "not woken"
    wait_for(lambda: h.woken.wait(0.1) and h.sup.status().phase is GroupPhase.PARKED, 5, "parked")
