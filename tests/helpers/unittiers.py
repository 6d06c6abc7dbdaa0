"""The root agent's part of a job's checkpoint tiers run with the shipped unit's privileges
(tests/helpers/tieragent.py under tests/helpers/unitcaps.py), and its workers' part as a real
other user: what tests/integration/test_unit_privileges.py and test_persist_as_user.py share."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.helpers.tiers import fake_save
from tests.helpers.unitcaps import unit_prefix
from tests.helpers.users import User, reachable_dir, unix_users

ROOT = Path(__file__).resolve().parents[2]
JOB = "unitjob"


@contextmanager
def place() -> Iterator[tuple[User, Path]]:
    """A workers' user, and a directory of root's (0755) for memory_dir and the test's saves."""
    with unix_users("worker") as users, reachable_dir("na-unit-") as base:
        yield users["worker"], base


def agent(verb: str, memory_dir: Path, user: User, *more: str) -> Any:
    """The agent's part (tests/helpers/tieragent.py) with the unit's privileges; its JSON."""
    done = subprocess.run(
        [
            *unit_prefix(),
            sys.executable,
            "-m",
            "tests.helpers.tieragent",
            verb,
            str(memory_dir),
            JOB,
            str(user.uid),
            str(user.gid),
            *more,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout) if done.stdout.strip() else None


def as_worker(user: User, script: str) -> subprocess.CompletedProcess[str]:
    """A shell command as the workers' user, umask 077 (nothing group- or world-readable
    unless the directory says otherwise)."""
    return user.run(["sh", "-c", f"umask 077 && {script}"])


def staged(base: Path, step: int) -> Path:
    """A save of `step` the workers' user can read, to copy into its tier as if it saved it."""
    stage = base / f"stage-{step}"
    fake_save(stage, step, rank=0, world=1)
    for path in [base, stage, *stage.iterdir()]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return stage
