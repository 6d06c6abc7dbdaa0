"""schedule()'s preemption where jobs share nodes by GPUs: across kinds (a GPU job takes a
whole-node job's node, a whole-node job a node every sharer of which may give), and queues'
guaranteed GPU shares (reclaim by jobs sharing nodes; what no preemption takes from a queue at
its share)."""

from __future__ import annotations

from dataclasses import replace

from nodeagent.model.pool import PoolJob, PoolJobState
from nodeagent.model.queues import QueueView
from nodeagent.pool.schedule import JobView, NodeView, PoolView, SchedulePolicy, schedule
from nodeagent.state import JobState

NOW = 10_000_000
POLICY = SchedulePolicy(reserve_after_ms=60_000, preempt_after_ms=0)
PENDING, RUNNING = PoolJobState.PENDING, PoolJobState.RUNNING


def pending(
    name: str, units: int | None, queue: str, *, priority: int = 0, seq: int = 10
) -> JobView:
    status = PoolJob(PENDING, seq=seq, submitted_ms=NOW)
    return JobView(name, status, 1, 1, 1, priority=priority, queue=queue, gpus_per_node=units)


def running(
    name: str,
    units: int | None,
    queue: str,
    nodes: tuple[str, ...],
    *,
    priority: int = 0,
    min_nodes: int = 1,
) -> JobView:
    """A job running on `nodes` since long ago (out of its resize cooldown)."""
    status = PoolJob(RUNNING, seq=1, submitted_ms=0, admitted_ms=NOW - 600_000)
    return JobView(
        name,
        status,
        min_nodes,
        len(nodes),
        len(nodes),
        priority=priority,
        queue=queue,
        gpus_per_node=units,
        record_state=JobState.RUNNING,
        members=nodes,
    )


def eights(*names: str) -> dict[str, NodeView]:
    return {n: NodeView(n, gpus=8) for n in names}


def test_a_queue_below_its_gpu_share_reclaims_shares_whatever_their_priority() -> None:
    """batch (priority 10) shares a and b, 8 GPUs on each; research is guaranteed 8 GPUs and
    holds none: its 8-GPU job takes batch's share of one node, saying why, and no more."""
    queues = {
        "research": QueueView("research", gpu_guaranteed=8),
        "batch": QueueView("batch"),
    }
    big = running("big", 8, "batch", ("a", "b"), priority=10)
    claim = pending("claim", 8, "research")
    shares = {"a": {"big": 8}, "b": {"big": 8}}
    view = PoolView(NOW, eights("a", "b"), {"big": big, "claim": claim}, {}, queues, shares=shares)
    result = schedule(view, POLICY)
    assert result.shares == {"a": {"claim": 8}, "b": {"big": 8}}
    assert result.jobs["claim"].reason == "admitted on 1 nodes, 8 GPUs each, preempting big"
    assert result.jobs["big"].reason == (
        "shrunk: its GPUs on a went to job claim (queue research below its guaranteed 8 GPUs)"
    )
    # At its share, a second research job takes nothing from batch (priority 0 < 10), though
    # batch's job could give one of its nodes.
    admitted = replace(claim, status=replace(claim.status, state=RUNNING, admitted_ms=NOW))
    more = pending("more", 4, "research", seq=11)
    grown = replace(big, target_nodes=2, members=("b", "c"))
    shares = {"a": {"claim": 8}, "b": {"big": 8}, "c": {"big": 8}}
    jobs = {"big": grown, "claim": admitted, "more": more}
    after = schedule(PoolView(NOW, eights("a", "b", "c"), jobs, {}, queues, shares=shares), POLICY)
    assert after.jobs["more"].state is PENDING
    assert after.shares == shares


def test_reclaim_never_takes_the_claimant_s_queue_above_its_gpu_share() -> None:
    """research is guaranteed 4 GPUs: an 8-GPU job of it would hold 8, above 4, so it takes
    nothing from batch's priority-10 job; a 4-GPU one does."""
    queues = {"research": QueueView("research", gpu_guaranteed=4)}
    big = running("big", 8, "batch", ("a", "b"), priority=10)
    shares = {"a": {"big": 8}, "b": {"big": 8}}
    queues["batch"] = QueueView("batch")
    for units, admitted in ((8, False), (4, True)):
        claim = pending("claim", units, "research")
        view = PoolView(
            NOW, eights("a", "b"), {"big": big, "claim": claim}, {}, queues, shares=shares
        )
        result = schedule(view, POLICY)
        assert (result.jobs["claim"].state is RUNNING) is admitted, result.jobs["claim"]


