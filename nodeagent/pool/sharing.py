"""The nodes that jobs asking for GPUs share (issue 66): pure, a part of schedule()'s round.

Rules (docs/pool.md, "GPUs"):
- a job whose spec asks for `gpus_per_node: K` and is not `exclusive` holds K GPU units of each
  of its nodes, and other such jobs may hold the rest; no whole-node job is placed on a node
  any job shares, and no job shares a node a whole-node job is placed on;
- packing: a pending job takes nodes already shared first, those with the fewest free units
  that still fit it (best fit), so that whole nodes stay free for jobs that want them; only then
  free nodes, in the order whole-node jobs get them, and none while free nodes are held for a
  pending job (backfill's reservation: schedule.py);
- gang admission as for whole nodes: at least `min_nodes` nodes with K free units each, at
  once, up to its target; it grows back the same way when it lost one;
- a share lasts while its job runs on a live node that is not drained and does not refuse it;
  a job above its target (a scale down) gives back the nodes its record does not name;
- a queue's quota counts each node a job shares as one of the queue's nodes, and its GPU quota
  the units the job holds there;
- preemption by shrinking (`shrink_for`): a pending job that found too few nodes, once it has
  waited `preempt_after`, takes the shares of running jobs of lower priority (strictly) that
  share nodes and hold more than their `min_nodes`, on the nodes where that frees enough: the
  fewest such shares a node, lowest priority and youngest first, so exactly the units it
  needs are freed there and no more; all or nothing; never from a job resized less than
  `resize_cooldown` ago; never taking another queue below its guaranteed shares (nodes, GPU
  units);
- across kinds: when shares are not enough, a pending GPU job takes whole-node jobs' nodes
  for the rest (pool/preempt.py, as a whole-node job would: none while free nodes are held for
  a pending job); a pending whole-node job that whole-node jobs' nodes are not enough for takes
  nodes every sharer of which may give its share (by priority; `whole_nodes`);
- reclaim: while the claimant's queue holds fewer GPU units than its guaranteed GPU share, it
  may take likewise the shares of jobs of other queues above their own GPU share, whatever
  their priority, until it holds its share (never above it).

Which units a job gets on a node is the node's choice (runtime/nodeloop.py).
"""

from __future__ import annotations

from typing import NamedTuple

from nodeagent.model.job import Event
from nodeagent.model.pool import PoolJobState
from nodeagent.model.queues import Ledger
from nodeagent.pool import preempt
from nodeagent.pool.schedrun import Run
from nodeagent.pool.schedview import JobView, SchedulePolicy

RUNNING = PoolJobState.RUNNING


def keep(run: Run) -> None:
    """Keep the shares that still hold (the first shares of the round)."""
    view, running = run.view, run.running()
    for node, held in view.shares.items():
        live = view.nodes.get(node)
        if live is None or live.drained or live.pinned is not None or node in run.placements:
            continue
        kept = [(j, units) for j, units in held.items() if j in running and j not in live.refused]
        for job_id, units in kept:
            run.share(node, job_id, units, refile=False)
        if kept:
            run.refile(node)
    for job in view.jobs.values():
        nodes = run.shared_by_job.get(job.id, set())
        extra = len(nodes) - job.target_nodes
        if extra > 0:
            members = set(job.members)
            spare = [n for n in sorted(nodes, reverse=True) if n not in members]
            for node in spare[:extra]:
                run.unshare(node, job.id)


def admit(run: Run, job: JobView, reserving: bool, policy: SchedulePolicy) -> str | None:
    """Admit pending `job` on nodes it can share (None), or say why it stays pending (the
    caller notes it)."""
    units = job.gpus_per_node or 0
    room = run.room(job)
    want = job.target_nodes if room is None else min(job.target_nodes, room)
    picked = _pick(run, job, want, reserving)
    nodes, whom = picked, ""
    if len(picked) < job.min_nodes:
        plan = _preempting(run, job, picked, reserving, policy)
        if plan is None:
            return f"needs {job.min_nodes} nodes with {units} free GPUs, {len(picked)} have them"
        taken, found = plan
        give(run, job, taken)
        run.give_up(job, found)
        nodes = [*picked, *sorted({t.node for t in taken})]
        if found:  # whole nodes freed: free ones now, as many as it still wants
            nodes += [n for n in run.free_nodes(job, want) if n not in nodes][: want - len(nodes)]
        whom = ", ".join(sorted({*(t.victim.id for t in taken), *(v.job.id for v in found)}))
    for node in nodes:
        run.share(node, job.id, units)
    reason = f"admitted on {len(nodes)} nodes, {units} GPUs each"
    if whom:
        reason += f", preempting {whom}"
    run.move(job, RUNNING, reason, "job_admitted")
    return None


class Taken(NamedTuple):
    victim: JobView
    node: str  # the node whose share it gives up
    why: str  # "priority 10 > 5", or "queue research below its guaranteed 16 GPUs"


