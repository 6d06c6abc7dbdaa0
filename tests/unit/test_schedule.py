"""schedule(): the pool's pure placement decision, as table tests."""

from __future__ import annotations

from dataclasses import replace

import pytest

from nodeagent.model.job import Cordon
from nodeagent.model.pool import PoolJob, PoolJobState, PoolNode
from nodeagent.model.queues import QueueView
from nodeagent.pool.leadership import NodeViews
from nodeagent.pool.schedule import (
    JobView,
    NodeView,
    PoolView,
    SchedulePolicy,
    refusals,
    schedule,
)
from nodeagent.state import JobState

NOW = 1_000_000
POLICY = SchedulePolicy(reserve_after_ms=60_000)
PENDING, RUNNING = PoolJobState.PENDING, PoolJobState.RUNNING


def job(
    id: str,
    min_nodes: int = 1,
    target: int | None = None,
    *,
    state: PoolJobState = PENDING,
    seq: int = 1,
    waited_ms: int = 0,
    priority: int = 0,
    record: JobState | None = None,
    members: tuple[str, ...] = (),
    cancel: str | None = None,
    pinned: bool = False,
) -> JobView:
    target = target or min_nodes
    status = PoolJob(state, seq=seq, submitted_ms=NOW - waited_ms, pinned=pinned)
    return JobView(
        id,
        status,
        min_nodes,
        max(target, min_nodes),
        target,
        priority=priority,
        record_state=record,
        members=members,
        cancel=cancel,
    )


def nodes(*names: str, **special: NodeView) -> dict[str, NodeView]:
    found = {n: NodeView(n) for n in names}
    found.update(special)
    return found


def run(
    nodes: dict[str, NodeView], jobs: list[JobView], placements: dict[str, str] | None = None
) -> tuple[dict[str, str], dict[str, PoolJob]]:
    view = PoolView(NOW, nodes, {j.id: j for j in jobs}, placements or {})
    result = schedule(view, POLICY)
    return result.placements, result.jobs


def on(placements: dict[str, str], job_id: str) -> list[str]:
    return sorted(n for n, j in placements.items() if j == job_id)


def test_gang_admission_gives_up_to_target_at_once() -> None:
    placements, jobs = run(nodes("a", "b", "c"), [job("j", 2, 3)])
    assert on(placements, "j") == ["a", "b", "c"]
    assert jobs["j"].state is RUNNING and jobs["j"].admitted_ms == NOW


def test_never_a_partial_start_below_min_nodes() -> None:
    placements, jobs = run(nodes("a"), [job("j", 2, 4)])
    assert placements == {}
    assert jobs["j"].state is PENDING
    assert jobs["j"].reason == "needs 2 nodes, the pool has 1 healthy nodes that can run it"


def test_pending_says_how_many_are_free() -> None:
    busy = job("busy", 2, state=RUNNING, record=JobState.RUNNING, members=("a", "b"))
    placements, jobs = run(
        nodes("a", "b", "c"), [busy, job("j", 2, seq=2)], {"a": "busy", "b": "busy"}
    )
    assert on(placements, "j") == []
    assert jobs["j"].reason == "needs 2 nodes, 1 free"


def test_first_come_first_served_at_equal_priority() -> None:
    placements, jobs = run(nodes("a", "b"), [job("late", 2, seq=2), job("early", 2, seq=1)])
    assert on(placements, "early") == ["a", "b"]
    assert jobs["late"].state is PENDING


def test_higher_priority_goes_first() -> None:
    placements, _ = run(
        nodes("a", "b"), [job("early", 2, seq=1), job("urgent", 2, seq=2, priority=5)]
    )
    assert on(placements, "urgent") == ["a", "b"]


def test_a_job_that_does_not_fit_does_not_block_a_smaller_one() -> None:
    busy = job("busy", 2, state=RUNNING, record=JobState.RUNNING, members=("a", "b"))
    placements, jobs = run(
        nodes("a", "b", "c"),
        [busy, job("big", 2, seq=2, waited_ms=1000), job("small", 1, seq=3)],
        {"a": "busy", "b": "busy"},
    )
    assert on(placements, "small") == ["c"]
    assert jobs["big"].state is PENDING


