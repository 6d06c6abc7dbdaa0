"""Where a job's wall time went (nodeagent/model/goodput.py), what rank 0's node says of its
training (nodeagent/job/progress.py), and the leader's metrics of it (job/leadership.py):
events on one clock, cut into pieces that add up."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from nodeagent.coord.bounded import unbounded
from nodeagent.errors import CorruptStateError
from nodeagent.job.leadership import GOODPUT_S, Leadership
from nodeagent.job.plan import Policy
from nodeagent.job.progress import Progress
from nodeagent.job.watch import Stretch
from nodeagent.model import goodput
from nodeagent.model.job import Event
from nodeagent.model.pool import PoolJob, PoolJobState
from nodeagent.supervisor.status import GroupPhase, GroupStatus
from nodeagent.telemetry.metrics import AgentMetrics
from tests.helpers import memstore


def at(seconds: float, kind: str, generation: int | None = None, **data: Any) -> Event:
    return Event(kind, generation=generation, data=data, at_ms=round(seconds * 1000))


def two_generations() -> list[Event]:
    """Announced at 0, started at 2, first step at 5 (said at 6), step 100 at 105 (a worker
    killed: said at 107), announced again at 106, started at 108, first step 91 at 112, the
    job succeeded at 200 having reached step 190 at 199."""
    return [
        at(0, "generation_announced", 1, reason="node_joined"),
        at(2, "generation_started", 1, world_size=4),
        at(6, "training_started", 1, step=1, age_ms=1000),
        at(106, "generation_announced", 2, reason="worker_failed"),
        at(107, "training_stopped", 1, step=100, age_ms=2000, steps=100, stalled_s=3.0),
        at(108, "generation_started", 2, world_size=4),
        at(113, "training_started", 2, step=91, age_ms=1000),
        at(199.5, "training_stopped", 2, step=190, age_ms=500, steps=100, stalled_s=2.0),
        at(200, "job_succeeded"),
    ]


def test_the_pieces_add_up_to_the_wall_time_and_each_is_what_it_says() -> None:
    found = goodput.account(two_generations(), now_ms=10**9)
    assert found is not None and found.ended and found.wall_s == 200
    parts = found.parts
    assert sum(parts.values()) == pytest.approx(200)
    assert parts["first_start"] == pytest.approx(5)  # announced -> rank 0's first step
    [reform] = found.reforms
    assert (reform.generation, reform.reason) == (2, "worker_failed")
    assert reform.detection_s == pytest.approx(1)  # step 100 at 105, announced at 106
    assert reform.reforming_s == pytest.approx(2)  # -> started at 108
    assert reform.startup_restore_s == pytest.approx(4)  # -> first step at 112
    # resumed at step 91 having reached 100: 10 steps trained again, at 87 s / 99 steps each
    assert reform.steps_lost == 10
    assert reform.retrained_s == pytest.approx(10 * 87 / 99)
    assert parts["checkpoint_stalls"] == pytest.approx(5)
    assert parts["ending"] == pytest.approx(1)  # step 190 at 199 -> the end at 200
    assert parts["productive"] == pytest.approx(100 + 87 - 5 - reform.retrained_s)
    assert found.ettr == pytest.approx(parts["productive"] / 200)
    assert found.rank_seconds == pytest.approx(parts["productive"] * 4)
    assert found.unaccounted == ()


def test_a_reform_splits_into_stopping_and_rendezvous_and_each_generation_says_its_pace() -> None:
    """The UI's timeline and step-time chart (docs/ui.md): the last node's ack of generation 2
    at 107.5 (its old workers stopped) splits re-forming 106 -> 108; a node_ready after the
    start, or of another generation, does not count; a node named slow is kept."""
    events = [
        *two_generations()[:5],
        at(106.5, "node_ready", 2),
        at(107.5, "node_ready", 2),
        at(109, "node_ready", 2),  # after the start: not the stopping
        at(107.8, "node_ready", 1),
        Event(
            "node_slow", 2, "c", data={"step_s": 1.5, "pace_s": 0.9, "began_s": 10}, at_ms=150_000
        ),
        *two_generations()[5:],
    ]
    found = goodput.account(events, now_ms=10**9)
    assert found is not None
    [reform] = found.reforms
    assert reform.at_s == pytest.approx(105)  # step 100, the last before the fault
    assert reform.stopping_s == pytest.approx(1.5)  # announced 106 -> acked 107.5
    assert reform.rendezvous_s == pytest.approx(0.5)  # -> started 108
    assert reform.stopping_s + reform.rendezvous_s == pytest.approx(reform.reforming_s)
    first, second = found.trained
    assert (first.generation, first.world, first.steps) == (1, 4, 100)
    assert first.step_s == pytest.approx(100 / 99)  # 5 -> 105, 100 steps
    assert second.step_s == pytest.approx(87 / 99)
    [slow] = found.slow
    assert (slow.node, slow.at_s, slow.step_s, slow.pace_s) == ("c", 150, 1.5, 0.9)
    data: Any = found.to_data()
    assert data["reforms"][0]["stopping_s"] == 1.5 and data["trained"][1]["steps"] == 100


def test_a_generation_still_training_has_no_pace_yet() -> None:
    running = goodput.account(two_generations()[:7], now_ms=150_000)
    assert running is not None
    assert [(t.generation, t.last_s, t.step_s) for t in running.trained] == [
        (1, 105, 100 / 99),
        (2, None, None),
    ]


def test_waiting_for_nodes_is_not_a_reform_and_a_running_job_ends_now() -> None:
    events = [
        *two_generations()[:3],
        at(50, "generation_announced", 2, reason="node_lost"),
        at(50.5, "job_waiting", 2),
        at(80, "generation_announced", 3, reason="node_joined"),
        at(82, "generation_started", 3, world_size=3),
        at(90, "training_started", 3, step=40, age_ms=0),
    ]
    found = goodput.account(events, now_ms=120_000)
    assert found is not None and not found.ended and found.wall_s == 120
    assert sum(found.parts.values()) == pytest.approx(120)
    assert found.parts["waiting"] == pytest.approx(29.5)  # 50.5 -> 80
    [reform] = found.reforms
    assert reform.generation == 3 and reform.reason == "node_lost"
    # rank 0's node said nothing of generation 1's end (lost): trained until the announcement
    assert reform.detection_s == 0 and found.unaccounted == (1,)
    assert reform.reforming_s == pytest.approx(82 - 50 - 29.5)
    assert found.parts["productive"] == pytest.approx(50 - 5 + 120 - 90)


def test_nothing_announced_is_nothing_to_account() -> None:
    assert goodput.account([at(1, "node_joined")], now_ms=5000) is None


def test_garbage_in_the_events_data_counts_as_nothing_said() -> None:
    events = two_generations()
    events[2] = at(6, "training_started", 1, step="one", age_ms=[1])
    found = goodput.account(events, now_ms=10**9)
    assert found is not None and sum(found.parts.values()) == pytest.approx(200)


def test_rank_0s_node_says_when_its_generation_trained_and_where_it_stopped() -> None:
    progress = Progress("a")
    running = GroupStatus(4, GroupPhase.RUNNING)
    assert progress.tick(10.0, running, 0, None) == []  # no beat read yet
    assert progress.tick(10.0, running, 1, Stretch(9.0, 21, 9.0, 21)) == []  # not rank 0's node
    [started] = progress.tick(10.5, running, 0, Stretch(9.5, 21, 9.5, 21), (20, 0.25))
    assert (started.type, started.generation, started.data) == (
        "training_started",
        4,
        {"step": 21, "age_ms": 1000},
    )
    assert progress.tick(30.0, running, 0, Stretch(9.5, 21, 29.0, 60), (25, 0.5)) == []
    assert progress.tick(31.0, running, 0, Stretch(9.5, 21, 30.0, 62), (25, 0.5)) == []
    assert progress.tick(32.0, running, 0, Stretch(9.5, 21, 31.0, 63), (30, 0.75)) == []
    [stopped] = progress.tick(33.5, GroupStatus(4, GroupPhase.STOPPING), 0, None)
    assert stopped.type == "training_stopped" and stopped.generation == 4
    # the save of step 20 was the one restored: its stall is not this generation's
    assert stopped.data == {
        "step": 63,
        "age_ms": 2500,
        "steps": 43,
        "trained_s": 21.5,
        "stalled_s": 1.25,
    }
    assert progress.tick(34.0, GroupStatus(4, GroupPhase.EXITED), 0, None) == []  # said once


class Counting(memstore.MemoryJobStore):
    """The in-memory store, counting the leader's reads of the events."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.reads = 0

    def events_tail(self, count: int) -> list[Event]:
        self.reads += 1
        return super().events_tail(count)


