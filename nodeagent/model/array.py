"""Job arrays, as `sbatch --array` makes them. Pure.

    0-999%50     tasks 0 to 999, at most 50 running at once
    1,3,8-11     tasks 1, 3, 8, 9, 10, 11
    0-20:5       tasks 0, 5, 10, 15, 20 (a step)

One submission makes one job per task, with its own id `JOB_T`, recovery, history and place
in the queue (`tasks`); each knows its array (`ArrayTask`), and its workers get
NODEAGENT_ARRAY_JOB_ID and NODEAGENT_ARRAY_TASK_ID (with _COUNT, _MIN, _MAX), and the SLURM_
variables of the same names, so a Slurm array script reads its index unchanged.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

MAX_TASKS = 1001  # one array's tasks at most: Slurm's default MaxArraySize (one request's
# writes and the pool round's work stay bounded: bench/array.py)
MAX_INDEX = 9_999_999
_RANGE = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")
HINT = "expected indices such as 0-999, 1,3,8-11 or 0-20:5, optionally with %LIMIT (0-999%50)"


class ArrayError(ValueError):
    """An array that is not one (said in words a user can act on)."""


@dataclass(frozen=True)
class Array:
    """What `--array` asks for: the task indices, in order, each once, and how many may run
    at once (None: no limit)."""

    indices: tuple[int, ...]
    limit: int | None = None

    def __str__(self) -> str:
        return _spelled(self.indices) + (f"%{self.limit}" if self.limit is not None else "")


@dataclass(frozen=True)
class ArrayTask:
    """One task of an array: the array's id, its index, and the array's bounds."""

    job: str
    index: int
    count: int
    first: int
    last: int
    limit: int | None = None

    def env(self) -> dict[str, str]:
        values = {
            "ARRAY_JOB_ID": self.job,
            "ARRAY_TASK_ID": str(self.index),
            "ARRAY_TASK_COUNT": str(self.count),
            "ARRAY_TASK_MIN": str(self.first),
            "ARRAY_TASK_MAX": str(self.last),
        }
        return {f"{p}_{k}": v for p in ("NODEAGENT", "SLURM") for k, v in values.items()}

    def to_doc(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def task_id(job: str, index: int) -> str:
    return f"{job}_{index}"


def parse(text: str) -> Array:
    """Raises: ArrayError."""
    spec, _, limit_text = text.strip().partition("%")
    limit: int | None = None
    if limit_text:
        if not limit_text.isdigit() or int(limit_text) < 1:
            raise ArrayError(f"{text!r}: the limit after % is a whole number of tasks, 1 or more")
        limit = int(limit_text)
    found: dict[int, None] = {}
    for part in spec.split(","):
        match = _RANGE.match(part.strip())
        if match is None:
            raise ArrayError(f"{text!r}: {part!r} is not an index or a range; {HINT}")
        low = int(match[1])
        high = int(match[2]) if match[2] is not None else low
        step = int(match[3]) if match[3] is not None else 1
        if high < low or step < 1 or high > MAX_INDEX:
            raise ArrayError(f"{text!r}: {part!r} is empty or out of bounds (0-{MAX_INDEX})")
        if (high - low) // step + 1 + len(found) > MAX_TASKS:
            raise ArrayError(f"{text!r}: more than {MAX_TASKS} tasks")
        found.update(dict.fromkeys(range(low, high + 1, step)))
    return Array(tuple(sorted(found)), limit)


def task_of(job: str, array: Array, index: int) -> ArrayTask:
    return ArrayTask(
        job, index, len(array.indices), array.indices[0], array.indices[-1], array.limit
    )


def _spelled(indices: tuple[int, ...]) -> str:
    """The indices as ranges (0-3,7), the way they read back."""
    parts: list[str] = []
    start = prev = indices[0] if indices else 0
    for i in indices[1:]:
        if i != prev + 1:
            parts.append(f"{start}-{prev}" if prev > start else f"{start}")
            start = i
        prev = i
    if indices:
        parts.append(f"{start}-{prev}" if prev > start else f"{start}")
    return ",".join(parts)
