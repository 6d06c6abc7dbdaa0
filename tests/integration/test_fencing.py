"""Workers are fenced when their agent cannot act: the fence keeper, PDEATHSIG, leftovers.

Real processes throughout: the keeper process, victims in their own sessions, and agents of a
real job against the session's redis-server.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from nodeagent.coord.keys import JobKeys
from nodeagent.supervisor.fence import Group, Keeper, start_ticks
from tests.helpers.cluster import (
    LeaseSampler,
    LocalCluster,
    RedisServer,
    local_cluster,
    wait_for,
)

# A process that notes when SIGTERM reached it (monotonic time) and keeps running until killed.
STUBBORN = textwrap.dedent(
    """
    import pathlib, signal, sys, time
    out = pathlib.Path(sys.argv[1])
    signal.signal(signal.SIGTERM, lambda *a: out.write_text(str(time.monotonic())))
    out.with_suffix(".ready").write_text("")
    while True:
        time.sleep(0.01)
    """
)


def _stubborn(tmp_path: Path) -> tuple[subprocess.Popen[bytes], Group, Path]:
    term = tmp_path / "term.txt"
    proc = subprocess.Popen([sys.executable, "-c", STUBBORN, str(term)], start_new_session=True)
    wait_for(lambda: term.with_suffix(".ready").exists(), 10, "the victim to start")
    started = start_ticks(proc.pid)
    assert started is not None
    return proc, Group(proc.pid, started), term


@pytest.fixture
def keeper(tmp_path: Path) -> Iterator[Keeper]:
    keeper = Keeper(tmp_path / "node.workers.json")
    keeper.start()
    yield keeper
    keeper.close()


def test_keeper_terms_then_kills_at_its_deadlines_unless_renewed(
    tmp_path: Path, keeper: Keeper
) -> None:
    proc, group, term = _stubborn(tmp_path)
    try:
        for _ in range(8):  # renewed every 0.1 s: the deadlines keep moving away
            now = time.monotonic()
            keeper.update(now + 0.3, now + 0.6, [group])
            time.sleep(0.1)
        assert proc.poll() is None and not term.exists()
        ordered = time.monotonic()
        keeper.update(ordered + 0.2, ordered + 0.5, [group])
        proc.wait(10)
        died = time.monotonic()
        assert proc.returncode == -signal.SIGKILL
        termed = float(term.read_text())
        assert ordered + 0.2 <= termed < ordered + 0.5  # the grace between TERM and KILL
        assert died >= ordered + 0.5
    finally:
        proc.kill()
        proc.wait()


def test_one_jobs_lapsed_lease_fences_only_that_jobs_workers(
    tmp_path: Path, keeper: Keeper
) -> None:
    """A node serving two jobs: each job's agent tells the keeper its own deadlines (a
    JobFence each). Job b stops renewing: only b's workers are fenced; a's keep running, and
    both are in the leftovers record."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a_proc, a_group, a_term = _stubborn(tmp_path / "a")
    b_proc, b_group, b_term = _stubborn(tmp_path / "b")
    a, b = keeper.fence("a"), keeper.fence("b")
    try:
        now = time.monotonic()
        b.update(now + 0.2, now + 0.5, [b_group])
        assert b.term_at == now + 0.2 and a.term_at is None
        for _ in range(10):  # a renews every 0.1 s
            now = time.monotonic()
            a.update(now + 0.3, now + 0.6, [a_group])
            time.sleep(0.1)
        b_proc.wait(10)
        assert b_proc.returncode == -signal.SIGKILL and b_term.exists()
        assert a_proc.poll() is None and not a_term.exists()
        recorded = json.loads((tmp_path / "node.workers.json").read_text())["groups"]
        assert sorted(g[0] for g in recorded) == sorted([a_group.pgid, b_group.pgid])
    finally:
        for proc in (a_proc, b_proc):
            proc.kill()
            proc.wait()