def test_no_preemption_takes_another_queue_below_its_guaranteed_gpus() -> None:
    """batch is guaranteed 16 GPUs and holds 16 (8 on a and b): a higher-priority job of another
    queue takes none of them, sharing nodes or whole; one of batch's own queue does."""
    queues = {"batch": QueueView("batch", gpu_guaranteed=16), "hot": QueueView("hot")}
    low = running("low", 8, "batch", ("a", "b"))
    shares = {"a": {"low": 8}, "b": {"low": 8}}
    for queue, taken in (("hot", False), ("batch", True)):
        high = pending("high", 8, queue, priority=5)
        view = PoolView(
            NOW, eights("a", "b"), {"low": low, "high": high}, {}, queues, shares=shares
        )
        assert (schedule(view, POLICY).jobs["high"].state is RUNNING) is taken
    whole = running("whole", None, "batch", ("a", "b"))
    for queue, taken in (("hot", False), ("batch", True)):
        high = pending("high", None, queue, priority=5)
        jobs = {"whole": whole, "high": high}
        view = PoolView(NOW, eights("a", "b"), jobs, {"a": "whole", "b": "whole"}, queues)
        assert (schedule(view, POLICY).jobs["high"].state is RUNNING) is taken
    # above its share by one node's units, it gives one node
    queues["batch"] = QueueView("batch", gpu_guaranteed=8)
    high = pending("high", None, "hot", priority=5)
    jobs = {"whole": whole, "high": high}
    view = PoolView(NOW, eights("a", "b"), jobs, {"a": "whole", "b": "whole"}, queues)
    assert schedule(view, POLICY).placements == {"a": "whole", "b": "high"}


def test_a_queue_s_gpu_guarantee_is_checked_against_its_gpu_quota() -> None:
    assert QueueView("q", gpu_quota=4, gpu_guaranteed=8).problems() == [
        "GPUs guaranteed 8 above its GPU quota of 4"
    ]
    assert QueueView("q", gpu_guaranteed=-1).problems()[0].startswith("GPUs guaranteed -1")
    kept = QueueView("q", gpu_quota=32, gpu_guaranteed=16)
    assert QueueView.from_json(kept.to_json()) == kept
    assert QueueView.from_json('{"name": "old"}').gpu_guaranteed == 0  # written before it
    assert "GPUs guaranteed 16" in kept.describe()


def test_a_gpu_job_takes_a_whole_node_job_s_node_when_no_share_would_do() -> None:
    """Nodes a and b: w (priority 0, whole nodes, min 1) holds both. h (priority 5, 4 GPUs)
    takes the node w gives up last-rank first (b) and shares it; w shrinks, saying why."""
    whole = running("w", None, "default", ("a", "b"))
    high = pending("h", 4, "default", priority=5)
    view = PoolView(NOW, eights("a", "b"), {"w": whole, "h": high}, {"a": "w", "b": "w"})
    result = schedule(view, POLICY)
    assert result.placements == {"a": "w"} and result.shares == {"b": {"h": 4}}
    assert result.jobs["h"].reason == "admitted on 1 nodes, 4 GPUs each, preempting w"
    assert result.jobs["w"].reason == "shrunk 2 -> 1 nodes for job h: priority 5 > 0"


def test_a_gpu_job_takes_shares_before_a_whole_node() -> None:
    """a is shared full by l (8 GPUs, on a and b, min 1); c and d are w's, whole (min 1): h (8
    GPUs, priority 5) takes l's share of a, not one of w's nodes."""
    low = running("l", 8, "default", ("a", "b"))
    whole = running("w", None, "default", ("c", "d"))
    high = pending("h", 8, "default", priority=5)
    jobs = {"l": low, "w": whole, "h": high}
    shares = {"a": {"l": 8}, "b": {"l": 8}}
    view = PoolView(NOW, eights(*"abcd"), jobs, {"c": "w", "d": "w"}, shares=shares)
    result = schedule(view, POLICY)
    assert result.shares == {"a": {"h": 8}, "b": {"l": 8}}
    assert result.placements == {"c": "w", "d": "w"}