def value(metrics: AgentMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, {"job_id": "j", **labels})


def test_the_leader_exports_the_goodput_every_so_often_and_drops_it_when_it_steps_down() -> None:
    store = Counting(now_ms=lambda: 0)
    store.events = two_generations()
    metrics = AgentMetrics("j", CollectorRegistry())
    now = [0.0]
    policy = Policy(1, 2, 2, 1, 3, 0, 60_000)
    leadership = Leadership(store, policy, metrics, 5.0, lambda: now[0], unbounded)
    leadership.account(10**9, 2)
    expected = goodput.account(store.events, 10**9)
    assert expected is not None and expected.ettr is not None
    ettr = value(metrics, "nodeagent_job_effective_training_ratio")
    assert ettr == pytest.approx(expected.ettr)
    assert value(metrics, "nodeagent_job_steps_lost") == 10
    stalls = value(metrics, "nodeagent_job_goodput_seconds", part="checkpoint_stalls")
    assert stalls == pytest.approx(5)
    now[0] += GOODPUT_S / 2
    leadership.account(10**9, 2)
    assert store.reads == 1  # not at every round
    leadership.account(10**9, 3)  # a new generation: at once
    assert store.reads == 2
    now[0] += GOODPUT_S
    leadership.account(10**9, 3)
    assert store.reads == 3
    leadership.stepped_down()
    assert value(metrics, "nodeagent_job_effective_training_ratio") is None


