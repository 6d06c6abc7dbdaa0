"""pool/lifecycle.py: reused ids and pruning of ended jobs, as table tests; the generated id."""

from __future__ import annotations

import argparse
from dataclasses import replace

import pytest

from nodeagent.cli.ctl.parser import parser as ctl_parser
from nodeagent.cli.ctl.submit import spec_from_args
from nodeagent.model.pool import PoolJob, PoolJobState
from nodeagent.pool.lifecycle import Pruning, Stopping, deadlines, prunable, unstale
from nodeagent.pool.schedule import JobView, NodeView, PoolView, SchedulePolicy, schedule
from nodeagent.state import JobState

NOW = 10_000_000
DAY = 86_400_000
S = PoolJobState


def status(state: PoolJobState, ended_ago: int | None = None, **more: object) -> PoolJob:
    ended = NOW - ended_ago if ended_ago is not None else None
    return PoolJob(state, seq=1, submitted_ms=0, ended_ms=ended, **more)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("jobs", "placed", "due"),
    [
        ({"old": status(S.SUCCEEDED, DAY)}, set(), ("old",)),
        ({"new": status(S.SUCCEEDED, DAY - 1)}, set(), ()),
        ({"f": status(S.FAILED, DAY), "c": status(S.CANCELLED, 2 * DAY)}, set(), ("c", "f")),
        ({"run": status(S.RUNNING)}, set(), ()),
        ({"wait": status(S.PENDING)}, set(), ()),
        ({"pin": status(S.SUCCEEDED, DAY, pinned=True)}, set(), ()),  # its nodes' job
        ({"held": status(S.SUCCEEDED, DAY)}, {"held"}, ()),  # a node still placed on it
        ({"odd": status(S.SUCCEEDED)}, set(), ()),  # no end time: never guessed
    ],
)
def test_ended_jobs_are_pruned_after_keep_ended(
    jobs: dict[str, PoolJob], placed: set[str], due: tuple[str, ...]
) -> None:
    assert prunable(jobs, placed, NOW, DAY) == due


def test_history_is_looked_at_once_per_minute_or_keep_ended_and_due_jobs_at_once() -> None:
    pruning = Pruning()
    assert pruning.due(NOW, DAY, ())  # never pruned yet
    pruning.last_ms = NOW
    assert not pruning.due(NOW + 59_999, DAY, ())
    assert pruning.due(NOW + 60_000, DAY, ())
    assert pruning.due(NOW + 3_000, 3_000, ())  # a short keep_ended: as often
    assert pruning.due(NOW + 1, DAY, ("old",))


def test_a_reused_id_is_admitted_as_new_once_its_keys_are_cleared() -> None:
    stale = JobView("again", status(S.PENDING, stale_keys=True), 1, 1, 1)
    plain = JobView("plain", status(S.PENDING), 1, 1, 1)
    view = PoolView(NOW, {}, {"again": stale, "plain": plain}, {})
    fresh_view, fresh = unstale(view)
    assert set(fresh) == {"again"} and not fresh["again"].stale_keys
    assert not fresh_view.jobs["again"].status.stale_keys
    assert fresh_view.jobs["plain"] is plain
    assert unstale(PoolView(NOW, {}, {"plain": plain}, {})) == (
        PoolView(NOW, {}, {"plain": plain}, {}),
        {},
    )


def submit_args(**given: object) -> argparse.Namespace:
    """`nodeagentctl submit -- python train.py` as the real parser reads it (the command after
    `--` is taken off before it), with `given`."""
    args = ctl_parser().parse_args(["submit"])
    args.argv = ["python", "train.py"]
    for key, value in given.items():
        setattr(args, key, value)
    return args


def test_a_submission_without_a_name_gets_a_new_id() -> None:
    spec = spec_from_args(submit_args(), "alice", "alice@h", new_id=lambda: "job-0000beef")
    assert spec.id == "job-0000beef"
    named = spec_from_args(submit_args(name="llama"), "alice", "a", new_id=lambda: "unused")
    assert named.id == "llama"
    generated = {spec_from_args(submit_args(), "alice", "a").id for _ in range(20)}
    assert len(generated) == 20 and all(g.startswith("job-") for g in generated)


def limited(ran_ms: int, **status: object) -> JobView:
    admitted = NOW - ran_ms
    running = PoolJob(S.RUNNING, seq=1, submitted_ms=0, admitted_ms=admitted, **status)  # type: ignore[arg-type]
    return JobView("lim", running, 1, 1, 1, time_limit_ms=60_000, signal=("USR1", 10_000))


