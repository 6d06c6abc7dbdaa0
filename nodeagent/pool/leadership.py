"""The pool leader's executor: read the pool, run schedule(), commit the result fenced.

Any agent may hold the pool leader lease (taken in its pool heartbeat, like a job's). Every
heartbeat while it holds it, it reads the pool (of its nodes and jobs only those changed since
its last round: PoolStore.read), the specs of the jobs not ended that changed and the records
of the running ones, builds a PoolView and writes what schedule() changed through the
POOL_COMMIT script, which refuses the write unless the lease value is still this leader's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from nodeagent.coord import eventlog, runs
from nodeagent.coord.ended import clear_job, prune
from nodeagent.coord.pool import PoolSnapshot, PoolStore, PoolWrite
from nodeagent.coord.store import JobStore
from nodeagent.errors import CoordinationError
from nodeagent.model import accounting, depend, goodput
from nodeagent.model.accounting import Record
from nodeagent.model.gpus import placement_texts
from nodeagent.model.history import restarts_by_cause
from nodeagent.model.job import Command, CommandType, Cordon, Event, JobRecord
from nodeagent.model.pool import PoolJob, PoolJobState, PoolNode
from nodeagent.model.spec import JobSpec
from nodeagent.pool import holders, lifecycle, riders
from nodeagent.pool.fairness import Fairness
from nodeagent.pool.schedule import JobView, NodeView, PoolView, SchedulePolicy, schedule

log = logging.getLogger(__name__)
EVENTS_READ = 10_000  # a job's whole event stream (coord/keys.py EVENTS_MAXLEN)


@dataclass(frozen=True)
class Round:
    """One pool leader round: what it saw, and what it wrote (None: nothing changed)."""

    view: PoolView
    write: PoolWrite | None
    garbage: tuple[str, ...] = ()  # what was read that nodeagent does not write (ignored)


class NodeViews:
    """The scheduler's view of each node, kept between a pool leader's rounds: made again only
    for a node whose report (the same object while the leader's view holds it: PoolStore.read)
    or cordon changed. At 10,000 nodes making them all took a third of every round. `jobs`:
    the jobs' views, kept alike."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[PoolNode, Cordon | None, NodeView]] = {}
        self._riders: dict[str, NodeView] = {}  # the riding nodes' views, as last known
        self.jobs = JobViews()

    def riding(self, names: frozenset[str], snap: PoolSnapshot) -> dict[str, NodeView]:
        """The views of nodes riding through a Redis outage (pool/riders.py): as last made
        (or, unknown to this leader, what they hold), taking no new job."""
        known = {name: view for name, (_, _, view) in self._held.items()}
        known.update(self._riders)
        self._riders = {}
        for name in names:
            held = snap.shares.get(name, {})
            last = known.get(name) or NodeView(
                name, serving=snap.placements.get(name), gpus=sum(held.values())
            )
            self._riders[name] = replace(last, unfit=riders.RIDING)
        return dict(self._riders)

    def of(
        self, reports: Mapping[str, PoolNode], cordons: Mapping[str, Cordon]
    ) -> dict[str, NodeView]:
        held, self._held = self._held, {}
        views = {}
        for name, report in reports.items():
            cordon = cordons.get(name)
            last = held.get(name)
            if last is not None and last[0] is report and last[1] == cordon:
                view = last[2]
            else:
                view = _node_view(name, report, cordon)
            self._held[name] = (report, cordon, view)
            views[name] = view
        return views


Vouch = Callable[[JobSpec], "str | None"]  # why a stored spec must not run (pool.auth: munge)


_KeptJob = tuple[PoolJob, "JobSpec | str", "JobRecord | None", tuple[object, ...], JobView]


class JobViews:
    """The scheduler's view of each job, kept between a pool leader's rounds: made again (its
    spec vouched for again) only for a job whose status, spec or record (each the same object
    while its text is: PoolStore.read, PoolStore.specs) or cancel, hold or requeue changed.
    At 10,000 pending jobs making them all took a tenth of the leader's time under a burst of
    submissions, and vouching for them again past Authority's memory one more."""

    def __init__(self) -> None:
        self._held: dict[str, _KeptJob] = {}

    def of(
        self,
        live: list[str],
        snap: PoolSnapshot,
        specs: Mapping[str, JobSpec | str],
        records: Mapping[str, JobRecord | None],
        vouch: Vouch | None,
    ) -> dict[str, JobView]:
        held, self._held = self._held, {}
        views = {}
        for j in live:
            status, spec, record = snap.jobs[j], specs[j], records.get(j)
            said = (snap.cancels.get(j), snap.holds.get(j), snap.requeues.get(j))
            last = held.get(j)
            if last is not None and last[0] is status and last[1] is spec and last[2] is record:
                view = last[4] if last[3] == said else None
            else:
                view = None
            if view is None:
                # before admission; every node placed on a job checks it again
                waiting = status.state is PoolJobState.PENDING and not status.pinned
                checked = _vouched(spec, vouch) if vouch is not None and waiting else spec
                view = job_view(j, snap, checked, record)
            self._held[j] = (status, spec, record, said, view)
            views[j] = view
        return views


def read_view(
    store: PoolStore,
    led_by: str | None = None,
    views: NodeViews | None = None,
    vouch: Vouch | None = None,
    ride_through_ms: int = 0,
) -> tuple[PoolSnapshot, PoolView, dict[str, JobRecord | None], dict[str, JobSpec | str]]:
    """The pool as schedule() sees it (also what `nodeagentctl jobs` shows), the records of
    its running and pinned jobs, and the specs of the jobs it holds (as stored: before the
    leader's check). `led_by`: the pool leader's lease value (it reads only
    the nodes changed since its last round, PoolStore.read); `views`: what it kept of the
    nodes' views; `vouch`: the pool leader's check of a pending job's spec signature (a spec
    it refuses is never admitted, and says why; a node checks it again when placed);
    `ride_through_ms`: how long a node whose pool lease lapsed keeps what its jobs still count
    it a member of (pool/riders.py).

    Raises:
        CoordinationError: Redis could not be read.
    """
    snap = store.read(led_by)
    pinning = {report.pinned for report in snap.nodes.values()}
    placed = set(snap.placements.values()).union(*snap.shares.values())
    live = [
        j
        for j, status in snap.jobs.items()
        if (j in pinning if status.pinned else not status.state.ended or j in placed)
    ]
    try:
        specs = store.specs(live, snap.jobs_changed)
    except CoordinationError:
        store.forget_jobs()  # the specs of the jobs it changed were not read: read all next
        raise
    records = store.records(
        j for j in live if snap.jobs[j].state is PoolJobState.RUNNING or snap.jobs[j].pinned
    )
    kept = views or NodeViews()
    nodes = kept.of(snap.nodes, snap.cordons)
    held = riders.riding(
        snap.deadlines, snap.now_ms, snap.placements, snap.shares, records, ride_through_ms
    )
    nodes.update(kept.riding(held, snap))
    jobs = kept.jobs.of(live, snap, specs, records, vouch)
    ended = {j: s.state for j, s in snap.jobs.items() if j not in jobs and s.state.ended}
    view = PoolView(
        snap.now_ms,
        nodes,
        jobs,
        snap.placements,
        snap.queues,
        ended,
        _runs(store, snap, jobs),
        snap.shares,
    )
    return snap, view, records, specs


def _runs(
    store: PoolStore, snap: PoolSnapshot, jobs: Mapping[str, JobView]
) -> dict[str, PoolJobState]:
    """How each ended run the pending jobs' dependencies name ended, by "id:seq": the pool's
    ended jobs, and, for a parent whose id another job has taken over since, its run in the
    pool's history (read only then)."""
    ended = {f"{j}:{s.seq}": s.state for j, s in snap.jobs.items() if s.state.ended}
    wanted = [
        f"{parent}:{seq}"
        for job in jobs.values()
        if job.dependency_runs and job.status.state is PoolJobState.PENDING
        for parent, seq in job.dependency_runs.items()
        if seq != depend.ARRAY  # an array's id: its tasks are bound one by one
        and f"{parent}:{seq}" not in ended
        and getattr(snap.jobs.get(parent), "seq", None) != seq
    ]
    if wanted:
        ended.update(runs.history_states(store, wanted))
    return ended


_NONE: Mapping[str, str] = MappingProxyType({})


def _vouched(spec: JobSpec | str, vouch: Vouch) -> JobSpec | str:
    if isinstance(spec, str):
        return spec
    why = vouch(spec)
    return spec if why is None else f"refused: {why}"


def _node_view(name: str, report: PoolNode, cordon: Cordon | None) -> NodeView:
    refused = MappingProxyType(dict(report.refused)) if report.refused else _NONE
    reason, drain = (cordon.reason, cordon.drain) if cordon is not None else (None, False)
    return NodeView(
        name,
        report.pinned,
        report.unfit,
        reason,
        drain,
        refused,
        report.labels,
        report.serving,
        len(report.gpus),
        report.sharing,
        report.memory,
        report.mem_per_gpu,
        report.cpus_per_gpu,
    )


def job_view(
    job_id: str, snap: PoolSnapshot, spec: JobSpec | str, record: JobRecord | None
) -> JobView:
    """A job as schedule() sees it (the job listing shows its priority, queue and target from
    it: views/jobs.py). Its target is its record's once it formed (a scale moves it there)."""
    status = snap.jobs[job_id]
    requeue = snap.requeues.get(job_id)
    if isinstance(spec, str):
        return JobView(job_id, status, 1, 1, 1, invalid=f"its spec cannot be read: {spec}")
    job = spec.job
    return JobView(
        job_id,
        status,
        job.min_nodes,
        job.max_nodes,
        record.target_nodes if record is not None else job.target_nodes,
        priority=spec.priority,
        queue=spec.queue,
        record_state=record.state if record is not None else None,
        members=record.members if record is not None else (),
        cancel=snap.cancels.get(job_id),
        selector=spec.selector,
        preemptible=spec.preemptible,
        time_limit_ms=round(spec.time_limit * 1000) if spec.time_limit is not None else None,
        signal=(spec.signal[0], round(spec.signal[1] * 1000)) if spec.signal else None,
        held=snap.holds.get(job_id),
        requeue=requeue.by if requeue and requeue.admitted_ms == status.admitted_ms else None,
        exit_code=record.exit_code if record is not None and record.state.terminal else None,
        standby=job.slow_node.policy == "replace",
        dependency=spec.dependency,
        dependency_runs=spec.dependency_runs,
        user=spec.user,
        name=spec.name or job_id,
        array=spec.array_task.job if spec.array_task is not None else None,
        array_limit=spec.array_task.limit if spec.array_task is not None else None,
        notify=spec.notify,
        gpus_per_node=spec.gpus_per_node,
        exclusive=spec.exclusive,
        mem=job.mem,
        mem_per_gpu=job.mem_per_gpu,
        cpus_per_gpu=job.cpus_per_gpu,
        kind=spec.kind,
        attended=spec.attended,
    )


def lead(
    store: PoolStore,
    leader: str,
    policy: SchedulePolicy,
    views: NodeViews | None = None,
    vouch: Vouch | None = None,
    pruning: lifecycle.Pruning | None = None,
    book: bool = False,
    fairness: Fairness | None = None,
    stopping: lifecycle.Stopping | None = None,
) -> Round:
    """One round as pool leader (`views`, `vouch`: as read_view's; `pruning`: when it last
    pruned ended jobs, kept between rounds; `book`: the ending jobs' accounting records go to
    the pool's ledger, pool/ledger.py; `fairness`: pool.fair_share's, kept between rounds;
    `stopping`: the cancelled jobs it told to stop, kept between rounds).

    Raises:
        CoordinationError: Redis could not be read or written.
        FencedError: another node leads the pool now.
    """
    snap, view, _, _ = read_view(store, leader, views, vouch, policy.ride_through_ms)
    usage = None
    if fairness is not None:
        view, usage = fairness.apply(store, leader, snap, view)
    view, fresh = lifecycle.unstale(view)
    holders.cancel_lapsed(store, view.jobs, snap.now_ms)  # (done in the next round's view)
    view, timed, due = lifecycle.deadlines(view)
    told = stopping or lifecycle.Stopping()
    for job in told.due(view):
        _stop(store, job.id, job.cancel or "a cancel")
        told.sent(job)
    result = schedule(view, policy)
    before = placement_texts(snap.placements, snap.shares)
    after = placement_texts(result.placements, result.shares)
    lapsed = tuple(n for n in snap.lapsed if n not in view.nodes)  # not a rider's
    _prune(store, leader, snap, policy, pruning or lifecycle.Pruning())
    if after == before and not result.jobs and not lapsed and not fresh and not timed and not usage:
        return Round(view, None, snap.garbage)
    for job_id in fresh:  # a reused id: the ended job's keys go before the new one is placed
        clear_job(store.client, store.keys.job(job_id))
    for deadline in due:  # sent before the status says so: at least once
        _send(store, deadline)
    unplace = tuple(n for n in before if n not in after)
    place = {n: text for n, text in after.items() if before.get(n) != text}
    events = result.events
    if (unplace or place) and not events:  # every placement change wakes the pool's nodes
        moved = sorted({*unplace, *place})
        events = (Event("placements", message=f"nodes {', '.join(moved)} moved"),)
    ending, booked = _ending(store, snap, view, result.jobs, book)
    jobs = {**fresh, **timed, **ending}
    write = PoolWrite(unplace, place, jobs, lapsed, events, booked, usage)
    for event in result.events:
        log.info("pool: %s", event.message)
    store.commit(leader, write)
    if fairness is not None and usage is not None:
        fairness.saved(snap.now_ms)
    return Round(view, write, snap.garbage)


def _ending(
    store: PoolStore, snap: PoolSnapshot, view: PoolView, jobs: Mapping[str, PoolJob], book: bool
) -> tuple[dict[str, PoolJob], tuple[Record, ...]]:
    """`jobs`, each that ends now with its effective training time ratio, accounted from its
    own events before the pool prunes them (model/goodput.py; `nodeagentctl history`), and
    (`book`: pool.accounting keeps them) the accounting records of those that end. One read of
    a job's events as it ends; a job whose events cannot be read keeps no goodput."""
    found = dict(jobs)
    records = []
    pool_events: list[Event] | None = None  # read once a round, if a job ends in it
    for job_id, status in jobs.items():
        before = snap.jobs.get(job_id)
        if not status.state.ended or (before is not None and before.state.ended):
            continue
        account, events = None, []
        try:
            events = JobStore(store.client, store.keys.job(job_id)).events_tail(EVENTS_READ)
            if pool_events is None:
                pool_events = eventlog.decoded(store, EVENTS_READ)
            pending = goodput.pending_spans(pool_events, job_id)
            account = goodput.account(events, snap.now_ms, status.submitted_ms, pending)
        except CoordinationError as exc:
            log.info("pool: job %s: its goodput cannot be read: %s", job_id, exc)
        if account is not None and account.ettr is not None:
            status = found[job_id] = replace(
                status, ettr=round(min(max(account.ettr, 0.0), 1.0), 4)
            )
        if book:
            job = view.jobs.get(job_id)
            records.append(
                accounting.record_of(
                    store.keys.pool,
                    job_id,
                    status,
                    restarts_by_cause(events),
                    account,
                    user=job.user if job else None,
                    queue=job.queue if job else None,
                    name=job.name if job else None,
                    array=job.array if job else None,
                    kind=job.kind if job else None,
                )
            )
    return found, tuple(records)


def _send(store: PoolStore, deadline: lifecycle.Deadline) -> None:
    """A time limit's signal, or its stop, through the job's own command stream."""
    if deadline.signal is None:
        _stop(store, deadline.job, "its time limit")
    else:
        jobs = JobStore(store.client, store.keys.job(deadline.job))
        jobs.send_command(Command(CommandType.SIGNAL, by="its time limit", signal=deadline.signal))
    log.info("pool: job %s: %s", deadline.job, deadline.reason)


def _stop(store: PoolStore, job_id: str, by: str) -> None:
    """Tell a running job to stop (its workers get the stop grace to checkpoint)."""
    JobStore(store.client, store.keys.job(job_id)).send_command(Command(CommandType.STOP, by=by))


def _prune(
    store: PoolStore,
    leader: str,
    snap: PoolSnapshot,
    policy: SchedulePolicy,
    pruning: lifecycle.Pruning,
) -> None:
    """Remove the jobs that ended pool.keep_ended ago, their own keys first, and the history
    of reused ids as old (pool/lifecycle.py).

    Raises:
        CoordinationError, FencedError: as the store's calls.
    """
    keep, now = policy.keep_ended_ms, snap.now_ms
    placed = set(snap.placements.values()).union(*snap.shares.values())
    due = lifecycle.prunable(snap.jobs, placed, now, keep)
    if not pruning.due(now, keep, due):
        return
    for job_id in due:
        clear_job(store.client, store.keys.job(job_id))
    pruned = prune(store.client, store.keys, leader, now - keep, due)
    pruning.last_ms = now
    if pruned:
        log.info("pool: pruned %d jobs that ended %.0fs ago or more", pruned, keep / 1000)
