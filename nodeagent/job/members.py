"""Who may run the next generation, and who does: pure, shared by the leader's plan (job/plan.py)
and by the shares it writes as a scale-down is announced (job/checkpoints/handouts.py: the
nodes that leave hand their stop save to those expected to stay)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from nodeagent.model.job import NodeReport
from nodeagent.state import NodeState

# Not eligible for a new generation.
UNAVAILABLE = frozenset({NodeState.LEAVING, NodeState.DRAINING, NodeState.CORDONED})


def eligible(nodes: Mapping[str, NodeReport]) -> tuple[str, ...]:
    """The live nodes that may be chosen for a new generation, by name."""
    return tuple(
        sorted(
            name
            for name, report in nodes.items()
            if report.state not in UNAVAILABLE and report.eligible
        )
    )


def choose(previous: Sequence[str], able: Sequence[str], target: int) -> tuple[str, ...]:
    """The members of the next generation: survivors keep their order (and so their group
    ranks); newcomers go last, by name."""
    kept_able = set(able)
    survivors = [name for name in previous if name in kept_able]
    kept = set(survivors)
    newcomers = sorted(name for name in able if name not in kept)
    return tuple((survivors + newcomers)[:target])


def ready(names: Sequence[str], nodes: Mapping[str, NodeReport]) -> tuple[str, ...]:
    """Those of `names` with no replacement worker still warming up (NodeReport.warming): the
    survivors never wait for a newcomer's imports and set-up (issue 53); it joins once ready."""
    return tuple(name for name in names if nodes[name].warming == 0)


def next_members(
    previous: Sequence[str],
    eligible: Sequence[str],
    nodes: Mapping[str, NodeReport],
    target: int,
    min_nodes: int,
) -> tuple[str, ...]:
    """The members of the next generation: chosen among the ready nodes, or among every
    eligible one when fewer than `min_nodes` are ready (the job cannot go on without the
    warming ones, so it waits for them, as it did before warm-ups)."""
    chosen = choose(previous, ready(eligible, nodes), target)
    if len(chosen) >= min_nodes:
        return chosen
    return choose(previous, eligible, target)
