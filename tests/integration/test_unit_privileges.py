"""Issue 51: under its shipped unit the root agent has no CAP_DAC_OVERRIDE,
CAP_DAC_READ_SEARCH or CAP_FOWNER, and the memory tier could not start: the tier was the
workers' user's, mode 0700, and the agent could not enter what it made. Here the agent's part
runs with exactly the unit's capabilities and umask (tests/helpers/unitcaps.py), the workers'
part as a real other user with umask 077: the agent makes the tier, verifies a save, copies it
to the replica area the workers read, is restarted over it, and removes it all at the end, also
what a worker closed to it."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.unitcaps import unit_prefix
from tests.helpers.unittiers import JOB, agent, as_worker, staged
from tests.helpers.unittiers import place as _place
from tests.helpers.users import User

_DAC_OVERRIDE, _DAC_READ_SEARCH, _FOWNER = 1, 2, 3  # capability bits (linux/capability.h)


@pytest.fixture
def place() -> Iterator[tuple[User, Path]]:
    with _place() as found:
        yield found


def test_the_unit_prefix_holds_no_dac_override() -> None:
    """What the other tests rest on: the agent's part really lacks the capabilities."""
    status = subprocess.run(
        [*unit_prefix(), "cat", "/proc/self/status"], capture_output=True, text=True, check=True
    ).stdout
    effective = int(
        next(line for line in status.splitlines() if line.startswith("CapEff")).split()[1], 16
    )
    assert os.geteuid() == 0
    for bit in (_DAC_OVERRIDE, _DAC_READ_SEARCH, _FOWNER):
        assert not effective & (1 << bit), hex(effective)


def test_a_workers_save_is_verified_copied_and_removed_without_dac_override(
    place: tuple[User, Path],
) -> None:
    user, base = place
    memory_dir = base / "shm"
    tier, area = memory_dir / f"n1.{JOB}", memory_dir / f"n1.{JOB}+replicas"
    stage = staged(base, 4)
    agent("prepare", memory_dir, user)
    saved = as_worker(user, f"mkdir -p {tier}/rank-0 && cp -r {stage} {tier}/rank-0/slot-0")
    assert saved.returncode == 0, saved.stderr

    assert agent("look", memory_dir, user) == {"steps": [4], "problems": []}
    [copy] = agent("copy", memory_dir, user)
    assert Path(copy).is_relative_to(area)
    read = as_worker(user, f"cat {copy}/__0_0.distcp {copy}/.metadata > /dev/null")
    assert read.returncode == 0, f"the workers cannot read the replica area: {read.stderr}"
    area_mode = area.stat()
    assert (area_mode.st_gid, oct(area_mode.st_mode & 0o7777)) == (user.gid, "0o750")
    persisted = agent("persist", memory_dir, user, str(base / "persist" / JOB))
    read = as_worker(user, f"cat {persisted}/__0_0.distcp {persisted}/manifest.json > /dev/null")
    assert read.returncode == 0, f"the workers cannot read the persistent tier: {read.stderr}"

    # A worker closes part of its tier to the agent; the agent is restarted over the tier.
    closed = as_worker(
        user,
        f"mkdir -p {tier}/rank-1/slot-0 && : > {tier}/rank-1/slot-0/x && chmod 0 {tier}/rank-1",
    )
    assert closed.returncode == 0, closed.stderr
    agent("prepare", memory_dir, user)
    assert agent("look", memory_dir, user) == {"steps": [4], "problems": []}

    agent("remove", memory_dir, user)
    assert not tier.exists() and not area.exists()


def test_a_tier_an_earlier_agent_left_closed_is_taken_back(place: tuple[User, Path]) -> None:
    """A tier left as agents before this one made it (the workers' user's, 0700, the save's
    files 0600): the agent makes it its group's again, and reads the save."""
    user, base = place
    memory_dir = base / "shm"
    memory_dir.mkdir(mode=0o755)
    tier = memory_dir / f"n1.{JOB}"
    shutil.copytree(staged(base, 6), tier / "rank-0" / "slot-0")
    for path in [tier, *tier.rglob("*")]:
        os.chown(path, user.uid, user.gid)
        path.chmod(0o700 if path.is_dir() else 0o600)

    agent("prepare", memory_dir, user)
    st = tier.stat()
    assert (st.st_uid, st.st_gid, oct(st.st_mode & 0o7777)) == (user.uid, 0, "0o770")
    assert agent("look", memory_dir, user)["steps"] == [], "the save's own files stay closed"
    agent("remove", memory_dir, user)
    assert not tier.exists()
