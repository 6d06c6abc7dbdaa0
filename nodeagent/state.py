"""The state machines of a job and of a node: str enums and their transition tables.

Both are published (status, events), hence str enums. An illegal transition raises
IllegalTransition: it is a bug in a decision function, never a runtime condition.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any

from nodeagent.errors import IllegalTransition


class JobState(str, Enum):
    """The state of a job, as the leader records it.

    WAITING     fewer than min_nodes eligible nodes (or joins settling); no workers run.
    RESTARTING  a new generation was announced; every live node is stopping its workers.
    RUNNING     the generation's members run their workers.
    SUCCEEDED   every worker of the generation exited 0. Terminal until `restart`.
    FAILED      restarts exhausted or rendezvous timed out. Terminal until `restart`.
    STOPPED     an operator ran `nodeagentctl stop`. Terminal until `restart`.
    """

    WAITING = "waiting"
    RESTARTING = "restarting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"

    @property
    def terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED)


_TERMINAL_JOB = {JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED}
JOB_TRANSITIONS: Mapping[JobState, frozenset[JobState]] = {
    JobState.WAITING: frozenset({JobState.RESTARTING, JobState.FAILED, JobState.STOPPED}),
    JobState.RESTARTING: frozenset(
        {JobState.RUNNING, JobState.WAITING, JobState.FAILED, JobState.STOPPED}
    ),
    JobState.RUNNING: frozenset({JobState.RESTARTING, *_TERMINAL_JOB}),
    JobState.SUCCEEDED: frozenset({JobState.RESTARTING}),
    JobState.FAILED: frozenset({JobState.RESTARTING}),
    JobState.STOPPED: frozenset({JobState.RESTARTING}),
}


class NodeState(str, Enum):
    """The state of one agent, as it publishes it.

    JOINING    started or rejoining; has not yet acknowledged a generation.
    STANDBY    acknowledged the current generation but is not one of its members.
    READY      a member with no workers yet: waiting for the assignment or starting them.
    RUNNING    this node's workers of the current generation are running.
    STOPPING   stopping its workers (SIGTERM, grace period, SIGKILL).
    SUCCEEDED  all of this node's workers of the generation exited 0.
    FAILED     a local worker failed; reported to the leader, waiting for the next generation.
    FENCED     could not renew its lease; stopped its workers; waits for a new generation.
    DRAINING   drained (by an operator or a GPU fault): stopping its workers to leave the job.
    CORDONED   not taking part in new generations: cordoned, or too few usable GPUs.
    LEAVING    shutting down: stopping workers, then removing its lease.
    """

    JOINING = "joining"
    STANDBY = "standby"
    READY = "ready"
    RUNNING = "running"
    STOPPING = "stopping"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    FENCED = "fenced"
    DRAINING = "draining"
    CORDONED = "cordoned"
    LEAVING = "leaving"


_ANYWHERE = {NodeState.FENCED, NodeState.LEAVING, NodeState.CORDONED}
_IDLE = {NodeState.JOINING, NodeState.STANDBY, NodeState.READY}
_OUTCOMES = {NodeState.SUCCEEDED, NodeState.FAILED}
_WORKING = {NodeState.RUNNING, NodeState.STOPPING, NodeState.DRAINING}
NODE_TRANSITIONS: Mapping[NodeState, frozenset[NodeState]] = {
    NodeState.JOINING: frozenset({NodeState.STANDBY, NodeState.READY, *_OUTCOMES, *_ANYWHERE}),
    # in_place: a node left out of the new generation stops the workers it had parked.
    NodeState.STANDBY: frozenset(
        {NodeState.JOINING, NodeState.READY, NodeState.STOPPING, NodeState.DRAINING, *_ANYWHERE}
    ),
    # A worker can start, fail or finish between two ticks: READY may lead anywhere.
    NodeState.READY: frozenset({*_IDLE, *_WORKING, *_OUTCOMES, *_ANYWHERE}),
    # Workers may all exit on their own before the next tick sees a new generation.
    NodeState.RUNNING: frozenset({*_IDLE, *_WORKING, *_OUTCOMES, *_ANYWHERE}),
    NodeState.STOPPING: frozenset({*_IDLE, *_WORKING, *_OUTCOMES, *_ANYWHERE}),
    NodeState.SUCCEEDED: frozenset({*_IDLE, *_ANYWHERE}),
    NodeState.FAILED: frozenset({*_IDLE, *_WORKING, *_ANYWHERE}),
    NodeState.FENCED: frozenset({*_IDLE, *_WORKING, NodeState.LEAVING, NodeState.CORDONED}),
    NodeState.DRAINING: frozenset({*_IDLE, NodeState.STOPPING, NodeState.FAILED, *_ANYWHERE}),
    NodeState.CORDONED: frozenset(
        {*_IDLE, *_WORKING, *_OUTCOMES, NodeState.FENCED, NodeState.LEAVING}
    ),
    NodeState.LEAVING: frozenset(),
}


def check_transition(table: Mapping[Any, frozenset[Any]], current: Enum, target: Enum) -> None:
    """Raise IllegalTransition unless `current -> target` is in `table` (or a no-op)."""
    if current != target and target not in table[current]:
        raise IllegalTransition(f"{current.value} -> {target.value} is not allowed")
