"""Issue 51: a submitted job's persistent tier, a directory its submitter chose, is written as
the job's user, never as root. The agent's part runs with the shipped unit's privileges
(tests/helpers/unitcaps.py), the job's user is a real other user: the copy lands as that
user's files and older steps are pruned as that user; a directory of root's, or a link the user
planted towards one, is refused by the kernel, and nothing of root's is written."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeagent.channel import tier
from tests.helpers.unittiers import JOB, agent, as_worker, staged
from tests.helpers.unittiers import place as _place
from tests.helpers.users import User


@pytest.fixture
def place() -> Iterator[tuple[User, Path]]:
    with _place() as found:
        yield found


def saved(user: User, base: Path, step: int, slot: int) -> None:
    """The workers' save of `step` in their tier's `slot`, as they would have written it."""
    stage = staged(base, step)
    into = base / "shm" / f"n1.{JOB}" / "rank-0" / f"slot-{slot}"
    done = as_worker(user, f"rm -rf {into} && cp -r {stage} {into}")
    assert done.returncode == 0, done.stderr


def test_a_submitted_jobs_steps_are_copied_and_pruned_as_its_user(
    place: tuple[User, Path],
) -> None:
    user, base = place
    memory_dir = base / "shm"
    agent("prepare", memory_dir, user)
    as_worker(user, f"mkdir -p {memory_dir}/n1.{JOB}/rank-0")
    own = base / "own"
    own.mkdir(mode=0o700)
    os.chown(own, user.uid, user.gid)  # the submitter's own directory, closed to others
    root = own / "ckpt"  # made by the copy, as the user
    for step, slot in ((4, 0), (8, 1), (12, 0)):
        saved(user, base, step, slot)
        said = agent("settle", memory_dir, user, str(root))
        assert said == {"persisted": step, "problems": []}
    assert tier.steps(root) == [12, 8]  # two kept, as the keeper keeps them; step 4 pruned
    for path in [root, *root.rglob("*")]:
        assert (path.stat().st_uid, path.stat().st_gid) == (user.uid, user.gid), path
    read = as_worker(user, f"cat {root}/step-12/rank-0/__0_0.distcp > /dev/null")
    assert read.returncode == 0, read.stderr


def test_a_directory_the_user_may_not_write_is_refused_and_nothing_of_roots_is_touched(
    place: tuple[User, Path],
) -> None:
    """What the agent writing as root would have done: through the user's link, into root's
    directory (a file there could be /etc/cron.d's). Now the kernel refuses it as it refuses
    the user."""
    user, base = place
    memory_dir = base / "shm"
    agent("prepare", memory_dir, user)
    as_worker(user, f"mkdir -p {memory_dir}/n1.{JOB}/rank-0")
    saved(user, base, 4, 0)
    roots = base / "roots"
    roots.mkdir(mode=0o755)
    own = base / "own"
    own.mkdir(mode=0o755)
    os.chown(own, user.uid, user.gid)
    planted = as_worker(user, f"ln -s {roots} {own}/link")
    assert planted.returncode == 0, planted.stderr
    for target in (roots, own / "link", roots / "deeper"):
        said = agent("settle", memory_dir, user, str(target))
        assert said["persisted"] is None
        [problem] = said["problems"]
        assert "as the job's user" in problem and "Permission denied" in problem, problem
    assert list(roots.iterdir()) == []