# A main process that starts one child in its group; each notes when SIGTERM reached it.
FAMILY = textwrap.dedent(
    """
    import pathlib, signal, subprocess, sys, time
    out = pathlib.Path(sys.argv[1])
    if len(sys.argv) == 2:
        subprocess.Popen([sys.executable, "-c", FAMILY, f"{out}-child", "x"])
    signal.signal(signal.SIGTERM, lambda *a: out.write_text(str(time.monotonic())))
    pathlib.Path(f"{out}.ready").write_text("")
    while True:
        time.sleep(0.01)
    """
)


def test_keeper_terms_the_main_process_and_kills_the_whole_group(tmp_path: Path) -> None:
    """At term_at only the group's leader hears SIGTERM (a DataLoader's workers must outlive
    its emergency checkpoint); at kill_at the whole group dies."""
    term, child_term = tmp_path / "term", tmp_path / "term-child"
    code = f"FAMILY = {FAMILY!r}\n{FAMILY}"
    leader = subprocess.Popen([sys.executable, "-c", code, str(term)], start_new_session=True)
    keeper = Keeper(None)
    keeper.start()
    try:
        wait_for(lambda: Path(f"{child_term}.ready").exists(), 10, "the child to start")
        (child,) = psutil.Process(leader.pid).children()
        started = start_ticks(leader.pid)
        assert started is not None
        now = time.monotonic()
        keeper.update(now + 0.2, now + 1.5, [Group(leader.pid, started)])
        wait_for(term.exists, 10, "the main process's SIGTERM")
        assert not child_term.exists()  # not told: the grace is its main process's
        leader.wait(10)
        assert leader.returncode == -signal.SIGKILL
        _wait_dead(child, "the child to be killed with its group")
        assert not child_term.exists()
    finally:
        keeper.close()
        leader.kill()
        leader.wait()


def test_keeper_kills_at_once_when_the_agent_dies(tmp_path: Path) -> None:
    """The pipe's end-of-file is the agent's death: no need to wait for a deadline."""
    victim, group, _ = _stubborn(tmp_path)
    agent_code = textwrap.dedent(
        f"""
        import time
        from nodeagent.supervisor.fence import Group, Keeper
        keeper = Keeper(None)
        keeper.start()
        keeper.update(time.monotonic() + 100, time.monotonic() + 200, [Group{tuple(group)}])
        print(keeper.pid, flush=True)
        time.sleep(600)
        """
    )
    agent = subprocess.Popen([sys.executable, "-c", agent_code], stdout=subprocess.PIPE, text=True)
    try:
        assert agent.stdout is not None
        keeper_pid = int(agent.stdout.readline())
        time.sleep(0.2)  # the keeper has read its orders
        assert victim.poll() is None
        agent.kill()
        killed = time.monotonic()
        victim.wait(10)
        assert victim.returncode == -signal.SIGKILL
        assert time.monotonic() - killed < 5  # not the 100 s deadline
        wait_for(lambda: not psutil.pid_exists(keeper_pid), 10, "the keeper to exit")
    finally:
        for proc in (agent, victim):
            proc.kill()
            proc.wait()
        if agent.stdout is not None:
            agent.stdout.close()


def test_keeper_says_goodbye_without_killing_when_told(tmp_path: Path) -> None:
    victim, group, _ = _stubborn(tmp_path)
    keeper = Keeper(None)
    keeper.start()
    try:
        keeper.update(time.monotonic() + 100, time.monotonic() + 200, [group])
        keeper.update(time.monotonic() + 100, time.monotonic() + 200, [])  # workers gone
        keeper.close()
        assert keeper.exit_status() == 0
        time.sleep(0.2)
        assert victim.poll() is None  # told the groups were gone: it fenced nothing
    finally:
        victim.kill()
        victim.wait()


def _dead(proc: psutil.Process) -> bool:
    """Gone or a zombie (this machine's init may take its time to reap orphans)."""
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_dead(proc: psutil.Process, what: str) -> None:
    wait_for(lambda: _dead(proc), 10, what)