def test_a_whole_node_job_takes_a_node_only_when_every_share_of_it_may_go() -> None:
    """a is shared by x and y (1 GPU each, both on a and b, min 1), b too; c by z alone (on c
    only, min 1: it cannot give). h (whole node, priority 5) takes a: both x and y give it up,
    and nothing else moves."""
    x = running("x", 1, "default", ("a", "b"))
    y = running("y", 1, "default", ("a", "b"))
    z = running("z", 1, "default", ("c",))
    high = pending("h", None, "default", priority=5)
    shares = {"a": {"x": 1, "y": 1}, "b": {"x": 1, "y": 1}, "c": {"z": 1}}
    jobs = {"x": x, "y": y, "z": z, "h": high}
    result = schedule(PoolView(NOW, eights(*"abc"), jobs, {}, shares=shares), POLICY)
    assert result.placements == {"a": "h"}
    assert result.shares == {"b": {"x": 1, "y": 1}, "c": {"z": 1}}
    assert result.jobs["h"].reason == "admitted on 1 nodes, preempting x, y"
    said = {e.data["job"]: e.message for e in result.events if e.type == "job_shrunk"}
    assert said == {
        "x": "job x: its GPUs on a went to job h (priority 5 > 0)",
        "y": "job y: its GPUs on a went to job h (priority 5 > 0)",
    }
    # y at its min_nodes: a cannot be freed whole, nor b; h waits and nothing moves
    jobs["y"] = replace(y, min_nodes=2)
    result = schedule(PoolView(NOW, eights(*"abc"), jobs, {}, shares=shares), POLICY)
    assert result.jobs["h"].state is PENDING and result.shares == shares


def test_a_whole_node_job_takes_whole_nodes_first_then_shared_ones_for_what_remains() -> None:
    """h (priority 5) needs 2 nodes: w (whole, on a and b, min 1) can give one; the other is
    c, which x (1 GPU, on c and d, min 1) shares alone; all or nothing."""
    whole = running("w", None, "default", ("a", "b"))
    x = running("x", 1, "default", ("c", "d"))
    high = replace(pending("h", None, "default", priority=5), min_nodes=2, target_nodes=2)
    jobs = {"w": whole, "x": x, "h": high}
    shares = {"c": {"x": 1}, "d": {"x": 1}}
    view = PoolView(NOW, eights(*"abcd"), jobs, {"a": "w", "b": "w"}, shares=shares)
    result = schedule(view, POLICY)
    assert sorted(n for n, j in result.placements.items() if j == "h") == ["b", "c"]
    assert result.shares == {"d": {"x": 1}} and result.placements["a"] == "w"
    # three nodes needed: one more than both can give, so neither gives any
    jobs["h"] = replace(high, min_nodes=3, target_nodes=3, max_nodes=3)
    view = PoolView(NOW, eights(*"abcd"), jobs, {"a": "w", "b": "w"}, shares=shares)
    result = schedule(view, POLICY)
    assert result.jobs["h"].state is PENDING
    assert result.placements == {"a": "w", "b": "w"} and result.shares == shares


