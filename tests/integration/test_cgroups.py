"""A worker is fenced by its cgroup: what left its process group and session dies too.

Real cgroups (root makes them below nodeagent/ in every hierarchy this machine mounts, and
removes them after), real processes, the real fence keeper; and real podman, where installed,
to show why: SIGKILL of `podman run` leaves the container running.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeagent.supervisor import cgroups
from nodeagent.supervisor.fence import Group, Keeper, kill_leftovers, start_ticks
from tests.helpers.cluster import wait_for

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
def name() -> Iterator[str]:
    """A cgroup below nodeagent/, made in every hierarchy; removed after."""
    made = f"nodeagent/test-{uuid.uuid4().hex[:8]}/w"
    for base in cgroups.hierarchies():
        (base / made).mkdir(parents=True)
    yield made
    cgroups.kill(made)
    wait_for(lambda: not cgroups.alive(made), 10, "the test's cgroup to empty")
    cgroups.remove(made)


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


def test_kill_reaches_what_left_the_process_group_and_remove_cleans_up(
    tmp_path: Path, name: str
) -> None:
    proc, escaped = _escaper(tmp_path, name)
    assert {proc.pid, escaped} <= cgroups.members(name)
    os.killpg(proc.pid, signal.SIGKILL)  # what a stop or the keeper did before cgroups
    proc.wait(10)
    assert not _dead(escaped) and cgroups.alive(name)
    assert cgroups.kill(name)
    wait_for(lambda: _dead(escaped), 10, "the escaped grandchild to die")
    assert not cgroups.alive(name)
    cgroups.remove(name)
    job = name.rsplit("/", 1)[0]
    assert not any((base / job).exists() for base in cgroups.hierarchies())
    assert not cgroups.kill(name)  # gone: nothing to kill


def test_keeper_kills_the_cgroup_when_the_agent_dies(tmp_path: Path, name: str) -> None:
    proc, escaped = _escaper(tmp_path, name)
    started = start_ticks(proc.pid)
    assert started is not None
    keeper = Keeper(None)
    keeper.start()
    now = time.monotonic()
    keeper.update(now + 100, now + 200, [Group(proc.pid, started, name)])
    assert keeper._proc is not None and keeper._proc.stdin is not None
    keeper._proc.stdin.close()  # the pipe's end without a goodbye: the agent died
    keeper._proc.wait(10)
    proc.wait(10)
    wait_for(lambda: _dead(escaped), 10, "the keeper to kill the escaped grandchild")


def test_leftovers_record_kills_the_cgroup_and_refuses_a_foreign_one(
    tmp_path: Path, name: str
) -> None:
    proc, escaped = _escaper(tmp_path, name)
    proc.kill()
    proc.wait(10)
    record = tmp_path / "node.workers.json"
    record.write_text(f'{{"groups": [[{proc.pid}, 1, "{name}"]]}}')
    assert [g.cgroup for g in kill_leftovers(record)] == [name]
    wait_for(lambda: _dead(escaped), 10, "the leftover's cgroup to die")
    # A record naming another service's cgroup is garbage: nothing in it is signalled.
    record.write_text(f'{{"groups": [[{os.getpid()}, 1, "system.slice/sshd.service"]]}}')
    assert kill_leftovers(record) == [] and not record.exists()


@pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed")
def test_a_killed_podman_run_leaves_its_container_and_the_cgroup_kill_ends_it() -> None:
    """Why containerised workers are fenced by cgroup (issue 43)."""
    name = f"nodeagent/test-{uuid.uuid4().hex[:8]}/podman"
    container = f"nodeagent-test-{uuid.uuid4().hex[:8]}"
    argv = [
        *("podman", "--runtime=runc", "run", "--rm", f"--name={container}", "--network=host"),
        *("--ulimit=nofile=4096:4096", "--ulimit=nproc=4096:4096", f"--cgroup-parent=/{name}"),
        *("--rootfs", "/:O", "/bin/sleep", "600"),
    ]
    client = subprocess.Popen(argv, start_new_session=True)
    try:
        wait_for(lambda: bool(cgroups.members(name)), 30, "the container to start")
        inside = cgroups.members(name)
        os.killpg(client.pid, signal.SIGKILL)
        client.wait(10)
        time.sleep(0.5)
        assert cgroups.alive(name), "the container died with its client: fencing by group works"
        assert cgroups.kill(name)
        wait_for(lambda: all(_dead(p) for p in inside), 10, "the container to die")
    finally:
        cgroups.kill(name)
        subprocess.run(["podman", "rm", "-f", container], capture_output=True, check=False)
        wait_for(lambda: not cgroups.alive(name), 10, "the container's cgroup to empty")
        cgroups.remove(name)


def test_the_main_process_is_found_below_the_runtimes_own(name: str) -> None:
    """As podman runs a worker: a monitor (conmon), its child the container's init, the init's
    child the worker; before the worker runs there is none to name."""
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
        assert Path(f"/proc/{worker}/cmdline").read_bytes().startswith(b"sleep\0")
        assert cgroups.main_process(name, 3) is None  # nothing runs below the worker
    finally:
        cgroups.kill(name)
        monitor.wait(10)
    assert cgroups.main_process(name, 2) is None
