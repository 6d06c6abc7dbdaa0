"""Issue 62: a job whose working directory is its user's own private directory (a 0700 home,
as Debian 12 makes them) could not start: the worker entered it before it switched to the
job's user, as the agent, which the shipped unit keeps from every directory it does not own
(no CAP_DAC_OVERRIDE or CAP_DAC_READ_SEARCH). Here the agent's worker start runs with exactly
the unit's capabilities (tests/helpers/unitcaps.py), the worker as a real other user."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.unitcaps import unit_prefix
from tests.helpers.users import User, reachable_dir, unix_users

ROOT = Path(__file__).resolve().parents[2]
SAY = "import os\nprint(os.getcwd())\nprint(open('note').read(), end='')\n"  # as `pwd; cat note`


@pytest.fixture
def home() -> Iterator[tuple[User, Path]]:
    """A user and their private home directory, with a `work` directory of theirs in it."""
    with unix_users("worker") as users, reachable_dir("na-home-") as base:
        user = users["worker"]
        home = base / "home"
        (home / "work").mkdir(parents=True)
        (home / "work" / "note").write_text("the user's own note\n")
        (home / "work" / "say.py").write_text(SAY)
        for path in (home / "work" / "note", home / "work" / "say.py", home / "work", home):
            os.chown(path, user.uid, user.gid)
            path.chmod(0o600 if path.is_file() else 0o700)
        yield user, home


def spawn(user: User, workdir: Path, *more: str) -> dict[str, object]:
    """The agent's worker start, with the unit's privileges (tests/helpers/spawnas.py)."""
    done = subprocess.run(
        [
            *unit_prefix(),
            sys.executable,
            "-m",
            "tests.helpers.spawnas",
            str(user.uid),
            str(user.gid),
            str(workdir),
            *more,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    found: dict[str, object] = json.loads(done.stdout)
    return found


@pytest.mark.parametrize("how", ["cold", "preload"])
def test_a_worker_starts_in_its_users_private_directory(home: tuple[User, Path], how: str) -> None:
    user, directory = home
    found = spawn(user, directory / "work", how)
    assert found.get("status") == 0, found
    assert found["said"] == f"{directory / 'work'}\nthe user's own note\n", found
    assert found["preloaded"] is (how == "preload")


def test_a_directory_the_user_cannot_enter_is_named_in_the_error(
    home: tuple[User, Path],
) -> None:
    user, directory = home
    closed = directory.parent / "roots"
    closed.mkdir(mode=0o700)
    found = spawn(user, closed)
    assert found["errno"] == errno.EACCES, found
    assert found["error"] == (
        f"cannot enter its working directory {closed} as user worker: Permission denied"
    )
    missing = spawn(user, directory.parent / "gone")
    assert missing["errno"] == errno.ENOENT, missing


def check(user: User, base: Path, workdir: Path, script: str) -> dict[str, object]:
    """A pinned node's preflight, with the unit's privileges (tests/helpers/checkas.py)."""
    done = subprocess.run(
        [*unit_prefix(), sys.executable, "-m", "tests.helpers.checkas", user.name, str(base),
         str(workdir), script],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    found: dict[str, object] = json.loads(done.stdout)
    return found


def test_a_pinned_nodes_check_looks_into_a_private_directory_as_its_user(
    home: tuple[User, Path],
) -> None:
    """The same directory named by a node's own `job:` section: `nodeagent config check` and
    `run` checked it as the agent, which cannot look into it (a PermissionError, and a
    traceback where exit 78 was due). The check is made as the job's user."""
    user, directory = home
    base = directory.parent
    assert check(user, base, directory / "work", "say.py") == {"ok": True}
    missing = check(user, base, directory / "work", "nothere.py")
    assert missing == {
        "key": "job.entrypoint",
        "problem": f"the workers' user {user.name!r}: cannot read the script nothere.py in "
        f"{directory / 'work'}",
    }
    gone = check(user, base, directory / "gone", "say.py")
    assert gone["key"] == "job.working_dir", gone
    assert f"cannot enter {directory / 'gone'}" in str(gone["problem"])
