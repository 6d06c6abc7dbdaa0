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
