"""What the supervisor reports about a generation's workers: the group's phase and status, a
worker's exit, what a start did. Plain data, read by the job's decisions (job/decide.py)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from nodeagent.model.job import Failure
from nodeagent.supervisor.spec import WorkerSpec


@dataclass(frozen=True)
class WorkerExit:
    """A worker's main process ended. `expected` when the agent had asked it to stop;
    `finished` when it had said it reached its end first (in place: its training returned),
    so that an exit that fails after that (a library's teardown aborting the interpreter) is
    not a failure of the job, which would then train again from its start (issue 52)."""

    generation: int
    rank: int
    local_rank: int
    exit_code: int | None
    signal: str | None
    expected: bool
    cause: str | None = None  # a failure's root cause or last lines (Worker.cause)
    finished: bool = False

    @property
    def failed(self) -> bool:
        return not self.expected and not self.finished and self.exit_code != 0


@dataclass(frozen=True)
class Started:
    """What start() did: the workers' specs (a survivor's keeps its own progress file),
    processes started in preloaded interpreters, in_place survivors kept, warm-ups (started
    before the generation formed, outside it) handed their ranks."""

    specs: tuple[WorkerSpec, ...] = ()
    preloaded: int = 0
    kept: int = 0
    warmed: int = 0


class GroupPhase(str, Enum):
    """The local worker group.

    NONE       no workers were started (or the last group was forgotten).
    RUNNING    at least one worker of the group is running and no stop was requested.
    STOPPING   a stop was requested; some process of the group is still alive.
    EXITED     every process of the group is gone.
    RELEASING  in_place: the workers were told to leave the generation; some have not yet.
    PARKED     in_place: every live worker has left the generation's process group and waits,
               alive, for its next assignment (no worker takes part in any collective); a
               warm-up still starting (GroupStatus.warming) was never in one.
    """

    NONE = "none"
    RUNNING = "running"
    STOPPING = "stopping"
    EXITED = "exited"
    RELEASING = "releasing"
    PARKED = "parked"


@dataclass(frozen=True)
class GroupStatus:
    generation: int | None = None
    phase: GroupPhase = GroupPhase.NONE
    failure: Failure | None = None
    succeeded: bool = False  # every worker exited 0
    warming: int = 0  # in place: warm-ups started outside any generation, not parked yet
    released: bool = False  # in place: told to leave its generation (Supervisor.release)

    @property
    def active(self) -> bool:
        """Some worker may still take part in the generation's collectives."""
        return self.phase in (GroupPhase.RUNNING, GroupPhase.STOPPING, GroupPhase.RELEASING)

    @property
    def stoppable(self) -> bool:
        """Live workers that no stop was requested for: what a stop must reach."""
        return self.phase in (GroupPhase.RUNNING, GroupPhase.RELEASING, GroupPhase.PARKED)


@dataclass(frozen=True)
class Activity:
    """A worker as /proc shows it (supervisor/usage.py): whether it does no work of its own
    (no thread of its process or of those it started running or in disk I/O) and the CPU
    seconds they have used (job/stalls.py)."""

    sleeping: bool
    cpu_s: float