def _child_alive(cluster: LocalCluster, generation: int, node: str) -> psutil.Process | None:
    (start,) = [s for s in cluster.starts(generation) if s["node"] == node]
    try:
        child = psutil.Process(start["child"])
    except psutil.NoSuchProcess:
        return None
    return child if child.status() != psutil.STATUS_ZOMBIE else None


def _cluster(redis_server: RedisServer, workdir: Path, job_id: str) -> LocalCluster:
    return LocalCluster(
        redis_server.url,
        workdir,
        job=job_id,
        max_nodes=2,
        job_options={"env": {"RECORD_DIR": str(workdir / "records"), "SPAWN_CHILD": "1"}},
    )


def test_killed_agent_takes_its_workers_and_their_children_along(
    redis_server: RedisServer, workdir: Path, job_id: str
) -> None:
    """SIGKILL of the agent alone (no systemd to clean its cgroup): PDEATHSIG kills the worker,
    the keeper its whole process group, long before the lease could lapse."""
    cluster = _cluster(redis_server, workdir, job_id)
    try:
        cluster.start("a", "b")
        doc = cluster.wait_running(2)
        gen = doc["generation"]
        child = _child_alive(cluster, gen, "b")
        assert child is not None
        (worker,) = [psutil.Process(p) for p in cluster.worker_pids("b")]
        cluster.agents["b"].proc.kill()
        killed = time.monotonic()
        _wait_dead(worker, "the worker to die with its agent")
        _wait_dead(child, "the worker's child to die with its agent")
        assert time.monotonic() - killed < 0.9  # lease_ttl is 1 s here
        cluster.agents["b"].proc.wait(10)
        cluster.start("b")  # restarted by hand, not by systemd
        cluster.wait_running(2, timeout=30, after_generation=gen)
        assert not [r for r in cluster.records() if r["event"] == "overlap"]
    finally:
        cluster.stop()


def test_an_agent_restarted_inside_its_lease_never_starts_into_the_running_generation(
    redis_server: RedisServer, workdir: Path, job_id: str
) -> None:
    """Issue 41: an agent SIGKILLed and restarted while its lease (20 s) is alive and before the
    leader reacted (the leader is frozen meanwhile: on a loaded machine it simply had not read
    yet). It used to acknowledge the running generation and start its rank again beside peers
    deep inside it (CI saw the job never re-form). Now it says it is a new agent of a member
    whose workers are gone, and the leader re-forms at once, not once the lease lapsed."""
    lease_s = 20.0
    cluster = LocalCluster(
        redis_server.url,
        workdir,
        job=job_id,
        max_nodes=3,
        timing={"lease_ttl": f"{lease_s:g}s", "stop_grace_period": "3s"},
        job_options={"env": {"RECORD_DIR": str(workdir / "records")}},
    )
    try:
        cluster.start("a", "b", "c")
        doc = cluster.wait_running(3)
        gen = doc["generation"]
        leader = str(doc["leader"]).split(" ", 1)[0]
        # neither the leader nor rank 0 (whose agent sees the master it published change)
        other = next(s["node"] for s in cluster.starts(gen) if s["rank"] and s["node"] != leader)
        (worker,) = [psutil.Process(p) for p in cluster.worker_pids(other)]
        cluster.agents[leader].proc.send_signal(signal.SIGSTOP)
        try:
            cluster.agents[other].proc.kill()
            cluster.agents[other].proc.wait(10)
            _wait_dead(worker, "the worker to die with its agent")
            restarted = time.monotonic()
            cluster.start(other)  # inside its lease, the leader not looking
            wait_for(
                lambda: "was running before this agent started" in cluster.agents[other].log(),
                30,
                "the restarted agent to see the generation ran before it",
            )
        finally:
            cluster.agents[leader].proc.send_signal(signal.SIGCONT)
        cluster.wait_running(3, timeout=60, after_generation=gen)
        assert time.monotonic() - restarted < lease_s, "re-formed only once the lease lapsed"
        assert [s["node"] for s in cluster.starts(gen)].count(other) == 1  # never again in gen
        assert not [r for r in cluster.records() if r["event"] == "overlap"]
    finally:
        cluster.stop()


