"""One agent's pure decisions about its own workers."""

from __future__ import annotations

from dataclasses import replace

import pytest

from nodeagent.job.decide import (
    Acknowledge,
    Leave,
    LocalView,
    ReleaseWorkers,
    StartWorkers,
    StopWorkers,
    decide,
    fenced_at,
)
from nodeagent.model.job import Cordon, Failure, JobRecord
from nodeagent.state import NODE_TRANSITIONS, JobState, NodeState
from nodeagent.supervisor.status import GroupPhase, GroupStatus
from tests.helpers.factories import make_record


def rec(state: JobState, gen: int, members: tuple[str, ...] = ("a", "b")) -> JobRecord:
    return make_record(state, gen, members, target_nodes=2, max_nodes=3)


RUNNING_G = GroupStatus(4, GroupPhase.RUNNING)
STOPPING_G = GroupStatus(4, GroupPhase.STOPPING)
EXITED_G = GroupStatus(4, GroupPhase.EXITED)
NONE = GroupStatus()
FAIL = Failure(generation=4, node="a", rank=0, kind="exit_code", exit_code=1)


def view(
    record: JobRecord | None,
    group: GroupStatus = NONE,
    acked: int = 0,
    name: str = "a",
    **kw: object,
) -> LocalView:
    return LocalView(name=name, acked_generation=acked, group=group, record=record, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("local", "state", "actions"),
    [
        # no job yet; or Redis lost the record while workers run: keep them
        (view(None), NodeState.JOINING, []),
        (view(None, RUNNING_G, acked=4), NodeState.RUNNING, []),
        # a new generation: ack (no workers), then start once RUNNING with us as member
        (view(rec(JobState.RESTARTING, 4), acked=3), NodeState.READY, [Acknowledge]),
        (view(rec(JobState.RUNNING, 4), acked=4), NodeState.READY, [StartWorkers]),
        # generation 4 formed before this agent started (it never acknowledged it): a new
        # incarnation of a member whose workers are gone never starts into it (issue 41)
        (view(rec(JobState.RUNNING, 4), acked=3), NodeState.FENCED, []),
        (view(rec(JobState.RUNNING, 4), acked=0), NodeState.FENCED, []),
        (view(rec(JobState.RUNNING, 4), acked=0, name="z"), NodeState.STANDBY, [Acknowledge]),
        # the last generation's copies are being cancelled: start once they ended
        (
            view(rec(JobState.RUNNING, 4), acked=4, tiers_copying=True),
            NodeState.READY,
            [],
        ),
        (view(rec(JobState.RUNNING, 4), acked=4, name="z"), NodeState.STANDBY, []),
        (view(rec(JobState.RUNNING, 4), RUNNING_G, acked=4), NodeState.RUNNING, []),
        # anything that replaces the generation stops the workers, acked only when stopped
        (view(rec(JobState.RESTARTING, 5), RUNNING_G, acked=4), NodeState.STOPPING, [StopWorkers]),
        (view(rec(JobState.RESTARTING, 5), STOPPING_G, acked=4), NodeState.STOPPING, []),
        (view(rec(JobState.RESTARTING, 5), EXITED_G, acked=4), NodeState.READY, [Acknowledge]),
        (
            view(rec(JobState.RUNNING, 4, ("b",)), RUNNING_G, acked=4),
            NodeState.STOPPING,
            [StopWorkers],
        ),
        (view(rec(JobState.STOPPED, 4), RUNNING_G, acked=4), NodeState.STOPPING, [StopWorkers]),
        # local failure: stop the rest at once, stay FAILED until a new generation
        (
            view(rec(JobState.RUNNING, 4), GroupStatus(4, GroupPhase.RUNNING, FAIL), acked=4),
            NodeState.FAILED,
            [StopWorkers],
        ),
        (
            view(rec(JobState.RUNNING, 4), GroupStatus(4, GroupPhase.EXITED, FAIL), acked=4),
            NodeState.FAILED,
            [],
        ),
        (
            view(
                rec(JobState.RUNNING, 4), GroupStatus(4, GroupPhase.EXITED, succeeded=True), acked=4
            ),
            NodeState.SUCCEEDED,
            [],
        ),
        # an old group that succeeded does not hold back a new generation
        (
            view(
                rec(JobState.RUNNING, 5), GroupStatus(4, GroupPhase.EXITED, succeeded=True), acked=5
            ),
            NodeState.READY,
            [StartWorkers],
        ),
        # shutting down
        (
            view(rec(JobState.RUNNING, 4), RUNNING_G, acked=4, shutting_down=True),
            NodeState.LEAVING,
            [StopWorkers],
        ),
        (
            view(rec(JobState.RUNNING, 4), STOPPING_G, acked=4, shutting_down=True),
            NodeState.LEAVING,
            [],
        ),
        (
            view(rec(JobState.RUNNING, 4), EXITED_G, acked=4, shutting_down=True),
            NodeState.LEAVING,
            [Leave],
        ),
        # fencing: stop workers, then stay fenced until a newer generation comes
        (
            view(rec(JobState.RUNNING, 4), RUNNING_G, acked=4, fence=True),
            NodeState.FENCED,
            [StopWorkers],
        ),
        (
            view(rec(JobState.RUNNING, 4), EXITED_G, acked=4, fenced_generation=4),
            NodeState.FENCED,
            [],
        ),
        (
            view(rec(JobState.RESTARTING, 5), EXITED_G, acked=4, fenced_generation=4),
            NodeState.READY,
            [Acknowledge],
        ),
    ],
)
def test_decide(local: LocalView, state: NodeState, actions: list[type]) -> None:
    decision = decide(local)
    assert decision.state is state, decision.reason
    assert [type(a) for a in decision.actions] == actions