def _preempting(
    run: Run, job: JobView, picked: list[str], reserving: bool, policy: SchedulePolicy
) -> tuple[list[Taken], list[preempt.Victim]] | None:
    """What GPU job `job` takes so that it has K free units on `min_nodes` nodes with those
    `picked` already: shares first (shrink_for), then whole-node jobs' nodes for what remains
    (none while free nodes are held for a pending job); None: not enough, nothing is taken."""
    if run.view.now_ms - job.status.submitted_ms < policy.preempt_after_ms:
        return None
    taken, rest = shrink_for(run, job, picked)
    if rest <= 0:
        return taken, []
    if reserving or not run.could_preempt(job):
        return None
    found = run.preemption(job, rest, after(run, job, taken))
    return None if found is None else (taken, found)


def shrink_for(run: Run, job: JobView, picked: list[str]) -> tuple[list[Taken], int]:
    """The shares to take so that GPU job `job` has K free units on as many of the nodes it
    still needs (`min_nodes` with those `picked` already) as they can, and how many it still
    needs then."""
    return _plan(run, job, job.min_nodes - len(picked), set(picked))


def whole_nodes(run: Run, claimant: JobView, need: int) -> tuple[list[Taken], int]:
    """The shares to take so that whole-node `claimant` gets up to `need` nodes that jobs
    share now, each freed of every share (by priority only: its queue reclaims by nodes), and
    how many it still needs then."""
    return _plan(run, claimant, need, set())


def _plan(run: Run, claimant: JobView, need: int, skip: set[str]) -> tuple[list[Taken], int]:
    """Up to `need` nodes (none of `skip`) where taking shares frees what `claimant` needs (K
    units, or the whole node): the fewest shares a node, lowest priority and youngest first,
    so exactly what it needs is freed there and no more."""
    view = run.view
    budget = _Budget(run, claimant)
    plans: list[tuple[int, str, list[tuple[JobView, str]]]] = []
    for node in sorted(_victims_nodes(run, claimant, budget.reclaiming)):  # (a bound: most
        held = run.shares.get(node, {})  # pending jobs find none)
        if node in skip or claimant.id in held or not run.usable(claimant, node):
            continue
        free = run.free_units(node)
        wanted = (claimant.gpus_per_node or 0) if claimant.shared else view.nodes[node].gpus
        victims = sorted(
            (
                (v, why)
                for j in held
                if (v := view.jobs.get(j)) is not None and (why := budget.why(v)) is not None
            ),
            key=lambda pair: preempt.order(pair[0]),
        )
        chosen: list[tuple[JobView, str]] = []
        for victim, why in victims:
            if free >= wanted and (claimant.shared or len(chosen) == len(held)):
                break
            chosen.append((victim, why))
            free += held[victim.id]
        if free >= wanted and chosen and (claimant.shared or len(chosen) == len(held)):
            plans.append((len(chosen), node, chosen))
    taken: list[Taken] = []
    for _, node, chosen in sorted(plans, key=lambda p: (p[0], p[1])):
        if need <= 0:
            break
        if budget.take([v for v, _ in chosen], node):
            taken += [Taken(victim, node, why) for victim, why in chosen]
            need -= 1
    return taken, need


def after(run: Run, claimant: JobView, taken: list[Taken]) -> Ledger:
    """The queues' ledger as it would stand once `claimant` had the nodes of `taken`."""
    ledger = run.ledger.copy()
    for victim, node, _ in taken:
        ledger.add(victim.queue, -1)
        ledger.add_gpus(victim.queue, -run.shares[node][victim.id])
    nodes = len({t.node for t in taken})
    ledger.add(claimant.queue, nodes)
    units = (claimant.gpus_per_node or 0) if claimant.shared else run.widest
    ledger.add_gpus(claimant.queue, nodes * units)
    return ledger


def give(run: Run, claimant: JobView, taken: list[Taken]) -> None:
    """The victims give up their shares of the nodes in `taken` to `claimant`, each saying
    why."""
    for victim, node, why in taken:
        run.unshare(node, victim.id)
        run.shrunk(victim, f"shrunk: its GPUs on {node} went to job {claimant.id} ({why})")
        data = {"job": victim.id, "for": claimant.id, "nodes": [node], "gpus": victim.gpus_per_node}
        message = f"job {victim.id}: its GPUs on {node} went to job {claimant.id} ({why})"
        run.events.append(Event("job_shrunk", message=message, data=data))


