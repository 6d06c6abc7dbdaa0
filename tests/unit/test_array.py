"""Job arrays (model/array.py): Slurm's index spellings, one job per task with its variables,
and the scheduler holding an array to its limit of running tasks (schedule(), pure)."""

from __future__ import annotations

import pytest

from nodeagent.errors import ConfigError
from nodeagent.model import array
from nodeagent.model.array import ArrayError
from nodeagent.model.pool import PoolJob, PoolJobState
from nodeagent.model.spec import array_tasks, load_spec
from nodeagent.pool.schedule import JobView, NodeView, PoolView, SchedulePolicy, schedule
from nodeagent.state import JobState

NOW = 10_000_000


@pytest.mark.parametrize(
    ("text", "indices", "limit"),
    [
        ("0-3", (0, 1, 2, 3), None),
        ("0-999%50", tuple(range(1000)), 50),
        ("1,3,8-11", (1, 3, 8, 9, 10, 11), None),
        ("0-20:5%2", (0, 5, 10, 15, 20), 2),
        ("3,1,3", (1, 3), None),
    ],
)
def test_slurms_spellings_give_the_tasks_in_order_each_once(
    text: str, indices: tuple[int, ...], limit: int | None
) -> None:
    found = array.parse(text)
    assert (found.indices, found.limit) == (indices, limit)
    assert array.parse(str(found)) == found


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "'' is not an index or a range"),
        ("5-1", "empty or out of bounds"),
        ("0-9%0", "a whole number of tasks, 1 or more"),
        ("0-20:0", "empty or out of bounds"),
        ("a-b", "expected indices such as 0-999"),
        ("0-1001", "more than 1001 tasks"),
    ],
)
def test_what_is_not_an_array_is_refused_saying_why(text: str, words: str) -> None:
    with pytest.raises(ArrayError, match=words):
        array.parse(text)


def test_each_task_is_a_job_of_its_own_with_slurms_variables_and_comes_back_from_redis() -> None:
    spec = load_spec({"id": "sweep", "entrypoint": ["x"], "user": "alice", "array": "0-2,7%2"})
    tasks = array_tasks(spec)
    assert [t.id for t in tasks] == ["sweep_0", "sweep_1", "sweep_2", "sweep_7"]
    env = tasks[3].job.env
    assert env["NODEAGENT_ARRAY_TASK_ID"] == env["SLURM_ARRAY_TASK_ID"] == "7"
    assert env["SLURM_ARRAY_JOB_ID"] == "sweep" and env["SLURM_ARRAY_TASK_COUNT"] == "4"
    assert (env["SLURM_ARRAY_TASK_MIN"], env["SLURM_ARRAY_TASK_MAX"]) == ("0", "7")
    assert all(t.array is None and t.array_task is not None for t in tasks)
    assert load_spec(tasks[3].to_dict(), submitted=True) == tasks[3]


def test_a_user_cannot_write_a_task_of_someone_elses_array_into_a_spec() -> None:
    task = array_tasks(load_spec({"id": "s", "entrypoint": ["x"], "user": "a", "array": "0"}))[0]
    with pytest.raises(ConfigError, match="array_task"):
        load_spec(task.to_dict())  # only what the pool stored carries it
    with pytest.raises(ConfigError, match="over 63 characters"):
        load_spec({"id": "x" * 60, "entrypoint": ["x"], "user": "a", "array": "0-999"})


def task(index: int, state: PoolJobState, limit: int | None = 2) -> JobView:
    running = state is PoolJobState.RUNNING
    status = PoolJob(state, seq=index + 1, submitted_ms=NOW, admitted_ms=NOW if running else None)
    return JobView(
        f"sweep_{index}", status, 1, 1, 1, array="sweep", array_limit=limit,
        record_state=JobState.RUNNING if running else None,
        members=(f"n{index}",) if running else (),
    )  # fmt: skip


def test_an_array_runs_no_more_tasks_at_once_than_its_limit_and_the_next_waits_saying_so() -> None:
    jobs = [task(0, PoolJobState.RUNNING), *(task(i, PoolJobState.PENDING) for i in (1, 2, 3))]
    nodes = {f"n{i}": NodeView(f"n{i}") for i in range(6)}
    view = PoolView(NOW, nodes, {j.id: j for j in jobs}, {"n0": "sweep_0"})
    decided = schedule(view, SchedulePolicy())
    states = {j.id: decided.jobs.get(j.id, j.status) for j in jobs}
    assert [states[f"sweep_{i}"].state for i in range(4)] == [
        PoolJobState.RUNNING, PoolJobState.RUNNING, PoolJobState.PENDING, PoolJobState.PENDING,
    ]  # fmt: skip
    assert states["sweep_2"].reason == "array sweep runs 2 tasks at once, its limit"
    unlimited = [task(i, PoolJobState.PENDING, limit=None) for i in range(4)]
    view = PoolView(NOW, nodes, {j.id: j for j in unlimited}, {})
    assert len(set(schedule(view, SchedulePolicy()).placements.values())) == 4
