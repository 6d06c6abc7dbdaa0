"""Where a generation's workers restore from: chosen once, by the leader, for every rank. Pure.

`choose(record, members, nodes)` is called as the leader writes a RUNNING record. It orders the
sources every rank tries (the workers agree at each one, nodeagent.worker.checkpointer):

1. the memory tier, for a step whose every rank of the new world is held, verified, by the node
   that will run that rank (the same world: a rank reads only its own save there); with
   replicas, at any world, the newest save every rank of which some member holds and the
   committed step (every rank on replicas + 1 nodes, job/checkpoints/replication.py): each node
   brings what it lacks of them from its peers before its workers start
   (job/checkpoints/replicaduties.py);
2. the persistent tier's newest whole step (every rank's save copied, at any world: resharded);
3. the script's own checkpoints; 4. the start.

Newest step first whatever the tier, the memory tier first on a tie; steps in `bad` never. A
step is bad once a worker found a NaN or an infinity in it (every copy holds the same) or once
BAD_AFTER (3) generations in a row that restored it failed before any node held a newer save
(no restart loop on a bad copy; fewer such failures make it suspect: `after_failure`). A copy
that fails its checksum is that node's to drop: it verifies its tier again and stops offering
it.
`fold(checkpoint, nodes)` keeps the record's view of the persistent tier and bad steps current.
`rolled_back(checkpoint, generation, zombies)` records a generation that goes back behind saves
held then, or that starts while a node held out may still be training the one before (its saves
and copies would come later), and `current(nodes, rollbacks)` leaves out of the nodes' reports
the saves that lie on the timeline it abandoned: the leader plans from those reports only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from nodeagent.channel.restore import Source, order_from_env, order_to_env
from nodeagent.job.checkpoints import replication
from nodeagent.model.job import JobRecord, NodeReport
from nodeagent.model.tiers import (
    BAD_AFTER,
    MAX_BAD,
    MAX_ROLLBACKS,
    CheckpointRecord,
    Held,
    SaveKey,
)

MEMORY_CHOICES = 2  # memory steps offered (a rank holds two)
TAIL = (Source("script"), Source("start"))


def fold(
    checkpoint: CheckpointRecord, nodes: Mapping[str, NodeReport], replicas: int = 0
) -> CheckpointRecord:
    """The record's checkpoint part with what live nodes report: the newest step whole in the
    persistent tier (every rank's save copied there, by any nodes), steps refused, and with
    `replicas` (job.checkpoint.replicas) the committed step (job/checkpoints/replication.py)."""
    persisted: dict[tuple[int, int, int], set[int]] = {}
    refused = set(checkpoint.bad)
    for report in nodes.values():
        if report.tier is None:
            continue
        refused.update(report.tier.refused)
        for held in report.tier.persisted:
            key = (held.step, held.generation, held.world_size)
            persisted.setdefault(key, set()).update(held.ranks)
    best = (checkpoint.persisted_step, checkpoint.persisted_generation)
    world = checkpoint.persisted_world
    for (step, generation, held_world), ranks in persisted.items():
        whole = len(ranks) == held_world and step not in refused
        if whole and (best[0] is None or (step, generation) > best):
            best, world = (step, generation), held_world
    committed = _committed(checkpoint.committed, nodes, replicas, refused)
    return replace(
        checkpoint,
        persisted_step=best[0],
        persisted_generation=best[1],
        persisted_world=world,
        bad=tuple(sorted(refused))[-MAX_BAD:],
        committed_step=committed[0] if committed else None,
        committed_generation=committed[1] if committed else 0,
        committed_world=committed[2] if committed else 0,
        replicas=replicas,
    )


def _committed(
    previous: SaveKey | None, nodes: Mapping[str, NodeReport], replicas: int, bad: set[int]
) -> SaveKey | None:
    """The newest save on replicas + 1 live nodes; else the one recorded, while its every rank
    is still held by some live node (a node lost takes copies away: it is still the newest
    whole in memory, and the survivors copy it again)."""
    if not replicas:
        return None
    held = replication.holdings(nodes)
    fresh = replication.committed(held, replicas, bad)
    if previous is None or previous[0] in bad or not replication.whole(held, previous):
        return fresh
    if fresh is None:
        return previous
    return max(fresh, previous, key=lambda k: (k[0], k[1]))


Saved = tuple[int, int]  # (step, the generation that saved it)


def _holds(held: Sequence[Held], saved: Saved, world: int, ranks: range) -> bool:
    have = {
        r
        for h in held
        if (h.step, h.generation) == saved and h.world_size == world
        for r in h.ranks
    }
    return all(r in have for r in ranks)


def memory_steps(
    members: Sequence[str], nproc: int, nodes: Mapping[str, NodeReport]
) -> list[Saved]:
    """Saves (step, generation), newest first, whose every rank of a world of `members` (group
    rank = index) is in the memory tier of the node that will run it, saved by one generation
    (the same step number saved in two timelines is two saves)."""
    world = len(members) * nproc
    first = nodes.get(members[0]) if members else None
    if first is None or first.tier is None:
        return []
    found = []
    for saved in sorted({(h.step, h.generation) for h in first.tier.memory}, reverse=True):
        if all(
            (report := nodes.get(name)) is not None
            and report.tier is not None
            and _holds(report.tier.memory, saved, world, range(g * nproc, (g + 1) * nproc))
            for g, name in enumerate(members)
        ):
            found.append(saved)
    return found


def newest_held(checkpoint: CheckpointRecord, nodes: Mapping[str, NodeReport]) -> int:
    """The newest step any node reports in memory, or the persisted one: what a restore of an
    older step loses against."""
    steps = [r.tier.newest_memory() for r in nodes.values() if r.tier is not None]
    known = [s for s in (*steps, checkpoint.persisted_step, checkpoint.newest) if s is not None]
    return max(known, default=0)


def choose(
    checkpoint: CheckpointRecord,
    members: Sequence[str],
    nproc: int,
    nodes: Mapping[str, NodeReport],
) -> CheckpointRecord:
    """The record's checkpoint part for a new generation of `members`: its restore order."""
    bad = set(checkpoint.bad)
    ordered = [
        (step, 1, Source("memory", step, generation))
        for step, generation in memory_steps(members, nproc, nodes)[:MEMORY_CHOICES]
        if step not in bad
    ]
    offered = {(s.step, s.generation) for _, _, s in ordered}
    for key in _anywhere(checkpoint, members, nodes):
        if key[0] not in bad and key[:2] not in offered:
            # held by the members, at any world: the nodes bring what they lack first
            offered.add(key[:2])
            ordered.append((key[0], 1, Source("memory", key[0], key[1])))
    persisted = checkpoint.persisted_step
    if persisted is not None and persisted not in bad:
        source = Source("persistent", persisted, checkpoint.persisted_generation)
        ordered.append((persisted, 0, source))
    sources = [source for _, _, source in sorted(ordered, key=lambda x: (x[0], x[1]), reverse=True)]
    order = tuple(order_to_env(tuple(sources + list(TAIL))).split())
    return replace(checkpoint, restore=order, newest=newest_held(checkpoint, nodes))


def _anywhere(
    checkpoint: CheckpointRecord, members: Sequence[str], nodes: Mapping[str, NodeReport]
) -> list[SaveKey]:
    """The memory saves a new world of `members` can restore at any world, with replicas: the
    newest every rank of which some member holds now (the last saves made as the old world
    stopped often are), and the committed one (on replicas + 1 nodes when recorded) while the
    members still hold it whole."""
    if not checkpoint.replicas:
        return []
    live = {name: nodes[name] for name in members if name in nodes}
    held = replication.holdings(live)
    newest = replication.newest_whole(held, checkpoint.bad)
    keys = (newest, checkpoint.committed)
    return [key for key in keys if key is not None and replication.whole(held, key)]


def rolled_back(
    checkpoint: CheckpointRecord, generation: int, zombies: bool = False
) -> CheckpointRecord:
    """`checkpoint` as `generation` starts with it: with a rollback recorded when the step its
    workers try first is older than the newest held, or whatever that step when `zombies`
    (nodes held out alive: job/suspicion.py) may still save and copy steps of an older
    generation beyond it until their leases fence them, none of which any generation goes on
    from. None when the workers try the script's own checkpoints first (no step known here)."""
    step = first_step(checkpoint)
    if step is None or (step >= checkpoint.newest and not zombies):
        return checkpoint
    rollbacks = (*checkpoint.rollbacks, (generation, step))[-MAX_ROLLBACKS:]
    return replace(checkpoint, rollbacks=rollbacks)


def on_timeline(held: Held, rollbacks: Sequence[tuple[int, int]]) -> bool:
    """`held` was saved on the timeline the job goes on with: no later generation went back
    behind its step."""
    return not any(
        generation > held.generation and held.step > step for generation, step in rollbacks
    )


def current(
    nodes: Mapping[str, NodeReport], rollbacks: Sequence[tuple[int, int]]
) -> Mapping[str, NodeReport]:
    """The reports with only the saves on the job's timeline (`on_timeline`)."""
    if not rollbacks:
        return nodes
    return {name: _current(report, rollbacks) for name, report in nodes.items()}


def _current(report: NodeReport, rollbacks: Sequence[tuple[int, int]]) -> NodeReport:
    tier = report.tier
    if tier is None:
        return report

    def keep(held: tuple[Held, ...]) -> tuple[Held, ...]:
        return tuple(h for h in held if on_timeline(h, rollbacks))

    kept = replace(
        tier, memory=keep(tier.memory), persisted=keep(tier.persisted), replicas=keep(tier.replicas)
    )
    return report if kept == tier else replace(report, tier=kept)


def first_step(checkpoint: CheckpointRecord) -> int | None:
    """The step this generation's workers try first (None: the script's own, or the start)."""
    for source in order_from_env(" ".join(checkpoint.restore)):
        if source.step is not None:
            return source.step
    return None


def after_failure(record: JobRecord, nodes: Mapping[str, NodeReport]) -> CheckpointRecord | None:
    """`record`'s checkpoint part once its generation failed (a worker crashed or hung) before
    any member held a newer save than the step it restored (within one save interval of that
    restore): the step is suspect, and bad once BAD_AFTER generations in a row restored it and
    failed so. A restart loop on a step that crashes the training ends there, and a crash or
    two that only happen to follow a restore (faults come in bursts; a bad host crashes the
    job twice) do not cost the step. None when `record` has no tiers."""
    checkpoint = record.checkpoint
    if checkpoint is None:
        return None
    step = first_step(checkpoint)
    if step is None or step in checkpoint.bad:
        return checkpoint
    newer = any(
        (report := nodes.get(name)) is not None
        and report.tier is not None
        and (report.tier.newest_memory() or -1) > step
        for name in record.members
    )
    if newer:
        return replace(checkpoint, suspect=None, suspect_failures=0)
    failures = checkpoint.suspect_failures + 1 if checkpoint.suspect == step else 1
    if failures < BAD_AFTER:
        return replace(checkpoint, suspect=step, suspect_failures=failures)
    bad = (*checkpoint.bad, step)[-MAX_BAD:]
    return replace(checkpoint, bad=bad, suspect=None, suspect_failures=0)