def test_a_pool_jobs_time_in_the_queue_starts_its_wall_time() -> None:
    found = goodput.account(two_generations(), now_ms=10**9, submitted_ms=-30_000)
    assert found is not None and found.wall_s == 230
    assert found.parts["queued"] == 30 and sum(found.parts.values()) == pytest.approx(230)
    later = goodput.account(two_generations(), now_ms=10**9, submitted_ms=5_000)
    assert later is not None and later.wall_s == 200 and later.parts["queued"] == 0


def test_a_clock_read_before_the_newest_event_never_makes_a_negative_part() -> None:
    found = goodput.account(two_generations()[:2], now_ms=1_000)  # started at 2 s, read at 1 s
    assert found is not None and found.wall_s == 2
    assert all(v >= 0 for v in found.parts.values())


def test_an_ended_pool_jobs_ettr_reads_back_and_garbage_is_refused() -> None:
    ended = PoolJob(PoolJobState.SUCCEEDED, 3, 1000, ended_ms=9000, ettr=0.8125)
    assert PoolJob.from_json(ended.to_json()) == ended
    assert PoolJob.from_json(replace(ended, ettr=None).to_json()).ettr is None
    for bad in (1.5, -0.1, "high"):
        raw = json.dumps({**json.loads(ended.to_json()), "ettr": bad})
        with pytest.raises(CorruptStateError, match="ettr"):
            PoolJob.from_json(raw)
    again = ended.moved(PoolJobState.RUNNING, 10_000, "requeued").moved(
        PoolJobState.FAILED, 20_000, "failed"
    )
    assert again.ettr is None  # a later end is accounted anew


def test_a_slow_member_costs_the_share_of_time_the_job_would_have_saved() -> None:
    """Generation 2 steps at 0.1 s, then one node is slow from 130 (named at 160, 30 s of
    windows before) until it recovers at 170: the job stepped in 0.4 s, so 3/4 of those 40 s
    are the slow ranks'. A second node named slow at 180 with no pace known costs nothing."""
    events = [
        *two_generations()[:-2],
        replace(at(160, "node_slow", 2, ratio=4.0, began_s=30, step_s=0.4, pace_s=0.1), node="c"),
        replace(at(170, "node_recovered_speed", 2, ratio=1.0), node="c"),
        replace(at(180, "node_slow", 2, ratio=2.0, began_s=5, step_s=0.2), node="d"),
        *two_generations()[-2:],
    ]
    plain = goodput.account(two_generations(), now_ms=10**9)
    found = goodput.account(events, now_ms=10**9)
    assert plain is not None and found is not None
    assert found.parts["slow_ranks"] == pytest.approx(30)
    assert found.parts["productive"] == pytest.approx(plain.parts["productive"] - 30)
    assert sum(found.parts.values()) == pytest.approx(found.wall_s)


