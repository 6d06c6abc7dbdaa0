"""A model of a job's memory tier under faults (issue 41): the saves and copies every node holds,
the commits, the membership, driven by the product's own pure decisions.

Nothing here decides for the product: where a save or a copy goes is `pin.choose`, which copies
the leader plans is `replication.copies`, what is committed is `restore.fold`, the restore order
is `restore.choose` and what a node brings for it `replication.restore_fetches`, whether a
crash makes the restored step bad `restore.after_failure`, which copies a
node keeps is `replication.keeps_copy`, when it drops the saves of ranks it no longer runs
is `replication.committed_here`, who stays at a scale-down is `members.choose`, and where the
nodes hand their stop saves is `replication.successors`. The model only plays the cluster:
workers save, copies land (all or some), the leader rounds, nodes are lost, workers crash, the
job scales, agents restart.
One process per node: group rank = rank.

`whole(cluster)` is the property: the step the record names committed has every rank on a live
node, and no re-form restored an older step than the newest committed, unless the restart-loop
guard gave that step up (BAD_AFTER generations in a row restored it and failed at once).
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field

from nodeagent.channel.pin import Pin, Slot, choose
from nodeagent.channel.restore import order_from_env
from nodeagent.job import members
from nodeagent.job.checkpoints import replication, restore
from nodeagent.model.job import NodeReport
from nodeagent.model.tiers import CheckpointRecord, Held, SaveKey, TierReport
from nodeagent.state import JobState, NodeState
from tests.helpers.factories import make_record

Slots = list[Slot | None]
ROWS = (12,)  # the state: tensors of 12 rows sharded row-wise (FSDP2): a rank reads few old ranks


@dataclass
class Node:
    """One node's tiers: its ranks' saves (rank -> two slots) and its copies of peers' saves
    ((the peer it came from, rank) -> two slots, as the replica area keeps them)."""

    memory: dict[int, Slots] = field(default_factory=dict)
    area: dict[tuple[str, int], Slots] = field(default_factory=dict)
    pin: Pin = field(default_factory=lambda: Pin(None))
    ranks: tuple[int, ...] = ()
    committed: tuple[SaveKey | None, SaveKey | None] = (None, None)  # before, newest

    def held(self) -> tuple[tuple[Held, ...], tuple[Held, ...]]:
        return _held(self.memory.items()), _held((r, s) for (_, r), s in self.area.items())


def _held(slots: Iterable[tuple[int, Slots]]) -> tuple[Held, ...]:
    by_key: dict[SaveKey, set[int]] = {}
    for rank, pair in slots:
        for slot in pair:
            if slot is not None:
                by_key.setdefault(slot.key, set()).add(rank)
    return tuple(
        Held(k[0], k[2], tuple(sorted(r)), k[1], tuple(_digest(k, x) for x in sorted(r)), ROWS)
        for k, r in sorted(by_key.items())
    )


def _digest(key: SaveKey, rank: int) -> str:
    return f"{key[0]}-{key[1]}-{key[2]}-{rank}"


def _put(pair: Slots, key: SaveKey, pin: Pin, now: float, generation: int | None) -> bool:
    """A save (generation given) or a copy into `pair` where pin.choose says; False: skipped."""
    index = choose(pair, pin, generation, now, patience=2.0 if generation is not None else 0)
    if index is None:
        return False
    pair[index] = Slot(key, now)
    return True


@dataclass
class Cluster:
    """The job: live nodes, members (ring = group-rank order), the record's checkpoint part."""

    replicas: int
    nodes: dict[str, Node]
    members: list[str]
    generation: int = 1
    step: int = 0  # the step the workers reached
    checkpoint: CheckpointRecord = field(default_factory=CheckpointRecord)
    now: float = 0.0
    floor: int = 0  # the newest step ever committed: no restore goes below it
    restored: list[tuple[str, int, int]] = field(default_factory=list)  # (why, floor, step)
    spare: int = 0  # names of nodes that join

    def __post_init__(self) -> None:
        self.checkpoint = CheckpointRecord(replicas=self.replicas)
        self._assign()

    @property
    def world(self) -> int:
        return len(self.members)

    def _assign(self) -> None:
        for rank, name in enumerate(self.members):
            self.nodes[name].ranks = (rank,)

    def reports(self) -> dict[str, NodeReport]:
        found = {}
        for name, node in self.nodes.items():
            memory, area = node.held()
            tier = TierReport(memory=memory, replicas=area, address=f"{name}:1")
            found[name] = NodeReport(name, "127.0.0.1", NodeState.RUNNING, tier=tier)
        return found

    # -- the workers and the agents --------------------------------------------------------

    def save(self, every: int = 5) -> None:
        """Every rank saves the next step (a save skipped where the pin says wait)."""
        self.step += every
        self.now += 1.0
        key = (self.step, self.generation, self.world)
        for name in self.members:
            node = self.nodes[name]
            for rank in node.ranks:
                pair = node.memory.setdefault(rank, [None, None])
                _put(pair, key, node.pin, self.now, self.generation)

    def copies(self, rng: random.Random, landing: float) -> None:
        """The leader's plan of copies for the newest whole save and the committed one; each
        lands with probability `landing` (the others are under way, or failed)."""
        live = {n: r for n, r in self.reports().items() if n in self.members}
        sends = replication.copies(
            tuple(self.members), live, self.replicas, self.checkpoint.committed
        )
        for copy in sends:
            if rng.random() < landing:
                self._land(copy.key, copy.rank, copy.sources[0], copy.target)

    def _land(self, key: SaveKey, rank: int, source: str, target: str) -> None:
        self.now += 0.01
        node = self.nodes[target]
        _put(node.area.setdefault((source, rank), [None, None]), key, node.pin, self.now, None)

    def lead(self) -> None:
        """A leader round: the commit (restore.fold), then each node's pin and its pruning,
        as the agents do on reading the record."""
        live = {n: r for n, r in self.reports().items() if n in self.members}
        self.checkpoint = restore.fold(self.checkpoint, live, self.replicas)
        committed = self.checkpoint.committed
        self.floor = max(self.floor, committed[0] if committed is not None else 0)
        for name in self.members:
            node = self.nodes[name]
            node.pin = Pin(committed)
            if committed != node.committed[1]:
                node.committed = (node.committed[1], committed)
            for pair in node.area.values():
                for i, slot in enumerate(pair):
                    if slot is not None and not replication.keeps_copy(slot.key, *node.committed):
                        pair[i] = None
            if replication.committed_here(committed, self.generation, self.world):
                for rank in [r for r in node.memory if r not in node.ranks]:
                    del node.memory[rank]

    # -- faults -----------------------------------------------------------------------------

    def lose(self, names: list[str]) -> None:
        """Nodes lost (agent, workers and tmpfs): the survivors re-form without them."""
        for name in names:
            del self.nodes[name]
        self.members = [m for m in self.members if m not in names]
        self._reform("lost " + ",".join(names))

    def crash(self) -> None:
        """A worker crashed (or an agent restarted: its workers go with it; its tiers stay):
        the leader judges the step the generation restored (`restore.after_failure`: a crash
        before any newer save makes it suspect, a second one bad), and the same members
        re-form."""
        record = make_record(
            JobState.RUNNING, self.generation, tuple(self.members), checkpoint=self.checkpoint
        )
        judged = restore.after_failure(record, self.reports())
        assert judged is not None
        self.checkpoint = judged
        self._reform("crash")

    def scale(self, target: int) -> None:
        """`nodeagentctl scale`: a graceful re-form. Every rank saves the step it reached as it
        stops; at a scale-down every member hands its stop save to its successors among the
        nodes expected to stay first (`members.choose`, `replication.successors`;
        job/checkpoints/handover.py), then the leaving nodes' tiers go with the job."""
        self.now += 1.0
        key = (self.step, self.generation, self.world)
        for name in self.members:
            node = self.nodes[name]
            for rank in node.ranks:  # written as the process ends: over the newer, not the pin
                pair = node.memory.setdefault(rank, [None, None])
                index = choose(pair, node.pin, None, self.now)
                assert index is not None
                pair[index] = Slot(key, self.now)
        staying = members.choose(self.members, self.members, target)
        leaving = [name for name in self.members if name not in staying]
        if leaving:
            live = {n: r for n, r in self.reports().items() if n in self.members}
            after = replication.successors(tuple(self.members), self.replicas, live, staying)
            for name in self.members:
                for successor in after.get(name, ()):
                    for rank in self.nodes[name].ranks:
                        self._land(key, rank, name, successor)
            for name in leaving:
                del self.nodes[name]
            self.members = list(staying)
        while len(self.members) < target:
            self.spare += 1
            name = f"n{self.spare}"
            self.nodes[name] = Node()
            self.members.append(name)
        self.lead()  # the leader reads the hand-over before the last acknowledgement
        self._reform(f"scale {target}")

    def _reform(self, why: str) -> None:
        """A new generation of the members: the leader's restore order, the fetches it plans,
        the workers' restore (the first source every rank can read), the timeline after it
        forgotten."""
        self.generation += 1
        self._assign()
        live = {n: r for n, r in self.reports().items() if n in self.members}
        live_ckpt = restore.fold(self.checkpoint, live, self.replicas)
        self.checkpoint = restore.choose(live_ckpt, self.members, 1, live)
        order = tuple(self.members)
        fetches = replication.restore_fetches(self.members, 1, self.checkpoint.restore, order, live)
        for target, wanted in fetches.items():
            for copy in wanted:
                self._land(copy.key, copy.rank, copy.sources[0], target)
        step = 0
        for source in order_from_env(" ".join(self.checkpoint.restore)):
            if source.tier == "memory" and source.step is not None:
                if self._readable(source.step, source.generation):
                    step = source.step
                    break
            elif source.tier == "start":
                break
        self.restored.append((why, self.floor, step))
        self.step = step
        for node in self.nodes.values():  # the abandoned timeline: never counted again
            for pairs in (node.memory.values(), node.area.values()):
                for pair in pairs:
                    for i, slot in enumerate(pair):
                        if slot and slot.key[0] > step and slot.key[1] < self.generation:
                            pair[i] = None
        self.lead()

    def _readable(self, step: int, generation: int | None) -> bool:
        """Every rank of the new world can read `step`: every old rank of it is on a member
        (what each rank reads of it was brought to its node by the fetches above)."""
        live = {n: r for n, r in self.reports().items() if n in self.members}
        held = replication.holdings(live)
        keys = [k for k in held if k[0] == step and generation in (None, k[1])]
        return any(replication.whole(held, k) for k in keys)


def whole(cluster: Cluster) -> str | None:
    """What is wrong with the model's state, or None: the committed step is whole on live
    nodes, and the last re-form restored no older step than the one committed as it began."""
    if cluster.restored:
        why, floor, step = cluster.restored[-1]
        if step < floor and floor not in cluster.checkpoint.bad:  # bad: the restart-loop guard
            return f"{why}: restored step {step}, older than step {floor} committed"
    committed = cluster.checkpoint.committed
    if committed is not None:
        held = replication.holdings(cluster.reports())
        if not replication.whole(held, committed):
            return f"committed step {committed} is whole on no live node"
    return None


def protected(cluster: Cluster) -> bool:
    """Every rank of the committed save is on replicas + 1 live members (or nothing was ever
    committed): the state from which `replicas` nodes may be lost at once. Not while a
    re-form's restored step waits for its copies (nothing committed at the new world yet): a
    loss then is a second fault inside the first one's recovery."""
    committed = cluster.checkpoint.committed
    if committed is None:
        return cluster.floor == 0 and not cluster.restored
    live = {n: r for n, r in cluster.reports().items() if n in cluster.members}
    held = replication.holdings(live)
    return not replication.under_replicated(held, committed, cluster.replicas)