@pytest.mark.parametrize(
    ("record", "acked", "group", "fenced"),
    [
        (rec(JobState.RUNNING, 4), 4, 4, 4),  # its generation runs: out of it, wait for 5
        (rec(JobState.RESTARTING, 5), 4, 4, 4),  # 5 only announced: it will acknowledge 5
        (rec(JobState.RESTARTING, 5), 5, 4, 5),  # it acknowledged 5 already: wait for 6
        (rec(JobState.WAITING, 3), 3, 0, 3),
        (None, 2, 3, 3),
    ],
)
def test_a_fenced_node_stays_out_of_what_ran_and_not_of_what_is_only_announced(
    record: JobRecord | None, acked: int, group: int, fenced: int
) -> None:
    assert fenced_at(acked, group, record) == fenced


def test_a_node_fenced_while_a_generation_is_announced_acknowledges_it_once_stopped() -> None:
    """The barrier waits for every live node: one fenced out of the announced generation for
    good would hold the job forever while its lease lives."""
    announced = rec(JobState.RESTARTING, 5)
    fenced = decide(view(announced, RUNNING_G, acked=4, fence=True))
    assert fenced.state is NodeState.FENCED
    assert [type(a) for a in fenced.actions] == [StopWorkers]
    out_of = fenced_at(4, RUNNING_G.generation or 0, announced)
    stopping = decide(view(announced, STOPPING_G, acked=4, fenced_generation=out_of))
    assert stopping.state is NodeState.STOPPING, stopping.reason
    stopped = decide(view(announced, EXITED_G, acked=4, fenced_generation=out_of))
    assert (stopped.state, [type(a) for a in stopped.actions]) == (
        NodeState.READY,
        [Acknowledge],
    )


def test_start_carries_group_rank() -> None:
    decision = decide(view(rec(JobState.RUNNING, 4, ("b", "a")), acked=4))
    start = decision.actions[0]
    assert isinstance(start, StartWorkers) and start.group_rank == 1


def test_fence_stop_is_marked_to_shorten_grace() -> None:
    decision = decide(view(rec(JobState.RUNNING, 4), RUNNING_G, acked=4, fence=True))
    stop = decision.actions[0]
    assert isinstance(stop, StopWorkers) and stop.fence


def test_never_starts_an_older_generation_after_acknowledging_a_newer_one() -> None:
    """Even with a stale RUNNING record in hand, a node that acked g+1 starts nothing of g."""
    for group in (NONE, EXITED_G):
        decision = decide(view(rec(JobState.RUNNING, 4), group, acked=5))
        assert not any(isinstance(a, StartWorkers) for a in decision.actions)


