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

A job of more than MAX_WATCHED members is watched on a ring instead: each member watches, and
is watched by, its RING nearest in the members' order (half on either side; the order is the
group ranks', interleaved by rack: job/members.py), and is held out when a strict majority of
those RING suspect it. A watcher's own suspicions do not count while it is itself held out by
its own watchers: on either side of a cut, the side whose members are suspected by most of
their watchers loses its votes, so the cut-off few cannot hold out the neighbours they lost.
The job-wide guard stays: never so many held out that those left are no strict majority.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace

from nodeagent.model.job import ClusterView, Event, NodeReport
from nodeagent.state import JobState

# The largest job whose members watch each other (every member each other member: a beat a
# member is members - 1 connections). A larger job is watched on a ring of RING neighbours.
MAX_WATCHED = 64
RING = 8


def watched(members: Sequence[str], me: str) -> tuple[str, ...]:
    """The members `me` watches: every other one in a job of at most MAX_WATCHED members, its
    RING nearest on the ring in a larger one (who watch it back)."""
    if me not in members:
        return ()
    if len(members) > MAX_WATCHED:
        return _ring(members, me)
    return tuple(name for name in members if name and name != me)


def held_out(members: Sequence[str], nodes: Mapping[str, NodeReport]) -> frozenset[str]:
    """The nodes a strict majority of their watchers among `members` (those in `nodes`: their
    leases hold) suspect, if the members left are still a strict majority; else none (the
    leases decide). A node that is no member: a strict majority of the members (RING's, on a
    ring) suspect it."""
    if len(members) <= MAX_WATCHED:
        votes = _votes(members, nodes)
        quorum = len(members) // 2 + 1
        held = frozenset(name for name, count in votes.items() if count >= quorum)
    else:
        everyone = _ring_votes(members, nodes, frozenset())
        held = _ring_held(members, _ring_votes(members, nodes, _ring_held(members, everyone)))
    kept = sum(1 for name in members if name not in held)
    return held if 2 * kept > len(members) else frozenset()


def hold_out(view: ClusterView) -> tuple[ClusterView, frozenset[str], list[Event]]:
    """The view without the nodes the members hold out, planned from as if their leases had
    lapsed (job/plan.py), and a node_lost event for each member of a running generation."""
    record = view.record
    voters = record.members if record is not None else ()
    # Only live leases: a lapsed one is lost by its expiry (node_lost), once.
    held = held_out(voters, view.nodes) & frozenset(view.nodes)
    if not held:
        return view, held, []
    events = []
    if record is not None and record.state is JobState.RUNNING:
        for name in (m for m in record.members if m in held):
            votes = suspected_by(name, voters, view.nodes)
            message = (
                f"{name} suspected lost by {votes} of {judges(voters)} members "
                "(its lease still holds: it is planned as lapsed)"
            )
            events.append(Event("node_lost", node=name, message=message, data={"suspected": votes}))
    nodes = {name: report for name, report in view.nodes.items() if name not in held}
    return replace(view, nodes=nodes), held, events


def suspected_by(name: str, members: Sequence[str], nodes: Mapping[str, NodeReport]) -> int:
    """How many of `members` with a live lease (its watchers among them, on a ring) suspect
    `name` (for the event that says so)."""
    if len(members) <= MAX_WATCHED:
        return _votes(members, nodes)[name]
    return _ring_votes(members, nodes, frozenset())[name]


def judges(members: Sequence[str]) -> int:
    """How many members judge each one: all of them, or its RING watchers on a ring."""
    return len(members) if len(members) <= MAX_WATCHED else RING


def _votes(members: Sequence[str], nodes: Mapping[str, NodeReport]) -> Counter[str]:
    """Each node's suspicions by `members` with a live lease (a node's of itself not counted)."""
    votes: Counter[str] = Counter()
    for name in members:
        report = nodes.get(name)
        if report is not None:
            votes.update(s for s in set(report.suspects) if s != name)
    return votes


def _ring(members: Sequence[str], name: str) -> tuple[str, ...]:
    """`name`'s RING nearest members, RING // 2 on either side of it in `members`' order."""
    at, count, half = members.index(name), len(members), RING // 2
    return tuple(members[(at + d) % count] for d in (*range(-half, 0), *range(1, half + 1)))


def _ring_votes(
    members: Sequence[str], nodes: Mapping[str, NodeReport], silenced: frozenset[str]
) -> Counter[str]:
    """Each node's suspicions by its ring watchers with a live lease, not `silenced`: a
    member's suspicions count only of its RING neighbours, and of nodes that are no member."""
    inside = frozenset(members)
    votes: Counter[str] = Counter()
    for name in members:
        report = nodes.get(name)
        if report is None or name in silenced:
            continue
        near = frozenset(_ring(members, name))
        votes.update(s for s in set(report.suspects) if s in near or s not in inside)
    return votes


def _ring_held(members: Sequence[str], votes: Counter[str]) -> frozenset[str]:
    """The nodes whose votes are a strict majority of RING: of their watchers for a member."""
    return frozenset(name for name, count in votes.items() if count >= RING // 2 + 1)
