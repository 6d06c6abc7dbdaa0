"""Issue 41, part 1: a whole step at all times, as a property of the product's own decisions
(tests/helpers/ckmodel.py plays the cluster): random sequences of saves, copies that land or
not, leader rounds, node losses (at most `replicas` at once, from a state where the committed
step is on replicas + 1 nodes), worker crashes, agent restarts and scales never leave the
committed step whole nowhere, and no re-form restores an older step than the committed one."""

from __future__ import annotations

import random
from typing import Any

import pytest

from nodeagent.job.checkpoints import replication
from tests.helpers.ckmodel import Cluster, Node, protected, whole

SEEDS = range(150)
EVENTS = 60


def cluster(replicas: int, size: int) -> Cluster:
    names = [f"m{i}" for i in range(size)]
    return Cluster(replicas, {n: Node() for n in names}, names)


def run(seed: int, replicas: int) -> list[str]:
    """One random sequence; the events it played (the last one broke the property if any)."""
    rng = random.Random(seed)
    job = cluster(replicas, rng.randint(replicas + 2, 6))
    played: list[str] = []
    for _ in range(EVENTS):
        roll = rng.random()
        if roll < 0.35:
            job.save()
            played.append(f"save {job.step}")
        elif roll < 0.6:
            job.copies(rng, landing=rng.choice((0.3, 1.0)))
            played.append("copies")
        elif roll < 0.75:
            job.lead()
            played.append("lead")
        elif roll < 0.85 and protected(job) and len(job.members) > replicas + 1:
            lost = rng.sample(job.members, rng.randint(1, replicas))
            job.lose(lost)
            played.append(f"lose {lost}")
        elif roll < 0.92:
            job.crash()
            played.append("crash or agent restart")
        else:  # down by any number of nodes, or up
            target = rng.randint(replicas + 1, 6)
            job.scale(target)
            played.append(f"scale {target}")
        problem = whole(job)
        if problem is not None:
            played.append(f"BROKEN: {problem}")
            return played
    return played


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_committed_step_survives_any_sequence_of_faults(replicas: int) -> None:
    broken = []
    for seed in SEEDS:
        played = run(seed, replicas)
        if played[-1].startswith("BROKEN"):
            broken.append((seed, played[-12:]))
    assert not broken, broken[:2]


def test_the_model_commits_and_restores_what_the_rules_say() -> None:
    """The model is not vacuous: a save copied to every successor commits; a loss of the node
    holding rank 0 restores that committed step at the smaller world; a crash before the new
    world's first commit restores it again (issue 41: it restored the start)."""
    job = cluster(1, 4)
    job.save()
    job.copies(random.Random(0), landing=1.0)
    job.lead()
    assert job.checkpoint.committed == (5, 1, 4)
    job.save()  # step 10, never copied: not committed
    job.lose(["m0"])
    assert job.restored[-1] == ("lost m0", 5, 5) and job.world == 3
    job.crash()
    assert job.restored[-1] == ("crash", 5, 5)
    assert whole(job) is None


def test_the_property_catches_a_node_dropping_old_ranks_at_the_reform(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rule before issue 41 (a node dropped the saves of ranks it no longer ran right
    after the re-form): the model finds the committed step whole nowhere."""
    monkeypatch.setattr(replication, "committed_here", lambda *_args: True)
    assert any(run(seed, 1)[-1].startswith("BROKEN") for seed in range(100))


def test_a_scale_down_by_more_than_replicas_nodes_keeps_the_committed_step() -> None:
    """6 -> 4 with one copy: m4's stop save and its committed save were on m4 and m5 alone,
    the two nodes that leave (the leader keeps the first members), and the new world restored
    the start; now every member hands its stop save to its successors among those that stay."""
    job = cluster(1, 6)
    job.save()
    job.copies(random.Random(0), landing=1.0)
    job.lead()
    assert job.checkpoint.committed == (5, 1, 6)
    job.scale(4)
    assert whole(job) is None


def test_the_property_catches_copies_pruned_past_a_committed_step_that_went_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rule before: a node removed the copies older than the step committed before the
    newest; when the restart-loop guard gives up a step the committed step goes back, and that
    rule removed the copies of the older step now committed."""

    def by_the_one_before(key: Any, before: Any, committed: Any) -> bool:
        return before is None or key[:2] >= before[:2]

    monkeypatch.setattr(replication, "keeps_copy", by_the_one_before)
    assert any(run(seed, 1)[-1].startswith("BROKEN") for seed in range(150))


def test_the_property_catches_a_hand_over_to_nodes_that_leave_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rule before: the hand-over followed the whole ring, leaving nodes included."""
    ring = replication.successors

    def whole_ring(order: Any, replicas: int, nodes: Any, staying: Any = None) -> Any:
        return ring(order, replicas, nodes)

    monkeypatch.setattr(replication, "successors", whole_ring)
    assert any(run(seed, 1)[-1].startswith("BROKEN") for seed in range(150))