def test_after_reserve_after_the_head_holds_free_nodes() -> None:
    busy = job("busy", 2, state=RUNNING, record=JobState.RUNNING, members=("a", "b"))
    grower = job("grow", 1, 3, state=RUNNING, seq=0, record=JobState.RUNNING, members=("d",))
    placements, jobs = run(
        nodes("a", "b", "c", "d"),
        [busy, grower, job("big", 2, seq=2, waited_ms=60_000), job("small", 1, seq=3)],
        {"a": "busy", "b": "busy", "d": "grow"},
    )
    assert "c" not in placements  # neither backfilled nor grown into: held for "big"
    assert jobs["small"].reason == "waiting: nodes are held for big, pending longer"


def test_a_job_too_big_for_the_pool_reserves_nothing() -> None:
    placements, jobs = run(
        nodes("a", "b"), [job("huge", 5, seq=1, waited_ms=10**9), job("small", 1, seq=2)]
    )
    assert on(placements, "small") == ["a"]
    assert "the pool has 2 healthy nodes" in jobs["huge"].reason


def test_running_job_below_target_grows_into_free_nodes() -> None:
    grower = job("j", 1, 3, state=RUNNING, record=JobState.RUNNING, members=("a",))
    placements, _ = run(nodes("a", "b", "c", "d"), [grower], {"a": "j"})
    assert on(placements, "j") == ["a", "b", "c"]


def test_above_target_gives_back_non_members_only() -> None:
    shrunk = job("j", 1, 1, state=RUNNING, record=JobState.RESTARTING, members=("b",))
    placements, _ = run(nodes("a", "b", "c"), [shrunk], {"a": "j", "b": "j", "c": "j"})
    assert on(placements, "j") == ["b"]


def test_finished_job_frees_its_nodes_and_the_next_is_admitted() -> None:
    done = job("done", 2, state=RUNNING, record=JobState.SUCCEEDED, members=("a", "b"))
    placements, jobs = run(
        nodes("a", "b"), [done, job("next", 2, seq=2)], {"a": "done", "b": "done"}
    )
    assert jobs["done"].state is PoolJobState.SUCCEEDED and jobs["done"].ended_ms == NOW
    assert on(placements, "next") == ["a", "b"]


@pytest.mark.parametrize(
    ("record", "cancel", "expected"),
    [
        (JobState.FAILED, None, PoolJobState.FAILED),
        (JobState.STOPPED, None, PoolJobState.CANCELLED),
        (JobState.STOPPED, "ops@x", PoolJobState.CANCELLED),
        (None, "ops@x", PoolJobState.CANCELLED),  # never formed: nothing to stop
        (JobState.RUNNING, "ops@x", RUNNING),  # still stopping its workers
    ],
)
def test_how_a_running_job_ends(
    record: JobState | None, cancel: str | None, expected: PoolJobState
) -> None:
    running = job("j", 1, state=RUNNING, record=record, members=("a",), cancel=cancel)
    placements, jobs = run(nodes("a"), [running], {"a": "j"})
    assert jobs.get("j", running.status).state is expected
    assert on(placements, "j") == ([] if expected.ended else ["a"])


def test_a_pending_job_is_cancelled_at_once() -> None:
    placements, jobs = run(nodes("a"), [job("j", cancel="ops@x")])
    assert placements == {} and jobs["j"].state is PoolJobState.CANCELLED


@pytest.mark.parametrize(
    "bad",
    [
        NodeView("a", unfit="1 of 8 GPUs usable"),
        NodeView("a", cordoned="rack maintenance"),
        NodeView("a", refused={"j": "no user"}),
        NodeView("a", pinned="other"),
    ],
)
def test_unhealthy_cordoned_refusing_or_pinned_nodes_are_never_placed(bad: NodeView) -> None:
    placements, _ = run(nodes("b", a=bad), [job("j", 1, 2)])
    assert on(placements, "j") == ["b"]


def test_lost_node_loses_its_placement_and_the_job_grows_back() -> None:
    running = job("j", 1, 2, state=RUNNING, record=JobState.RUNNING, members=("a", "b"))
    placements, _ = run(nodes("a", "c"), [running], {"a": "j", "b": "j"})
    assert on(placements, "j") == ["a", "c"]


