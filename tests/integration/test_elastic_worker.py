"""In-place recovery, worker side: real processes, real gloo on CPU, no agent, no Redis.

The test is the stand-in agent: it makes each worker's control file (nodeagent.channel.control),
starts workers with torchrun's environment, and writes assignments into the files as the
agent will. tests/helpers/elastic_worker.py is the training script.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from nodeagent.channel import control
from nodeagent.channel.control import Assignment, ControlFile
from tests.helpers.cluster import free_port
from tests.helpers.standin import assignment, stacks_of

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "helpers" / "elastic_worker.py"


@dataclass
class Worker:
    process: subprocess.Popen[bytes]
    channel: ControlFile

    @property
    def pid(self) -> int:
        return self.process.pid


@dataclass
class Job:
    """The stand-in agent: workers, their channels, and what they recorded."""

    directory: Path
    reform_timeout: float = 30.0
    env: dict[str, str] = field(default_factory=dict)
    workers: list[Worker] = field(default_factory=list)

    def start(self, a: Assignment, seed: int = 0) -> Worker:
        path = self.directory / f"worker-{len(self.workers)}.control"
        control.create(path)
        env = {
            **os.environ,
            **a.environment(),
            "TORCHELASTIC_MAX_RESTARTS": "3",
            "TORCHELASTIC_RUN_ID": "elastic-test",
            "NODEAGENT_CONTROL_FILE": str(path),
            "RECORD_DIR": str(self.directory),
            "REFORM_TIMEOUT_S": str(self.reform_timeout),
            "SEED": str(seed),
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(ROOT),
            **self.env,
        }
        log = open(self.directory / f"worker-{len(self.workers)}.log", "wb")  # noqa: SIM115
        process = subprocess.Popen([sys.executable, str(SCRIPT)], env=env, stdout=log, stderr=log)
        log.close()
        worker = Worker(process, ControlFile(path))
        self.workers.append(worker)
        return worker

    def lines(self, event: str | None = None) -> list[dict[str, Any]]:
        found = []
        for path in sorted(self.directory.glob("*.jsonl")):
            for text in path.read_text().splitlines():
                line = json.loads(text)
                if event is None or line["event"] == event:
                    found.append(line)
        return found

    def wait(self, what: str, until: Callable[[], bool], timeout: float = 45.0) -> None:
        deadline = time.monotonic() + timeout
        while not until():
            if time.monotonic() > deadline:
                logs = {p.name: p.read_text()[-2000:] for p in self.directory.glob("*.log")}
                stacks = {w.pid: stacks_of(w.pid) for w in self.workers if w.process.poll() is None}
                raise AssertionError(
                    f"timed out waiting for {what}; logs: {logs}; stacks of live workers: {stacks}"
                )
            time.sleep(0.02)

    def steps(self, pid: int) -> list[int]:
        return [line["step"] for line in self.lines("step") if line["pid"] == pid]

    def stepping(self, pid: int, generation: int, count: int = 3) -> bool:
        lines = [line for line in self.lines("step") if line["pid"] == pid]
        return sum(1 for line in lines if line["gen"] == generation) >= count

    def finish(self, *workers: Worker) -> dict[int, dict[str, Any]]:
        """Stop every rank at one step ahead of all; return each pid's final line."""
        stop_at = max(line["step"] for line in self.lines("step")) + 10
        (self.directory / "stop").write_text(str(stop_at))
        for worker in workers:
            assert worker.process.wait(timeout=20) == 0, f"worker {worker.pid} failed"
        finals = {line["pid"]: line for line in self.lines("final")}
        assert {line["step"] for line in finals.values()} == {stop_at}
        return finals

    def close(self) -> None:
        for worker in self.workers:
            if worker.process.poll() is None:
                worker.process.kill()
            worker.process.wait()
            worker.channel.close()


@pytest.fixture
def job(tmp_path: Path) -> Iterator[Job]:
    job = Job(tmp_path)
    yield job
    job.close()


def start_two(job: Job) -> tuple[Worker, Worker]:
    port = free_port()
    first, second = (job.start(assignment(1, rank, 2, port)) for rank in range(2))
    job.wait("both ranks stepping", lambda: all(job.stepping(w.pid, 1) for w in (first, second)))
    return first, second


def consecutive(steps: list[int]) -> bool:
    return steps == list(range(steps[0], steps[0] + len(steps)))


def assert_identical(finals: dict[int, dict[str, Any]], count: int) -> None:
    assert len(finals) == count and len({line["hash"] for line in finals.values()}) == 1