class _Budget:
    """What one claimant may take: each victim down to its min_nodes, never another queue
    below its guaranteed shares (nodes, GPU units), and by reclaim (a victim whose priority
    is not lower) never the claimant's queue above its guaranteed GPUs."""

    def __init__(self, run: Run, claimant: JobView) -> None:
        self.run, self.claimant, ledger = run, claimant, run.ledger
        # the units its queue may still reclaim (a whole-node job's reclaims by nodes)
        self.reclaim = ledger.gpu_deficit(claimant.queue) if claimant.shared else 0
        self.reclaiming = self.reclaim > 0 and any(
            ledger.gpu_surplus(q) > 0 for q in ledger.gpu_queues() if q != claimant.queue
        )
        self.spare: dict[str, int] = {}  # victim -> nodes it may still give (above min_nodes)
        self.nodes: dict[str, int] = {}  # queue -> nodes it may still give (above its share)
        self.gpus: dict[str, int] = {}  # queue -> units it may still give (above its share)

    def why(self, victim: JobView) -> str | None:
        """Why `victim` may give a share to the claimant, or None."""
        claimant, ledger = self.claimant, self.run.ledger
        if not _shrinkable(self.run, victim):
            return None
        if victim.priority < claimant.priority:
            return f"priority {claimant.priority} > {victim.priority}"
        if self.reclaiming and victim.queue != claimant.queue and ledger.gpu_surplus(victim.queue):
            share = ledger.gpu_guaranteed(claimant.queue)
            return f"queue {claimant.queue} below its guaranteed {share} GPUs"
        return None

    def take(self, chosen: list[JobView], node: str) -> bool:
        """Take the shares `chosen` hold on `node`, if every bound allows it."""
        run, ledger, claimant = self.run, self.run.ledger, self.claimant
        held = run.shares.get(node, {})
        spare = {v.id: self.spare.get(v.id, run.holds(v.id) - v.min_nodes) for v in chosen}
        nodes: dict[str, int] = {}
        gpus: dict[str, int] = {}
        for victim in chosen:
            if victim.queue != claimant.queue:
                nodes[victim.queue] = nodes.get(victim.queue, 0) + 1
                gpus[victim.queue] = gpus.get(victim.queue, 0) + held[victim.id]
        reclaims = any(v.priority >= claimant.priority for v in chosen)
        if (
            min(spare.values()) <= 0
            or any(self.nodes.get(q, ledger.surplus(q)) < n for q, n in nodes.items())
            or any(self.gpus.get(q, ledger.gpu_surplus(q)) < n for q, n in gpus.items())
            or (reclaims and self.reclaim < (claimant.gpus_per_node or 0))
        ):
            return False
        for victim in chosen:
            self.spare[victim.id] = spare[victim.id] - 1
        for queue, count in nodes.items():
            self.nodes[queue] = self.nodes.get(queue, ledger.surplus(queue)) - count
        for queue, count in gpus.items():
            self.gpus[queue] = self.gpus.get(queue, ledger.gpu_surplus(queue)) - count
        if reclaims:
            self.reclaim -= claimant.gpus_per_node or 0
        return True


def _victims_nodes(run: Run, claimant: JobView, reclaiming: bool) -> set[str]:
    """The nodes shared by running GPU jobs that hold more than their min_nodes and have a
    lower priority than `claimant` or, when its queue reclaims GPUs, are of another queue (those
    jobs found once a round: run.givers; the nodes kept for the next claimant of the same
    priority and queue while no share moves: run.version)."""
    if run.givers is None:
        running = run.running()
        run.givers = sorted(
            (
                j
                for j in run.view.jobs.values()
                if j.shared and j.id in running and run.holds(j.id) > j.min_nodes
            ),
            key=lambda j: j.priority,
        )
    key = (claimant.priority, claimant.queue if reclaiming else None, run.version)
    kept = run.givers_nodes.get(key)
    if kept is not None:
        return kept
    found: set[str] = set()
    for giver in run.givers:
        if giver.priority < claimant.priority or (reclaiming and giver.queue != claimant.queue):
            found |= run.shared_by_job.get(giver.id, set())
        elif not reclaiming:
            break
    run.givers_nodes = {key: found}  # (an older version's is stale)
    return found


def _shrinkable(run: Run, victim: JobView) -> bool:
    status = run.status(victim)
    return (
        run.holds(victim.id) > victim.min_nodes
        and status.state is RUNNING
        and not status.pinned
        and not preempt.cooling(status, run.view.now_ms, run.cooldown_ms)
    )


def grow(run: Run, job: JobView, reserving: bool) -> None:
    """A running job below its target takes nodes back the way it was admitted."""
    want = job.target_nodes - run.holds(job.id)
    room = run.room(job)
    if room is not None:
        want = min(want, room)
    if want <= 0:
        return
    picked = _pick(run, job, want, reserving)
    for node in picked:
        run.share(node, job.id, job.gpus_per_node or 0)
    if picked and run.status(job).admitted_ms != run.view.now_ms:
        run.grown(job)


def _pick(run: Run, job: JobView, want: int, reserving: bool) -> list[str]:
    """Up to `want` nodes for `job`: shared ones, fullest first, then free ones."""
    units = job.gpus_per_node or 0
    holding = run.shared_by_job.get(job.id, set())
    picked: list[str] = []
    for free in sorted(f for f in run.by_free if f >= units):
        for node in run.by_free[free]:
            if len(picked) >= want:
                return picked
            if node not in holding and run.usable(job, node):
                picked.append(node)
    if len(picked) < want and not reserving:
        picked += run.free_nodes(job, want - len(picked))
    return picked