@pytest.mark.parametrize(
    ("job", "sent"),
    [
        (limited(49_999), None),  # before the signal
        (limited(50_000), ("USR1", "SIGUSR1 sent 10s before its time limit of 1m")),
        (limited(55_000, signalled_ms=NOW - 5_000), None),  # sent once
        (limited(60_000, signalled_ms=NOW - 10_000), (None, "time limit of 1m reached")),
        (limited(61_000), (None, "time limit of 1m reached")),  # late: the stop alone
        (limited(70_000, time_up_ms=NOW - 10_000), None),  # stopped once
        (replace(limited(70_000), time_limit_ms=None), None),  # no limit
        (replace(limited(70_000), signal=None), (None, "time limit of 1m reached")),
    ],
)
def test_a_time_limit_signals_before_and_stops_at_the_limit(
    job: JobView, sent: tuple[str | None, str] | None
) -> None:
    view, statuses, due = deadlines(PoolView(NOW, {}, {"lim": job}, {}))
    if sent is None:
        assert (statuses, due) == ({}, ()) and view.jobs["lim"] is job
        return
    signal, reason = sent
    assert [(d.signal, d.reason.split(":")[0]) for d in due] == [(signal, reason)]
    status = statuses["lim"]
    assert (status.signalled_ms == NOW) is (signal is not None)
    assert (status.time_up_ms == NOW) is (signal is None)
    assert view.jobs["lim"].status == status


def test_a_job_stopped_at_its_limit_ends_as_timeout_not_cancelled() -> None:
    job = replace(limited(61_000, time_up_ms=NOW - 1_000), record_state=JobState.STOPPED)
    done = schedule(PoolView(NOW, {}, {"lim": job}, {}), SchedulePolicy())
    assert done.jobs["lim"].state is S.TIMEOUT
    assert done.jobs["lim"].reason == "time limit of 1m reached"
    running = replace(job, record_state=JobState.RUNNING)  # still stopping: not yet
    assert "lim" not in schedule(PoolView(NOW, {}, {"lim": running}, {}), SchedulePolicy()).jobs
    succeeded = replace(job, record_state=JobState.SUCCEEDED)  # it finished within its grace
    ended = schedule(PoolView(NOW, {}, {"lim": succeeded}, {}), SchedulePolicy()).jobs["lim"]
    assert ended.state is S.SUCCEEDED


def test_a_held_job_is_not_admitted_and_holds_back_nothing() -> None:
    first = JobView("first", PoolJob(S.PENDING, seq=1, submitted_ms=0), 1, 1, 1, held="alice")
    second = JobView("second", PoolJob(S.PENDING, seq=2, submitted_ms=0), 1, 1, 1)
    view = PoolView(NOW, {"a": NodeView("a")}, {"first": first, "second": second}, {})
    done = schedule(view, SchedulePolicy())
    assert done.placements == {"a": "second"}
    assert done.jobs["first"].reason == "held by alice: `nodeagentctl release first` lets it go"


def test_a_requeued_job_leaves_its_nodes_and_keeps_its_place_while_they_stop() -> None:
    status = PoolJob(S.RUNNING, seq=1, submitted_ms=0, admitted_ms=NOW - 1)
    running = JobView(
        "rq", status, 1, 1, 1, record_state=JobState.RUNNING, members=("a",), requeue="bob"
    )
    behind = JobView("behind", PoolJob(S.PENDING, seq=2, submitted_ms=0), 1, 1, 1)
    nodes = {"a": NodeView("a", serving="rq")}
    view = PoolView(NOW, nodes, {"rq": running, "behind": behind}, {"a": "rq"})
    done = schedule(view, SchedulePolicy())
    assert done.placements == {}  # its node leaves it; nothing behind takes it meanwhile
    assert done.jobs["rq"].state is S.PENDING and done.jobs["rq"].seq == 1
    assert done.jobs["rq"].reason == "waiting for its workers to stop on a"
    assert done.jobs["behind"].reason == "waiting: nodes are held for rq, pending longer"
    stopped = replace(done.jobs["rq"], reason="")  # its workers stopped: it runs again first
    again = PoolView(
        NOW,
        {"a": NodeView("a")},
        {"rq": replace(running, status=stopped, requeue=None), "behind": behind},
        {},
    )
    assert schedule(again, SchedulePolicy()).placements == {"a": "rq"}


def test_node_time_is_counted_at_every_change_of_a_job_s_node_count() -> None:
    hour = 3_600_000
    status = PoolJob(
        S.RUNNING, seq=1, submitted_ms=0, admitted_ms=NOW - hour, accounted_ms=NOW - hour
    )
    status = replace(status, peak_nodes=2)
    job = JobView("acc", status, 1, 2, 2, record_state=JobState.SUCCEEDED, members=("a", "b"))
    nodes = {"a": NodeView("a"), "b": NodeView("b")}
    ended = schedule(PoolView(NOW, nodes, {"acc": job}, {"a": "acc", "b": "acc"}), SchedulePolicy())
    done = ended.jobs["acc"]
    assert (done.state, done.node_ms, done.accounted_ms) == (S.SUCCEEDED, 2 * hour, NOW)
    fresh = JobView("new", PoolJob(S.PENDING, seq=2, submitted_ms=0), 2, 2, 2)
    admitted = schedule(PoolView(NOW, nodes, {"new": fresh}, {}), SchedulePolicy()).jobs["new"]
    assert (admitted.node_ms, admitted.accounted_ms, admitted.peak_nodes) == (0, NOW, 2)


