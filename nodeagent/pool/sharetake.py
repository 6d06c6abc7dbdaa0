"""Which shares of nodes jobs share by GPUs go to a pending job (pool/sharing.py's preemption,
and the shared nodes a whole-node job may take): pure, a part of schedule()'s round.

Rules (docs/pool.md, "GPUs"):
- a claimant takes, on each node, the shares of jobs that may give theirs, lowest priority and
  youngest first, until the node has what it needs (K free units for a GPU job, and the memory
  it asks for there, each share counted at its limit; the whole node, every share of it, for a
  whole-node job); the nodes needing the fewest such shares
  first; all or nothing (the caller's);
- a job may give its share of a node when it runs there, is not pinned, was not resized within
  `resize_cooldown`, and either has a lower priority than the claimant (strictly) or, for a
  GPU claimant whose queue holds fewer GPU units than its guaranteed GPU share, is of another
  queue above its own GPU share (reclaim: whatever its priority);
- first by shrinking: a job holding more nodes than its `min_nodes` gives one share a node,
  down to them; only when that is not enough, whole `preemptible` jobs are evicted: every
  share they hold goes, and they go back to pending (preempt.py's rule for whole-node jobs);
- never another queue below its guaranteed shares (nodes, GPU units), and by reclaim never
  the claimant's queue above its guaranteed GPUs.
"""

from __future__ import annotations

from typing import NamedTuple

from nodeagent.model.job import Event
from nodeagent.model.pool import PoolJobState
from nodeagent.model.queues import Ledger
from nodeagent.pool import preempt
from nodeagent.pool.schedrun import Run
from nodeagent.pool.schedview import JobView

RUNNING = PoolJobState.RUNNING


class Taken(NamedTuple):
    victim: JobView
    node: str  # the node whose share it gives up
    why: str  # "priority 10 > 5", or "queue research below its guaranteed 16 GPUs"
    evict: bool = False  # every share it holds goes, and it goes back to pending


def shares_for(run: Run, claimant: JobView, need: int, skip: set[str]) -> tuple[list[Taken], int]:
    """The shares to take so that `claimant` has what it needs (K free units, or a whole node)
    on up to `need` nodes (none of `skip`): by shrinking first, then by evicting; and how many
    nodes it still needs then."""
    budget = _Budget(run, claimant, len(skip))
    taken, need = _plan(run, budget, need, skip)
    if need > 0:
        budget.evicting = True
        more, need = _plan(run, budget, need, skip | {t.node for t in taken})
        taken += more
    return taken, need


def _plan(run: Run, budget: _Budget, need: int, skip: set[str]) -> tuple[list[Taken], int]:
    view, claimant = run.view, budget.claimant
    plans: list[tuple[int, str, list[tuple[JobView, str]]]] = []
    for node in sorted(_victims_nodes(run, claimant, budget.reclaiming)):  # (a bound: most
        held = run.shares.get(node, {})  # pending jobs find none)
        if node in skip or claimant.id in held or not run.usable(claimant, node):
            continue
        victims = sorted(
            (
                (v, why)
                for j in held
                if (v := view.jobs.get(j)) is not None and (why := budget.why(v)) is not None
            ),
            key=lambda pair: preempt.order(pair[0]),
        )
        if claimant.shared:  # the fewest shares that free its K units, and its memory, there
            free, units = run.free_units(node), claimant.gpus_per_node or 0
            memory = run.memory_free(node)
            needs = claimant.memory_on(view.nodes[node], units) if memory is not None else 0
            memory = memory if memory is not None else 0
            chosen: list[tuple[JobView, str]] = []
            for victim, why in victims:
                if free >= units and memory >= needs:
                    break
                chosen.append((victim, why))
                free += held[victim.id]
                memory += run.share_memory(node, victim.id)
            if not chosen or free < units or memory < needs:
                continue
        elif len(victims) == len(held):  # a whole node: every share of it
            chosen = victims
        else:
            continue
        plans.append((len(chosen), node, chosen))
    taken: list[Taken] = []
    for _, node, chosen in sorted(plans, key=lambda p: (p[0], p[1])):
        if need <= 0:
            break
        evicted = budget.take([v for v, _ in chosen], node)
        if evicted is not None:
            taken += [Taken(v, node, why, v.id in evicted) for v, why in chosen]
            need -= 1
    return taken, need


