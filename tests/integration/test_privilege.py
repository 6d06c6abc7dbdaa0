"""Least privilege with real processes: workers run as job.user, cannot read root's files, and
die with their agent; the files the agent writes are private to it.

Switching users needs root: the tests that do are skipped otherwise. They run their workers as
a throwaway system user (useradd, removed afterwards) or, without useradd, as nobody. Workers
are /bin/sh scripts: the test's Python may live where another user cannot read it (pyenv under
/root).
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import yaml

from nodeagent.config.hosts import Resolver
from nodeagent.config.identity import WorkerUser, resolve
from nodeagent.supervisor.errorfile import read_error_file
from nodeagent.supervisor.fence import Group, Keeper
from nodeagent.supervisor.group import Supervisor
from nodeagent.supervisor.ranklogs import stable_log_path
from nodeagent.supervisor.spares import Spawner
from nodeagent.supervisor.spec import WorkerSpec
from nodeagent.supervisor.status import GroupPhase
from tests.helpers.cluster import RedisServer, local_cluster, wait_for
from tests.helpers.runas import AS_TESTER
from tests.helpers.users import reachable_dir

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
SHARED_GROUP = "users"  # a supplementary group the throwaway user gets (gid 100 on Debian)


@dataclass(frozen=True)
class JobUser:
    name: str
    run_as: WorkerUser


@pytest.fixture(scope="module")
def job_user() -> Iterator[JobUser]:
    """A system user of its own for this module's workers, or nobody without useradd."""
    if os.geteuid() != 0:
        pytest.skip("switching users needs root")
    useradd, userdel = shutil.which("useradd"), shutil.which("userdel")
    name = "nobody"
    if useradd and userdel:
        name = f"na-test-{uuid.uuid4().hex[:8]}"
        groups = ["--groups", SHARED_GROUP] if Resolver().group(SHARED_GROUP) is not None else []
        subprocess.run(
            [useradd, "--system", "--no-create-home", "--home-dir", "/nonexistent", *groups, name],
            check=True,
            timeout=60,
        )
    try:
        yield JobUser(name, resolve(name, None, False, {}, Resolver()))
    finally:
        if name != "nobody" and userdel:
            subprocess.run([userdel, name], check=False, timeout=60)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory another user can reach (pytest's tmp_path is under a 0700 directory)."""
    with reachable_dir("na-privilege-") as path:
        yield path


def spec(base: Path, script: str, env: dict[str, str] | None = None) -> WorkerSpec:
    logs = base / "logs" / "job" / "1"
    return WorkerSpec(
        rank=0,
        local_rank=0,
        argv=("/bin/sh", "-c", script),
        env={
            "PATH": "/usr/bin:/bin",
            "HOME": "/root",  # the agent's own, as systemd gives a root service
            "NODEAGENT_PROGRESS_FILE": str(logs / "rank-0.progress"),
            **(env or {}),
        },
        cwd=str(base),
        log_path=logs / "rank-0.log",
        progress_path=logs / "rank-0.progress",
    )


def run_one(spawner: Spawner, worker: WorkerSpec, last: str = "") -> list[str]:
    """Start one worker under a real supervisor and return its output lines once it exited
    and its log holds `last` (the log is written by a thread that pumps the worker's output:
    on a loaded machine it can lag the exit)."""
    lines: list[str] = []
    supervisor = Supervisor(
        echo=lambda rank, line: lines.append(line), wake=threading.Event().set, spawner=spawner
    )
    supervisor.start(1, "n1", [worker])

    def exited() -> bool:
        supervisor.poll()
        return supervisor.status().phase is GroupPhase.EXITED

    try:
        wait_for(exited, 30, "the worker to exit")
    finally:
        supervisor.kill()
    wait_for(
        lambda: (
            worker.log_path.read_text().count("\n") >= 1 and last in worker.log_path.read_text()
        ),
        10,
        "the worker's log",
    )
    return worker.log_path.read_text().splitlines()


WHOAMI = textwrap.dedent(
    """
    echo "uid=$(id -u)"
    echo "gid=$(id -g)"
    echo "groups=$(id -G)"
    echo "session=$HOME $USER $LOGNAME"
    if cat "$SECRET" >/dev/null 2>&1; then echo secret=read; else echo secret=denied; fi
    if [ -w "$NODEAGENT_PROGRESS_FILE" ]; then echo progress=writable; fi
    if cat "$LOG" >/dev/null 2>&1; then echo log=read; else echo log=denied; fi
    if [ -w "$LOG" ]; then echo log_write=allowed; else echo log_write=denied; fi
    """
)
LAST = "log_write="  # WHOAMI's last line


def facts(lines: list[str]) -> dict[str, str]:
    return dict(line.split("=", 1) for line in lines if "=" in line)


@ROOT_ONLY
def test_workers_run_as_the_job_user_and_cannot_read_root_files(
    job_user: JobUser, shared_dir: Path
) -> None:
    secret = shared_dir / "config.yaml"  # as the Ansible role installs it: 0600 root:root
    secret.write_text("redis: {url: 'redis://nodeagent-agent:hunter2@10.0.0.2:6379/0'}\n")
    secret.chmod(0o600)
    worker = spec(shared_dir, WHOAMI)
    env = {**worker.env, "SECRET": str(secret), "LOG": str(worker.log_path)}
    worker = WorkerSpec(**{**worker.__dict__, "env": env})
    user = job_user.run_as
    got = facts(run_one(Spawner(user=user), worker, LAST))
    assert got["uid"] == str(user.uid) and got["gid"] == str(user.gid)
    assert set(got["groups"].split()) == {str(g) for g in user.groups}
    if job_user.name != "nobody" and Resolver().group(SHARED_GROUP) is not None:
        assert str(Resolver().group(SHARED_GROUP)) in got["groups"].split()
    home = Resolver().user(job_user.name)
    assert home is not None and got["session"] == f"{home.home} {job_user.name} {job_user.name}"
    assert got["secret"] == "denied"  # the config and its Redis password are root's alone
    assert got["progress"] == "writable"  # it maps its progress file for writing
    assert got["log"] == "read"  # its own output: the job's group reads it (0640) ...
    assert got["log_write"] == "denied"  # ... and the agent alone writes it


@ROOT_ONLY
def test_job_env_overrides_the_session_variables(job_user: JobUser, shared_dir: Path) -> None:
    run_as = resolve(job_user.name, None, False, {"HOME": "/scratch"}, Resolver())
    worker = spec(shared_dir, WHOAMI, {"HOME": "/scratch"})
    got = facts(run_one(Spawner(user=run_as), worker, LAST))
    assert got["session"] == f"/scratch {job_user.name} {job_user.name}"


@ROOT_ONLY
def test_the_files_a_worker_gets_and_the_agent_keeps(job_user: JobUser, shared_dir: Path) -> None:
    worker = spec(shared_dir, "exit 0")
    worker.log_path.parent.mkdir(parents=True)
    worker.log_path.write_text("an older line\n")
    worker.log_path.chmod(0o644)  # written by an older agent under umask 022
    user = job_user.run_as
    run_one(Spawner(user=user), worker)
    log = worker.log_path.stat()
    assert (stat.S_IMODE(log.st_mode), log.st_uid, log.st_gid) == (0o640, 0, user.gid)
    stable = stable_log_path(worker.log_path)
    if stable.exists():  # written by a RankLog (run_one's workers go through the group)
        assert stable.stat().st_gid == user.gid
    beats = worker.progress_path.stat()
    assert (stat.S_IMODE(beats.st_mode), beats.st_uid, beats.st_gid) == (0o640, user.uid, 0)
    for directory in (worker.log_path.parent, worker.log_path.parent.parent):
        mode = directory.stat()
        assert (stat.S_IMODE(mode.st_mode), mode.st_uid, mode.st_gid) == (0o750, 0, user.gid)


@ROOT_ONLY
def test_a_worker_of_another_user_dies_with_its_agent(job_user: JobUser, shared_dir: Path) -> None:
    """PR_SET_PDEATHSIG is set after the user switch (a later credential change would clear
    it): a worker running as the job's user is killed by the kernel when its agent is
    SIGKILLed, with no chance to clean up."""
    agent_code = textwrap.dedent(
        f"""
        import subprocess, sys, time
        from nodeagent.config.hosts import Resolver
        from nodeagent.config.identity import resolve
        from nodeagent.supervisor.spares import _start
        user = resolve({job_user.name!r}, None, False, {{}}, Resolver())
        argv = ["/bin/sh", "-c", "echo $$ && exec sleep 600"]
        worker = _start(argv, {{"PATH": "/bin"}}, "/", subprocess.DEVNULL, user)
        print(worker.stdout.readline().decode().strip(), flush=True)
        time.sleep(600)
        """
    )
    agent = subprocess.Popen(
        [sys.executable, "-c", agent_code], stdout=subprocess.PIPE, start_new_session=True
    )
    pid = 0
    try:
        assert agent.stdout is not None
        pid = int(agent.stdout.readline())
        worker = psutil.Process(pid)
        assert worker.uids().real == job_user.run_as.uid  # it switched users
        # the signal must survive the exec as well (a set-user-ID program would clear it)
        wait_for(lambda: worker.cmdline()[:1] == ["sleep"], 10, "the worker to exec sleep")
        agent.send_signal(signal.SIGKILL)
        agent.wait(10)
        wait_for(lambda: _gone(pid), 10, "the worker to die")
    finally:
        agent.kill()
        agent.wait()
        if agent.stdout is not None:
            agent.stdout.close()
        if pid and not _gone(pid):
            os.kill(pid, signal.SIGKILL)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_the_worker_record_is_the_agents_alone(tmp_path: Path) -> None:
    record = tmp_path / "node.workers.json"
    record.write_text('{"groups": []}')
    record.chmod(0o666)  # left by an older agent, or created under a loose umask
    keeper = Keeper(record)  # not started: update() only records
    keeper.update(None, None, [Group(12345, 678)])
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    assert "12345" in record.read_text()


def test_config_check_refuses_an_unknown_user_naming_the_key(tmp_path: Path) -> None:
    cases: list[tuple[dict[str, object], str]] = [
        ({"user": f"no-such-user-{uuid.uuid4().hex[:6]}"}, "job.user: no such user"),
        ({**AS_TESTER, "group": "no-such-group-here"}, "job.group: no such group"),
    ]
    if os.geteuid() == 0:
        cases.append(({"user": "root"}, "job.user: 'root' is root"))
        if Resolver().user("nodeagent") is None:  # and no job.user: not root in its place
            cases.append(({}, "job.user: not set, and this node has no 'nodeagent' user"))
    for keys, words in cases:
        config = tmp_path / "config.yaml"
        job: dict[str, object] = {"id": "x", "entrypoint": ["/bin/true"], **keys}
        config.write_text(yaml.safe_dump({"job": job, "log_dir": str(tmp_path)}))
        result = subprocess.run(
            [sys.executable, "-m", "nodeagent", "config", "check", "--syntax-only", str(config)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 78 and words in result.stderr, (keys, result.stderr)


@ROOT_ONLY
def test_a_real_agent_runs_its_workers_as_the_job_user(
    job_user: JobUser, shared_dir: Path, redis_server: RedisServer, job_id: str
) -> None:
    secret = shared_dir / "secret"
    secret.write_text("hunter2\n")
    secret.chmod(0o600)
    readable = (
        f"if cat {secret} >/dev/null 2>&1; then echo secret=read; else echo secret=denied; fi"
    )
    script = f"echo uid=$(id -u); {readable}; exec sleep 600"
    with local_cluster(
        redis_server.url,
        shared_dir / "cluster",
        job=job_id,
        max_nodes=1,
        entrypoint=["/bin/sh", "-c", script],
        job_options={"user": job_user.name},
        timing={"heartbeat_interval": "200ms", "lease_ttl": "1s"},
    ) as cluster:
        cluster.start("a")
        agent = cluster.agents["a"]
        wait_for(lambda: "[rank 0]: secret=" in agent.log(), 30, "the worker's lines")
        assert f"[rank 0]: uid={job_user.run_as.uid}" in agent.log()
        assert "[rank 0]: secret=denied" in agent.log()
        workers = wait_for(lambda: cluster.worker_pids("a"), 10, "the worker's pid")
        agent.proc.kill()  # SIGKILL: no goodbye; the kernel and the fence keeper remain
        agent.proc.wait(10)
        wait_for(lambda: all(_gone(pid) for pid in workers), 10, "the workers to die")


@ROOT_ONLY
def test_a_worker_of_another_user_can_write_its_error_file(
    job_user: JobUser, shared_dir: Path
) -> None:
    """Its generation's directory is the agent's: the agent makes the (empty) error file the
    worker's, so torch's @record can write the root cause there, and the agent reads it."""
    error_file = shared_dir / "logs" / "job" / "1" / "rank-0.error.json"
    cause = '{"message": {"message": "ValueError: bad batch", "extraInfo": {}}}'
    worker = spec(
        shared_dir,
        f"echo failing; printf '%s' '{cause}' > \"$TORCHELASTIC_ERROR_FILE\"; exit 3",
        env={"TORCHELASTIC_ERROR_FILE": str(error_file)},
    )
    user = job_user.run_as
    run_one(Spawner(user=user), worker)
    owner = error_file.stat()
    assert (stat.S_IMODE(owner.st_mode), owner.st_uid, owner.st_gid) == (0o640, user.uid, 0)
    assert read_error_file(error_file) == "ValueError: bad batch"
