"""A rank every other rank waits on, named by the job's leader in about a second (pure).

A rank stuck while its process runs (a deadlocked data loader, a call that never returns) is as
silent as its peers, which are blocked in a collective with it: its own agent cannot tell it
from them, and alone would wait `hang_timeout`. The job can:

- **Each agent** lists, in its report, its ranks whose silence has become unlikely at their own
  step times (`stall_after`: the phi accrual detector of job/accrual.py over the rank's beat
  intervals, `timing.waited_phi`, never under FLOOR_S nor FLOOR_STEPS steps), each with its
  last step, whether it waits on a peer (its `progress.compute()` mark moved on since that beat)
  and whether it is asleep (no thread of its process or of those it started running or in
  disk I/O, supervisor/usage.py, and under IDLE_CPU of a CPU used over its silence: a rank
  saving, pickling, writing, fsyncing or computing is busy). A healthy job lists nothing, so
  its reports do not change at every heartbeat.
- **The job's leader** (`waited_on`), once every rank of the running generation is listed:
  - ranks behind the others (a lower last step: the others went through a collective they did
    not come back from) are the ones waited on, if each of them is asleep (one busy behind, as
    rank 0 saving alone, is working: nobody);
  - all at one step: the ranks asleep that do not wait are the ones waited on, if some rank
    waits and none is busy in its own work.
  It names them in the record (`JobRecord.waited_on`), only while that holds, and reads the
  reports again every POLL_S while some member lists a rank and nobody is named.
- **The named node** fails its rank as hung (job/watch.py). From there it is any hang: in
  place, that rank alone is killed (its sockets close, the waiting ranks' collective ends) and
  replaced; in restart mode, the job restarts.

A rank asleep in long work of its own while every peer waits (an upload at a trickle, a read of
a network file system that blocks) looks stuck after its step history's silence; pauses
within its last 200 steps (accrual.WINDOW) are part of that history, a rarer one costs the rank
a restart.
`waited_phi: off` leaves such jobs to `hang_timeout`, as are jobs whose ranks do not mark their
compute (nobody is known to wait, unless a rank fell behind) and every rank waiting at one step
(a collective that never returns, a network fault).
"""

from __future__ import annotations

from collections.abc import Mapping

from nodeagent.job.accrual import MIN_SAMPLES, Arrivals, Silence
from nodeagent.model.job import JobRecord, NodeReport
from nodeagent.model.stalls import RankStall, WaitedOn
from nodeagent.state import JobState, NodeState
from nodeagent.supervisor.status import Activity

FLOOR_S = 0.5  # the least silence listed, whatever the rank's steps
FLOOR_STEPS = 3  # nor under this many of its mean step
CAP_S = 3600.0  # the longest silence the detector is asked about (hang_timeout judges past it)
IDLE_CPU = 0.25  # a rank that used more of a CPU than this over its silence is busy
POLL_S = 0.1  # how often the leader reads the reports while some member lists a rank


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


def idle(cpu_at_beat: float | None, now: Activity | None, silence: float) -> bool:
    """The worker slept through its silence: none of its threads works now and its process used
    under IDLE_CPU of a CPU since its last beat. Unknown activity is never idle."""
    if cpu_at_beat is None or now is None or not now.sleeping or silence <= 0:
        return False
    return (now.cpu_s - cpu_at_beat) < IDLE_CPU * silence


def waited_on(record: JobRecord, nodes: Mapping[str, NodeReport]) -> tuple[WaitedOn, ...]:
    """The ranks every other rank waits on (the module docstring); () unless every rank of the
    running generation is listed by its node."""
    if record.state is not JobState.RUNNING or not record.members:
        return ()
    every = range(record.nproc_per_node)
    listed: list[tuple[str, RankStall]] = []
    for member in record.members:
        report = nodes.get(member)
        if (
            report is None
            or report.state is not NodeState.RUNNING
            or report.worker_generation != record.generation
            or sorted(s.local_rank for s in report.stalls) != list(every)
        ):
            return ()
        listed += [(member, stall) for stall in report.stalls]
    top = max(stall.step for _, stall in listed)
    behind = [(node, stall) for node, stall in listed if stall.step < top]
    if behind:
        chosen = behind if all(stall.asleep for _, stall in behind) else []
    else:
        own = [(node, stall) for node, stall in listed if not stall.waiting]
        busy = any(not stall.asleep for _, stall in own)
        some_wait = len(own) < len(listed)
        chosen = own if own and some_wait and not busy else []
    return tuple(WaitedOn(node, stall.local_rank) for node, stall in chosen)


def listing(nodes: Mapping[str, NodeReport]) -> bool:
    """Some node lists a rank silent past its step times: the leader reads again soon."""
    return any(report.stalls for report in nodes.values())
