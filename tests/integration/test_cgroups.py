"""A containerised worker is fenced by its container's cgroup: what left its process group and
session dies too.

Real cgroups (root makes one where podman puts a container's, nodeagent/libpod-<id>, in every
hierarchy this machine mounts, and removes it after), a cidfile naming it, real processes, the
real fence keeper; and a real podman service, where installed, to show why: SIGKILL of
`podman run` leaves the container running.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeagent.checkpoint import space
from nodeagent.config.container import ContainerRule, ContainerSpec, parse_mounts
from nodeagent.supervisor import cgroups
from nodeagent.supervisor.container import Containers, Podman, job_prefix
from nodeagent.supervisor.fence import LINGER_S, Group, Keeper, kill_leftovers, start_ticks
from nodeagent.supervisor.group import Supervisor
from nodeagent.supervisor.spares import Spawner
from nodeagent.supervisor.spec import WorkerSpec
from nodeagent.supervisor.status import GroupPhase
from tests.helpers.cluster import wait_for
from tests.helpers.images import (
    build_image,
    clean_containers,
    containers_named,
    podman_missing,
    remove_image,
    service_socket,
)

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not cgroups.hierarchies(), reason="making cgroups needs root and cgroupfs"
)

# Forks a grandchild that leaves the session (setsid) and the process group, as conmon does,
# writes its pid, and waits; the grandchild lives until killed.
ESCAPER = textwrap.dedent(
    """
    import os, pathlib, sys, time
    out = pathlib.Path(sys.argv[1])
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            out.write_text(str(os.getpid()))
            while True:
                time.sleep(0.05)
        os._exit(0)
    while True:
        time.sleep(0.05)
    """
)


@pytest.fixture
def name(tmp_path: Path) -> Iterator[str]:
    """A container's cgroup as podman's cgroupfs manager names it, made in every hierarchy, and
    its cidfile at tmp_path/w.cid; removed after."""
    container = secrets.token_hex(32)
    made = cgroups.container_names(container)[0]
    for base in cgroups.hierarchies():
        (base / made).mkdir(parents=True)
    (tmp_path / "w.cid").write_text(container)
    yield made
    cgroups.kill(made)
    wait_for(lambda: not cgroups.alive(made), 10, "the test's cgroup to empty")
    for base in cgroups.hierarchies():
        with contextlib.suppress(OSError):
            (base / made).rmdir()


def _enter(name: str) -> None:
    """Runs in the child before exec: join `name` in every hierarchy that takes it (a v1
    cpuset with no CPUs set does not)."""
    for base in cgroups.hierarchies():
        with contextlib.suppress(OSError):
            (base / name / "cgroup.procs").write_text(str(os.getpid()))


def _escaper(tmp_path: Path, name: str) -> tuple[subprocess.Popen[bytes], int]:
    out = tmp_path / "escaped.pid"
    proc = subprocess.Popen(
        [sys.executable, "-c", ESCAPER, str(out)],
        start_new_session=True,
        preexec_fn=lambda: _enter(name),
    )
    wait_for(out.exists, 10, "the grandchild to escape")
    time.sleep(0.05)  # its pid is written before the write's end
    escaped = int(out.read_text())
    assert os.getsid(escaped) != os.getsid(proc.pid)  # out of the worker's session and group
    return proc, escaped


def _dead(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"


def test_kill_reaches_what_left_the_process_group(tmp_path: Path, name: str) -> None:
    cidfile = str(tmp_path / "w.cid")
    proc, escaped = _escaper(tmp_path, name)
    assert cgroups.container_cgroup(cidfile) == name
    assert {proc.pid, escaped} <= cgroups.members(name)
    os.killpg(proc.pid, signal.SIGKILL)  # what a stop or the keeper did before cgroups
    proc.wait(10)
    assert not _dead(escaped) and cgroups.container_alive(cidfile)
    assert cgroups.kill_container(cidfile)
    wait_for(lambda: _dead(escaped), 10, "the escaped grandchild to die")
    assert not cgroups.container_alive(cidfile)
    assert not cgroups.kill_container(str(tmp_path / "none.cid"))  # no container: nothing


def test_keeper_kills_the_container_when_the_agent_dies(tmp_path: Path, name: str) -> None:
    proc, escaped = _escaper(tmp_path, name)
    keeper = _agent_died(proc, tmp_path / "w.cid")
    proc.wait(10)
    wait_for(lambda: _dead(escaped), 10, "the keeper to kill the escaped grandchild")
    keeper.wait(LINGER_S + 10)  # it watches the container a while, then leaves


def _agent_died(client: subprocess.Popen[bytes], cidfile: Path) -> subprocess.Popen[bytes]:
    """A fence keeper told of `client`'s group and container, whose agent then died (the pipe's
    end without a goodbye): the keeper process."""
    started = start_ticks(client.pid)
    assert started is not None
    keeper = Keeper(None)
    keeper.start()
    now = time.monotonic()
    keeper.update(now + 100, now + 200, [Group(client.pid, started, str(cidfile))])
    assert keeper._proc is not None and keeper._proc.stdin is not None
    keeper._proc.stdin.close()
    return keeper._proc


def test_leftovers_record_kills_the_container_and_refuses_a_foreign_cgroup(
    tmp_path: Path, name: str
) -> None:
    proc, escaped = _escaper(tmp_path, name)
    proc.kill()
    proc.wait(10)
    record = tmp_path / "node.workers.json"
    cidfile = str(tmp_path / "w.cid")
    record.write_text(f'{{"groups": [[{proc.pid}, 1, "{cidfile}"]]}}')
    assert [g.cidfile for g in kill_leftovers(record)] == [cidfile]
    wait_for(lambda: _dead(escaped), 10, "the leftover's container to die")
    # A record naming another service's cgroup is garbage: nothing in it is signalled.
    record.write_text(f'{{"groups": [[{os.getpid()}, 1, "system.slice/sshd.service"]]}}')
    assert kill_leftovers(record) == [] and not record.exists()


@pytest.mark.skipif(podman_missing() is not None, reason=str(podman_missing()))
def test_a_killed_podman_run_leaves_its_container_and_its_cgroup_kill_ends_it(
    tmp_path: Path,
) -> None:
    """Why containerised workers are fenced by cgroup (issue 43); the agent only reads the
    cgroup tree and signals (the unit's ProtectControlGroups= holds)."""
    cidfile = tmp_path / "w.cid"
    SLEEP = b"/bin/sleep\x00600\x00"
    image = build_image(f"nodeagent-cgroups-{uuid.uuid4().hex[:8]}")
    podman = Podman(ContainerRule(True, socket=service_socket()), ContainerSpec("x"))
    parent = podman.cgroup_parent()
    assert parent == "/nodeagent"  # the test's service runs podman's cgroupfs manager
    argv = [
        *("podman", "--remote", f"--url=unix://{service_socket()}", "run", "--rm"),
        *(f"--name=nodeagent-test-{uuid.uuid4().hex[:8]}", f"--cidfile={cidfile}", "--init"),
        *("--network=host", "--ulimit=nofile=4096:4096", "--ulimit=nproc=4096:4096"),
        *(f"--cgroup-parent={parent}", "--volume=/usr:/usr:ro", image, "/bin/sleep", "600"),
    ]
    client = subprocess.Popen(argv, start_new_session=True)
    try:
        name = wait_for(lambda: cgroups.container_cgroup(str(cidfile)), 60, "the container")
        sleep = wait_for(lambda: cgroups.main_process(name, 1), 30, "the container's command")
        init = cgroups.main_process(name, 0)
        assert init is not None and Path(f"/proc/{sleep}/cmdline").read_bytes() == SLEEP
        os.killpg(client.pid, signal.SIGKILL)
        client.wait(10)
        time.sleep(0.5)
        assert cgroups.container_alive(str(cidfile)), "died with its client: fenced by group"
        assert cgroups.kill_container(str(cidfile))
        wait_for(lambda: _dead(sleep) and _dead(init), 10, "the container to die")
        # podman removes what it made: the container, and its cgroup.
        wait_for(lambda: cgroups.container_cgroup(str(cidfile)) is None, 30, "its cgroup to go")
    finally:
        cgroups.kill_container(str(cidfile))
        remove_image(image)


def test_an_unreachable_podman_service_is_an_error_naming_its_socket(tmp_path: Path) -> None:
    socket = str(tmp_path / "none.sock")
    podman = Podman(ContainerRule(True, socket=socket), ContainerSpec("x"))
    with pytest.raises(OSError, match=f"the podman service at {socket}"):
        podman.cgroup_parent()


def test_the_main_process_is_found_below_the_runtimes_own(name: str) -> None:
    """Three generations in one cgroup, the first one's parent outside it (as conmon is outside
    a container's): each is named by its depth; before the last runs there is none to name."""
    chain = (
        "import subprocess, sys, time; time.sleep(float(sys.argv[1])); subprocess.run(sys.argv[2:])"
    )
    init = [sys.executable, "-c", chain, "3", "sleep", "600"]  # runs the worker in 3 s
    monitor = subprocess.Popen(
        [sys.executable, "-c", chain, "0", *init],
        start_new_session=True,
        preexec_fn=lambda: _enter(name),
    )
    try:
        wait_for(lambda: cgroups.main_process(name, 1), 10, "the init")
        assert cgroups.main_process(name, 0) == monitor.pid
        assert cgroups.main_process(name, 2) is None  # the init has not started the worker yet
        worker = wait_for(lambda: cgroups.main_process(name, 2), 10, "the worker")
        # Found between its fork and its exec, the worker still shows the init's command line:
        # the same process, which the exec does not change.
        wait_for(lambda: _cmdline(worker).startswith(b"sleep\0"), 10, "the worker's exec")
        assert cgroups.main_process(name, 2) == worker
        assert cgroups.main_process(name, 3) is None  # nothing runs below the worker
    finally:
        cgroups.kill(name)
        monitor.wait(10)
    assert cgroups.main_process(name, 2) is None


def _cmdline(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


@pytest.mark.skipif(podman_missing() is not None, reason=str(podman_missing()))
def test_podman_as_the_services_client_writes_nothing_but_the_cidfile(tmp_path: Path) -> None:
    """What the agent's unit allows is enough for a worker's `podman run`: here in a mount
    namespace whose root is read-only (stricter than ProtectSystem=full), no namespace, mount
    or capability of its own; only the cidfile's directory (a tmpfs) is written."""
    image = build_image(f"nodeagent-ro-{uuid.uuid4().hex[:8]}")
    private = Path(tempfile.mkdtemp(dir="/dev/shm"))  # as memory_dir: the agent's alone
    run_dir = private / "run"
    run_dir.mkdir(mode=0o700)
    cidfile = run_dir / "w.cid"
    podman = (
        f"podman --remote --url=unix://{service_socket()} run --rm --cidfile={cidfile} --init "
        "--ulimit=nofile=4096:4096 --ulimit=nproc=4096:4096 --user=65534:65534 "
        f"--volume=/usr:/usr:ro --cgroup-parent=/nodeagent {image} /usr/bin/id -u"
    )
    script = f"mount -o remount,bind,ro / && ! touch /etc/nodeagent-probe 2>/dev/null && {podman}"
    try:
        result = subprocess.run(
            ["unshare", "--mount", "sh", "-c", script],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode == 0 and result.stdout.strip() == "65534", result.stderr
        assert cgroups.container_id(str(cidfile)) is not None
    finally:
        shutil.rmtree(private, ignore_errors=True)
        remove_image(image)


@pytest.mark.skipif(podman_missing() is not None, reason=str(podman_missing()))
def test_a_containerised_worker_is_gone_only_once_its_container_is(tmp_path: Path) -> None:
    """The supervisor with a real podman service: a worker whose `podman run` is killed (as the
    fence keeper kills a process group) leaves its container running; the supervisor kills it
    as what the worker left, and the group is EXITED only once the service removed it."""
    image = build_image(f"nodeagent-sup-{uuid.uuid4().hex[:8]}")
    job = f"sup{uuid.uuid4().hex[:6]}"
    memory_dir = tmp_path / "shm"
    memory_dir.mkdir(mode=0o755)
    (tmp_path / "logs" / job).mkdir(parents=True)

    def make_dir(path: Path, mode: int, uid: int, gid: int) -> None:
        space.make_marked(path, "test", mode, "n", job, uid, gid)

    rule = ContainerRule(
        True, socket=service_socket(), ulimits=("nofile=4096:4096", "nproc=4096:4096")
    )
    removed: list[str] = []

    class Recorded(Podman):
        def remove(self, *names: str) -> None:
            super().remove(*names)
            removed.extend(names)  # once the service has answered

    runtime = Recorded(rule, ContainerSpec(image, parse_mounts("/usr:/usr:ro")))
    shm, run = memory_dir / f"n.{job}+shm", memory_dir / f"n.{job}+run"
    containers = Containers(runtime, "n", job, shm, run, None, make_dir)
    sup = Supervisor(
        echo=lambda rank, line: None, wake=lambda: None, spawner=Spawner(containers=containers)
    )
    spec = WorkerSpec(
        rank=0,
        local_rank=0,
        argv=("/usr/bin/sleep", "600"),
        env={"NODEAGENT_GENERATION": "1", "PATH": "/usr/bin"},
        cwd=None,
        log_path=tmp_path / "logs" / job / "rank-0.log",
        progress_path=tmp_path / "logs" / job / "rank-0.progress",
    )

    def phase() -> GroupPhase:
        sup.poll()
        return sup.status().phase

    try:
        sup.start(1, "n", [spec])
        cidfile = str(containers.cidfile(spec))
        wait_for(lambda: cgroups.container_alive(cidfile), 60, "the container to start")
        name = cgroups.container_cgroup(cidfile)
        assert name is not None
        sleep = wait_for(lambda: cgroups.main_process(name, 1), 30, "the container's command")
        (client,) = [w.pid for w in sup._workers]
        assert client is not None
        os.killpg(client, signal.SIGKILL)
        wait_for(lambda: phase() is GroupPhase.EXITED, 60, "the group to end")
        assert removed == [containers.name(spec)]  # asked of the service before the end
        assert _dead(sleep) and not containers_named(job_prefix(job))
    finally:
        sup.kill()
        clean_containers(job)
        remove_image(image)


def test_the_keeper_kills_a_container_that_comes_up_after_the_fence(
    tmp_path: Path, name: str
) -> None:
    """A container whose start was under way when the agent died (its cgroup empty when the
    keeper fenced) is killed when it comes up, within the keeper's LINGER_S."""
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    client = subprocess.Popen(sleeper, start_new_session=True)
    keeper = _agent_died(client, tmp_path / "w.cid")  # it fences what it was told
    late: subprocess.Popen[bytes] | None = None
    try:
        assert client.wait(10) == -signal.SIGKILL
        time.sleep(1.0)  # the container's start, still under way, finishes
        late = subprocess.Popen(sleeper, start_new_session=True, preexec_fn=lambda: _enter(name))
        assert late.wait(10) == -signal.SIGKILL  # within what is left of LINGER_S
        keeper.wait(LINGER_S + 10)  # then it leaves
    finally:
        for proc in (client, late, keeper):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
