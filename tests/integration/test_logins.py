"""`ssh node` into a job of the user's (runtime/logins.py, cli/pamadopt.py) with a real agent
under pool.auth: munge, its real job cgroups and two Unix users the tests create: the check run
as pam_exec runs it (a child of the login's process), that process taken into the user's
allocation's cgroup and killed with it; another user, an unknown one and a caller that is not
root refused, saying why; root let in without asking. With sshd and PAM themselves:
tests/booted/test_logins.py."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.helpers.allocations import holding, users_pool
from tests.helpers.cluster import RedisServer, wait_for
from tests.helpers.munge import MungeDaemon
from tests.helpers.pool import PoolCluster
from tests.helpers.unitcaps import unit_setting
from tests.helpers.users import User, unix_users

pytestmark = pytest.mark.timeout(300)
CHECK = [sys.executable, "-I", "-m", "nodeagent.cli.pamadopt"]  # as the role writes it
DROP_IN = Path(__file__).resolve().parents[2] / "systemd/nodeagent.service.d/ssh-adopt.conf"


def login(socket: Path, user: str, stages: str) -> subprocess.Popen[str]:
    """A login's process as sshd's is to the check: the check its child in each of `stages`
    (PAM_TYPE, with PAM_USER), as long as it lets the login in; then it says the last status
    and stays (a shell)."""
    script = 's=0; for PAM_TYPE in $STAGES; do export PAM_TYPE; "$@" || { s=$?; break; }; done'
    shell = ["/bin/sh", "-c", f'{script}; echo "check $s"; exec sleep 600', "login"]
    return subprocess.Popen(
        [*shell, *CHECK, "--socket", str(socket)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PAM_USER": user, "STAGES": stages},
    )


def in_job(pid: int, job: str) -> list[str]:
    """The lines of /proc/PID/cgroup that put it in `job`'s cgroup on node a."""
    lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    return [line for line in lines if line.endswith(f"/job-a.{job}")]


def checked(
    socket: Path, user: str, as_user: User | None = None, stage: str = "account"
) -> tuple[int, str]:
    """The check's exit status and what it printed."""
    argv = [*(as_user.argv_as(reach=True) if as_user else []), *CHECK, "--socket", str(socket)]
    env = {**os.environ, "PAM_USER": user, "PAM_TYPE": stage}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    return done.returncode, done.stdout + done.stderr


@pytest.fixture(scope="module")
def users() -> Iterator[dict[str, User]]:
    with unix_users("alice", "bob") as made:
        yield made


@pytest.fixture
def pool(
    redis_server: RedisServer, job_id: str, munged: MungeDaemon, users: dict[str, User]
) -> Iterator[PoolCluster]:
    with users_pool(redis_server.url, job_id, munged, users) as cluster:
        yield cluster


@pytest.fixture
def socket(pool: PoolCluster) -> Iterator[Path]:
    """Node a's login socket (outside systemd: in its state directory)."""
    pool.caps["a"] = unit_setting("CapabilityBoundingSet", DROP_IN).split()
    pool.start("a")
    pool.wait_nodes(1)
    path = pool.directory / "state" / "login.sock"
    wait_for(path.exists, 30, "node a's login socket")
    yield path


def test_a_login_goes_into_its_users_allocation_and_ends_with_it(
    pool: PoolCluster, munged: MungeDaemon, users: dict[str, User], socket: Path
) -> None:
    alice, bob = users["alice"], users["bob"]
    held = holding(pool, munged, alice, "login-held", 1)
    session, checked_only, shell = None, None, []
    try:
        checked_only = login(socket, alice.name, "account")  # let in, moved nowhere
        assert checked_only.stdout is not None
        assert checked_only.stdout.readline() == "check 0\n"
        assert in_job(checked_only.pid, "login-held") == []

        session = login(socket, alice.name, "account open_session")
        assert session.stdout is not None
        assert session.stdout.readline() == "check 0\n"
        inside = in_job(session.pid, "login-held")
        assert any(line.startswith("0::") for line in inside), inside
        assert any("memory" in line.split(":")[1] for line in inside), inside

        for stage in ("account", "open_session"):
            status, said = checked(socket, bob.name, stage=stage)
            assert status == 1 and f"{bob.name} holds no job on node a" in said, said
        status, said = checked(socket, alice.name, stage="close_session")
        assert (status, said) == (0, ""), said  # nothing to check at a session's end
        status, said = checked(socket, "no-such-user-here")
        assert status == 1 and "no-such-user-here is not a user of node a" in said, said
        status, said = checked(socket.with_name("absent.sock"), "root")
        assert (status, said) == (0, ""), said  # root is not asked about
        status, said = checked(socket.with_name("absent.sock"), alice.name)
        assert status == 1 and "does not answer" in said, said

        status, said = checked(socket, alice.name, as_user=alice)
        assert status == 1 and "Permission denied" in said, said  # the socket is root's
        socket.chmod(0o666)
        status, said = checked(socket, alice.name, as_user=alice)
        assert status == 1 and f"only root asks this socket, not uid {alice.uid}" in said, said
        socket.chmod(0o600)

        shell = psutil.Process(held.pid).children(recursive=True)  # alloc's, on this host
        held.kill()  # the holder gone: the allocation ends, and the login with it
        assert session.wait(timeout=120) == -9

        def left() -> list[Path]:  # the agent removes them once what was in them is gone
            return [p for p in Path("/sys/fs/cgroup").glob("*/**/job-a.login-held") if p.is_dir()]

        wait_for(lambda: not left(), 60, "the allocation's cgroups removed")
    finally:
        for process in [psutil.Process(held.pid), *shell]:
            with contextlib.suppress(psutil.Error):
                process.kill()
        for popen in (held, session, checked_only):
            if popen is not None:
                popen.kill()
                popen.wait(timeout=60)
                if popen.stdout is not None:
                    popen.stdout.close()