def test_preemptible_jobs_sharing_nodes_are_evicted_only_when_shrinking_is_not_enough() -> None:
    """a: p (preemptible, 8 GPUs, on a only); b and c: s (8 GPUs, on both, min 1). h (8 GPUs,
    priority 5) shrinks s (b), and evicts nothing; then with s at its min_nodes, h2 evicts p:
    every share it held goes and it waits again, saying why."""
    p = replace(running("p", 8, "default", ("a",)), preemptible=True)
    s = running("s", 8, "default", ("b", "c"))
    high = pending("h", 8, "default", priority=5)
    shares = {"a": {"p": 8}, "b": {"s": 8}, "c": {"s": 8}}
    jobs = {"p": p, "s": s, "h": high}
    result = schedule(PoolView(NOW, eights(*"abc"), jobs, {}, shares=shares), POLICY)
    assert result.shares == {"a": {"p": 8}, "b": {"h": 8}, "c": {"s": 8}}
    assert not [e for e in result.events if e.type == "job_evicted"]

    jobs["s"] = replace(s, min_nodes=2)
    result = schedule(PoolView(NOW, eights(*"abc"), jobs, {}, shares=shares), POLICY)
    assert result.shares == {"a": {"h": 8}, "b": {"s": 8}, "c": {"s": 8}}
    assert result.jobs["p"].state is PENDING
    assert result.jobs["p"].reason == "evicted by job h (priority 5 > 0)"
    assert result.jobs["p"].evicted == "by job h (priority 5 > 0)"
    (evicted,) = [e for e in result.events if e.type == "job_evicted"]
    assert evicted.data["nodes"] == ["a"] and evicted.data["for"] == "h"


def test_a_whole_node_job_evicts_preemptible_jobs_sharing_a_node_and_frees_all_they_held() -> None:
    """a: x (preemptible, 1 GPU, on a and b, min 2) and y (preemptible, 1 GPU, on a only); b:
    x alone. h (whole node, priority 5) takes b, the node that needs the fewest shares to go:
    x is evicted, and its share of a goes too; y stays."""
    x = replace(running("x", 1, "default", ("a", "b"), min_nodes=2), preemptible=True)
    y = replace(running("y", 1, "default", ("a",)), preemptible=True)
    high = pending("h", None, "default", priority=5)
    shares = {"a": {"x": 1, "y": 1}, "b": {"x": 1}}
    jobs = {"x": x, "y": y, "h": high}
    result = schedule(PoolView(NOW, eights("a", "b"), jobs, {}, shares=shares), POLICY)
    assert result.placements == {"b": "h"} and result.shares == {"a": {"y": 1}}
    assert result.jobs["x"].state is PENDING and "y" not in result.jobs
    assert result.jobs["h"].reason == "admitted on 1 nodes, preempting x"
    # not preemptible: nothing moves
    jobs = {"x": replace(x, preemptible=False), "y": y, "h": high}
    result = schedule(PoolView(NOW, eights("a", "b"), jobs, {}, shares=shares), POLICY)
    assert result.jobs["h"].state is PENDING and result.shares == shares


def test_reclaim_counts_the_units_the_claimant_gets_without_preempting() -> None:
    """research is guaranteed 8 GPUs and holds 4 (r on n1); c (research, 4 GPUs, 2 nodes)
    finds 4 free units on n1 and takes them; a second node from p (priority 10, on n2 and n3)
    would take research to 12, above its 8: nothing is taken. Guaranteed 12, it is."""
    r = running("r", 4, "research", ("n1",))
    p = running("p", 8, "prod", ("n2", "n3"), priority=10)
    claim = replace(pending("c", 4, "research"), min_nodes=2, max_nodes=2, target_nodes=2)
    shares = {"n1": {"r": 4}, "n2": {"p": 8}, "n3": {"p": 8}}
    jobs = {"r": r, "p": p, "c": claim}
    for guaranteed, admitted in ((8, False), (12, True)):
        queues = {"research": QueueView("research", gpu_guaranteed=guaranteed)}
        queues["prod"] = QueueView("prod")
        view = PoolView(NOW, eights("n1", "n2", "n3"), jobs, {}, queues, shares=shares)
        result = schedule(view, POLICY)
        assert (result.jobs["c"].state is RUNNING) is admitted, (guaranteed, result.jobs["c"])


def test_a_job_admitted_in_a_round_is_not_taken_back_in_it() -> None:
    """j1 (priority 10, preemptible, 4 GPUs) is admitted on a; j2 (research, guaranteed 8 GPUs,
    8 GPUs, priority 0), judged after it in the same round, could reclaim a only by evicting
    j1: it waits instead."""
    queues = {"research": QueueView("research", gpu_guaranteed=8), "prod": QueueView("prod")}
    j1 = replace(pending("j1", 4, "prod", priority=10, seq=2), preemptible=True)
    j2 = pending("j2", 8, "research", seq=1)
    view = PoolView(NOW, eights("a"), {"j1": j1, "j2": j2}, {}, queues)
    result = schedule(view, POLICY)
    assert result.jobs["j1"].state is RUNNING and result.jobs["j2"].state is PENDING
    assert result.shares == {"a": {"j1": 4}}