def test_random_histories_only_make_legal_transitions() -> None:
    """The agent raises on an illegal transition, so no history may produce one.

    A seeded random walk: the leader's record only moves forward, actions are applied as the
    agent applies them, workers fail, succeed or exit on their own, leases lapse, agents stop.
    """
    import random
    from dataclasses import replace as copy

    from nodeagent.state import check_transition

    rng = random.Random(1234)
    for _ in range(3000):
        record: JobRecord | None = None
        gen, acked, fenced, fence, leaving = 0, 0, None, False, False
        cordon: Cordon | None = None
        unfit: str | None = None
        group = NONE
        state = NodeState.JOINING
        in_place = rng.random() < 0.5
        for _ in range(25):
            event = rng.choice(
                [
                    "record",
                    "record",
                    "fail",
                    "succeed",
                    "exit",
                    "fence",
                    "unfence",
                    "tick",
                    "tick",
                    "lost_record",
                    "leave",
                    "cordon",
                    "drain",
                    "uncordon",
                    "unfit",
                    "fit",
                    "parked",
                    "parked",
                    "parked",
                ]
            )
            if event == "record":
                if rng.random() < 0.5:
                    gen += 1
                members = rng.choice([("a", "b"), ("b",), ("a",)])
                record = rec(rng.choice(list(JobState)), gen, members)
            elif event == "lost_record":
                record = None
            elif event == "fail" and group.phase is GroupPhase.RUNNING:
                failure = copy(FAIL, generation=group.generation or 0)
                group = copy(
                    group,
                    failure=failure,
                    phase=rng.choice([GroupPhase.RUNNING, GroupPhase.EXITED]),
                )
            elif event == "succeed" and group.phase is GroupPhase.RUNNING:
                group = copy(group, phase=GroupPhase.EXITED, succeeded=True)
            elif event == "exit" and group.phase is not GroupPhase.NONE:
                group = copy(group, phase=GroupPhase.EXITED)  # stopped, or in_place gave up
            elif event == "parked" and group.phase is GroupPhase.RELEASING:
                group = copy(group, phase=GroupPhase.PARKED)
            elif event == "fence":
                fence = True
            elif event == "unfence":
                fence = False
            elif event == "leave":
                leaving = True
            elif event in ("cordon", "drain"):
                cordon = Cordon(reason="r", by="ops", drain=event == "drain")
            elif event == "uncordon":
                cordon = None
            elif event in ("unfit", "fit"):
                unfit = "too few GPUs" if event == "unfit" else None
            local = LocalView(
                name="a",
                acked_generation=acked,
                group=group,
                record=record,
                shutting_down=leaving,
                fence=fence,
                fenced_generation=fenced,
                cordon=cordon,
                unfit=unfit,
                in_place=in_place,
                warm_ups=in_place and rng.random() < 0.5,
            )
            decision = decide(local)
            check_transition(NODE_TRANSITIONS, state, decision.state)
            state = decision.state
            if state is NodeState.FENCED and fenced is None:
                fenced = fenced_at(acked, group.generation or 0, record)
            for action in decision.actions:
                if isinstance(action, Acknowledge):
                    # The invariant: no worker of this node is in any generation's group.
                    assert not group.active, (group, decision)
                    acked = action.generation
                    if fenced is not None and acked > fenced:
                        fenced = None
                elif isinstance(action, StartWorkers):
                    group = GroupStatus(action.record.generation, GroupPhase.RUNNING)
                elif isinstance(action, StopWorkers) and group.stoppable:
                    group = copy(group, phase=GroupPhase.STOPPING)
                elif isinstance(action, ReleaseWorkers):
                    assert in_place and not group.released
                    assert group.phase in (GroupPhase.RUNNING, GroupPhase.EXITED)
                    if group.phase is GroupPhase.RUNNING:
                        group = copy(group, phase=GroupPhase.RELEASING)
                    group = copy(group, released=True)
            if state is NodeState.LEAVING and any(isinstance(a, Leave) for a in decision.actions):
                break


RELEASING_G = GroupStatus(4, GroupPhase.RELEASING)
PARKED_G = GroupStatus(4, GroupPhase.PARKED)


