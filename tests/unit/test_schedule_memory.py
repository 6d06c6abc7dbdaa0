"""The scheduler counts memory as it counts GPUs (issue 80): a node's memory for jobs and its
default share per GPU (what its agent tells the pool), each job's ask (`mem`, `mem_per_gpu`);
and the CPUs each GPU unit of a node holds against a job's `cpus_per_gpu`."""

from __future__ import annotations

from dataclasses import replace

from nodeagent.model.pool import PoolJob, PoolJobState
from nodeagent.pool.schedule import JobView, NodeView, PoolView, SchedulePolicy, schedule
from nodeagent.state import JobState

GIB = 1 << 30
NOW = 1_000_000
POLICY = SchedulePolicy(reserve_after_ms=60_000)
PENDING, RUNNING = PoolJobState.PENDING, PoolJobState.RUNNING


def job(name: str, min_nodes: int, seq: int = 1) -> JobView:
    """A pending job of `min_nodes` whole nodes."""
    status = PoolJob(PENDING, seq=seq, submitted_ms=NOW)
    return JobView(name, status, min_nodes, min_nodes, min_nodes)


def node(name: str, memory: int = 80 * GIB, gpus: int = 8) -> NodeView:
    """An 8-GPU node whose jobs share `memory` (its default share: memory / GPUs)."""
    return NodeView(name, gpus=gpus, memory=memory, mem_per_gpu=memory // gpus if gpus else 0)


def gpu_job(
    name: str, units: int = 1, seq: int = 1, mem: int | None = None, mem_per_gpu: int | None = None
) -> JobView:
    return replace(job(name, 1, seq=seq), gpus_per_node=units, mem=mem, mem_per_gpu=mem_per_gpu)


def running(view: JobView) -> JobView:
    status = replace(view.status, state=RUNNING, admitted_ms=NOW)
    return replace(view, status=status, record_state=JobState.RUNNING)


def test_a_shared_node_takes_a_job_only_in_the_memory_its_sharers_leave() -> None:
    """a (80 GiB for jobs, 10 per GPU) runs a 1-GPU job holding 60 GiB: a 1-GPU job asking for
    30 GiB goes to b, though a has 7 free GPUs; one asking for nothing (10 GiB, the node's
    share) still packs onto a; a job asking for 2 x 8 GiB too."""
    nodes = {n: node(n) for n in "ab"}
    big = running(gpu_job("big", mem=60 * GIB))
    asks = [gpu_job("thirty", seq=2, mem=30 * GIB), gpu_job("plain", seq=3)]
    asks.append(gpu_job("two", 2, seq=4, mem_per_gpu=8 * GIB))
    jobs = {j.id: j for j in [big, *asks]}
    result = schedule(PoolView(NOW, nodes, jobs, {}, shares={"a": {"big": 1}}), POLICY)
    assert result.shares == {"a": {"big": 1, "plain": 1}, "b": {"thirty": 1, "two": 2}}


def test_a_job_that_asks_for_more_memory_than_any_node_has_waits_saying_so() -> None:
    nodes = {"a": node("a"), "b": node("b", memory=40 * GIB)}
    huge = gpu_job("huge", mem=100 * GIB)
    result = schedule(PoolView(NOW, nodes, {"huge": huge}, {}), POLICY)
    assert result.shares == {} and result.placements == {}
    assert result.jobs["huge"].reason == (
        "needs 1 nodes, the pool has 0 healthy nodes that can run it; "
        "2 have less memory for jobs than it asks for (mem 100 GiB)"
    )
    # 12 GiB per GPU: a 1-GPU share fits both; a whole node of 8 GPUs (96 GiB) neither
    per_gpu = gpu_job("per-gpu", mem_per_gpu=12 * GIB)
    whole = replace(job("whole", 1, seq=2), mem_per_gpu=12 * GIB)
    result = schedule(PoolView(NOW, nodes, {"per-gpu": per_gpu, "whole": whole}, {}), POLICY)
    assert set(result.shares) == {"a"} and result.placements == {}
    assert "2 have less memory for jobs than it asks for (mem_per_gpu 12 GiB)" in (
        result.jobs["whole"].reason
    )
    # on b only (60 GiB fits a, not b): admitted on a
    sixty = replace(job("sixty", 1), mem=60 * GIB)
    assert schedule(PoolView(NOW, nodes, {"sixty": sixty}, {}), POLICY).placements == {"a": "sixty"}


def test_a_node_that_says_nothing_of_its_memory_counts_none() -> None:
    """An agent older than the memory fields: placed as before, whatever is asked."""
    nodes = {"old": NodeView("old", gpus=8)}
    asks = [gpu_job("huge", mem=1 << 50), gpu_job("more", seq=2, mem=1 << 50)]
    result = schedule(PoolView(NOW, nodes, {j.id: j for j in asks}, {}), POLICY)
    assert result.shares == {"old": {"huge": 1, "more": 1}}


def test_a_job_blocked_by_memory_does_not_block_a_smaller_one_of_its_shape() -> None:
    """Two pending 1-GPU jobs, alike but for memory: the verdict on the first (no node has
    50 GiB free) is not the second's (schedule.Blocked's shapes carry the ask)."""
    nodes = {"a": node("a")}
    held = running(gpu_job("held", mem=40 * GIB))
    first, second = gpu_job("first", seq=2, mem=50 * GIB), gpu_job("second", seq=3, mem=GIB)
    jobs = {j.id: j for j in [held, first, second]}
    result = schedule(PoolView(NOW, nodes, jobs, {}, shares={"a": {"held": 1}}), POLICY)
    assert result.shares == {"a": {"held": 1, "second": 1}}
    assert result.jobs["first"].reason == (
        "needs 1 nodes with 1 free GPUs and 50 GiB of memory, 0 have them"
    )
    assert result.jobs["second"].state is RUNNING


def test_a_job_of_higher_priority_takes_the_memory_it_needs_from_a_lower_one() -> None:
    """a has 7 free GPUs but 10 GiB of memory left: a preemptible job of priority 0 holds 70
    GiB. A 1-GPU job of priority 5 asking for 30 GiB evicts it (its units alone were enough:
    the memory was not) and takes a."""
    nodes = {"a": node("a")}
    low = running(gpu_job("low", mem=70 * GIB))
    low = replace(
        low,
        preemptible=True,
        members=("a",),
        status=replace(low.status, admitted_ms=NOW - 600_000),
    )
    high = replace(gpu_job("high", seq=2, mem=30 * GIB), priority=5)
    view = PoolView(NOW, nodes, {"low": low, "high": high}, {}, shares={"a": {"low": 1}})
    result = schedule(view, POLICY)
    assert result.shares == {"a": {"high": 1}}, result.jobs
    assert result.jobs["low"].state is PENDING and "high" in (result.jobs["low"].evicted or "")


def test_a_job_asking_more_cpus_per_gpu_than_a_node_holds_goes_elsewhere_or_waits() -> None:
    """a holds 4 CPUs per GPU, b 12, c says nothing (counted by its agent alone): a job asking
    for 8 goes to b; one asking for 16 to c; a whole-node job asking for 8 may take a (it has
    every CPU of the node)."""
    nodes = {"a": replace(node("a"), cpus_per_gpu=4), "b": replace(node("b"), cpus_per_gpu=12)}
    eight = replace(gpu_job("eight"), cpus_per_gpu=8)
    result = schedule(PoolView(NOW, nodes, {"eight": eight}, {}), POLICY)
    assert result.shares == {"b": {"eight": 1}}
    sixteen = replace(gpu_job("sixteen"), cpus_per_gpu=16)
    result = schedule(PoolView(NOW, nodes, {"sixteen": sixteen}, {}), POLICY)
    assert result.jobs["sixteen"].reason == (
        "needs 1 nodes, the pool has 0 healthy nodes that can run it; "
        "2 hold fewer CPUs per GPU than it asks for (16)"
    )
    result = schedule(PoolView(NOW, {**nodes, "c": node("c")}, {"sixteen": sixteen}, {}), POLICY)
    assert result.shares == {"c": {"sixteen": 1}}
    whole = replace(job("whole", 2), cpus_per_gpu=8)
    result = schedule(PoolView(NOW, nodes, {"whole": whole}, {}), POLICY)
    assert sorted(result.placements) == ["a", "b"]