def test_submit_takes_torchrun_s_and_slurm_s_spellings_too() -> None:
    args = ctl_parser().parse_args(
        ["submit", "--nnodes", "2-4", "--working-dir", "/shared/w", "--parsable"]
    )
    args.argv = ["python", "train.py"]
    spec = spec_from_args(args, "alice", "a", new_id=lambda: "job-00000001")
    assert (spec.job.min_nodes, spec.job.max_nodes, spec.job.working_dir) == (2, 4, "/shared/w")
    plain = ctl_parser().parse_args(["submit", "--nodes", "3"])
    plain.argv = ["x"]
    assert spec_from_args(plain, "a", "a").job.max_nodes == 3


def test_gpu_time_counts_the_units_a_job_asked_for_or_every_unit_of_its_whole_nodes() -> None:
    hour = 3_600_000
    status = PoolJob(
        S.RUNNING, seq=1, submitted_ms=0, admitted_ms=NOW - hour, accounted_ms=NOW - hour
    )
    nodes = {"a": NodeView("a", gpus=8), "b": NodeView("b", gpus=4)}
    placed = {"a": "j", "b": "j"}
    for asked, exclusive, gpu_hours in ((2, False, 4), (None, False, 12), (2, True, 12)):
        job = JobView(
            "j",
            status,
            1,
            2,
            2,
            record_state=JobState.SUCCEEDED,
            gpus_per_node=asked,
            exclusive=exclusive,
        )
        ended = schedule(PoolView(NOW, nodes, {"j": job}, placed), SchedulePolicy()).jobs["j"]
        assert (ended.gpu_ms, ended.node_ms) == (gpu_hours * hour, 2 * hour)
    fresh = JobView("new", PoolJob(S.PENDING, seq=2, submitted_ms=0), 2, 2, 2, gpus_per_node=3)
    admitted = schedule(PoolView(NOW, nodes, {"new": fresh}, {}), SchedulePolicy()).jobs["new"]
    assert (admitted.peak_gpus, admitted.peak_nodes, admitted.gpu_ms) == (6, 2, 0)


def test_a_job_sharing_nodes_is_charged_the_units_it_holds_on_each() -> None:
    hour = 3_600_000
    status = PoolJob(
        S.RUNNING, seq=1, submitted_ms=0, admitted_ms=NOW - hour, accounted_ms=NOW - hour
    )
    job = JobView("j", status, 1, 2, 2, record_state=JobState.SUCCEEDED, gpus_per_node=3)
    nodes = {"a": NodeView("a", gpus=8), "b": NodeView("b", gpus=8)}
    shares = {"a": {"j": 3, "k": 5}, "b": {"j": 3}}
    ended = schedule(PoolView(NOW, nodes, {"j": job}, {}, shares=shares), SchedulePolicy())
    assert (ended.jobs["j"].gpu_ms, ended.jobs["j"].node_ms) == (6 * hour, 2 * hour)
    assert ended.shares == {}  # its end frees both (k is not a job of this view: not kept)


def test_a_cancelled_running_job_is_told_to_stop_once_a_term_and_again_once_readmitted() -> None:
    """Stopping: the leader, not whoever asked, tells a cancelled running job to stop (a cancel
    written while the job looked pending may meet the round that admitted it)."""
    running = status(S.RUNNING, admitted_ms=NOW)

    def job(job_id: str, record: JobState | None, **changes: object) -> JobView:
        base = JobView(job_id, running, 1, 1, 1, cancel="alice", record_state=record)
        return replace(base, **changes)  # type: ignore[arg-type]

    jobs = [
        job("told", JobState.RUNNING),
        job("restarting", JobState.RESTARTING),
        job("unformed", None),  # schedule() ends it at once: nothing to tell
        job("stopped", JobState.STOPPED),
        job("uncancelled", JobState.RUNNING, cancel=None),
        job("pending", JobState.RUNNING, status=status(S.PENDING)),
        job("pinned", JobState.RUNNING, status=status(S.RUNNING, pinned=True)),
    ]
    view = PoolView(NOW, {}, {j.id: j for j in jobs}, {})
    stopping = Stopping()
    due = stopping.due(view)
    assert [j.id for j in due] == ["told", "restarting"]
    stopping.sent(due[0])
    assert [j.id for j in stopping.due(view)] == ["restarting"]  # not told twice
    again = job("told", JobState.RUNNING, status=status(S.RUNNING, admitted_ms=NOW + 1))
    readmitted = replace(view, jobs={"told": again})
    assert [j.id for j in stopping.due(readmitted)] == ["told"]  # requeued, admitted, cancelled
    assert stopping.told == frozenset()  # what no longer needs telling is forgotten