def test_a_node_that_refuses_its_job_is_taken_off_it() -> None:
    running = job("j", 1, 1, state=RUNNING, record=None)
    refusing = NodeView("a", refused={"j": "no user"})
    placements, _ = run(nodes("b", a=refusing), [running], {"a": "j"})
    assert on(placements, "j") == ["b"]


ROOT_REFUSED = "user root is not allowed (pool.allow_root is false)"


@pytest.mark.parametrize(
    ("free", "state", "placed", "words"),
    [
        # Nowhere else to go: pending, with the nodes' reasons.
        ((), PENDING, [], "4 refuse it (a, b, c and 1 more: user root is not allowed"),
        # A node that does not refuse it: admitted there in the same round.
        (("z",), RUNNING, ["z"], "admitted on 1 nodes"),
    ],
)
def test_a_job_every_node_refuses_after_admission_goes_back_to_pending(
    free: tuple[str, ...], state: PoolJobState, placed: list[str], words: str
) -> None:
    """Admitted on a, b, c, d, each of which then refused it (its spec's user is not allowed
    there) before it formed: it does not stay running on 0 nodes."""
    admitted = job("j", 1, 4, state=RUNNING, record=None)
    refusing = {n: NodeView(n, refused={"j": ROOT_REFUSED}) for n in "abcd"}
    before = dict.fromkeys("abcd", "j")
    result = schedule(PoolView(NOW, {**nodes(*free), **refusing}, {"j": admitted}, before), POLICY)
    assert on(result.placements, "j") == placed
    assert result.jobs["j"].state is state and words in result.jobs["j"].reason
    assert [e.type for e in result.events][:1] == ["job_refused"]
    assert "a, b, c and 1 more: user root" in result.events[0].message


def test_refusals_name_at_most_three_reasons_and_count_the_rest() -> None:
    refusing = [NodeView(n, refused={"j": f"not allowed on {n}"}) for n in "edcba"]
    assert refusals(refusing, "j") == (
        "a: not allowed on a; b: not allowed on b; c: not allowed on c; 2 more nodes"
    )


def test_pinned_nodes_serve_their_job_and_follow_its_record() -> None:
    pinned = job("legacy", 2, state=PENDING, record=None, pinned=True)
    view_nodes = nodes(a=NodeView("a", pinned="legacy"), b=NodeView("b", pinned="legacy"))
    placements, jobs = run(view_nodes, [pinned])
    assert on(placements, "legacy") == ["a", "b"] and jobs["legacy"].state is RUNNING
    done = job("legacy", 2, state=RUNNING, record=JobState.SUCCEEDED, pinned=True)
    placements, jobs = run(view_nodes, [done], placements)
    assert placements == {} and jobs["legacy"].state is PoolJobState.SUCCEEDED
    again = job("legacy", 2, state=PoolJobState.SUCCEEDED, record=JobState.RESTARTING, pinned=True)
    placements, jobs = run(view_nodes, [again], {})
    assert jobs["legacy"].state is RUNNING and on(placements, "legacy") == ["a", "b"]


def test_no_node_is_in_two_jobs_and_nothing_changes_when_settled() -> None:
    jobs = [job(f"j{i}", 1, 2, seq=i) for i in range(5)]
    placements, statuses = run(nodes(*"abcdefg"), jobs)
    assert len(placements) == 7 and len(set(placements)) == 7
    settled = [
        replace(j, status=statuses[j.id], record_state=JobState.RUNNING if j.id != "j4" else None)
        for j in jobs
    ]
    view = PoolView(NOW, nodes(*"abcdefg"), {j.id: j for j in settled}, placements)
    result = schedule(view, POLICY)
    assert result.placements == placements and not result.changed(placements)


def test_a_job_whose_spec_cannot_be_read_fails() -> None:
    broken = replace(job("j"), invalid="job spec: not JSON")
    placements, jobs = run(nodes("a"), [broken])
    assert placements == {} and jobs["j"].state is PoolJobState.FAILED
    assert jobs["j"].reason == "job spec: not JSON"