def after(run: Run, claimant: JobView, taken: list[Taken], picked: int = 0) -> Ledger:
    """The queues' ledger as it would stand once `claimant` had the nodes of `taken`, and
    `picked` nodes more it gets without preempting."""
    ledger = run.ledger.copy()
    evicted: dict[str, JobView] = {}
    for victim, node, _, evict in taken:
        if evict:
            evicted[victim.id] = victim
            continue
        ledger.add(victim.queue, -1)
        ledger.add_gpus(victim.queue, -run.shares[node][victim.id])
    for victim in evicted.values():
        count, units = _holding(run, victim.id)
        ledger.add(victim.queue, -count)
        ledger.add_gpus(victim.queue, -units)
    nodes = len({t.node for t in taken}) + picked
    ledger.add(claimant.queue, nodes)
    units = (claimant.gpus_per_node or 0) if claimant.shared else run.widest
    ledger.add_gpus(claimant.queue, nodes * units)
    return ledger


def give(run: Run, claimant: JobView, taken: list[Taken]) -> None:
    """The victims give up their shares of the nodes in `taken` to `claimant` (one evicted:
    every share it holds), each saying why."""
    evicted: set[str] = set()
    for victim, node, why, evict in taken:
        if evict:
            if victim.id not in evicted:
                evicted.add(victim.id)
                _evict(run, claimant, victim, why)
            continue
        run.unshare(node, victim.id)
        run.shrunk(victim, f"shrunk: its GPUs on {node} went to job {claimant.id} ({why})")
        data = {"job": victim.id, "for": claimant.id, "nodes": [node], "gpus": victim.gpus_per_node}
        message = f"job {victim.id}: its GPUs on {node} went to job {claimant.id} ({why})"
        run.events.append(Event("job_shrunk", message=message, data=data))


def _evict(run: Run, claimant: JobView, victim: JobView, why: str) -> None:
    nodes = sorted(run.shared_by_job.get(victim.id, set()))
    for node in nodes:
        run.unshare(node, victim.id)
    data = {"job": victim.id, "for": claimant.id, "nodes": nodes, "gpus": victim.gpus_per_node}
    run.evict(victim, claimant, why, data)


def _holding(run: Run, job: str) -> tuple[int, int]:
    """The nodes `job` shares and the units it holds on them (what its eviction frees)."""
    nodes = run.shared_by_job.get(job, set())
    return len(nodes), sum(run.shares[node][job] for node in nodes)


