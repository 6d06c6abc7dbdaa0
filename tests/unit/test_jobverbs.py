"""pool/jobverbs.py: the rules nodeagentctl (pool.auth none) and the pool leader share, so that
both faces refuse the same thing in the same words."""

from __future__ import annotations

from typing import NamedTuple

import pytest

from nodeagent.pool import jobverbs

BOUNDS = "the target must be within [min_nodes, max_nodes] = [1, 6]"


@pytest.mark.parametrize(
    ("value", "target"), [("4", 4), (" +2", 5), ("-1", 2), ("+0", 3), ("1", 1), ("-2", 1)]
)
def test_a_target_is_n_or_relative_to_the_current_one(value: str, target: int) -> None:
    assert jobverbs.scale_target("llama", value, 3, 1, 6) == target


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("2.9", "scale: expected N, +N or -N, got '2.9'"),
        ("+x", "scale: expected N, +N or -N, got '+x'"),
        ("", "scale: expected N, +N or -N, got ''"),
        ("7", f"cannot scale job llama to 7: {BOUNDS}"),
        ("-3", f"cannot scale job llama to 0: {BOUNDS}"),
    ],
)
def test_a_target_that_cannot_be_says_why(value: str, why: str) -> None:
    assert jobverbs.scale_target("llama", value, 3, 1, 6) == why


def test_a_relative_target_of_garbage_is_none() -> None:
    assert jobverbs.relative_target("+2", 3) == 5
    assert jobverbs.relative_target("two", 3) is None


class Sized(NamedTuple):
    min_nodes: int
    max_nodes: int
    target_nodes: int


SPEC, RECORD = Sized(1, 6, 3), Sized(1, 6, 5)  # a scale moved the running job's target to 5


@pytest.mark.parametrize(
    ("pending", "record", "submitted", "plan"),
    [
        (False, RECORD, SPEC, (5, 6)),  # running: as its record says now
        (False, RECORD, None, (5, 6)),  # a pinned job that formed
        (False, None, SPEC, (3, 4)),  # a pinned job not formed yet: its config
        (True, RECORD, SPEC, (3, 4)),  # pending (requeued): its spec, not the old record
        (True, None, SPEC, (3, 4)),
    ],
)
def test_a_scale_is_planned_from_what_the_job_runs_by(
    pending: bool, record: Sized | None, submitted: Sized | None, plan: tuple[int, int]
) -> None:
    assert jobverbs.scale_plan("llama", "+1", pending, record, submitted) == plan


def test_a_scale_of_a_job_known_by_neither_record_nor_spec_says_so() -> None:
    found = jobverbs.scale_plan("llama", "+1", False, None, None)
    assert found == "job llama has not formed yet: nothing to scale"
    assert jobverbs.scale_plan("llama", "+4", False, RECORD, SPEC) == (
        f"cannot scale job llama to 9: {BOUNDS}"
    )
