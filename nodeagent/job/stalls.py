"""A rank every peer waits on, named by the job's leader in about a second (pure).

A rank stuck while its process runs (a deadlocked data loader, an I/O call that never returns)
is as silent as its peers, which are blocked in the step's collective with it: its own agent
cannot tell it from them, and alone would wait `hang_timeout`. But the job can: ranks that mark
their own part of a step (`progress.compute()`) say, in their beat, that they did it and wait
on a peer. So:

- **Each agent** lists, in its report, its ranks whose silence has become unlikely at their own
  step times (`stall_after`: the phi accrual detector of job/accrual.py over the rank's beat
  intervals, `timing.waited_phi`, never under FLOOR_S nor FLOOR_STEPS steps), split into those
  waiting on a peer and those silent in their own work. A rank counts as silent in its own work
  only while its process sleeps (not running, not in disk I/O) and used under IDLE_CPU of a CPU
  over its silence: a rank saving (pickling, writing, fsyncing) or computing is busy, not stuck.
  The lists are empty in a healthy job, so its reports do not change at every heartbeat.
- **The job's leader** (`waited_on`) names the nodes of the ranks silent in their own work when
  every rank of the generation is listed, at least one of them waiting: every peer waits on
  those. The record carries the names (`JobRecord.waited_on`), and only while it holds.
- **The named node** fails its silent rank as hung (job/watch.py). From there it is any hang:
  in place, that rank alone is killed (its sockets close, the waiting ranks' collective ends)
  and replaced; in restart mode, the job restarts.

A rank busy in long work of its own that sleeps (an upload at a trickle, a read of a network
file system that blocks) while every peer waits looks stuck after its step history's silence;
the job's history learns such pauses once they are seen, and the first costs the rank a
restart. `waited_phi: off` leaves such jobs to `hang_timeout`.
"""

from __future__ import annotations

from collections.abc import Mapping

from nodeagent.job.accrual import MIN_SAMPLES, Arrivals, Silence
from nodeagent.model.job import JobRecord, NodeReport
from nodeagent.state import JobState, NodeState
from nodeagent.supervisor.status import Activity

FLOOR_S = 0.5  # the least silence listed, whatever the rank's steps
FLOOR_STEPS = 3  # nor under this many of its mean step
CAP_S = 3600.0  # the longest silence the detector is asked about (hang_timeout judges past it)
IDLE_CPU = 0.25  # a rank that used more of a CPU than this over its silence is busy


def stall_after(arrivals: Arrivals, phi: float) -> float | None:
    """The silence after which a rank with these step intervals is listed as stalled; None while
    too few intervals were seen to judge (or `phi` is 0: off)."""
    if phi <= 0 or len(arrivals.intervals) < MIN_SAMPLES:
        return None
    mean, _ = arrivals.mean_and_spread()
    rule = Silence(max(mean, 1e-6), CAP_S, phi)
    floor = max(FLOOR_S, FLOOR_STEPS * mean)
    low, high = floor, CAP_S
    if rule.phi_of(low, arrivals) >= phi:
        return floor
    for _ in range(50):  # bisection, to well under a millisecond
        middle = (low + high) / 2
        low, high = (low, middle) if rule.phi_of(middle, arrivals) >= phi else (middle, high)
    return high


def idle(since_beat: Activity | None, now: Activity | None, silence: float) -> bool:
    """The process slept through its silence: it sleeps now and used under IDLE_CPU of a CPU
    since its last beat. Unknown activity is never idle."""
    if since_beat is None or now is None or not now.sleeping or silence <= 0:
        return False
    return (now.cpu_s - since_beat.cpu_s) < IDLE_CPU * silence


def waited_on(record: JobRecord, nodes: Mapping[str, NodeReport]) -> tuple[str, ...]:
    """The members whose ranks every other rank waits on (the module docstring); () unless
    every rank of the running generation is listed stalled by its node, some waiting and
    some silent in their own work."""
    if record.state is not JobState.RUNNING or not record.members:
        return ()
    named, waiting = [], 0
    for member in record.members:
        report = nodes.get(member)
        if (
            report is None
            or report.state is not NodeState.RUNNING
            or report.worker_generation != record.generation
        ):
            return ()
        listed = set(report.stalled) | set(report.waiting)
        overlap = set(report.stalled) & set(report.waiting)
        if listed != set(range(record.nproc_per_node)) or overlap:
            return ()
        waiting += len(report.waiting)
        if report.stalled:
            named.append(member)
    return tuple(named) if named and waiting else ()