def whole(name: str, queue: str, nodes: int, *, priority: int = 0, seq: int = 10) -> JobView:
    """A pending whole-node job of `nodes` nodes, all of them needed."""
    status = PoolJob(PENDING, seq=seq, submitted_ms=NOW)
    return JobView(name, status, nodes, nodes, nodes, priority=priority, queue=queue)


def test_a_whole_node_job_reclaims_its_queues_guaranteed_gpus_by_whole_nodes() -> None:
    """research is guaranteed 16 GPUs and no nodes, and holds none; batch (priority 10, no
    guarantee) holds all three 8-GPU nodes with one whole-node job. research's 2-node job
    takes two of them, whatever batch's priority, each counted as 8 GPUs, and says why; a
    3-node job would take its queue above its share (24 > 16) and takes nothing."""
    queues = {"research": QueueView("research", gpu_guaranteed=16), "batch": QueueView("batch")}
    big = running("big", None, "batch", ("a", "b", "c"), priority=10)
    for size, admitted in ((2, True), (3, False)):
        claim = whole("claim", "research", size)
        jobs = {"big": big, "claim": claim}
        view = PoolView(NOW, eights("a", "b", "c"), jobs, {n: "big" for n in "abc"}, queues)
        result = schedule(view, POLICY)
        if not admitted:
            assert result.jobs["claim"].state == PENDING, result.jobs["claim"]
            assert result.placements == {n: "big" for n in "abc"}
            continue
        assert sorted(n for n, j in result.placements.items() if j == "claim") == ["b", "c"]
        assert result.jobs["claim"].reason == "admitted on 2 nodes, preempting big"
        assert result.jobs["big"].reason == (
            "shrunk 3 -> 1 nodes for job claim: queue research below its guaranteed 16 GPUs"
        )


def test_whole_node_reclaim_by_gpus_never_takes_a_queue_below_its_own_gpu_share() -> None:
    """batch is guaranteed 16 GPUs and holds exactly that on two nodes: research's reclaim
    finds nothing to take there, though research is below its own share."""
    queues = {
        "research": QueueView("research", gpu_guaranteed=16),
        "batch": QueueView("batch", gpu_guaranteed=16),
    }
    big = running("big", None, "batch", ("a", "b"), priority=10)
    claim = whole("claim", "research", 1)
    held = {"a": "big", "b": "big"}
    view = PoolView(NOW, eights("a", "b"), {"big": big, "claim": claim}, held, queues)
    result = schedule(view, POLICY)
    assert result.jobs["claim"].state == PENDING
    assert result.placements == held
    unguaranteed = {**queues, "batch": QueueView("batch")}  # the same, batch guaranteed nothing
    result = schedule(replace(view, queues=unguaranteed), POLICY)
    assert result.jobs["claim"].state == RUNNING and result.placements["b"] == "claim"


def test_a_gpu_job_reclaims_its_queues_guaranteed_gpus_from_a_whole_node_job() -> None:
    """research is guaranteed 8 GPUs and holds none; batch's whole-node job (priority 10)
    holds the only node. research's 8-GPU job takes the node, whatever batch's priority, and
    shares it."""
    queues = {"research": QueueView("research", gpu_guaranteed=8), "batch": QueueView("batch")}
    big = running("big", None, "batch", ("a", "b"), priority=10)
    claim = pending("claim", 8, "research")
    held = {"a": "big", "b": "big"}
    view = PoolView(NOW, eights("a", "b"), {"big": big, "claim": claim}, held, queues)
    result = schedule(view, POLICY)
    assert result.shares == {"b": {"claim": 8}}
    assert result.jobs["big"].reason == (
        "shrunk 2 -> 1 nodes for job claim: queue research below its guaranteed 8 GPUs"
    )
