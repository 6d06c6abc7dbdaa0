"""Which members the job's own members hold out as lost, before their leases lapse. Pure.

Each member's agent watches the other members directly (job/peerwatch.py: a beat every
`timing.peer_interval` on a connection it dialled): a peer whose connection closes (its agent
died: the kernel closes its sockets at once) or that stays silent `timing.peer_timeout` is
suspected, and the suspicion goes out in the node's report (`NodeReport.suspects`). One
suspicion proves nothing: a watcher may be the one cut off. The leader holds a node out only
when a strict majority of the record's members, each with a live lease, suspect it, and only
while the nodes left are a strict majority of the members: a minority on its side of a
partition can never hold out the majority, and a job of two waits for the lease as before.

A node held out is planned as if its lease had lapsed (job/plan.py): it is lost to the running
generation, not waited for in the next one, never chosen, and no checkpoint it reports is a
restore source. If it is alive (a partition, a freeze) its workers may run on until it reads
the new generation or its own lease fences it: what counts of what they do, and what does not
yet, is in docs/design.md ("Fast detection: the members watch each other").

A node stays held out while its watchers suspect it, which they do until it beats again: a
member left out of the next generation is still watched by the members that suspect it, so it
is not chosen again while it is still silent.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from nodeagent.model.job import NodeReport

# The largest job whose members watch each other (every member each other member: a beat a
# member is members - 1 connections). A larger job is left to its leases.
MAX_WATCHED = 64


def watched(members: Sequence[str], me: str) -> tuple[str, ...]:
    """The members `me` watches: every other one, in a job of at most MAX_WATCHED members."""
    if me not in members or len(members) > MAX_WATCHED:
        return ()
    return tuple(name for name in members if name and name != me)


def held_out(members: Sequence[str], nodes: Mapping[str, NodeReport]) -> frozenset[str]:
    """The nodes a strict majority of `members` (those in `nodes`: their leases hold) suspect,
    if the members left are still a strict majority; else none (the leases decide)."""
    if len(members) > MAX_WATCHED:
        return frozenset()
    votes = _votes(members, nodes)
    quorum = len(members) // 2 + 1
    held = frozenset(name for name, count in votes.items() if count >= quorum)
    kept = sum(1 for name in members if name not in held)
    return held if 2 * kept > len(members) else frozenset()


def suspected_by(name: str, members: Sequence[str], nodes: Mapping[str, NodeReport]) -> int:
    """How many of `members` with a live lease suspect `name` (for the event that says so)."""
    return _votes(members, nodes)[name]


def _votes(members: Sequence[str], nodes: Mapping[str, NodeReport]) -> Counter[str]:
    """Each node's suspicions by `members` with a live lease (a node's of itself not counted)."""
    votes: Counter[str] = Counter()
    for name in members:
        report = nodes.get(name)
        if report is not None:
            votes.update(s for s in set(report.suspects) if s != name)
    return votes
