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
- memory is counted as GPUs are: a job fits a node only in the memory its sharers leave
  (each one's limit there, model/resources.py: what it asked for, else the node's share per
  GPU), and never on a node that has less than it asks for (schedrun.Small);
- CPUs are the node's, divided with its GPUs (model/cores.py): a job that asks for more CPUs
  per GPU than a node holds for each goes elsewhere (schedrun's `few`);
- a share lasts while its job runs on a live node that is not drained and does not refuse it;
  a job above its target (a scale down) gives back the nodes its record does not name;
- a queue's quota counts each node a job shares as one of the queue's nodes, and its GPU quota
  the units the job holds there;
- a running job that replaces its slow nodes, at its target, is lent K free units of one more
  node as its standby, last in the round (`stand_by`: schedule._stand_by's rule);
- preemption (pool/sharetake.py, which shares go): a pending job that found too few nodes,
  once it has waited `preempt_after`, takes shares of running jobs of lower priority (or, for
  a queue below its guaranteed GPUs, of queues above theirs) on the nodes where that frees
  its K units, shrinking them, then evicting preemptible ones; when shares are not enough,
  whole-node jobs' nodes for the rest (pool/preempt.py, as a whole-node job would: none while
  free nodes are held for a pending job); all or nothing.

Which units a job gets on a node is the node's choice (runtime/nodeloop.py).
"""

from __future__ import annotations

from nodeagent.config.values import size_text
from nodeagent.model.pool import PoolJobState
from nodeagent.pool import preempt, sharetake
from nodeagent.pool.schedrun import Run
from nodeagent.pool.schedview import JobView, SchedulePolicy

RUNNING = PoolJobState.RUNNING


def keep(run: Run) -> None:
    """Keep the shares that still hold (the first shares of the round)."""
    view, running = run.view, run.running()
    kept: dict[str, dict[str, int]] = {}
    for node, held in view.shares.items():
        live = view.nodes.get(node)
        if live is None or live.drained or live.pinned is not None or node in run.placements:
            continue
        still = {j: units for j, units in held.items() if j in running and j not in live.refused}
        if still:
            kept[node] = still
    run.keep_shares(kept)
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
            memory = f" and {_memory(job)} of memory" if job.asks_memory else ""
            return (
                f"needs {job.min_nodes} nodes with {units} free GPUs{memory}, "
                f"{len(picked)} have them"
            )
        taken, found = plan
        sharetake.give(run, job, taken)
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


def _memory(job: JobView) -> str:
    """What `job` asks for in memory on each node, in words."""
    if job.mem is not None:
        return size_text(job.mem)
    return size_text((job.mem_per_gpu or 0) * max(job.gpus_per_node or 0, 1))


def _preempting(
    run: Run, job: JobView, picked: list[str], reserving: bool, policy: SchedulePolicy
) -> tuple[list[sharetake.Taken], list[preempt.Victim]] | None:
    """What GPU job `job` takes so that it has K free units on `min_nodes` nodes with those
    `picked` already: shares first (pool/sharetake.py), then whole-node jobs' nodes for what
    remains (none while free nodes are held for a pending job); None: not enough, nothing is
    taken."""
    if run.view.now_ms - job.status.submitted_ms < policy.preempt_after_ms:
        return None
    taken, rest = sharetake.shares_for(run, job, job.min_nodes - len(picked), set(picked))
    if rest <= 0:
        return taken, []
    if reserving or not run.could_preempt(job):
        return None
    found = run.preemption(job, rest, sharetake.after(run, job, taken, len(picked)))
    return None if found is None else (taken, found)


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
            if node not in holding and run.usable(job, node) and run.fits_memory(job, node):
                picked.append(node)
    if len(picked) < want and not reserving:
        picked += run.free_nodes(job, want - len(picked))
    return picked


def stand_by(run: Run, job: JobView, before: list[str]) -> None:
    """Lend running `job` (at its target, replacing slow nodes) K free units of one more node
    as its standby (schedule._stand_by): the node it stood by on before while it still has
    them, else the one packing would give it."""
    units = job.gpus_per_node or 0
    holding = run.shared_by_job.get(job.id, set())
    kept = [
        n
        for n in sorted(before)
        if n not in holding
        and n not in run.placements
        and run.usable(job, n)
        and run.free_units(n) >= units
        and run.fits_memory(job, n)
    ]
    for node in kept[:1] or _pick(run, job, 1, reserving=False):
        run.share(node, job.id, units)
