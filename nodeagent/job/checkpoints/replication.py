"""Which copies of the job's saves go where, and which step is committed. Pure (issue 27).

Every node keeps its ranks' saves in its memory tier, and `replicas` (k) peers keep a copy of
each in their replica areas. Copies follow a ring over the job's nodes (`ring`): the members in
group-rank order, interleaved by failure domain (the pool label `rack`) so that a node's next
peers are in other racks where there are any. Every node reports what it holds, verified
(model/tiers.py), and everything here is computed from those reports alone, by the leader, which
reads them all anyway (job/checkpoints/handouts.py hands each node its share: `handouts`):

- `committed`: the newest save every rank of which is verified on k+1 live nodes. The leader
  records it (fenced with the record); a node loss restores from it, at any world.
- `copies`: the copies still missing for the newest save whole anywhere and for the committed
  one (after a node loss, what the lost node held has one copy fewer: re-protecting is the same
  rule). A copy is made by the first holder in ring order, to the next nodes after it that do
  not hold it.
- `restore_fetches`: what each member must bring from its peers before its workers restore a
  memory step: its own ranks' saves at the same world; at another (DCP reshards), the old ranks
  whose rows its ranks read, or every one where the save's layout is not row-wise
  (channel/layout.py; the holders report the row counts, Held.rows).

Saves are told apart by (step, generation, world): a step number can recur after a rollback.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from nodeagent.channel import layout
from nodeagent.channel.restore import order_from_env
from nodeagent.model.handout import Handout, Served, Transfer
from nodeagent.model.job import JobRecord, NodeReport, RestartReason
from nodeagent.model.tiers import SaveKey
from nodeagent.state import JobState

# key -> rank -> node -> the digest that node reports for its copy
Holders = dict[SaveKey, dict[int, dict[str, str]]]


@dataclass(frozen=True)
class Copy:
    """One rank's save to be brought to `target`, from the first of `sources` that has it whole."""

    key: SaveKey
    rank: int
    digest: str
    sources: tuple[str, ...]
    target: str

    def __str__(self) -> str:
        step, generation, world = self.key
        return f"step {step}@{generation} rank {self.rank}/{world} -> {self.target}"


def ring(members: Sequence[str], domains: Mapping[str, str]) -> tuple[str, ...]:
    """`members` (group-rank order) reordered so that neighbours sit in different failure
    domains where the domains allow it: one node of each domain in turn, the largest domain
    first. One domain (or none named): the members' own order."""
    by_domain: dict[str, list[str]] = {}
    for name in members:
        by_domain.setdefault(domains.get(name, ""), []).append(name)
    if len(by_domain) <= 1:
        return tuple(members)
    queues = sorted(by_domain.values(), key=len, reverse=True)
    order: list[str] = []
    while len(order) < len(members):
        for queue in queues:
            if queue:
                order.append(queue.pop(0))
    return tuple(order)


def holdings(nodes: Mapping[str, NodeReport]) -> Holders:
    """Who holds which rank of which save, verified (memory tier and replica area), as the
    given nodes report it: pass live nodes only (a node cut off holds nothing one can reach)."""
    found: Holders = {}
    for name, report in nodes.items():
        if report.tier is None:
            continue
        for held in (*report.tier.memory, *report.tier.replicas):
            for i, rank in enumerate(held.ranks):
                digest = held.digests[i] if held.digests else ""
                found.setdefault(held.key, {}).setdefault(rank, {})[name] = digest
    return found


def _count(ranks: Mapping[int, Mapping[str, str]], world: int) -> int:
    """The fewest nodes any rank of a world-`world` save is held on (0: a rank is missing)."""
    return min((len(ranks.get(rank, {})) for rank in range(world)), default=0)


def _newest(keys: Iterable[SaveKey]) -> list[SaveKey]:
    return sorted(keys, key=lambda k: (k[0], k[1]), reverse=True)


def whole(held: Holders, key: SaveKey) -> bool:
    """Every rank of save `key` is held by some node."""
    return _count(held.get(key, {}), key[2]) >= 1


def committed(held: Holders, replicas: int, bad: Iterable[int] = ()) -> SaveKey | None:
    """The newest save every rank of which is held on replicas + 1 nodes (steps in `bad`
    never)."""
    refused = set(bad)
    for key in _newest(held):
        if key[0] not in refused and _count(held[key], key[2]) >= replicas + 1:
            return key
    return None


def newest_whole(held: Holders, bad: Iterable[int] = ()) -> SaveKey | None:
    """The newest save every rank of which some node holds."""
    refused = set(bad)
    return next(
        (k for k in _newest(held) if k[0] not in refused and _count(held[k], k[2]) >= 1), None
    )


