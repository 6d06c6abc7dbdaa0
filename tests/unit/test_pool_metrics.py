"""pool_figures(): the pool leader's gauges from its view, as table tests; the collector's
rule that only a leader whose last pool call went through exports them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from nodeagent.model.pool import PoolJob, PoolJobState
from nodeagent.model.queues import QueueView
from nodeagent.pool.ledger import Bookkeeper
from nodeagent.pool.metrics import PoolCollector, PoolFigures, pool_figures
from nodeagent.pool.schedule import JobView, NodeView, PoolView

NOW = 10_000_000
PENDING, RUNNING = PoolJobState.PENDING, PoolJobState.RUNNING


def job(
    id: str,
    state: PoolJobState = PENDING,
    *,
    seq: int = 1,
    waited_ms: int = 0,
    priority: int = 0,
    pinned: bool = False,
) -> JobView:
    status = PoolJob(state, seq=seq, submitted_ms=NOW - waited_ms, pinned=pinned)
    return JobView(id, status, 1, 1, 1, priority=priority, user=f"{id}-user")


def view(
    nodes: Sequence[NodeView],
    listed: Sequence[JobView] = (),
    placements: dict[str, str] | None = None,
) -> PoolView:
    return PoolView(NOW, {n.name: n for n in nodes}, {j.id: j for j in listed}, placements or {})


def counts(**given: int) -> dict[str, int]:
    return {"free": 0, "busy": 0, "cordoned": 0, "unhealthy": 0, **given}


def jobs(**given: int) -> dict[str, int]:
    return {"pending": 0, "running": 0, **given}


NODE_CASES = [
    ("empty pool", view([]), counts()),
    ("free nodes", view([NodeView("a"), NodeView("b")]), counts(free=2)),
    (
        "placed is busy",
        view([NodeView("a"), NodeView("b")], placements={"a": "j"}),
        counts(free=1, busy=1),
    ),
    ("pinned is busy, placed or not", view([NodeView("a", pinned="p")]), counts(busy=1)),
    ("cordoned", view([NodeView("a", cordoned="maintenance")]), counts(cordoned=1)),
    ("unfit is unhealthy", view([NodeView("a", unfit="1 of 8 GPUs usable")]), counts(unhealthy=1)),
    (
        "unhealthy wins over cordoned",
        view([NodeView("a", unfit="xid 79", cordoned="maintenance")]),
        counts(unhealthy=1),
    ),
    (
        "cordoned wins over busy",
        view([NodeView("a", cordoned="maintenance")], placements={"a": "j"}),
        counts(cordoned=1),
    ),
    (
        "refusing a job is still free",
        view([NodeView("a", refused={"j": "no user"})], [job("j")]),
        counts(free=1),
    ),
    (
        "a placement of a node without a live lease counts nothing",
        view([NodeView("a")], placements={"gone": "j"}),
        counts(free=1),
    ),
]


@pytest.mark.parametrize(("name", "pool", "expected"), NODE_CASES, ids=[c[0] for c in NODE_CASES])
def test_each_node_counts_once(name: str, pool: PoolView, expected: dict[str, int]) -> None:
    figures = pool_figures(pool)
    assert dict(figures.nodes) == expected
    assert sum(figures.nodes.values()) == len(pool.nodes)


ENDED = [PoolJobState.SUCCEEDED, PoolJobState.FAILED, PoolJobState.CANCELLED]

JOB_CASES: list[tuple[str, list[JobView], dict[str, int], float, dict[str, float]]] = [
    ("no jobs", [], jobs(), 0.0, {}),
    ("running only: nothing waits", [job("r", RUNNING, waited_ms=9_000)], jobs(running=1), 0.0, {}),
    (
        "the head is the first submitted",
        [job("old", seq=1, waited_ms=90_000), job("new", seq=2, waited_ms=5_000)],
        jobs(pending=2),
        90.0,
        {"old": 90.0, "new": 5.0},
    ),
    (
        "priority before first come",
        [job("old", seq=1, waited_ms=90_000), job("urgent", seq=2, waited_ms=5_000, priority=5)],
        jobs(pending=2),
        5.0,
        {"old": 90.0, "urgent": 5.0},
    ),
    (
        "ended jobs are not counted",
        [job(f"e{i}", state, seq=i) for i, state in enumerate(ENDED)] + [job("p", waited_ms=1)],
        jobs(pending=1),
        0.001,
        {"p": 0.001},
    ),
    (
        "a pinned job runs",
        [job("pin", RUNNING, pinned=True)],
        jobs(running=1),
        0.0,
        {},
    ),
    (
        "a submission stamped after the read waits 0, not less",
        [job("p", waited_ms=-50)],
        jobs(pending=1),
        0.0,
        {"p": 0.0},
    ),
]


@pytest.mark.parametrize(
    ("name", "listed", "expected", "head", "pending"), JOB_CASES, ids=[c[0] for c in JOB_CASES]
)
def test_jobs_and_waits(
    name: str,
    listed: list[JobView],
    expected: dict[str, int],
    head: float,
    pending: dict[str, float],
) -> None:
    figures = pool_figures(view([NodeView("a")], listed))
    users = {j: f"{j}-user" for j in pending}
    assert figures == PoolFigures(counts(free=1), expected, head, pending, figures.queues, users)
    assert figures.queues["default"].pending == expected["pending"]


@dataclass
class Member:
    leading: bool = False
    last_error: str | None = None
    last_view: PoolView | None = None
    preemptions: dict[str, int] = field(default_factory=dict)
    redis_errors: int = 0
    beaten_at: float | None = None
    bookkeeper: Bookkeeper | None = None


def scrape(member: Member) -> str:
    registry = CollectorRegistry()
    registry.register(PoolCollector(member, "research"))
    return generate_latest(registry).decode()


LEADER_VIEW = view(
    [NodeView("a"), NodeView("b"), NodeView("c", unfit="no GPU")],
    [job("big", waited_ms=61_500), job("small", RUNNING, seq=2)],
    placements={"b": "small"},
)


def test_the_leader_exports_the_pool() -> None:
    text = scrape(Member(leading=True, last_view=LEADER_VIEW))
    for line in [
        'nodeagent_pool_leader{pool="research"} 1.0',
        'nodeagent_pool_nodes{pool="research",state="free"} 1.0',
        'nodeagent_pool_nodes{pool="research",state="busy"} 1.0',
        'nodeagent_pool_nodes{pool="research",state="cordoned"} 0.0',
        'nodeagent_pool_nodes{pool="research",state="unhealthy"} 1.0',
        'nodeagent_pool_jobs{pool="research",state="pending"} 1.0',
        'nodeagent_pool_jobs{pool="research",state="running"} 1.0',
        'nodeagent_pool_queue_head_wait_seconds{pool="research"} 61.5',
        'nodeagent_pool_job_pending_seconds{job_id="big",pool="research",user="big-user"} 61.5',
    ]:
        assert line in text.splitlines(), (line, text)
    assert text.count("nodeagent_pool_job_pending_seconds{") == 1  # pending jobs only


def test_queues_and_preemptions() -> None:
    """Nodes, pending jobs and the longest wait per queue (every queue that exists or holds a
    job), quotas and shares; the preemptions this node made as leader, on every node."""
    research = replace(job("r", waited_ms=30_000), queue="research")
    pool = replace(
        view([NodeView("a"), NodeView("b")], [research, job("d", RUNNING)], {"a": "d"}),
        queues={
            "research": QueueView("research", quota=4, guaranteed=2),
            "idle": QueueView("idle"),
        },
    )
    text = scrape(Member(leading=True, last_view=pool, preemptions={"shrink": 3}))
    for line in [
        'nodeagent_pool_queue_nodes{pool="research",queue="default"} 1.0',
        'nodeagent_pool_queue_nodes{pool="research",queue="research"} 0.0',
        'nodeagent_pool_queue_nodes{pool="research",queue="idle"} 0.0',
        'nodeagent_pool_queue_pending_jobs{pool="research",queue="research"} 1.0',
        'nodeagent_pool_queue_pending_seconds{pool="research",queue="research"} 30.0',
        'nodeagent_pool_queue_quota_nodes{pool="research",queue="research"} 4.0',
        'nodeagent_pool_queue_guaranteed_nodes{pool="research",queue="research"} 2.0',
        'nodeagent_pool_preemptions_total{kind="shrink",pool="research"} 3.0',
    ]:
        assert line in text.splitlines(), (line, text)
    assert 'queue_quota_nodes{pool="research",queue="idle"}' not in text  # no quota: no series
    follower = scrape(Member(leading=False, preemptions={"shrink": 1}))
    assert 'nodeagent_pool_preemptions_total{kind="shrink",pool="research"} 1.0' in follower


@pytest.mark.parametrize(
    "member",
    [
        Member(leading=False, last_view=LEADER_VIEW),  # deposed: its old view is not the pool's
        Member(leading=True, last_error="Redis unreachable", last_view=LEADER_VIEW),
        Member(leading=True, last_view=None),  # leads, no round yet
    ],
    ids=["not leading", "leader cut off from Redis", "no round yet"],
)
def test_only_a_leader_in_touch_exports_figures(member: Member) -> None:
    text = scrape(member)
    leads = member.leading and member.last_error is None
    assert f'nodeagent_pool_leader{{pool="research"}} {1.0 if leads else 0.0}' in text
    assert "nodeagent_pool_nodes" not in text
    assert "nodeagent_pool_queue_head_wait_seconds" not in text


def test_every_node_exports_its_pool_heartbeat_and_failed_calls() -> None:
    """Issue 62: a node serving no job has no job heartbeat; its pool's says it is alive and
    reaches Redis (the alerts read both)."""
    text = scrape(Member(redis_errors=2, beaten_at=1_700_000_000.5)).splitlines()
    assert 'nodeagent_pool_redis_errors_total{pool="research"} 2.0' in text
    assert (
        'nodeagent_pool_last_heartbeat_timestamp_seconds{pool="research"} 1.7000000005e+09' in text
    )
    never = scrape(Member())
    assert "nodeagent_pool_last_heartbeat_timestamp_seconds{" not in never  # none went through
    assert 'nodeagent_pool_redis_errors_total{pool="research"} 0.0' in never.splitlines()


def test_a_bookkeeper_exports_the_accounting_backlog() -> None:
    member = Member(leading=True)
    keeper = Bookkeeper(None, None, lambda: 0.0)  # type: ignore[arg-type]  # read only here
    keeper.waiting, keeper.written = 12, 340
    text = scrape(replace(member, bookkeeper=keeper))
    assert 'nodeagent_pool_accounting_waiting{pool="research"} 12.0' in text
    assert 'nodeagent_pool_accounting_written_total{pool="research"} 340.0' in text
    assert "accounting" not in scrape(member)
    assert "accounting" not in scrape(replace(member, bookkeeper=keeper, leading=False))


def test_queue_gpus_count_units_held_and_whole_nodes_every_unit() -> None:
    """A queue's GPUs: a job sharing a node its units there, a whole-node job every unit of
    its node; its GPU quota (no series without one) and its guaranteed GPUs."""
    nodes = [NodeView("a", gpus=8), NodeView("b", gpus=8)]
    small = replace(job("s", RUNNING), queue="research", gpus_per_node=2)
    whole = replace(job("w", RUNNING), queue="research")
    pool = replace(
        view(nodes, [small, whole, job("d", RUNNING)], {"b": "w"}),
        shares={"a": {"s": 2, "d": 3}},
        queues={"research": QueueView("research", gpu_quota=16, gpu_guaranteed=10)},
    )
    text = scrape(Member(leading=True, last_view=pool)).splitlines()
    for line in [
        'nodeagent_pool_queue_gpus{pool="research",queue="research"} 10.0',
        'nodeagent_pool_queue_gpus{pool="research",queue="default"} 3.0',
        'nodeagent_pool_queue_quota_gpus{pool="research",queue="research"} 16.0',
        'nodeagent_pool_queue_guaranteed_gpus{pool="research",queue="research"} 10.0',
        'nodeagent_pool_queue_guaranteed_gpus{pool="research",queue="default"} 0.0',
    ]:
        assert line in text, (line, text)
    assert not any('quota_gpus{pool="research",queue="default"}' in line for line in text)
