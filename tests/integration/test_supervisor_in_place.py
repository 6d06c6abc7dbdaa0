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
time.sleep(float(os.environ.get("SET_UP_S", "0")))  # imports, a model built: a slow start
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
    def __init__(self, tmp_path: Path, warm_ups: bool = False) -> None:
        self.logs = tmp_path / "logs"
        self.woken = threading.Event()
        self.sup = Supervisor(echo=lambda rank, line: None, wake=self.woken.set, warm_ups=warm_ups)

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

    def kill_second_and_release(self, set_up_s: float) -> tuple[WorkerSpec, int | None, int]:
        """Generation 1 started with a slow start (`set_up_s`), local rank 1 SIGKILLed, the
        group released: generation 1's second spec, the survivor's pid and the victim's."""
        first = [replace(s, env={**s.env, "SET_UP_S": str(set_up_s)}) for s in self.specs(1, 0)]
        self.sup.start(1, "n", first)
        self.wait_lines(first[1].log_path, "started: generation 1 rank 1")
        survivor, victim = self.pids()
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: self.sup.poll() or self.sup.status().failure, 10, "the failure seen")
        self.sup.release(30)
        return first[1], survivor, victim

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


def test_a_failed_rank_warms_up_outside_the_generation_and_is_kept_once_ready(
    tmp_path: Path,
) -> None:
    """Warm-ups (issue 53): the dead rank's replacement starts at the release, told to leave
    the old generation before it can read anything else, and parks once set up. Meanwhile the
    group is PARKED (nobody is in a collective) with one warming: the agent acknowledges the
    next generation at once and the leader goes on without this node."""
    h = Harness(tmp_path, warm_ups=True)
    try:
        dead, survivor, victim = h.kill_second_and_release(1.5)
        status = h.sup.status()
        assert (status.phase, status.warming) == (GroupPhase.PARKED, 1) or (
            status.phase is GroupPhase.RELEASING  # the survivor has not reported leaving yet
        )
        warmup = [w for w in h.sup.workers() if w.state == "warming"]
        assert len(warmup) == 1 and warmup[0].pid not in (None, survivor, victim)
        directory = dead.log_path.parent
        h.wait_lines(directory / "rank-1.warmup.log", "started: generation 1 rank 1")
        assert (directory / "rank-1.warmup.control").exists()
        assert dead.log_path.read_text().count("started") == 1  # the dead one's log kept

        def ready() -> bool:
            h.sup.poll()
            return h.sup.status().warming == 0 and h.sup.status().phase is GroupPhase.PARKED

        wait_for(ready, 15, "the warm-up parked")
        assert [w.state for w in h.sup.workers()] == ["parked", "failed", "parked"]

        second = h.specs(2, 4)
        started = h.sup.start(2, "n", second)
        assert (started.kept, started.warmed) == (1, 1)  # the warm-up was in no generation
        assert [w.pid for w in h.sup.workers()] == [survivor, warmup[0].pid]
        h.wait_lines(second[1].log_path, "assigned: generation 2 rank 5")
        assert h.sup.status().phase is GroupPhase.RUNNING
    finally:
        h.sup.kill()


def test_a_rank_warming_up_when_the_node_is_chosen_takes_its_assignment_as_it_starts(
    tmp_path: Path,
) -> None:
    """A job that cannot go on without this node (min_nodes) chooses it while it warms: the
    warm-up is handed its rank like a survivor, never started twice."""
    h = Harness(tmp_path, warm_ups=True)
    try:
        h.kill_second_and_release(2)
        warming = [w.pid for w in h.sup.workers() if w.state == "warming"]
        assert len(warming) == 1
        wait_for(lambda: h.sup.poll() or h.sup.status().phase is GroupPhase.PARKED, 15, "parked")
        assert h.sup.status().warming == 1
        h.sup.start(2, "n", h.specs(2, 0))
        assert h.sup.workers()[1].pid == warming[0]
        h.wait_lines(h.specs(2, 0)[1].log_path, "assigned: generation 2 rank 1")
    finally:
        h.sup.kill()


def test_without_warm_ups_a_dead_rank_waits_for_the_next_generation(h: Harness) -> None:
    h.kill_second_and_release(0)
    h.settle(GroupPhase.PARKED)
    assert len(h.sup.workers()) == 2 and h.sup.status().warming == 0
