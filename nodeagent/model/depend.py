"""A job's dependencies, with Slurm's meanings (`sbatch --dependency`). Pure.

    afterok:ID[:ID...]     once every named job has succeeded
    afterany:ID[:ID...]    once every named job has ended, however
    afternotok:ID[:ID...]  once every named job has ended without succeeding (failed,
                           cancelled, timed out)
    singleton              once no job of the same user and name submitted before it is
                           pending or running

An ID may be a job array's (model/array.py), as in Slurm: its tasks taken together, which have
all succeeded once every one has, have ended once every one has, and have failed once every
one has ended and one did not succeed (`array_state`).

Several, comma-separated, must all hold (Slurm's `,`; its `?`, any of them, is not taken). A
dependency that can no longer hold (afterok on a job that failed, afternotok on one that
succeeded, a job the pool no longer knows) never will: the job ends saying so, as Slurm's
`kill_invalid_depend` ends it, instead of waiting for ever.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from nodeagent.model.pool import PoolJobState

KINDS = ("afterok", "afterany", "afternotok", "singleton")
ARRAY = -1  # an array's id in a spec's dependency_runs: its tasks are bound there, each to its run
MAX_JOBS = 100  # job ids one spec names, all kinds together
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
HINT = "expected afterok:ID[:ID...], afterany:..., afternotok:... or singleton, comma-separated"


class DependencyError(ValueError):
    """A dependency that is not one (said in words a user can act on)."""


@dataclass(frozen=True)
class Dependency:
    kind: str
    jobs: tuple[str, ...] = ()

    def __str__(self) -> str:
        return ":".join((self.kind, *self.jobs))


def parse(text: str) -> tuple[Dependency, ...]:
    """Raises: DependencyError."""
    found: list[Dependency] = []
    for part in (p.strip() for p in text.split(",")):
        kind, *jobs = part.split(":")
        if "?" in part:
            raise DependencyError(f"{part!r}: any-of (`?`) is not taken; {HINT}")
        if kind not in KINDS:
            raise DependencyError(f"{part!r}: unknown kind {kind!r}; {HINT}")
        if (kind == "singleton") != (not jobs):
            raise DependencyError(
                f"{part!r}: singleton names no job, the others at least one; {HINT}"
            )
        bad = [j for j in jobs if not _ID.match(j)]
        if bad:
            raise DependencyError(f"{part!r}: {bad[0]!r} is not a job id; {HINT}")
        found.append(Dependency(kind, tuple(dict.fromkeys(jobs))))
    if sum(len(d.jobs) for d in found) > MAX_JOBS:
        raise DependencyError(f"more than {MAX_JOBS} jobs named")
    return tuple(found)


def text(dependencies: Iterable[Dependency]) -> str:
    return ",".join(str(d) for d in dependencies)


def named(dependencies: Iterable[Dependency]) -> list[str]:
    """The job ids the dependencies name, each once."""
    return list(dict.fromkeys(j for d in dependencies for j in d.jobs))


@dataclass(frozen=True)
class Verdict:
    """ready: it may start; else `why` it waits, or (`never`) why it never will."""

    ready: bool
    why: str = ""
    never: bool = False


READY = Verdict(True)


def verdict(
    dependencies: Iterable[Dependency],
    state_of: Callable[[str], PoolJobState | None],
    earlier_namesakes: Callable[[], list[str]],
) -> Verdict:
    """Whether a job's dependencies hold. `state_of(id)`: the named job's pool state now (None:
    the pool does not know it); `earlier_namesakes()`: the pending or running jobs of the same
    user and name submitted before it (asked only for singleton)."""
    waits: list[str] = []
    for dep in dependencies:
        if dep.kind == "singleton":
            before = earlier_namesakes()
            if before:
                waits.append(f"{', '.join(before[:3])} to end (singleton)")
            continue
        for job in dep.jobs:
            state = state_of(job)
            if state is None:
                return Verdict(False, f"{job} is no longer known to the pool ({dep})", True)
            if not state.ended:
                goal = "succeed" if dep.kind == "afterok" else "end"
                waits.append(f"{job} to {goal} ({dep.kind})")
            elif dep.kind == "afterok" and state is not PoolJobState.SUCCEEDED:
                return Verdict(False, f"{job} {state.value}, and it waited for its success", True)
            elif dep.kind == "afternotok" and state is PoolJobState.SUCCEEDED:
                return Verdict(False, f"{job} succeeded, and it waited for its failure", True)
    if waits:
        return Verdict(False, "waits for " + "; ".join(waits[:3]) + _more(len(waits) - 3))
    return READY


def tasks_of(array_id: str, runs: Mapping[str, int]) -> list[str]:
    """The tasks of array `array_id` a spec's dependency_runs binds (ARRAY_T), in index order."""
    prefix = array_id + "_"
    found = [k for k in runs if k.startswith(prefix) and k[len(prefix) :].isdigit()]
    return sorted(found, key=lambda k: int(k[len(prefix) :]))


def array_state(states: Iterable[PoolJobState | None]) -> PoolJobState | None:
    """An array's state as a dependency sees it, from its tasks' (None: a task the pool no
    longer knows, or no task): pending while one has not ended; then succeeded if every one
    did, else failed."""
    found = list(states)
    if not found or any(s is None for s in found):
        return None
    if any(s is not None and not s.ended for s in found):
        return PoolJobState.PENDING
    if all(s is PoolJobState.SUCCEEDED for s in found):
        return PoolJobState.SUCCEEDED
    return PoolJobState.FAILED


def _more(count: int) -> str:
    return f" and {count} more" if count > 0 else ""
