"""Dependencies with Slurm's meanings (model/depend.py), and the scheduler holding to them
(schedule(), pure): a job waits, saying for what; is admitted in the very round its parent's
success is recorded; and ends when its dependency can never hold."""

from __future__ import annotations

from dataclasses import replace

import pytest

from nodeagent.model import depend
from nodeagent.model.depend import Dependency, DependencyError
from nodeagent.model.pool import PoolJob, PoolJobState
from nodeagent.model.spec import load_spec
from nodeagent.pool.schedule import JobView, NodeView, PoolView, SchedulePolicy, schedule
from nodeagent.state import JobState

NOW = 10_000_000
PENDING, RUNNING = PoolJobState.PENDING, PoolJobState.RUNNING


def test_slurms_spellings_parse_and_come_back_as_written() -> None:
    found = depend.parse("afterok:pre:tok,afterany:eval,afternotok:x,singleton")
    assert found == (
        Dependency("afterok", ("pre", "tok")),
        Dependency("afterany", ("eval",)),
        Dependency("afternotok", ("x",)),
        Dependency("singleton"),
    )
    assert depend.text(found) == "afterok:pre:tok,afterany:eval,afternotok:x,singleton"
    assert depend.named(found) == ["pre", "tok", "eval", "x"]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("after:a", "unknown kind 'after'"),
        ("afterok", "singleton names no job, the others at least one"),
        ("singleton:a", "singleton names no job"),
        ("afterok:a?afterok:b", "any-of (`?`) is not taken"),
        ("afterok:a b", "'a b' is not a job id"),
        ("afterok:" + ":".join(f"j{i}" for i in range(101)), "more than 100 jobs"),
    ],
)
def test_what_is_not_a_dependency_is_refused_saying_what_would_be(text: str, words: str) -> None:
    with pytest.raises(DependencyError) as caught:
        depend.parse(text)
    assert (words in str(caught.value) and "expected afterok:ID" in str(caught.value)) or (
        "more than" in words
    )


def test_a_spec_carries_its_dependency_and_name_and_refuses_a_wrong_one() -> None:
    doc = {"id": "c", "entrypoint": ["x"], "user": "alice", "dependency": "afterok:a,singleton"}
    spec = load_spec({**doc, "name": "nightly"})
    assert spec.dependency == depend.parse("afterok:a,singleton") and spec.name == "nightly"
    assert load_spec(spec.to_dict()) == spec
    with pytest.raises(Exception, match="dependency: 'afterok:': '' is not a job id; expected"):
        load_spec({**doc, "dependency": "afterok:"})


def job(
    id: str,
    state: PoolJobState = PENDING,
    *,
    seq: int,
    after: str = "",
    record: JobState | None = None,
    user: str = "alice",
    name: str = "",
) -> JobView:
    admitted = NOW - 1000 if state is RUNNING else None
    status = PoolJob(state, seq=seq, submitted_ms=NOW - 5000, admitted_ms=admitted)
    return JobView(
        id, status, 1, 1, 1, record_state=record, dependency=depend.parse(after) if after else (),
        user=user, name=name or id, members=("n1",) if state is RUNNING else (),
    )  # fmt: skip


def round_of(*jobs: JobView, ended: dict[str, PoolJobState] | None = None) -> dict[str, PoolJob]:
    nodes = {n: NodeView(n) for n in ("n1", "n2", "n3")}
    placements = {j.members[0]: j.id for j in jobs if j.status.state is RUNNING}
    view = PoolView(NOW, nodes, {j.id: j for j in jobs}, placements, ended=ended or {})
    decided = schedule(view, SchedulePolicy())
    return {j.id: decided.jobs.get(j.id, j.status) for j in jobs}


def test_a_job_waits_for_its_parent_saying_so_and_starts_in_the_round_its_success_is_recorded() -> (
    None
):
    parent = job("pre", RUNNING, seq=1, record=JobState.RUNNING)
    child = job("eval", seq=2, after="afterok:pre")
    found = round_of(parent, child)
    assert found["eval"].state is PENDING
    assert found["eval"].reason == "waits for pre to succeed (afterok)"
    parent = job("pre", RUNNING, seq=1, record=JobState.SUCCEEDED)  # its record succeeded
    found = round_of(parent, child)
    assert found["pre"].state is PoolJobState.SUCCEEDED
    assert found["eval"].state is RUNNING  # the same round


def test_a_dependency_that_can_never_hold_ends_the_job_saying_why() -> None:
    failed = {"pre": PoolJobState.FAILED, "ok": PoolJobState.SUCCEEDED}
    found = round_of(
        job("eval", seq=2, after="afterok:pre"),
        job("cleanup", seq=3, after="afternotok:ok"),
        job("report", seq=4, after="afterany:pre"),
        job("alert", seq=5, after="afternotok:pre"),
        job("orphan", seq=6, after="afterok:gone"),
        ended=failed,
    )
    assert found["eval"].state is PoolJobState.CANCELLED
    assert found["eval"].reason == (
        "dependency never satisfied: pre failed, and it waited for its success"
    )
    assert found["cleanup"].state is PoolJobState.CANCELLED
    assert "ok succeeded, and it waited for its failure" in found["cleanup"].reason
    assert found["report"].state is RUNNING and found["alert"].state is RUNNING
    assert found["orphan"].state is PoolJobState.CANCELLED
    assert "gone is no longer known to the pool" in found["orphan"].reason


