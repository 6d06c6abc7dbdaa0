"""supervisor/jobspace.py with real namespaces, as root with the unit's capabilities would
start it: a job's /dev/shm of its own, the memory tier seen through it, a holder that died
replaced, and a set-up that fails said with its step."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeagent.config.identity import WorkerUser
from nodeagent.runtime.isolation import remove_as
from nodeagent.supervisor.jobspace import JobSpace, JobSpaceError
from nodeagent.supervisor.spares import _start

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a job's user is another user: root")
NOBODY = WorkerUser("nobody", 65534, 65534, (), switch=True)
LIST = "import os, sys; print(sorted(os.listdir(sys.argv[1])))"


@pytest.fixture
def tier(job_id: str) -> Iterator[Path]:
    """A memory tier's directory under the node's /dev/shm, with a file the agent wrote."""
    path = Path("/dev/shm", f"nodeagent-space-{job_id}")
    path.mkdir(mode=0o755)
    (path / "saved").write_text("step 7")
    try:
        yield path
    finally:
        for left in path.iterdir():
            left.unlink()
        path.rmdir()


def run(space: JobSpace, *argv: str) -> str:
    """A worker-to-be as nobody in `space`: what it printed."""
    popen = _start(
        [sys.executable, "-c", *argv], {}, None, subprocess.DEVNULL, NOBODY, (), space.make()
    )
    out, _ = popen.communicate(timeout=60)
    assert popen.returncode == 0, out
    return out.decode().strip()


def test_a_jobs_dev_shm_is_its_own_with_the_tier_seen_through(tier: Path, job_id: str) -> None:
    space = JobSpace("n", job_id, NOBODY, [tier], 64 << 20, remove_as_user=remove_as)
    try:
        write = "import sys; open('/dev/shm/' + sys.argv[1], 'w').write('x')"
        run(space, write, "left.bin")
        assert run(space, LIST, "/dev/shm") == str(sorted(["left.bin", tier.name]))
        assert run(space, LIST, str(tier)) == "['saved']"  # the agent's file, through
        assert not Path("/dev/shm/left.bin").exists()

        first = space.make()
        os.kill(first, 9)  # its holder died (an OOM in the job's cgroup, say)
        os.waitpid(first, 0)
        assert space.make() != first  # a new one, and an empty /dev/shm in it
        assert run(space, LIST, "/dev/shm") == str([tier.name])
    finally:
        space.close()


def test_a_space_that_cannot_be_made_says_which_step(tmp_path: Path, job_id: str) -> None:
    not_a_dir = Path("/dev/shm", f"nodeagent-space-{job_id}.file")
    not_a_dir.write_text("")
    space = JobSpace("n", job_id, NOBODY, [not_a_dir], remove_as_user=remove_as)
    try:
        with pytest.raises(JobSpaceError) as error:
            space.make()
        assert "the memory tier bound back into it: Not a directory" in str(error.value)
    finally:
        space.close()
        not_a_dir.unlink()