def test_a_cordoned_node_keeps_its_job_and_a_drained_one_leaves_it() -> None:
    running = job("j", 1, 2, state=RUNNING, record=JobState.RUNNING, members=("a", "b"))
    cordoned = NodeView("a", cordoned="maintenance")
    placements, _ = run(nodes("b", a=cordoned), [running], {"a": "j", "b": "j"})
    assert on(placements, "j") == ["a", "b"]
    drained = NodeView("a", cordoned="maintenance", drained=True)
    placements, _ = run(nodes("b", "c", a=drained), [running], {"a": "j", "b": "j"})
    assert on(placements, "j") == ["b", "c"]  # and it grows back into a free node


def test_a_selector_places_a_job_only_on_nodes_with_its_labels() -> None:
    h100 = {"gpu": "h100"}
    view_nodes = nodes(
        a=NodeView("a", labels={"gpu": "a100"}),
        b=NodeView("b", labels=h100),
        c=NodeView("c", labels={**h100, "rack": "r1"}),
    )
    picky = replace(job("picky", 2), selector=h100)
    placements, jobs = run(view_nodes, [picky])
    assert on(placements, "picky") == ["b", "c"] and jobs["picky"].state is RUNNING
    too_picky = replace(job("rare", 1), selector={"gpu": "b200"})
    placements, jobs = run(view_nodes, [too_picky])
    assert placements == {}
    assert jobs["rare"].reason == (
        "needs 1 nodes, the pool has 0 healthy nodes that can run it; 3 lack gpu=b200"
    )


def test_a_pool_leader_keeps_each_nodes_view_until_its_report_or_cordon_changes() -> None:
    views = NodeViews()
    a, b = PoolNode("a", "10.0.0.1", 5000), PoolNode("b", "10.0.0.2", 5000, pinned="j")
    first = views.of({"a": a, "b": b}, {})
    assert first["b"].pinned == "j" and first["a"].eligible
    again = views.of({"a": a, "b": b}, {})
    assert again["a"] is first["a"] and again["b"] is first["b"]  # kept, not made again
    cordoned = views.of({"a": a, "b": b}, {"a": Cordon("disk", by="ops", drain=True)})
    assert cordoned["a"].cordoned == "disk" and cordoned["a"].drained
    assert cordoned["b"] is first["b"]
    a2 = PoolNode("a", "10.0.0.1", 5000, refused={"j": "no user"})  # a new report
    changed = views.of({"a": a2}, {})
    assert changed["a"].refused == {"j": "no user"} and not changed["a"].cordoned
    assert list(changed) == ["a"]  # b is gone


def test_a_job_that_replaces_slow_nodes_holds_one_free_node_as_its_standby() -> None:
    """slow_node.policy: replace needs a spare beside the members (docs/slow-nodes.md): the
    pool lends it a node no other job wants, and keeps lending the same one."""
    replacing = replace(
        job("j", 2, 3, state=RUNNING, record=JobState.RUNNING, members=("a", "b", "c")),
        standby=True,
    )
    reporting = replace(replacing, id="k", standby=False)
    placed = {"a": "j", "b": "j", "c": "j"}
    placements, _ = run(nodes("a", "b", "c", "d", "e"), [replacing], placed)
    assert on(placements, "j") == ["a", "b", "c", "d"]
    again, _ = run(nodes("a", "b", "c", "d", "e"), [replacing], placements)
    assert again == placements  # settled: nothing moves
    # A lower-named node freed since does not take the standby's place (its agent stands by).
    placements, _ = run(nodes("0", "a", "b", "c", "d", "e"), [replacing], placements)
    assert on(placements, "j") == ["a", "b", "c", "d"]
    without, _ = run(nodes("a", "b", "c", "d"), [reporting], {n: "k" for n in "abc"})
    assert on(without, "k") == ["a", "b", "c"]