def test_singleton_runs_one_job_of_a_user_and_name_at_a_time_in_submission_order() -> None:
    found = round_of(
        job("night-1", RUNNING, seq=1, record=JobState.RUNNING, name="nightly"),
        job("night-2", seq=2, after="singleton", name="nightly"),
        job("bobs", seq=3, after="singleton", name="nightly", user="bob"),
    )
    assert found["night-2"].state is PENDING
    assert found["night-2"].reason == "waits for night-1 to end (singleton)"
    assert found["bobs"].state is RUNNING  # another user's namesake does not count


def test_a_waiting_dependent_holds_no_nodes_back_from_the_jobs_behind_it() -> None:
    parent = job("pre", RUNNING, seq=1, record=JobState.RUNNING)
    found = round_of(parent, job("eval", seq=2, after="afterok:pre"), job("other", seq=3))
    assert found["eval"].state is PENDING and found["other"].state is RUNNING


def test_a_dependency_names_the_run_it_was_bound_to_not_whoever_takes_its_id_later() -> None:
    """alice's eval waits for pre, run 1, which succeeded; bob then submitted a job under the
    ended id pre (run 5) and cancelled it: eval still runs, on run 1's success (from the pool's
    history), and bob's run 5 changes nothing. Unbound (run not known): the newest run."""
    bobs = job("pre", PoolJobState.CANCELLED, seq=5, user="bob")
    bound = replace(job("eval", seq=6, after="afterok:pre"), dependency_runs={"pre": 1})
    nodes = {n: NodeView(n) for n in ("n1", "n2")}
    view = PoolView(
        NOW, nodes, {j.id: j for j in (bobs, bound)}, {},
        runs={"pre:1": PoolJobState.SUCCEEDED, "pre:5": PoolJobState.CANCELLED},
    )  # fmt: skip
    decided = schedule(view, SchedulePolicy())
    assert decided.jobs["eval"].state is RUNNING
    forgotten = replace(bound, dependency_runs={"pre": 0})  # pruned from the history
    view = PoolView(NOW, nodes, {j.id: j for j in (bobs, forgotten)}, {}, runs={})
    ended = schedule(view, SchedulePolicy()).jobs["eval"]
    assert ended.state is PoolJobState.CANCELLED and "pre is no longer known" in ended.reason


def test_an_arrays_id_waits_for_all_its_tasks_as_slurm_does() -> None:
    """afterok on an array: once every task succeeded; afternotok: once all ended and one did
    not succeed; afterany: once all ended. Its tasks are bound at submission (depend.ARRAY)."""
    runs = {"sweep": depend.ARRAY, "sweep_0": 1, "sweep_1": 2}
    ok = replace(job("eval", seq=5, after="afterok:sweep"), dependency_runs=runs)
    not_ok = replace(job("alert", seq=6, after="afternotok:sweep"), dependency_runs=runs)
    nodes = {n: NodeView(n) for n in ("n1", "n2", "n3")}

    def decide(*tasks: PoolJobState) -> dict[str, PoolJob]:
        ran = {f"sweep_{i}:{i + 1}": state for i, state in enumerate(tasks) if state.ended}
        live = [
            job(f"sweep_{i}", state, seq=i + 1, record=JobState.RUNNING)
            for i, state in enumerate(tasks)
            if not state.ended
        ]
        jobs = {j.id: j for j in (*live, ok, not_ok)}
        placements = {f"n{i + 1}": j.id for i, j in enumerate(live)}
        view = PoolView(NOW, nodes, jobs, placements, runs=ran)
        decided = schedule(view, SchedulePolicy())
        return {j: decided.jobs.get(j, jobs[j].status) for j in ("eval", "alert")}

    waiting = decide(PoolJobState.SUCCEEDED, RUNNING)
    assert waiting["eval"].state is PENDING
    assert waiting["eval"].reason == "waits for sweep to succeed (afterok)"
    done = decide(PoolJobState.SUCCEEDED, PoolJobState.SUCCEEDED)
    assert done["eval"].state is RUNNING
    assert done["alert"].state is PoolJobState.CANCELLED
    assert "sweep succeeded, and it waited for its failure" in done["alert"].reason
    one_failed = decide(PoolJobState.SUCCEEDED, PoolJobState.FAILED)
    assert one_failed["alert"].state is RUNNING
    assert one_failed["eval"].state is PoolJobState.CANCELLED
    assert depend.array_state([]) is None and depend.array_state([None]) is None
    assert depend.tasks_of("sweep", {"sweep_10": 3, "sweep_2": 2, "sweep_x": 1, "sweep": -1}) == [
        "sweep_2", "sweep_10",
    ]  # fmt: skip
