"""The pool's decision: which node serves which job. Pure: `schedule(view, policy)`.

Rules (docs/design.md, "The pool"):
- a node serves one whole-node job at a time, or jobs that asked for GPUs share it, each on
  units of its own (pool/sharing.py: the packing, their admission and preemption); a node
  pinned by its `job:` section serves only that job;
- gang admission: a pending job is admitted only when at least `min_nodes` healthy,
  uncordoned, free nodes that do not refuse it (and carry the labels its `selector` names) can
  be given to it at once; it gets up to its target; never a partial start below `min_nodes`;
- queues (nodeagent.model.queues): a job is admitted, or grows, only within its queue's quota
  (nodes) and GPU quota (a whole-node job's nodes counted at the widest node's units);
  a job of a queue that does not exist waits;
- order: priority (higher first), then first come, first served;
- arrays (model/array.py): a task is admitted only while its array runs fewer tasks than its
  limit (`--array 0-999%50`);
- dependencies (model/depend.py, sbatch --dependency): a pending job whose dependencies do not
  hold yet waits, saying for what, and holds nothing back; one whose dependencies can never hold
  ends cancelled, saying why; each is judged on the states this round settled, so a dependent is
  admitted in the round that records its parent's success;
- preemption by shrinking (nodeagent.pool.preempt): a pending job that does not fit takes the
  nodes lower-priority jobs hold above their min_nodes (or, for a queue below its guaranteed
  share, those of queues above theirs), after waiting `preempt_after`, and evicts whole
  `preemptible` jobs (back to pending) only when that is not enough, then nodes jobs share
  whose every sharer may give its share (pool/sharetake.py); a job shrunk this way
  grows back into free nodes, but neither is shrunk nor grown back within `resize_cooldown`;
- backfill with a reservation: a job that does not fit does not block smaller jobs behind it,
  until the first job in order that could fit the pool has waited `reserve_after`; from then on
  free nodes are held for it (nothing behind it is admitted, no running job grows) until it fits.
  Pure FIFO would idle the pool behind one large job; pure backfill could starve it for ever;
- a running job below its target grows into free nodes; above its target (after a scale down)
  it gives back the nodes its record does not name as members;
- a cordoned node keeps the job it serves but gets no new one; a drained node leaves its job
  now (its workers get the stop grace; the job re-forms without it);
- a job admitted on nodes that all refuse it before it ever formed (its spec's user is not
  allowed there, say) goes back to pending, saying which nodes refused it and why;
- a job ends when its own record does (succeeded, failed, stopped = cancelled); its nodes go
  back to the pool at once. A node whose lease lapsed loses its placement (the job re-forms
  through its own protocol, and grows back into a free node).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from nodeagent.config.values import format_duration, size_text
from nodeagent.model import depend
from nodeagent.model.pool import PoolJobState
from nodeagent.model.queues import QueueView
from nodeagent.pool import lifecycle, sharetake, sharing
from nodeagent.pool.schedrun import Run
from nodeagent.pool.schedview import (
    JobView,
    NodeView,
    PoolView,
    Schedule,
    SchedulePolicy,
)
from nodeagent.state import JobState

__all__ = [
    "JobView",
    "NodeView",
    "PoolView",
    "QueueView",
    "Schedule",
    "SchedulePolicy",
    "schedule",
]

_CANCELLED = PoolJobState.CANCELLED
RUNNING = PoolJobState.RUNNING
_ENDED = {
    JobState.SUCCEEDED: PoolJobState.SUCCEEDED,
    JobState.FAILED: PoolJobState.FAILED,
    JobState.STOPPED: PoolJobState.CANCELLED,
}


def schedule(view: PoolView, policy: SchedulePolicy) -> Schedule:
    """The placements and job statuses that follow from `view`."""
    run = Run(view, policy.resize_cooldown_ms)
    ordered = sorted(view.jobs.values(), key=lambda j: j.order)
    for job in ordered:
        _settle(run, job)
    _keep(run)
    sharing.keep(run)
    _pin(run)
    for job in view.jobs.values():
        _refused(run, job)
    for job in view.jobs.values():
        if run.status(job).state is PoolJobState.RUNNING:
            _shrink(run, job)
    reserved = _admit(run, policy, ordered)
    if not reserved:
        _grow(run, policy)
        _stand_by(run)
    settled = {job.id: run.status(job) for job in view.jobs.values()}
    run.jobs.update(lifecycle.account(view, run.placements, settled, run.shares))
    return Schedule(run.placements, run.jobs, tuple(run.events), run.shares)


def _settle(run: Run, job: JobView) -> None:
    """End jobs whose record ended (a pinned one follows its record both ways); cancel pending
    jobs asked to; a running job asked to cancel ends once stopped (or if it never formed)."""
    state, record = job.status.state, job.record_state
    if job.invalid is None and job.cancel is None and not job.status.pinned:
        if state is PoolJobState.PENDING:  # (most jobs: nothing below applies to them)
            return
        quiet = record not in _ENDED and job.requeue is None and job.status.time_up_ms is None
        if state is RUNNING and quiet:
            return
    if job.invalid is not None and not state.ended:
        run.move(job, PoolJobState.FAILED, job.invalid, "job_ended")
        return
    ended = _ENDED.get(record) if record is not None else None
    if job.status.pinned:
        if ended is not None and record is not None and state is not ended:
            run.move(job, ended, f"its record is {record.value}", "job_ended")
        elif ended is None and state is not PoolJobState.RUNNING:
            run.move(job, PoolJobState.RUNNING, "pinned by its nodes", "job_running")
        return
    timed_out = state is PoolJobState.RUNNING and job.status.time_up_ms is not None
    if timed_out and (record is None or ended is _CANCELLED):  # stopped at its limit, or unformed
        limit = format_duration((job.time_limit_ms or 0) / 1000)
        run.move(job, PoolJobState.TIMEOUT, f"time limit of {limit} reached", "job_ended")
        return
    if state is PoolJobState.PENDING and job.cancel is not None:
        run.move(
            job, PoolJobState.CANCELLED, f"cancelled by {job.cancel} while pending", "job_ended"
        )
    elif state is PoolJobState.RUNNING and job.cancel is not None and ended in (None, _CANCELLED):
        if record is None or ended is not None:  # stopped, or never formed
            run.move(job, PoolJobState.CANCELLED, f"cancelled by {job.cancel}", "job_ended")
    elif state is PoolJobState.RUNNING and job.requeue is not None and ended is None:
        run.move(job, PoolJobState.PENDING, f"requeued by {job.requeue}", "job_requeued")
    elif state is PoolJobState.RUNNING and ended is not None and record is not None:
        run.move(job, ended, f"its record is {record.value}", "job_ended")


def _keep(run: Run) -> None:
    """Keep the placements that still hold: a live node, on a running job it does not refuse.
    (The first placements of the round: each job's are made at once, run.keep.)"""
    view, running = run.view, run.running()
    kept: dict[str, list[str]] = {}
    for node, job_id in view.placements.items():
        live = view.nodes.get(node)
        if (
            job_id in running
            and live is not None
            and job_id not in live.refused
            and not live.drained
            and (live.pinned is None or live.pinned == job_id)
        ):
            kept.setdefault(job_id, []).append(node)
    for job_id, nodes in kept.items():
        run.keep(nodes, job_id)


def _refused(run: Run, job: JobView) -> None:
    """A running job that never formed and has no node left (each refused it, as `_keep`
    found) goes back to pending, saying why; `_admit` then places it elsewhere or says why not.
    """
    if job.id not in run.refusers or job.record_state is not None:
        return  # (most jobs: checked first)
    status = run.status(job)
    if status.state is not PoolJobState.RUNNING or status.pinned or run.holds(job.id):
        return
    why = refusals(run.view.nodes.values(), job.id)
    if not why:  # only nodes without its labels: lost nodes re-admit it as before
        return
    run.move(job, PoolJobState.PENDING, f"refused by its nodes: {why}", "job_refused")


def refusals(nodes: Iterable[NodeView], job_id: str, names: int = 3) -> str:
    """Which nodes refuse `job_id` and why, grouped by reason ("a, b: user root is not
    allowed"): at most `names` names a reason and `names` reasons, the rest counted."""
    by_reason: dict[str, list[str]] = {}
    for node in nodes:
        if job_id in node.refused:
            by_reason.setdefault(node.refused[job_id], []).append(node.name)
    groups = sorted(by_reason.items(), key=lambda item: min(item[1]))
    parts = []
    for reason, who in groups[:names]:
        more = f" and {len(who) - names} more" if len(who) > names else ""
        parts.append(f"{', '.join(sorted(who)[:names])}{more}: {reason}")
    if len(groups) > names:
        parts.append(f"{sum(len(who) for _, who in groups[names:])} more nodes")
    return "; ".join(parts)


def _pin(run: Run) -> None:
    running, placements = run.running(), run.placements
    for node in run.view.nodes.values():
        job = node.pinned
        if job is not None and job in running and placements.get(node.name) != job:
            run.place(node.name, job)  # (_keep kept most: a pinned pool places nothing)


def _shrink(run: Run, job: JobView) -> None:
    """Above target (after a scale down): give back placed nodes that are not members."""
    extra = len(run.by_job.get(job.id, ())) - job.target_nodes
    if extra <= 0:
        return
    placed, members = run.placed(job.id), set(job.members)
    spare = [n for n in reversed(placed) if n not in members and run.view.nodes[n].pinned is None]
    for node in spare[:extra]:
        run.unplace(node)


def _admit(run: Run, policy: SchedulePolicy, ordered: list[JobView]) -> bool:
    """Admit pending jobs in order (`ordered`: every job, in order); True when free nodes are
    now reserved for the head."""
    view = run.view
    pending = [j for j in ordered if run.status(j).state is PoolJobState.PENDING]
    reserving: JobView | None = None
    tasks = Counter(  # the tasks of each array running now, for arrays with a limit
        j.array
        for j in view.jobs.values()
        if j.array_limit and run.status(j).state is PoolJobState.RUNNING
    )
    blocked = Blocked(run, policy)
    for job in pending:
        if job.held is not None:
            run.note(job, f"held by {job.held}: `nodeagentctl release {job.id}` lets it go")
            continue
        if job.dependency and not _depends(run, job):
            continue
        if job.array is not None and job.array_limit and tasks[job.array] >= job.array_limit:
            run.note(job, f"array {job.array} runs {job.array_limit} tasks at once, its limit")
            continue
        if reserving is None and run.serving.get(job.id):  # requeued, evicted: it keeps its
            stopping = ", ".join(sorted(run.serving[job.id])[:3])  # place, nodes wait for it
            run.note(job, f"waiting for its workers to stop on {stopping}")
            reserving = job
            continue
        held = _held_by_queue(run, job) if job.shared else None  # (a whole-node job's: _whole)
        if job.shared and held is None:  # on nodes it shares: partly used ones even now
            sharing_said = blocked.said(job, reserving is not None)
            if sharing_said is None:
                why = sharing.admit(run, job, reserving is not None, policy)
                if why is None:
                    tasks[job.array] += 1
                    continue
                sharing_said = (_could_fit(run, job) or why, False)
                blocked.keep(job, sharing_said, reserving is not None)
            run.note(job, sharing_said[0])
            continue
        if reserving is not None:
            run.note(job, f"waiting: nodes are held for {reserving.id}, pending longer")
            continue
        said = blocked.said(job)
        if said is None:
            said = _whole(run, job, policy, held if job.shared else _held_by_queue(run, job))
            if said is None:
                tasks[job.array] += 1
                continue
            blocked.keep(job, said)
        reason, reserves = said
        run.note(job, reason)
        if reserves and view.now_ms - job.status.submitted_ms >= policy.reserve_after_ms:
            reserving = job
    return reserving is not None


def _whole(run: Run, job: JobView, policy: SchedulePolicy, held: str | None) -> Said | None:
    """Admit a whole-node job now, on free nodes or preempting; else why it waits, and whether
    it may hold free nodes for itself once it waited long enough (it could run if it had them)."""
    if held is not None:
        return held, False
    room = run.room(job)
    want = job.target_nodes if room is None else min(job.target_nodes, room)
    free = run.free_count(job)
    if free >= job.min_nodes:
        take = run.take(job, want)
        run.move(job, PoolJobState.RUNNING, f"admitted on {len(take)} nodes", "job_admitted")
        return None
    if _preempt(run, job, policy, job.min_nodes - free, want):
        return None
    fits_pool = _could_fit(run, job)
    if fits_pool is not None:
        return fits_pool, False
    return f"needs {job.min_nodes} nodes, {free} free", True


Said = tuple[str, bool]  # why a job waits; whether it may hold free nodes for itself


class Blocked:
    """The verdicts on the jobs that could not start in this round, by their shape: the next
    pending job of the same shape gets the same while nothing was placed, freed or moved since
    (Run.version). At 10,000 pending jobs judging each one took most of a round; a queue of
    such jobs is mostly a few shapes (Kubernetes' equivalence classes, Slurm's skipping of a
    partition's jobs once one did not fit). A job whose nodes are its own (some refuse it, lack
    its labels or its GPUs, or it shares some already) has no shape: it is judged alone. A job
    that shares nodes by GPUs (pool/sharing.py) has a shape of its own: its units, and whether
    free nodes are held for another (then it takes only partly used ones)."""

    def __init__(self, run: Run, policy: SchedulePolicy) -> None:
        self._run, self._policy = run, policy
        self._version = run.version
        self._said: dict[tuple[object, ...], Said] = {}

    def _shape(self, job: JobView, reserving: bool) -> tuple[object, ...] | None:
        """What the verdict on `job` reads of it (pool/schedrun.py's room, free_count,
        could_preempt; _held_by_queue, _preempt, _could_fit; for a job sharing nodes,
        sharing.admit's _pick and sharetake.shares_for too), or None."""
        run, policy = self._run, self._policy
        if job.id in run.refusers or job.id in run.shared_by_job:
            return None
        old = run.view.now_ms - job.status.submitted_ms >= policy.preempt_after_ms
        shape = (job.queue, job.min_nodes, job.target_nodes, job.priority, old)
        if job.shared:
            return (*shape, job.gpus_per_node, job.mem, job.mem_per_gpu, reserving)
        return shape

    def said(self, job: JobView, reserving: bool = False) -> Said | None:
        if self._run.version != self._version:
            self._said.clear()
            self._version = self._run.version
        shape = self._shape(job, reserving)
        return self._said.get(shape) if shape is not None else None

    def keep(self, job: JobView, said: Said, reserving: bool = False) -> None:
        shape = self._shape(job, reserving)
        if shape is not None and self._run.version == self._version:
            self._said[shape] = said


def _depends(run: Run, job: JobView) -> bool:
    """Whether `job`'s dependencies hold (model/depend.py), on the states this round settled:
    a job whose parent's success is recorded in this round is admitted in it. One that waits
    says for what; one whose dependencies can never hold ends, saying why."""
    jobs, view = run.view.jobs, run.view

    def state_of(job_id: str) -> PoolJobState | None:
        """The state of the run the dependency names (its seq, bound at submission), or of
        the array of that id (its tasks, bound likewise)."""
        tasks = job.dependency_runs.get(job_id) == depend.ARRAY and depend.tasks_of(
            job_id, job.dependency_runs
        )
        if tasks:
            return depend.array_state(state_of(task) for task in tasks)
        found, seq = jobs.get(job_id), job.dependency_runs.get(job_id)
        if found is not None and (seq is None or found.status.seq == seq):
            return run.status(found).state
        return view.ended.get(job_id) if seq is None else view.runs.get(f"{job_id}:{seq}")

    def earlier_namesakes() -> list[str]:
        return [
            j for seq, j in run.namesakes().get((job.user, job.name), ()) if seq < job.status.seq
        ]

    found = depend.verdict(job.dependency, state_of, earlier_namesakes)
    if found.never:
        reason = f"dependency never satisfied: {found.why}"
        run.move(job, PoolJobState.CANCELLED, reason, "job_ended")
    elif not found.ready:
        run.note(job, found.why)
    return found.ready


def _held_by_queue(run: Run, job: JobView) -> str | None:
    """Why `job`'s queue keeps it pending: it does not exist, or it is at its quota."""
    if not run.ledger.exists(job.queue):
        return f"pending: queue {job.queue} does not exist (nodeagentctl queue create {job.queue})"
    quota, used = run.ledger.quota(job.queue), run.ledger.used(job.queue)
    if quota is not None and quota - used < job.min_nodes:
        return f"pending: queue {job.queue} at its quota of {quota} nodes ({used} in use)"
    gpus, held = run.ledger.gpu_quota(job.queue), run.ledger.gpus_used(job.queue)
    needs = job.min_nodes * run.per_node_gpus(job)
    if gpus is not None and gpus - held < needs:
        return (
            f"pending: queue {job.queue} at its GPU quota of {gpus} ({held} in use, "
            f"it needs {needs})"
        )
    return None


def _preempt(run: Run, job: JobView, policy: SchedulePolicy, need: int, want: int) -> bool:
    """Admit `job` on nodes taken from running jobs (nodeagent.pool.preempt): whole-node
    jobs' nodes first; when they are not enough, nodes whose every share may go to it
    (pool/sharetake.py, fewest shares first), and whole-node jobs' for what remains. Each victim
    shrinks (or is evicted) and says why."""
    view = run.view
    if view.now_ms - job.status.submitted_ms < policy.preempt_after_ms:
        return False
    free = job.min_nodes - need  # what it gets without preempting: counted in its queue's share
    ledger = sharetake.after(run, job, [], free)
    found = run.preemption(job, need, ledger) if run.could_preempt(job) else None
    taken: list[sharetake.Taken] = []
    if found is None:
        taken, rest = sharetake.shares_for(run, job, need, set())
        if not taken:
            return False
        ledger = sharetake.after(run, job, taken, free)
        found = run.preemption(job, rest, ledger) if rest > 0 else []
        if found is None:
            return False
    sharetake.give(run, job, taken)
    run.give_up(job, found)
    take = run.take(job, want)
    whom = ", ".join(sorted({*(v.job.id for v in found), *(t.victim.id for t in taken)}))
    run.move(
        job,
        PoolJobState.RUNNING,
        f"admitted on {len(take)} nodes, preempting {whom}",
        "job_admitted",
    )
    return True


def _could_fit(run: Run, job: JobView) -> str | None:
    """Why `job` can never fit this pool as it is, or None."""
    excluded = run.refusers.get(job.id, set())
    healthy = len(run.healthy) - len(excluded & run.healthy)
    if healthy >= job.min_nodes:
        return None
    unmatched, short = run.unmatched.get(job.id, 0), run.short.get(job.id, 0)
    small, few = run.small.get(job.id, 0), run.few.get(job.id, 0)
    why = ""
    if len(excluded) > unmatched + short + small + few:
        refusing = len(excluded) - unmatched - short - small - few
        why = f"; {refusing} refuse it ({refusals(run.view.nodes.values(), job.id)})"
    if unmatched:
        labels = ",".join(f"{k}={v}" for k, v in sorted(job.selector.items()))
        why += f"; {unmatched} lack {labels}"
    if short:
        why += f"; {short} offer fewer than {job.gpus_per_node} GPUs"
    if small:
        why += f"; {small} have less memory for jobs than it asks for ({_asked(job)})"
    if few:
        why += f"; {few} hold fewer CPUs per GPU than it asks for ({job.cpus_per_gpu})"
    return f"needs {job.min_nodes} nodes, the pool has {healthy} healthy nodes that can run it{why}"


def _asked(job: JobView) -> str:
    if job.mem is not None:
        return f"mem {size_text(job.mem)}"
    return f"mem_per_gpu {size_text(job.mem_per_gpu or 0)}"


def _stand_by(run: Run) -> None:
    """A running job that replaces its slow nodes (slow_node.policy: replace) holds one free
    node beyond its target: the spare its leader swaps in for a slow member
    (docs/slow-nodes.md); a job sharing nodes by GPUs, K free units of one more node
    (pool/sharing.py). Last in the round, so only a node that no pending job and no growing
    job took (none while free nodes are held for a pending one); `_shrink` (sharing.keep) hands
    it back at the start of the next round, where they come first again, and here the same node
    is taken again while it is free (its agent keeps standing by: no churn)."""
    jobs = sorted((j for j in run.view.jobs.values() if j.standby), key=lambda j: j.order)
    if not jobs:
        return
    # The nodes each such job held before this round and it holds no more (one pass over the
    # placements and shares, not one a job: bench/schedule.py's 10,000 nodes)
    freed: dict[str, list[str]] = {job.id: [] for job in jobs}
    for node, held in run.view.placements.items():
        if held in freed and node not in run.placements:
            freed[held].append(node)
    for node, sharers in run.view.shares.items():
        for job_id in sharers:
            if job_id in freed and node not in run.shared_by_job.get(job_id, ()):
                freed[job_id].append(node)
    for job in jobs:
        status = run.status(job)
        if status.state is not PoolJobState.RUNNING or status.pinned:
            continue
        if run.holds(job.id) != job.target_nodes:
            continue  # short of its target (no free node is left) or holding one already
        room = run.room(job)
        if room is not None and room < 1:
            continue
        if job.shared:
            sharing.stand_by(run, job, freed[job.id])
            continue
        before = sorted(
            n
            for n in freed[job.id]
            if n not in run.placements and n not in run.shares and run.usable(job, n)
        )
        if before:
            run.place(before[0], job.id)
        else:
            run.take(job, 1)


def _grow(run: Run, policy: SchedulePolicy) -> None:
    """Running jobs below their target take free nodes, in order, within their queue's quota;
    a job shrunk for another waits out the resize cooldown first (no thrash)."""
    now, now_running = run.view.now_ms, run.running()
    whole, shared = run.by_job, run.shared_by_job
    running = sorted(  # (those below their target: a pool of 5,000 small jobs has few; what
        (  # run.holds counts, inline: 5,000 calls a round at 1,000 x 8 GPUs)
            j
            for j in run.view.jobs.values()
            if j.id in now_running
            and len(whole.get(j.id, ())) + len(shared.get(j.id, ())) < j.target_nodes
        ),
        key=lambda j: j.order,
    )
    for job in running:
        status = run.status(job)
        if status.pinned:
            continue
        shrunk = status.shrunk_ms
        if shrunk is not None and now - shrunk < policy.resize_cooldown_ms:
            continue
        if job.shared:
            sharing.grow(run, job, reserving=False)
            continue
        want = job.target_nodes - len(run.by_job.get(job.id, ()))
        room = run.room(job)
        if room is not None:
            want = min(want, room)
        if want > 0 and run.take(job, want) and status.admitted_ms != now:
            run.grown(job)