def test_a_standby_gives_way_to_a_pending_job_and_to_a_job_below_its_target() -> None:
    replacing = replace(
        job("j", 2, 3, state=RUNNING, record=JobState.RUNNING, members=("a", "b", "c")),
        standby=True,
    )
    pending = job("p", 1, seq=2)
    placements, jobs = run(
        nodes("a", "b", "c", "d"), [replacing, pending], {"a": "j", "b": "j", "c": "j", "d": "j"}
    )
    assert on(placements, "p") == ["d"] and jobs["p"].state is RUNNING
    assert on(placements, "j") == ["a", "b", "c"]
    short = job("g", 1, 2, state=RUNNING, record=JobState.RUNNING, members=("e",), seq=3)
    placements, _ = run(
        nodes("a", "b", "c", "d", "e"),
        [replacing, short],
        {"a": "j", "b": "j", "c": "j", "d": "j", "e": "g"},
    )
    assert on(placements, "g") == ["d", "e"] and on(placements, "j") == ["a", "b", "c"]


def test_a_job_asking_for_gpus_goes_only_to_nodes_offering_that_many() -> None:
    """A job that asks for K GPUs shares nodes offering at least K units; one that no node can
    run says which fall short; a whole-node job goes anywhere free, with GPUs or none."""
    view_nodes = nodes(
        a=NodeView("a", gpus=2), b=NodeView("b", gpus=8), c=NodeView("c"), d=NodeView("d", gpus=8)
    )
    four = replace(job("four", 2), gpus_per_node=4)
    result = schedule(PoolView(NOW, view_nodes, {"four": four}, {}), POLICY)
    assert result.placements == {} and result.shares == {"b": {"four": 4}, "d": {"four": 4}}
    assert result.jobs["four"].reason == "admitted on 2 nodes, 4 GPUs each"
    anything = job("any", 4)  # a whole-node job: any node, with GPUs or none
    assert on(run(view_nodes, [anything])[0], "any") == ["a", "b", "c", "d"]
    sixteen = replace(job("big", 1), gpus_per_node=16)
    placements, jobs = run(view_nodes, [sixteen])
    assert placements == {}
    assert jobs["big"].reason == (
        "needs 1 nodes, the pool has 0 healthy nodes that can run it; 4 offer fewer than 16 GPUs"
    )


def gpu_jobs(*asks: tuple[str, int], seq: int = 1) -> list[JobView]:
    return [replace(job(name, 1, seq=seq + i), gpus_per_node=k) for i, (name, k) in enumerate(asks)]


def test_eight_one_gpu_jobs_pack_one_node_and_leave_the_others_whole() -> None:
    view_nodes = {n: NodeView(n, gpus=8) for n in "abc"}
    ones = gpu_jobs(*((f"one-{i}", 1) for i in range(8)))
    pair = job("pair", 2, seq=20)  # a two-node whole-node job
    result = schedule(PoolView(NOW, view_nodes, {j.id: j for j in [*ones, pair]}, {}), POLICY)
    assert result.shares == {"a": {f"one-{i}": 1 for i in range(8)}}
    assert result.placements == {"b": "pair", "c": "pair"}
    split = gpu_jobs(("four", 4), ("two", 2), ("too", 2))
    packed = schedule(PoolView(NOW, view_nodes, {j.id: j for j in split}, {}), POLICY)
    assert packed.shares == {"a": {"four": 4, "two": 2, "too": 2}}  # 4+2+2: one node


def test_packing_takes_the_fullest_node_that_fits_and_keeps_shares_between_rounds() -> None:
    view_nodes = {n: NodeView(n, gpus=8) for n in "abc"}
    running = [
        replace(
            j,
            status=replace(j.status, state=RUNNING, admitted_ms=NOW),
            record_state=JobState.RUNNING,
        )
        for j in gpu_jobs(("six", 6), ("three", 3))
    ]
    shares = {"a": {"six": 6}, "b": {"three": 3}}
    new = gpu_jobs(("two", 2), seq=10)[0]
    view = PoolView(NOW, view_nodes, {j.id: j for j in [*running, new]}, {}, shares=shares)
    result = schedule(view, POLICY)
    assert result.shares == {"a": {"six": 6, "two": 2}, "b": {"three": 3}}  # best fit: a
    five = gpu_jobs(("five", 5), seq=11)[0]
    view = PoolView(NOW, view_nodes, {j.id: j for j in [*running, five]}, {}, shares=shares)
    assert schedule(view, POLICY).shares["b"] == {"three": 3, "five": 5}
    # a share of an ended job is freed in its round; one on a lost node is dropped
    ended = replace(running[0], record_state=JobState.SUCCEEDED)
    lost = {n: v for n, v in view_nodes.items() if n != "b"}
    view = PoolView(NOW, lost, {"six": ended, "three": running[1]}, {}, shares=shares)
    result = schedule(view, POLICY)
    assert result.shares == {"a": {"three": 3}}  # three grew back into a, now free of six
    assert result.jobs["six"].state is PoolJobState.SUCCEEDED


