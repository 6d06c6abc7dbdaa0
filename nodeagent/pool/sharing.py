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
  the units the job holds there.

Which units a job gets on a node is the node's choice (runtime/nodeloop.py).
"""

from __future__ import annotations

from nodeagent.model.pool import PoolJobState
from nodeagent.pool.schedrun import Run
from nodeagent.pool.schedview import JobView

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


def admit(run: Run, job: JobView, reserving: bool) -> bool:
    """Admit pending `job` on nodes it can share (True), or leave it pending (False)."""
    units = job.gpus_per_node or 0
    room = run.room(job)
    want = job.target_nodes if room is None else min(job.target_nodes, room)
    picked = _pick(run, job, want, reserving)
    if len(picked) < job.min_nodes:
        run.note(
            job, f"needs {job.min_nodes} nodes with {units} free GPUs, {len(picked)} have them"
        )
        return False
    for node in picked:
        run.share(node, job.id, units)
    reason = f"admitted on {len(picked)} nodes, {units} GPUs each"
    run.move(job, RUNNING, reason, "job_admitted")
    return True


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