@pytest.mark.timeout(60)
def test_new_assignment_reforms_in_place_without_losing_a_step(job: Job) -> None:
    first, second = start_two(job)
    port = free_port()
    written = time.time()
    for rank, worker in enumerate((first, second)):
        worker.channel.assign(assignment(2, rank, 2, port))
    job.wait(
        "both ranks stepping in generation 2",
        lambda: all(job.stepping(w.pid, 2, 1) for w in (first, second)),
    )
    resumed = max(
        min(line["t"] for line in job.lines("step") if line["pid"] == w.pid and line["gen"] == 2)
        for w in (first, second)
    )
    print(f"\nre-form: assignment written -> both ranks stepping again {resumed - written:.3f} s")
    for worker in (first, second):
        assert worker.channel.report().left_generation == 1
    finals = job.finish(first, second)
    assert_identical(finals, 2)
    for worker in (first, second):
        assert consecutive(job.steps(worker.pid)), "a step was lost or repeated"
    synced = [line for line in job.lines("synced") if line["gen"] == 2]
    assert {line["pid"] for line in synced} == {first.pid, second.pid}  # same processes


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sharded", [False, True], ids=["ddp", "ddp+fsdp2"])
def test_a_rank_that_leaves_first_frees_its_peers_blocked_in_a_collective(
    job: Job, sharded: bool
) -> None:
    """Only rank 0 is told: it leaves between steps while rank 1 goes on into the next step's
    all-reduce. Rank 0's old group must really close (nothing may keep it alive, such as the
    traceback of the Reform that holds train_fn's DDP wrapper, or torch's own references
    after FSDP2 ran: see nodeagent/worker/release.py), so that rank 1's all-reduce fails at
    once and rank 1 leaves too, instead of waiting on open connections (90 s here)."""
    job.env["SHARDED"] = "1" if sharded else "0"
    first, second = start_two(job)
    first.channel.leave(1)
    job.wait("rank 1 to leave too", lambda: second.channel.report().left_generation == 1, 20)
    port = free_port()
    for rank, worker in enumerate((first, second)):
        worker.channel.assign(assignment(2, rank, 2, port))
    job.wait("both stepping in 2", lambda: all(job.stepping(w.pid, 2) for w in (first, second)))
    assert_identical(job.finish(first, second), 2)


@pytest.mark.timeout(90)
def test_a_survivor_blocked_on_a_frozen_peer_leaves_as_soon_as_it_is_told(job: Job) -> None:
    """Rank 1 freezes (SIGSTOP) with its connections open: rank 0 blocks in the next
    all-reduce, where no check() runs and gloo would wait out its 30 min timeout. Told to
    leave, its abort thread shuts the group's connections down after a grace of two steps
    (nodeagent/worker/abort.py), so it leaves and re-forms with a newcomer, the same process,
    long before the 30 s reform_timeout (its fallback, which would kill it)."""
    first, second = start_two(job)
    os.kill(second.pid, signal.SIGSTOP)
    time.sleep(1.0)
    blocked_at = len(job.steps(first.pid))
    time.sleep(0.5)
    assert len(job.steps(first.pid)) == blocked_at  # blocked: no step comes
    first.channel.leave(1)
    job.wait("rank 0 to leave", lambda: first.channel.report().left_generation == 1, 20)
    assert first.process.poll() is None  # it left; nobody killed it
    os.kill(second.pid, signal.SIGKILL)
    port = free_port()
    first.channel.assign(assignment(2, 0, 2, port))
    newcomer = job.start(assignment(2, 1, 2, port), seed=7)
    job.wait("both stepping in 2", lambda: all(job.stepping(w.pid, 2) for w in (first, newcomer)))
    assert "shut down" in (job.directory / "worker-0.log").read_text()
    assert_identical(job.finish(first, newcomer), 2)


@pytest.mark.timeout(60)
def test_survivor_of_a_killed_peer_reforms_and_the_newcomer_gets_its_state(job: Job) -> None:
    first, second = start_two(job)
    killed = time.time()
    os.kill(first.pid, signal.SIGKILL)  # rank 0: the process group's store goes with it
    first.process.wait()
    job.wait(
        "the survivor to leave generation 1", lambda: second.channel.report().left_generation == 1
    )
    left = time.time()
    committed = second.channel.report().committed_step
    port = free_port()
    second.channel.assign(assignment(3, 0, 2, port))
    newcomer = job.start(assignment(3, 1, 2, port), seed=7)  # other initial weights
    job.wait(
        "both stepping in generation 3",
        lambda: all(job.stepping(w.pid, 3) for w in (second, newcomer)),
    )
    stepping = max(
        min(line["t"] for line in job.lines("step") if line["pid"] == w.pid and line["gen"] == 3)
        for w in (second, newcomer)
    )
    print(
        f"\nSIGKILL -> survivor left generation 1: {left - killed:.3f} s (seen by polling);"
        f" assignment written and newcomer started -> both stepping: {stepping - left:.3f} s"
    )
    synced = {line["pid"]: line for line in job.lines("synced") if line["gen"] == 3}
    assert synced[second.pid]["hash"] == synced[newcomer.pid]["hash"]
    assert synced[second.pid]["step"] == synced[newcomer.pid]["step"] == committed
    assert job.steps(newcomer.pid)[0] == committed + 1
    assert consecutive(job.steps(second.pid))
    assert_identical(job.finish(second, newcomer), 2)


@pytest.mark.timeout(60)
def test_survivor_without_a_new_assignment_exits_after_reform_timeout(job: Job) -> None:
    job.reform_timeout = 1.0
    first, second = start_two(job)
    os.kill(second.pid, signal.SIGKILL)
    started = time.monotonic()
    code = first.process.wait(timeout=20)
    assert code != 0
    assert time.monotonic() - started >= 1.0
    assert first.channel.report().left_generation == 1
    assert [line["pid"] for line in job.lines("timed_out")] == [first.pid]
