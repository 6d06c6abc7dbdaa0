"""schedule()'s memo of blocked shapes (schedule.Blocked): a pending job that shares its shape
with one that could not start gets the same verdict, unjudged, while nothing moved; whole-node
jobs and jobs that share nodes by GPUs alike. Checked against schedule() judging every job
alone, on seeded random pools: placements, statuses and events the same."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from nodeagent.model.pool import PoolJob, PoolJobState
from nodeagent.model.queues import QueueView
from nodeagent.pool import schedule as scheduling
from nodeagent.pool.schedule import JobView, NodeView, PoolView, SchedulePolicy, schedule
from nodeagent.state import JobState

NOW = 10_000_000
POLICY = SchedulePolicy(reserve_after_ms=60_000, preempt_after_ms=30_000)


def pool(rng: random.Random) -> PoolView:
    """Nodes (some cordoned, some refusing a job, some labelled), queues with quotas and
    guarantees, and jobs running and pending in few shapes: what the memo meets."""
    names = [f"n{i:02d}" for i in range(rng.randint(2, 14))]
    jobs: dict[str, JobView] = {}
    placements: dict[str, str] = {}
    free = list(names)
    rng.shuffle(free)
    for i in range(rng.randint(0, 4)):  # running, on nodes of their own
        size = rng.randint(1, 3)
        members, free = tuple(free[:size]), free[size:]
        if not members:
            break
        status = PoolJob(
            PoolJobState.RUNNING, seq=i + 1, submitted_ms=0, admitted_ms=NOW - 100_000 * (i + 1)
        )
        jobs[f"r{i}"] = JobView(
            f"r{i}", status, 1, len(members) + 1, len(members), priority=rng.choice([0, 0, 5]),
            queue=rng.choice(["default", "a", "b"]), record_state=JobState.RUNNING,
            members=members, preemptible=rng.random() < 0.3,
        )  # fmt: skip
        placements.update(dict.fromkeys(members, f"r{i}"))
    for i in range(rng.randint(1, 40)):  # pending, of a few shapes
        size = rng.choice([1, 1, 2, 3, 20])
        status = PoolJob(
            PoolJobState.PENDING, seq=100 + i, submitted_ms=NOW - rng.choice([0, 40_000, 90_000])
        )
        jobs[f"p{i:02d}"] = JobView(
            f"p{i:02d}", status, size, size + 1, size + rng.choice([0, 1]),
            priority=rng.choice([0, 0, 3, 9]), queue=rng.choice(["default", "a", "b"]),
            selector={"gpu": "h100"} if rng.random() < 0.1 else {},
            held="bob" if rng.random() < 0.05 else None,
        )  # fmt: skip
    pending = [j for j in jobs if j.startswith("p")]
    nodes = {}
    for name in names:
        refused = {rng.choice(pending): "no"} if rng.random() < 0.15 else {}
        nodes[name] = NodeView(
            name,
            cordoned="x" if rng.random() < 0.1 else None,
            refused=refused,
            labels={"gpu": "h100"} if rng.random() < 0.5 else {},
            serving=placements.get(name),
        )
    queues = {
        "a": QueueView("a", quota=rng.choice([None, 2, 4]), guaranteed=rng.choice([0, 2])),
        "b": QueueView("b", guaranteed=rng.choice([0, 3])),
    }
    return PoolView(NOW, nodes, jobs, placements, queues)


def gpu_pool(rng: random.Random) -> PoolView:
    """Nodes of 4 or 8 GPUs (some cordoned, some refusing a job), jobs sharing them running
    (some above their min_nodes: what a claimant may shrink), whole-node jobs, and pending jobs
    of both kinds in few shapes, some waiting long enough to preempt or to hold free nodes."""
    names = [f"g{i:02d}" for i in range(rng.randint(2, 12))]
    gpus = {n: rng.choice([4, 8, 8]) for n in names}
    jobs: dict[str, JobView] = {}
    placements: dict[str, str] = {}
    shares: dict[str, dict[str, int]] = {}
    for i in range(rng.randint(0, 8)):  # running, sharing nodes
        units = rng.choice([1, 2, 4])
        on = [n for n in rng.sample(names, k=min(len(names), rng.randint(1, 3)))
              if sum(shares.get(n, {}).values()) + units <= gpus[n]]  # fmt: skip
        if not on:
            continue
        for n in on:
            shares.setdefault(n, {})[f"s{i}"] = units
        status = PoolJob(
            PoolJobState.RUNNING, seq=i + 1, submitted_ms=0, admitted_ms=NOW - 100_000 * (i + 1)
        )
        jobs[f"s{i}"] = JobView(
            f"s{i}", status, 1, len(on), len(on), priority=rng.choice([0, 0, 5]),
            queue=rng.choice(["default", "a", "b"]), record_state=JobState.RUNNING,
            members=tuple(on), gpus_per_node=units, preemptible=rng.random() < 0.3,
            standby=rng.random() < 0.2,
        )  # fmt: skip
    free = [n for n in names if n not in shares]
    if free and rng.random() < 0.5:  # a whole-node job
        members = tuple(free[: rng.randint(1, len(free))])
        status = PoolJob(PoolJobState.RUNNING, seq=50, submitted_ms=0, admitted_ms=NOW - 50_000)
        jobs["w"] = JobView("w", status, 1, len(members), len(members),
                            record_state=JobState.RUNNING, members=members,
                            standby=rng.random() < 0.5)  # fmt: skip
        placements.update(dict.fromkeys(members, "w"))
        spare = [n for n in free if n not in members]
        if jobs["w"].standby and spare:  # the standby it was lent last round
            placements[spare[0]] = "w"
    for i in range(rng.randint(1, 40)):  # pending, of a few shapes
        size = rng.choice([1, 1, 2, 3])
        status = PoolJob(
            PoolJobState.PENDING, seq=100 + i, submitted_ms=NOW - rng.choice([0, 40_000, 90_000])
        )
        jobs[f"p{i:02d}"] = JobView(
            f"p{i:02d}", status, size, size, size + rng.choice([0, 1]),
            priority=rng.choice([0, 3, 9]), queue=rng.choice(["default", "a", "b"]),
            gpus_per_node=rng.choice([1, 2, 4, 8, None]),
        )  # fmt: skip
    pending = [j for j in jobs if j.startswith("p")]
    nodes = {
        name: NodeView(
            name,
            cordoned="x" if rng.random() < 0.1 else None,
            refused={rng.choice(pending): "no"} if rng.random() < 0.15 else {},
            serving=placements.get(name),
            sharing=tuple(shares.get(name, {})),
            gpus=gpus[name],
        )
        for name in names
    }
    queues = {
        "a": QueueView(
            "a",
            quota=rng.choice([None, 2, 4]),
            gpu_quota=rng.choice([None, 8]),
            gpu_guaranteed=rng.choice([0, 0, 8]),
        ),
        "b": QueueView("b", gpu_guaranteed=rng.choice([0, 4])),
    }
    return PoolView(NOW, nodes, jobs, placements, queues, shares=shares)


@pytest.mark.parametrize("seed", range(300))
@pytest.mark.parametrize("make", [pool, gpu_pool])
def test_the_memo_of_blocked_shapes_decides_as_judging_every_job_alone(
    seed: int, make: Callable[[random.Random], PoolView], monkeypatch: pytest.MonkeyPatch
) -> None:
    view = make(random.Random(seed))
    remembered = schedule(view, POLICY)
    monkeypatch.setattr(scheduling.Blocked, "said", lambda self, *judged: None)
    alone = schedule(view, POLICY)
    assert remembered.placements == alone.placements
    assert remembered.jobs == alone.jobs
    assert remembered.events == alone.events


def test_jobs_of_one_shape_are_judged_once_while_nothing_moves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ten jobs wanting 3 nodes, 2 free: judged once, each told the same; a job some node refuses
    is judged alone; and once one of another shape is admitted, the shape is judged again."""
    judged: list[str] = []
    whole = scheduling._whole

    def counting(run: object, job: JobView, *rest: object) -> object:
        judged.append(job.id)
        return whole(run, job, *rest)  # type: ignore[arg-type]

    monkeypatch.setattr(scheduling, "_whole", counting)

    def pending(job_id: str, size: int, seq: int) -> JobView:
        return JobView(job_id, PoolJob(PoolJobState.PENDING, seq=seq, submitted_ms=NOW), size,
                       size, size)  # fmt: skip

    jobs = {f"big{i}": pending(f"big{i}", 3, i) for i in range(10)}
    jobs["refused"] = pending("refused", 3, 10)
    jobs["small"] = pending("small", 1, 11)
    jobs["after"] = pending("after", 3, 12)
    running = PoolJob(PoolJobState.RUNNING, seq=0, submitted_ms=0, admitted_ms=NOW)
    jobs["r"] = JobView("r", running, 1, 1, 1, record_state=JobState.RUNNING, members=("c",))
    nodes = {
        "a": NodeView("a", refused={"refused": "no"}),
        "b": NodeView("b"),
        "c": NodeView("c", serving="r"),
    }
    result = schedule(PoolView(NOW, nodes, jobs, {"c": "r"}), SchedulePolicy())
    assert judged == ["big0", "refused", "small", "after"]
    assert {result.jobs[f"big{i}"].reason for i in range(10)} == {"needs 3 nodes, 2 free"}
    assert result.jobs["after"].reason == "needs 3 nodes, 1 free"  # small took one
    assert result.jobs["small"].state is PoolJobState.RUNNING


@pytest.mark.parametrize("seed", range(300))
def test_what_a_round_decides_on_shared_nodes_fits_them(seed: int) -> None:
    """Whatever preempts whom: no node holds more units than it offers, none is both placed
    and shared, a job is on a node at most once, and a job the round leaves pending (evicted
    ones too) holds nothing."""
    view = gpu_pool(random.Random(seed))
    result = schedule(view, POLICY)
    for node, held in result.shares.items():
        assert sum(held.values()) <= view.nodes[node].gpus, (node, held)
        assert node not in result.placements, node
    state = {j: result.jobs.get(j, view.jobs[j].status).state for j in view.jobs}
    holding = {*result.placements.values(), *(j for h in result.shares.values() for j in h)}
    assert not {j for j in holding if state[j] is not PoolJobState.RUNNING}
    for event in result.events:
        if event.type == "job_evicted":
            assert state[str(event.data["job"])] is PoolJobState.PENDING
