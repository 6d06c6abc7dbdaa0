"""pool/lifecycle.py: reused ids and pruning of ended jobs, as table tests; the generated id."""

from __future__ import annotations

import argparse

import pytest

from nodeagent.cli.ctlpool import spec_from_args
from nodeagent.model.pool import PoolJob, PoolJobState
from nodeagent.pool.lifecycle import Pruning, prunable, unstale
from nodeagent.pool.schedule import JobView, PoolView

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
    args: dict[str, object] = {
        "spec": None,
        "argv": ["python", "train.py"],
        "name": None,
        "nodes": None,
        "nproc_per_node": None,
        "workdir": None,
        "user": None,
        "queue": None,
        "priority": None,
        "max_restarts": None,
        "recovery": None,
        "preemptible": None,
        "selector": [],
        "env": [],
    }
    args.update(given)
    return argparse.Namespace(**args)


def test_a_submission_without_a_name_gets_a_new_id() -> None:
    spec = spec_from_args(submit_args(), "alice", "alice@h", new_id=lambda: "job-0000beef")
    assert spec.id == "job-0000beef"
    named = spec_from_args(submit_args(name="llama"), "alice", "a", new_id=lambda: "unused")
    assert named.id == "llama"
    generated = {spec_from_args(submit_args(), "alice", "a").id for _ in range(20)}
    assert len(generated) == 20 and all(g.startswith("job-") for g in generated)