def test_restarted_agent_kills_what_its_predecessor_left(
    redis_server: RedisServer, workdir: Path, job_id: str
) -> None:
    """Agent and keeper both SIGKILLed: the worker's child survives them. The next agent finds
    its process group in state_dir and kills it before joining."""
    cluster = _cluster(redis_server, workdir, job_id)
    try:
        cluster.start("a", "b")
        gen = cluster.wait_running(2)["generation"]
        child = _child_alive(cluster, gen, "b")
        assert child is not None
        # Frozen first: an agent that saw its keeper die would start another one (CI saw that
        # keeper fence the leftovers when the agent was killed a moment later).
        cluster.agents["b"].proc.send_signal(signal.SIGSTOP)
        keeper = cluster.keeper_pid("b")
        assert keeper is not None
        os.kill(keeper, signal.SIGKILL)
        cluster.agents["b"].proc.kill()
        cluster.agents["b"].proc.wait(10)
        time.sleep(0.3)
        assert not _dead(child)  # left over
        cluster.start("b")
        _wait_dead(child, "the restarted agent to kill the leftover")
        wait_for(
            lambda: "left by a previous agent" in cluster.agents["b"].log(),
            10,
            "the restarted agent to report the leftovers",
        )
        cluster.wait_running(2, timeout=30, after_generation=gen)
    finally:
        cluster.stop()


def test_frozen_agent_has_its_workers_fenced_before_its_lease_lapses(
    redis_server: RedisServer, workdir: Path, job_id: str
) -> None:
    """SIGSTOP of the agent alone for 3 leases: its keeper stops the workers in time, the other
    node re-forms without it, and it rejoins when it thaws."""
    cluster = _cluster(redis_server, workdir, job_id)
    sampler = LeaseSampler(redis_server.client(), JobKeys("nodeagent", job_id))
    try:
        cluster.start("a", "b")
        gen = cluster.wait_running(2)["generation"]
        with sampler:
            (worker,) = [psutil.Process(p) for p in cluster.worker_pids("b")]
            os.kill(cluster.agents["b"].proc.pid, signal.SIGSTOP)
            _wait_dead(worker, "the frozen agent's worker to be fenced")
            died = time.time()
            cluster.wait_running(1, timeout=30, after_generation=gen)
            time.sleep(2.0)
            os.kill(cluster.agents["b"].proc.pid, signal.SIGCONT)
            cluster.wait_running(2, timeout=30, after_generation=gen + 1)
        deadline = sampler.deadline_at("b", died)
        assert deadline is not None and died < deadline
        assert not [r for r in cluster.records() if r["event"] == "overlap"]
        (stop,) = [r for r in cluster.records() if r["event"] == "stop" and r["node"] == "b"]
        assert stop["generation"] == gen  # SIGTERM first: the worker could save a checkpoint
    finally:
        os.kill(cluster.agents["b"].proc.pid, signal.SIGCONT)
        cluster.stop()


def test_dead_keeper_is_restarted_and_the_job_keeps_running(
    redis_server: RedisServer, workdir: Path, job_id: str
) -> None:
    with local_cluster(redis_server.url, workdir, job=job_id, max_nodes=2) as cluster:
        cluster.start("a", "b")
        gen = cluster.wait_running(2)["generation"]
        old = cluster.keeper_pid("b")
        assert old is not None
        os.kill(old, signal.SIGKILL)
        wait_for(
            lambda: (pid := cluster.keeper_pid("b")) != old and pid,
            10,
            "a new fence keeper",
        )
        time.sleep(1.0)
        assert cluster.status()["generation"] == gen  # nothing re-formed
        assert "fence keeper exited" in cluster.agents["b"].log()
