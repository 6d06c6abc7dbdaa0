"""Fair share (model/fairshare.py, pool/fairness.py): usage decayed by its half-life, Slurm's
classic factor, the order it gives schedule(), and the usage saved for the next leader."""

from __future__ import annotations

import math

import pytest

from nodeagent.errors import CorruptStateError
from nodeagent.model.fairshare import QUEUE, FairShare, Usage, charged, factors, holding
from nodeagent.model.pool import PoolJob, PoolJobState
from nodeagent.pool.fairness import boost, charge
from nodeagent.pool.schedule import JobView, NodeView, PoolView, SchedulePolicy, schedule

HOUR_MS = 3_600_000


def test_usage_is_node_time_halved_every_half_life() -> None:
    start = Usage(0, {"alice": 3600.0})
    later = charged(start, {}, HOUR_MS, half_life_s=3600)
    assert later.users["alice"] == pytest.approx(1800.0)
    # two nodes for an hour, each second decayed as it ages: 2 * 3600 / ln 2 * (1 - 1/2)
    held = charged(Usage(0), {"bob": 2}, HOUR_MS, half_life_s=3600)
    assert held.users["bob"] == pytest.approx(2 * 3600 / math.log(2) * 0.5)
    # charging in many small rounds gives what one long one gives
    stepped = Usage(0)
    for t in range(1, 61):
        stepped = charged(stepped, {"bob": 2}, t * 60_000, half_life_s=3600)
    assert stepped.users["bob"] == pytest.approx(held.users["bob"])
    gone = charged(Usage(0, {"carol": 1.0}), {}, 100 * HOUR_MS, half_life_s=3600)
    assert "carol" not in gone.users


def test_the_factor_is_one_unused_a_half_at_its_share_less_beyond() -> None:
    policy = FairShare(weight=1000, shares={"alice": 1, "bob": 1})
    found = factors(policy, Usage(0, {"alice": 100.0, "bob": 100.0}), ["carol"])
    assert found["carol"] == 1.0  # nothing used (and a share of its own: 1)
    assert found["alice"] == found["bob"] == pytest.approx(2 ** (-0.5 / (1 / 3)))
    skewed = factors(policy, Usage(0, {"alice": 900.0, "bob": 100.0}), [])
    assert skewed["bob"] > 0.5 > skewed["alice"]
    assert skewed["alice"] == pytest.approx(2 ** (-0.9 / 0.5))
    weighted = factors(
        FairShare(1, shares={"alice": 3}), Usage(0, {"alice": 75.0, "bob": 25.0}), []
    )
    assert weighted["alice"] == pytest.approx(0.5) and weighted["bob"] == pytest.approx(0.5)
    assert factors(policy, Usage(0), ["alice"]) == {"alice": 1.0}


def test_queues_are_weighed_against_queues_and_users_against_users() -> None:
    policy = FairShare(weight=1, shares={"queue:prod": 3})
    usage = Usage(0, {"alice": 50.0, "bob": 50.0, "queue:prod": 75.0, "queue:dev": 25.0})
    found = factors(policy, usage, ["queue:idle"])
    assert found["alice"] == found["bob"] == pytest.approx(0.5)
    assert found["queue:prod"] == pytest.approx(2 ** (-0.75 / 0.6))  # shares 3 of 5
    assert found["queue:dev"] == pytest.approx(2 ** (-0.25 / 0.2))
    assert found["queue:idle"] == 1.0
    assert boost(found, "alice", "prod") == pytest.approx(0.5 * found["queue:prod"])
    assert boost(found, "carol", "new") == 1.0


def test_holding_counts_each_users_nodes() -> None:
    placements = {"n1": "a", "n2": "a", "n3": "b", "n4": "x"}
    assert holding(placements, {"a": "alice", "b": "bob", "x": ""}) == {"alice": 2, "bob": 1}
    shared = {"n9": {"a": 0.25, "c": 0.5}}  # on a node jobs share: the part their GPUs are
    assert holding(placements, {"a": "alice", "b": "bob", "c": "carol"}, shared) == {
        "alice": 2.25,
        "bob": 1,
        "carol": 0.5,
    }


def test_the_saved_usage_comes_back_and_garbage_is_refused() -> None:
    usage = Usage(5, {"alice": 12.5}, FairShare(1000, 3600, {"alice": 2}))
    assert Usage.from_json(usage.to_json()) == usage
    for raw in ("", "{}", '{"at_ms": 1, "users": {"a": -1}, "policy": {}}',
                '{"at_ms": 1, "users": {"a": "x"}, "policy": {"weight": 1, "half_life_s": 1, '
                '"shares": {}}}'):  # fmt: skip
        with pytest.raises(CorruptStateError):
            Usage.from_json(raw)


def test_a_user_who_used_less_goes_first_within_a_priority() -> None:
    """Equal priorities: the job of the user below its share is admitted before an earlier
    job of the user above it; a higher priority still goes first when the weight is below the
    gap."""

    def job(job_id: str, seq: int, user: str, boost: float, priority: int = 0) -> JobView:
        status = PoolJob(PoolJobState.PENDING, seq, 0)
        return JobView(job_id, status, 1, 1, 1, user=user, fair_share=boost, priority=priority)

    nodes = {"n1": NodeView("n1")}
    jobs = {
        "a1": job("a1", 1, "alice", 100 * 0.1),  # submitted first, alice above her share
        "b1": job("b1", 2, "bob", 100 * 0.9),
    }
    result = schedule(PoolView(0, nodes, jobs, {}), SchedulePolicy())
    assert result.placements == {"n1": "b1"}
    jobs["a1"] = job("a1", 1, "alice", 100 * 0.1, priority=1000)
    result = schedule(PoolView(0, nodes, jobs, {}), SchedulePolicy())
    assert result.placements == {"n1": "a1"}


def test_a_shared_node_is_charged_to_each_job_by_its_gpus_part_and_a_whole_node_whole() -> None:
    """pool/fairness.charge over a round's view: bob's two-GPU job on an 8-GPU node alice's
    six-GPU job shares is a quarter of that node an hour, alice's three quarters, and her
    whole-node job on another node one; the queues are charged the same."""

    def job(job_id: str, user: str, queue: str, gpus: int | None) -> JobView:
        status = PoolJob(PoolJobState.RUNNING, 1, 0)
        return JobView(job_id, status, 1, 1, 1, user=user, queue=queue, gpus_per_node=gpus)

    nodes = {"n1": NodeView("n1", gpus=8), "n2": NodeView("n2", gpus=8)}
    jobs = {
        "a-six": job("a-six", "alice", "research", 6),
        "b-two": job("b-two", "bob", "prod", 2),
        "a-whole": job("a-whole", "alice", "research", None),
    }
    shares = {"n1": {"a-six": 6, "b-two": 2}}
    view = PoolView(HOUR_MS, nodes, jobs, {"n2": "a-whole"}, shares=shares)
    usage, boosted = charge(FairShare(weight=100, half_life_s=3600), Usage(0), view)
    hour = 3600 / math.log(2) * 0.5  # a node held for an hour, each second decayed as it ages
    assert usage.users["bob"] == pytest.approx(0.25 * hour)
    assert usage.users["alice"] == pytest.approx(1.75 * hour)
    assert usage.users[QUEUE + "prod"] == pytest.approx(0.25 * hour)
    assert usage.users[QUEUE + "research"] == pytest.approx(1.75 * hour)
    # bob used less: his job's boost is the larger
    assert boosted.jobs["b-two"].fair_share > boosted.jobs["a-six"].fair_share