def copies(
    order: Sequence[str],
    nodes: Mapping[str, NodeReport],
    replicas: int,
    keep: SaveKey | None = None,
    bad: Iterable[int] = (),
) -> list[Copy]:
    """The copies missing for the newest whole save and for `keep` (the committed one), so
    that every rank of each is on replicas + 1 nodes of `order` (the ring). Only to nodes
    with a replica listener."""
    live = _in(order, nodes)
    held = holdings(live)
    wanted = [k for k in dict.fromkeys((newest_whole(held, bad), keep)) if k is not None]
    position = {name: i for i, name in enumerate(order)}
    reachable = _listeners(live)
    found = []
    for key in wanted:
        for rank in range(key[2]):
            holders = held.get(key, {}).get(rank, {})
            if not holders or len(holders) > replicas:
                continue
            sources = tuple(sorted(holders, key=position.__getitem__))
            need = replicas + 1 - len(holders)
            start = position[sources[0]]
            for step in range(1, len(order)):
                target = order[(start + step) % len(order)]
                if target not in holders and target in reachable:
                    found.append(Copy(key, rank, holders[sources[0]], sources, target))
                    need -= 1
                    if not need:
                        break
    return found


def restore_fetches(
    members: Sequence[str],
    nproc: int,
    restore: Sequence[str],
    order: Sequence[str],
    nodes: Mapping[str, NodeReport],
) -> dict[str, list[Copy]]:
    """What each member (group rank = index, `nproc` ranks each) must bring from its peers
    before its workers try the memory steps of the restore order `restore`: for a save of
    the same world, its own ranks' copies; of another, the old ranks they read (resharding):
    those whose rows overlap theirs where the holders report the save's row counts
    (Held.rows, channel/layout.py), else every one. The holdings are read once for all."""
    held = holdings(_in(order, nodes))
    position = {name: i for i, name in enumerate(order)}
    counts = {
        h.key: h.rows
        for r in nodes.values()
        if r.tier is not None
        for h in (*r.tier.memory, *r.tier.replicas)
        if h.rows
    }
    world = len(members) * nproc
    return {
        name: _fetches(
            name, range(g * nproc, (g + 1) * nproc), world, restore, held, position, counts.get
        )
        for g, name in enumerate(members)
    }


def _fetches(
    me: str,
    local_ranks: Sequence[int],
    world: int,
    restore: Sequence[str],
    held: Holders,
    position: Mapping[str, int],
    rows: Callable[[SaveKey], tuple[int, ...] | None],
) -> list[Copy]:
    found = []
    for source in order_from_env(" ".join(restore)):
        if source.tier != "memory" or source.step is None:
            continue
        for key in _newest(held):
            step, generation, saved_world = key
            if step != source.step or (source.generation not in (None, generation)):
                continue
            counts = rows(key) if saved_world != world else None
            for rank in layout.reads(saved_world, counts, local_ranks, world):
                holders = held[key].get(rank, {})
                if me in holders or not holders:
                    continue
                sources = tuple(sorted(holders, key=lambda n: position.get(n, len(position))))
                found.append(Copy(key, rank, holders[sources[0]], sources, me))
            break
    return found


def scaling_down(record: JobRecord) -> bool:
    """`record` announces a generation with fewer nodes than run now (`nodeagentctl scale`): its
    member list is still the running one's until the new generation starts."""
    return (
        record.state is JobState.RESTARTING
        and record.reason == RestartReason.SCALE
        and record.target_nodes < len(record.members)
    )


def successors(
    order: Sequence[str],
    replicas: int,
    nodes: Mapping[str, NodeReport],
    staying: Collection[str] | None = None,
) -> dict[str, tuple[str, ...]]:
    """Each node of the ring `order` -> the next `replicas` nodes after it with a replica
    listener (as `nodes` report them): where it copies the save its workers make as they stop
    for a scale-down or its drain (job/checkpoints/handover.py), the same ring a save's copies
    follow.

    With `staying` (the nodes a scale-down is expected to keep), only those are successors: a
    scale-down by more than `replicas` nodes would otherwise hand saves to nodes that leave
    too. A node that stays hands to the next ones that stay; the nodes that leave are dealt
    out over those that stay in turn, in the ring's order, so that halving a job adds one
    node's saves to each node kept, not all of them to the first one after the block that
    leaves."""
    listening = _listeners(nodes)
    reachable = [name for name in order if name in listening]
    keep = set(reachable if staying is None else staying)
    kept = [name for name in reachable if name in keep]
    count = min(replicas, len(kept))
    after: dict[str, tuple[str, ...]] = {}
    dealt = 0  # nodes that leave, dealt out so far
    first = bisect.bisect_right  # the next kept node after a ring position
    index = {name: i for i, name in enumerate(reachable)}
    positions = [index[name] for name in kept]
    for position, name in enumerate(reachable):
        if name in keep:
            start = first(positions, position)
            nexts = (kept[(start + i) % len(kept)] for i in range(len(kept)))
            after[name] = tuple(itertools.islice((n for n in nexts if n != name), replicas))
        else:
            after[name] = tuple(kept[(dealt + i) % len(kept)] for i in range(count))
            dealt += 1
    return after