def test_a_shared_node_is_no_whole_node_job_s_and_a_reservation_keeps_free_nodes_whole() -> None:
    view_nodes = {n: NodeView(n, gpus=8) for n in "ab"}
    one = replace(
        gpu_jobs(("one", 1))[0], status=PoolJob(RUNNING, seq=1, submitted_ms=0, admitted_ms=0)
    )
    whole = job("whole", 2, seq=2, waited_ms=POLICY.reserve_after_ms)  # waited long: reserves
    more = gpu_jobs(("more", 1), ("big", 8), seq=3)
    shares = {"a": {"one": 1}}
    view = PoolView(NOW, view_nodes, {j.id: j for j in [one, whole, *more]}, {}, shares=shares)
    result = schedule(view, POLICY)
    assert result.placements == {}  # a is shared: the whole-node job waits for it
    assert result.jobs["whole"].reason == "needs 2 nodes, 1 free"
    assert result.shares == {"a": {"one": 1, "more": 1}}  # a partly used node: still packed
    assert result.jobs["big"].reason == "needs 1 nodes with 8 free GPUs, 0 have them"  # not b


def test_an_exclusive_gpu_job_holds_whole_nodes() -> None:
    view_nodes = {n: NodeView(n, gpus=8) for n in "ab"}
    alone = replace(job("alone", 1), gpus_per_node=1, exclusive=True)
    result = schedule(PoolView(NOW, view_nodes, {"alone": alone}, {}), POLICY)
    assert result.placements == {"a": "alone"} and result.shares == {}


def test_a_gpu_quota_holds_under_a_burst_and_counts_a_whole_node_as_all_its_gpus() -> None:
    view_nodes = {n: NodeView(n, gpus=8) for n in "abc"}
    queues = {"research": QueueView("research", gpu_quota=4)}
    burst = [replace(j, queue="research") for j in gpu_jobs(*((f"b{i}", 1) for i in range(10)))]
    result = schedule(PoolView(NOW, view_nodes, {j.id: j for j in burst}, {}, queues), POLICY)
    running = sorted(j for j, s in result.jobs.items() if s.state is RUNNING)
    assert running == ["b0", "b1", "b2", "b3"] and result.shares == {"a": dict.fromkeys(running, 1)}
    assert result.jobs["b4"].reason == (
        "pending: queue research at its GPU quota of 4 (4 in use, it needs 1)"
    )
    # whole nodes: every unit of each counts, ahead of placing (the widest node's)
    eight = {"train": QueueView("train", gpu_quota=8)}
    pair = replace(job("pair", 2), queue="train")
    one = replace(job("one", 1, 2, seq=2), queue="train")
    result = schedule(PoolView(NOW, view_nodes, {"pair": pair, "one": one}, {}, eight), POLICY)
    assert result.jobs["pair"].reason == (
        "pending: queue train at its GPU quota of 8 (0 in use, it needs 16)"
    )
    assert on(result.placements, "one") == ["a"]  # its target 2 cut to what 8 GPUs allow