@pytest.mark.parametrize(
    ("local", "state", "actions"),
    [
        # a new generation releases the workers instead of stopping them; acked once parked
        (view(rec(JobState.RESTARTING, 5), RUNNING_G, 4), NodeState.STOPPING, [ReleaseWorkers]),
        (view(rec(JobState.RESTARTING, 5), RELEASING_G, 4), NodeState.STOPPING, []),
        (view(rec(JobState.RESTARTING, 5), PARKED_G, 4), NodeState.READY, [Acknowledge]),
        (view(rec(JobState.RUNNING, 5), PARKED_G, 5), NodeState.READY, [StartWorkers]),
        # a local failure releases the survivors too; the node reports FAILED meanwhile
        (
            view(rec(JobState.RUNNING, 4), GroupStatus(4, GroupPhase.RUNNING, FAIL), 4),
            NodeState.FAILED,
            [ReleaseWorkers],
        ),
        (
            view(rec(JobState.RUNNING, 4), GroupStatus(4, GroupPhase.PARKED, FAIL), 4),
            NodeState.FAILED,
            [],
        ),
        # every local worker gone: released all the same (its replacements warm up), once;
        # not without warm-ups (checkpoint tiers, containers)
        (
            view(
                rec(JobState.RUNNING, 4), GroupStatus(4, GroupPhase.EXITED, FAIL), 4, warm_ups=True
            ),
            NodeState.FAILED,
            [ReleaseWorkers],
        ),
        (
            view(rec(JobState.RUNNING, 4), GroupStatus(4, GroupPhase.EXITED, FAIL), 4),
            NodeState.FAILED,
            [],
        ),
        (
            view(
                rec(JobState.RUNNING, 4),
                GroupStatus(4, GroupPhase.EXITED, FAIL, released=True),
                4,
                warm_ups=True,
            ),
            NodeState.FAILED,
            [],
        ),
        # parked workers with no place in the new generation, or no job to go on with: stop
        (
            view(rec(JobState.RUNNING, 5, ("b", "c")), PARKED_G, 5),
            NodeState.STANDBY,
            [StopWorkers],
        ),
        # left out while its replacement warms up, or while the job is below its target: kept
        (
            view(rec(JobState.RUNNING, 5, ("b", "c")), replace(PARKED_G, warming=1), 5),
            NodeState.STANDBY,
            [],
        ),
        (view(rec(JobState.RUNNING, 5, ("b",)), PARKED_G, 5), NodeState.STANDBY, []),
        (view(rec(JobState.STOPPED, 5), PARKED_G, 5), NodeState.READY, [StopWorkers]),
        (
            view(rec(JobState.RUNNING, 5), PARKED_G, 5, cordon=Cordon("r", "ops")),
            NodeState.CORDONED,
            [StopWorkers],
        ),
        (
            view(rec(JobState.RUNNING, 4), PARKED_G, 4, shutting_down=True),
            NodeState.LEAVING,
            [StopWorkers],
        ),
        (
            view(rec(JobState.RUNNING, 4), RELEASING_G, 4, fence=True),
            NodeState.FENCED,
            [StopWorkers],
        ),
        # the job itself ending stops them, as in restart mode
        (view(rec(JobState.STOPPED, 4), RUNNING_G, 4), NodeState.STOPPING, [StopWorkers]),
    ],
)
def test_decide_in_place(local: LocalView, state: NodeState, actions: list[type]) -> None:
    decision = decide(replace(local, in_place=True))
    assert decision.state is state, decision.reason
    assert [type(a) for a in decision.actions] == actions


@pytest.mark.parametrize(
    ("reason", "group", "broken"),
    [
        ("scale", RUNNING_G, False),  # a graceful re-form: the saves made on leaving persist
        ("drain", RUNNING_G, False),
        ("worker_failed", RUNNING_G, True),
        ("running", GroupStatus(4, GroupPhase.RUNNING, FAIL), True),  # this node's own worker
    ],
)
def test_a_release_says_whether_the_generation_failed(
    reason: str, group: GroupStatus, broken: bool
) -> None:
    generation = 4 if group.failure is not None else 5
    record = replace(rec(JobState.RUNNING, generation), reason=reason)
    decision = decide(view(record, group, 4, in_place=True))
    assert [(type(a), getattr(a, "broken", None)) for a in decision.actions] == [
        (ReleaseWorkers, broken)
    ]