def handouts(
    generation: int,
    nodes: Mapping[str, NodeReport],
    sends: Sequence[Copy],
    fetched: Mapping[str, Sequence[Copy]] = {},
    after: Mapping[str, Sequence[str]] = {},
    announced: bool = False,
) -> dict[str, Handout]:
    """Each node's share (model/handout.py) of the copies `sends` (each made by the first of
    its sources) and of the fetches `fetched` (node -> what it brings), with its successors
    `after` (node -> the next nodes on the ring), the addresses of the peers each names, the
    peers that may ask it, and the saves each may fetch from it. Every node named, every node
    of `fetched` and every node of `after` gets a share: an empty one says "written: nothing
    to do". `announced`: shares of a scale-down's announcement (Handout.announced)."""
    transfers: dict[str, list[Transfer]] = {name: [] for name in (*fetched, *after)}
    asking: dict[str, set[str]] = {}
    serves: dict[str, set[Served]] = {}
    for name, nexts in after.items():
        for successor in nexts:
            asking.setdefault(successor, set()).add(name)
    for copy in sends:
        sender = copy.sources[0]
        transfers.setdefault(sender, []).append(_transfer(copy, False))
        asking.setdefault(copy.target, set()).add(sender)
        transfers.setdefault(copy.target, [])
    for name, wanted in fetched.items():
        for copy in wanted:
            transfers[name].append(_transfer(copy, True))
            step, saved_by, _world = copy.key
            for source in copy.sources:
                asking.setdefault(source, set()).add(name)
                serves.setdefault(source, set()).add((name, step, saved_by, copy.rank))
                transfers.setdefault(source, [])
    addresses = _listeners(nodes)
    shares = {}
    for name, mine in transfers.items():
        nexts = tuple(after.get(name, ()))
        named = {n for t in mine for n in (t.target, *t.sources) if n != name} | set(nexts)
        shares[name] = Handout(
            generation,
            tuple(mine),
            tuple(sorted((n, addresses[n]) for n in named if n in addresses)),
            tuple(sorted(asking.get(name, ()))),
            nexts,
            tuple(sorted(serves.get(name, ()))),
            announced,
        )
    return shares


def reported_listeners(
    addresses: Mapping[str, str], reports: Mapping[str, NodeReport]
) -> dict[str, str]:
    """The peer addresses of a share (node -> host:port) that are the listener each node
    reports itself (`reports`: the job's nodes whose lease holds): the share is written by
    whoever holds the agents' Redis password, and one naming a stranger's address for a node
    is ignored, not dialled (the listener there would also have to prove it is an agent:
    checkpoint/peerauth.py)."""
    listening = _listeners(reports)
    return {n: a for n, a in addresses.items() if listening.get(n) == a}


def _listeners(nodes: Mapping[str, NodeReport]) -> dict[str, str]:
    """Node -> the address of its replica listener, for the nodes that report one."""
    return {n: r.tier.address for n, r in nodes.items() if r.tier and r.tier.address}


def _in(order: Sequence[str], nodes: Mapping[str, NodeReport]) -> dict[str, NodeReport]:
    """The reports of the nodes of the ring `order` (a set: the ring may hold 10,000 names)."""
    names = set(order)
    return {name: report for name, report in nodes.items() if name in names}


def _transfer(copy: Copy, fetch: bool) -> Transfer:
    return Transfer(copy.key, copy.rank, copy.digest, copy.sources, copy.target, fetch)


def committed_here(committed: SaveKey | None, generation: int, world: int) -> bool:
    """The committed save `committed` was saved by the running `generation` at its `world`:
    only then may a node drop the saves of ranks it no longer runs (until then they may be all
    that is whole of the step the generation restored: issue 41)."""
    return committed is not None and committed[1] == generation and committed[2] == world


def keeps_copy(key: SaveKey, committed_before: SaveKey | None, committed: SaveKey | None) -> bool:
    """Whether a node keeps its copy of save `key`, given the last two committed saves it read
    (the one before, and the newest): the copies older than both go. Not those of the one
    before: the leader commits from reports a heartbeat old, and a worker may have written over
    its save since (channel/pin.py), so one committed step back is kept whole; and when the
    committed step went back (a step given up as bad, issue 41), the newest is the older one,
    and its copies are what is whole of it."""
    if committed_before is None or committed is None:
        return True
    return key[:2] >= min(committed_before[:2], committed[:2])


def under_replicated(held: Holders, key: SaveKey | None, replicas: int) -> list[int]:
    """The ranks of save `key` held on fewer than replicas + 1 nodes."""
    if key is None:
        return []
    ranks = held.get(key, {})
    return [rank for rank in range(key[2]) if len(ranks.get(rank, {})) < replicas + 1]


def digest_of(report: NodeReport, key: SaveKey, rank: int) -> str | None:
    """The digest `report`'s node says its copy of rank `rank` of save `key` has (None: it
    reports none)."""
    if report.tier is None:
        return None
    for held in (*report.tier.memory, *report.tier.replicas):
        if held.key == key and rank in held.ranks and held.digests:
            return held.digests[held.ranks.index(rank)]
    return None