def test_a_gpu_job_of_higher_priority_takes_exactly_the_units_it_needs_from_lower_ones() -> None:
    """Nodes a and b full: l (priority 0, 4 GPUs on each, min 1 node) and m (priority 0, 4 on
    each, min 2: it cannot give). h (priority 5, 4 GPUs, 1 node) takes l's share on a, and
    nothing more: l keeps b, m both; l says why and is not shrunk again within the cooldown."""
    view_nodes = {n: NodeView(n, gpus=8) for n in "ab"}

    def running(name: str, min_nodes: int, seq: int) -> JobView:
        view = replace(job(name, min_nodes, 2, seq=seq), gpus_per_node=4)
        status = replace(view.status, state=RUNNING, admitted_ms=NOW - 600_000)
        return replace(view, status=status, record_state=JobState.RUNNING, members=("a", "b"))

    low, mid = running("l", 1, 1), running("m", 2, 2)
    high = replace(job("h", 1, priority=5, seq=3), gpus_per_node=4)
    shares = {"a": {"l": 4, "m": 4}, "b": {"l": 4, "m": 4}}
    view = PoolView(NOW, view_nodes, {j.id: j for j in (low, mid, high)}, {}, shares=shares)
    result = schedule(view, POLICY)
    assert result.shares == {"a": {"m": 4, "h": 4}, "b": {"l": 4, "m": 4}}
    assert result.jobs["h"].reason == "admitted on 1 nodes, 4 GPUs each, preempting l"
    assert result.jobs["l"].shrunk_ms == NOW and "went to job h" in result.jobs["l"].reason
    (shrunk,) = [e for e in result.events if e.type == "job_shrunk"]
    assert shrunk.data["nodes"] == ["a"] and shrunk.data["for"] == "h"
    # an equal priority takes nothing
    equal = replace(high, priority=0)
    view = PoolView(NOW, view_nodes, {j.id: j for j in (low, mid, equal)}, {}, shares=shares)
    assert schedule(view, POLICY).jobs["h"].state is PoolJobState.PENDING


def test_a_job_sharing_nodes_that_replaces_slow_ones_stands_by_on_k_free_units() -> None:
    """j (2 GPUs a node, on a and b, slow_node.policy: replace) is lent 2 units of one more
    node, the fullest that fits (c, beside six's 6), kept there round after round; a pending
    job that wants those units gets them first, and the standby goes to another node."""
    view_nodes = {n: NodeView(n, gpus=8) for n in "abcd"}
    status = PoolJob(RUNNING, seq=1, submitted_ms=0, admitted_ms=0)
    j = replace(
        job("j", 1, 2, record=JobState.RUNNING, members=("a", "b")),
        status=status,
        gpus_per_node=2,
        standby=True,
    )
    six = replace(job("six", 1, record=JobState.RUNNING, seq=2), status=status, gpus_per_node=6)
    shares = {"a": {"j": 2}, "b": {"j": 2}, "c": {"six": 6}}
    view = PoolView(NOW, view_nodes, {"j": j, "six": six}, {}, shares=shares)
    first = schedule(view, POLICY)
    assert first.shares == {"a": {"j": 2}, "b": {"j": 2}, "c": {"six": 6, "j": 2}}
    again = schedule(replace(view, shares=first.shares), POLICY)
    assert again.shares == first.shares  # settled: the standby stays on c
    two = replace(job("two", 1, seq=3), gpus_per_node=2)
    jobs = {"j": j, "six": six, "two": two}
    taken = schedule(PoolView(NOW, view_nodes, jobs, {}, shares=first.shares), POLICY)
    assert taken.shares["c"] == {"six": 6, "two": 2}  # the pending job first
    assert taken.shares["d"] == {"j": 2}  # c full, a and b its own: the standby on a free node


def test_a_standby_is_never_a_node_another_job_shares_now() -> None:
    """w (whole nodes, target 2, replacing slow nodes) stood by on c; at the start of the round
    the pool takes c back, and a pending GPU job shares it: w's standby goes to d, not back to
    c (a node is placed on one job or shared, never both)."""
    view_nodes = {n: NodeView(n, gpus=8) for n in "abcd"}
    status = PoolJob(RUNNING, seq=1, submitted_ms=0, admitted_ms=0)
    w = replace(job("w", 1, 2, record=JobState.RUNNING, members=("a", "b")), status=status,
                standby=True)  # fmt: skip
    p = replace(job("p", 1, seq=2), gpus_per_node=4)
    view = PoolView(NOW, view_nodes, {"w": w, "p": p}, {"a": "w", "b": "w", "c": "w"})
    result = schedule(view, POLICY)
    assert result.shares == {"c": {"p": 4}}
    assert result.placements == {"a": "w", "b": "w", "d": "w"}