@pytest.mark.parametrize(
    "cordon", [None, Cordon("drained", "ops", drain=True)], ids=["scaled-away", "drained"]
)
def test_a_node_left_out_stops_its_parked_workers_through_legal_states(
    cordon: Cordon | None,
) -> None:
    """Scale-down (or a drain) of an in_place job: release, park, acknowledge, find no place
    (standby), stop the parked workers. Found by an end-to-end run: standby -> stopping."""
    from nodeagent.state import check_transition

    out = rec(JobState.RUNNING, 5, ("b",))
    steps = [
        (rec(JobState.RESTARTING, 5), RUNNING_G, 4, None),
        (rec(JobState.RESTARTING, 5), RELEASING_G, 4, None),
        (out, PARKED_G, 4, None),
        (out, PARKED_G, 5, cordon),
        (out, STOPPING_G, 5, cordon),
        (out, EXITED_G, 5, cordon),
    ]
    state = NodeState.RUNNING
    for record, group, acked, drain in steps:
        decision = decide(view(record, group, acked, in_place=True, cordon=drain))
        check_transition(NODE_TRANSITIONS, state, decision.state)
        state = decision.state
    assert state is (NodeState.STANDBY if cordon is None else NodeState.CORDONED)


def test_transition_table_covers_every_state() -> None:
    assert set(NODE_TRANSITIONS) == set(NodeState)
    assert NODE_TRANSITIONS[NodeState.LEAVING] == frozenset()


@pytest.mark.parametrize(
    ("reason", "broken"),
    [
        ("worker_failed", True),
        ("worker_hung", True),
        ("node_lost", True),
        ("scale", False),
        ("node_left", False),
        ("operator", False),
        ("node_joined", False),
    ],
)
def test_stops_of_failed_generations_are_marked_broken(reason: str, broken: bool) -> None:
    """A failed generation's collectives cannot complete: its workers get the short grace."""
    from dataclasses import replace

    record = replace(rec(JobState.RESTARTING, 5), reason=reason)
    stop = decide(view(record, RUNNING_G, acked=4)).actions[0]
    assert isinstance(stop, StopWorkers) and stop.broken is broken
    local_failure = GroupStatus(4, GroupPhase.RUNNING, FAIL)
    stop = decide(view(rec(JobState.RUNNING, 4), local_failure, acked=4)).actions[0]
    assert isinstance(stop, StopWorkers) and stop.broken


DRAIN = Cordon(reason="XID 79", by="gpu", drain=True)
CORDON = Cordon(reason="maintenance", by="ops")


@pytest.mark.parametrize(
    ("local", "state", "actions"),
    [
        (
            view(rec(JobState.RUNNING, 4), RUNNING_G, acked=4, cordon=DRAIN),
            NodeState.DRAINING,
            [StopWorkers],
        ),
        (view(rec(JobState.RUNNING, 4), STOPPING_G, acked=4, cordon=DRAIN), NodeState.DRAINING, []),
        (
            view(rec(JobState.RESTARTING, 5), EXITED_G, acked=4, cordon=DRAIN),
            NodeState.CORDONED,
            [Acknowledge],
        ),
        # a plain cordon keeps the running generation; the next one goes on without the node
        (view(rec(JobState.RUNNING, 4), RUNNING_G, acked=4, cordon=CORDON), NodeState.RUNNING, []),
        (
            view(rec(JobState.RUNNING, 5), EXITED_G, acked=5, cordon=CORDON),
            NodeState.CORDONED,
            [],
        ),
        (  # cordoned after a restart: no acknowledgement of a generation it never saw form
            view(rec(JobState.RUNNING, 5), EXITED_G, acked=4, cordon=CORDON),
            NodeState.CORDONED,
            [],
        ),
        (
            view(rec(JobState.RUNNING, 5), NONE, acked=5, unfit="1 usable GPU"),
            NodeState.CORDONED,
            [],
        ),
    ],
)
def test_cordons_and_drains(local: LocalView, state: NodeState, actions: list[type]) -> None:
    decision = decide(local)
    assert decision.state is state, decision.reason
    assert [type(a) for a in decision.actions] == actions


def test_a_drain_stop_gets_the_full_grace() -> None:
    stop = decide(view(rec(JobState.RUNNING, 4), RUNNING_G, acked=4, cordon=DRAIN)).actions[0]
    assert isinstance(stop, StopWorkers) and not stop.broken and not stop.fence