class _Budget:
    """What one claimant may take: each victim down to its min_nodes (or, `evicting`, a whole
    preemptible one), never another queue below its guaranteed shares (nodes, GPU units), and
    by reclaim (a victim whose priority is not lower) never the claimant's queue above its
    guaranteed GPUs."""

    def __init__(self, run: Run, claimant: JobView, picked: int) -> None:
        self.run, self.claimant, ledger = run, claimant, run.ledger
        # the units its queue may still reclaim, once it holds those of the `picked` nodes it
        # gets without preempting (a whole-node job's queue reclaims by nodes)
        units = claimant.gpus_per_node or 0
        deficit = ledger.gpu_deficit(claimant.queue) - picked * units
        self.reclaim = max(0, deficit) if claimant.shared else 0
        self.reclaiming = self.reclaim > 0 and any(
            ledger.gpu_surplus(q) > 0 for q in ledger.gpu_queues() if q != claimant.queue
        )
        self.evicting = False  # whole preemptible jobs may go too (once shrinking was not enough)
        self.spare: dict[str, int] = {}  # victim -> nodes it may still give (above min_nodes)
        self.evicted: set[str] = set()
        self.nodes: dict[str, int] = {}  # queue -> nodes it may still give (above its share)
        self.gpus: dict[str, int] = {}  # queue -> units it may still give (above its share)

    def why(self, victim: JobView) -> str | None:
        """Why `victim` may give its share to the claimant, or None."""
        claimant, ledger = self.claimant, self.run.ledger
        if not self._may_give(victim):
            return None
        if victim.priority < claimant.priority:
            return f"priority {claimant.priority} > {victim.priority}"
        if self.reclaiming and victim.queue != claimant.queue and ledger.gpu_surplus(victim.queue):
            share = ledger.gpu_guaranteed(claimant.queue)
            return f"queue {claimant.queue} below its guaranteed {share} GPUs"
        return None

    def _may_give(self, victim: JobView) -> bool:
        run, status = self.run, self.run.status(victim)
        if status.state is not RUNNING or status.pinned or status.admitted_ms == run.view.now_ms:
            return False  # (one admitted in this round is not taken back in it)
        if preempt.cooling(status, run.view.now_ms, run.cooldown_ms):
            return False
        if victim.id in self.evicted or run.holds(victim.id) > victim.min_nodes:
            return True
        return self.evicting and victim.preemptible and victim.id not in self.spare

    def take(self, chosen: list[JobView], node: str) -> set[str] | None:
        """Take the shares `chosen` hold on `node`, if every bound allows it: the victims
        evicted (now or by an earlier node's), None if not taken. A victim shrinks while it
        holds more than its min_nodes; at them, once shrinking was not enough, a preemptible
        one that gave nothing yet is evicted."""
        run, ledger, claimant = self.run, self.run.ledger, self.claimant
        gone = {v.id for v in chosen if v.id in self.evicted}
        spare: dict[str, int] = {}
        evicts: set[str] = set()
        for victim in chosen:
            if victim.id in gone:
                continue
            left = self.spare.get(victim.id, run.holds(victim.id) - victim.min_nodes)
            if left > 0:
                spare[victim.id] = left - 1
            elif self.evicting and victim.preemptible and victim.id not in self.spare:
                evicts.add(victim.id)
            else:
                return None
        nodes: dict[str, int] = {}
        gpus: dict[str, int] = {}
        for victim in chosen:
            if victim.queue == claimant.queue or victim.id in gone:
                continue  # (an evicted one's shares were counted when it was evicted)
            if victim.id in evicts:
                count, units = _holding(run, victim.id)
            else:
                count, units = 1, run.shares[node][victim.id]
            nodes[victim.queue] = nodes.get(victim.queue, 0) + count
            gpus[victim.queue] = gpus.get(victim.queue, 0) + units
        reclaims = any(v.priority >= claimant.priority for v in chosen)
        if (
            any(self.nodes.get(q, ledger.surplus(q)) < n for q, n in nodes.items())
            or any(self.gpus.get(q, ledger.gpu_surplus(q)) < n for q, n in gpus.items())
            or (reclaims and self.reclaim < (claimant.gpus_per_node or 0))
        ):
            return None
        self.spare.update(spare)
        self.evicted |= evicts
        for queue, count in nodes.items():
            self.nodes[queue] = self.nodes.get(queue, ledger.surplus(queue)) - count
        for queue, count in gpus.items():
            self.gpus[queue] = self.gpus.get(queue, ledger.gpu_surplus(queue)) - count
        if reclaims:
            self.reclaim -= claimant.gpus_per_node or 0
        return gone | evicts


def _victims_nodes(run: Run, claimant: JobView, reclaiming: bool) -> set[str]:
    """The nodes shared by running GPU jobs that could give a share (above their min_nodes,
    or preemptible) and have a lower priority than `claimant` or, when its queue reclaims
    GPUs, are of another queue (those jobs found once a round: run.givers; the nodes kept for
    the next claimant of the same priority and queue while no share moves: run.version)."""
    if run.givers is None:
        running = run.running()
        run.givers = sorted(
            (
                j
                for j in run.view.jobs.values()
                if j.shared and j.id in running and (j.preemptible or run.holds(j.id) > j.min_nodes)
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