def test_a_pool_job_pending_again_after_a_requeue_counts_as_queued() -> None:
    """Generation 1 stepped until 105; the pool requeued the job at 105.5 and admitted it again
    at 150; generation 2 was announced at 151, started at 153, stepped from 157. Without the
    pool's spans those 44.5 s were the re-form's detection; with them they are queued."""
    events = [
        at(0, "generation_announced", 1, reason="node_joined"),
        at(2, "generation_started", 1, world_size=4),
        at(6, "training_started", 1, step=1, age_ms=1000),
        at(107, "training_stopped", 1, step=100, age_ms=2000, steps=100),
        at(151, "generation_announced", 2, reason="node_joined"),
        at(153, "generation_started", 2, world_size=4),
        at(158, "training_started", 2, step=91, age_ms=1000),
        at(199.5, "training_stopped", 2, step=130, age_ms=500, steps=40),
        at(200, "job_succeeded"),
    ]
    pool = [
        at(1, "job_admitted", job="j"),
        at(105.5, "job_requeued", job="j"),
        at(120, "job_evicted", job="other"),
        at(150, "job_admitted", job="j"),
        at(300, "job_evicted", job="j"),
    ]
    spans = goodput.pending_spans(pool, "j")
    assert spans == ((105_500, 150_000), (300_000, None))
    plain = goodput.account(events, now_ms=10**9)
    found = goodput.account(events, now_ms=10**9, pending=spans[:1])
    assert plain is not None and found is not None
    assert found.parts["queued"] == pytest.approx(44.5)
    assert found.reforms[0].detection_s == pytest.approx(plain.reforms[0].detection_s - 44.5)
    assert sum(found.parts.values()) == pytest.approx(found.wall_s)
    # still pending now: the tail after the last step is queued, not ending
    running = events[:4]
    now = goodput.account(running, now_ms=130_000, pending=((105_500, None),))
    assert now is not None and now.parts["queued"] == pytest.approx(130 - 105.5)
    assert sum(now.parts.values()) == pytest.approx(now.wall_s)


def test_a_requeued_job_whose_record_waited_for_nodes_meanwhile_counts_it_as_queued() -> None:
    """Requeued at 105.5: its agents left, and the one leading the record as it left announced
    generation 2 and found nobody eligible (`job_waiting` at 106). The pool's pending span
    (to 150) is queued, not waiting for nodes (CI saw 0.16 s queued of 1.6 s pending)."""
    events = [
        at(0, "generation_announced", 1, reason="node_joined"),
        at(2, "generation_started", 1, world_size=4),
        at(6, "training_started", 1, step=1, age_ms=1000),
        at(107, "training_stopped", 1, step=100, age_ms=2000, steps=100),
        at(105.8, "generation_announced", 2, reason="node_left"),
        at(106, "job_waiting", 2),
        at(151, "generation_announced", 3, reason="node_joined"),
        at(153, "generation_started", 3, world_size=4),
        at(158, "training_started", 3, step=91, age_ms=1000),
        at(199.5, "training_stopped", 3, step=130, age_ms=500, steps=40),
        at(200, "job_succeeded"),
    ]
    found = goodput.account(events, now_ms=10**9, pending=((105_500, 150_000),))
    assert found is not None
    assert found.parts["queued"] == pytest.approx(44.5)
    assert found.parts["waiting"] == pytest.approx(1.0)  # 150 -> 151: back, waiting for nodes
    assert sum(found.parts.values()) == pytest.approx(found.wall_s)


def test_a_job_below_its_target_world_trains_short_rank_hours() -> None:
    """Generation 1 ran 2 nodes of 2 ranks for a target of 3 nodes: 2 ranks short while it
    trained; generation 2 ran the 3 nodes."""
    events = [
        at(
            0,
            "generation_announced",
            1,
            reason="node_joined",
            members=["a", "b"],
            world_size=4,
            target_nodes=3,
        ),
        at(2, "generation_started", 1, world_size=4),
        at(6, "training_started", 1, step=1, age_ms=1000),
        at(
            106,
            "generation_announced",
            2,
            reason="node_joined",
            members=["a", "b"],
            members_more=1,
            world_size=6,
            target_nodes=3,
        ),
        at(107, "training_stopped", 1, step=100, age_ms=2000, steps=100),
        at(108, "generation_started", 2, world_size=6),
        at(113, "training_started", 2, step=101, age_ms=1000),
        at(199.5, "training_stopped", 2, step=190, age_ms=500, steps=90),
        at(200, "job_succeeded"),
    ]
    found = goodput.account(events, now_ms=10**9)
    assert found is not None
    assert found.short_rank_seconds == pytest.approx(100 * 2)  # 5 -> 105, 2 ranks short
    assert found.to_data()["short_rank_hours"] == pytest.approx(200 / 3600, abs=1e-4)
    assert found.rank_seconds == pytest.approx(100 * 4 + 87 * 6)


def test_show_labels_every_part() -> None:
    from nodeagent.cli.ctl.show import LABELS

    assert list(LABELS) == list(goodput.PARTS)
