"""The sd_notify protocol against real sockets, and `nodeagent run` under a fake systemd."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from nodeagent.telemetry.sdnotify import Notifier
from tests.helpers.cluster import (
    AgentProcess,
    RedisServer,
    local_cluster,
    start_agent,
    wait_for,
)
from tests.helpers.pool import PoolCluster


class FakeSystemd:
    """The receiving end of NOTIFY_SOCKET: collects every datagram."""

    def __init__(self, address: str | bytes) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)
        self.sock.settimeout(0.1)
        self.messages: list[str] = []

    def receive(self) -> list[str]:
        try:
            while True:
                self.messages.append(self.sock.recv(4096).decode())
        except (TimeoutError, BlockingIOError):
            pass
        return self.messages

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def systemd(tmp_path: Path) -> Iterator[FakeSystemd]:
    fake = FakeSystemd(str(tmp_path / "notify.sock"))
    yield fake
    fake.close()


def test_messages_reach_a_path_socket(systemd: FakeSystemd, tmp_path: Path) -> None:
    notifier = Notifier(str(tmp_path / "notify.sock"), "2000000")
    assert notifier.enabled and notifier.watchdog_interval_s == 1.0
    notifier.ready("running")
    notifier.status("running")  # unchanged: not sent again
    notifier.status("restarting")
    notifier.ping()
    notifier.ping()  # within half the watchdog interval: not sent again
    notifier.stopping()
    assert systemd.receive() == [
        "READY=1\nSTATUS=running",
        "STATUS=restarting",
        "WATCHDOG=1",
        "STOPPING=1\nSTATUS=stopping workers and leaving the job",
    ]


def test_abstract_namespace_socket() -> None:
    name = f"nodeagent-test-{os.getpid()}"
    fake = FakeSystemd(b"\0" + name.encode())
    try:
        assert Notifier(f"@{name}").send("READY=1")
        assert fake.receive() == ["READY=1"]
    finally:
        fake.close()


def test_no_socket_is_a_no_op() -> None:
    notifier = Notifier.from_environ({})
    assert not notifier.enabled and not notifier.send("READY=1") and notifier.next_ping() is None


def test_agent_under_systemd(
    systemd: FakeSystemd, redis_server: RedisServer, job_id: str, tmp_path: Path
) -> None:
    with local_cluster(redis_server.url, tmp_path / "job", job=job_id, max_nodes=1) as cluster:
        cluster.start(
            "a",
            env={
                "NOTIFY_SOCKET": str(tmp_path / "notify.sock"),
                "WATCHDOG_USEC": "400000",
                "WATCHDOG_PID": "1",
            },
        )
        cluster.wait_running(1)
        wait_for(lambda: sum(m == "WATCHDOG=1" for m in systemd.receive()) >= 3, 10, "pings")
        messages = systemd.receive()
        assert messages[0].startswith("READY=1\nSTATUS=")
        assert any(m.startswith("STATUS=running; job running, generation 1") for m in messages)
        cluster.agents["a"].proc.send_signal(signal.SIGTERM)
        assert cluster.agents["a"].proc.wait(15) == 0
        time.sleep(0.2)
        assert any(m.startswith("STOPPING=1") for m in systemd.receive())
        # the worker never saw NOTIFY_SOCKET or WATCHDOG_* (it records bad_env if it does)
        assert [r["event"] for r in cluster.records()].count("bad_env") == 0
        assert cluster.starts(1)


def _stops_saying_so(agent: AgentProcess, systemd: FakeSystemd) -> None:
    """SIGTERM: the daemon exits 0, having told systemd STOPPING=1."""
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.proc.wait(15) == 0
    time.sleep(0.2)
    assert any(m.startswith("STOPPING=1") for m in systemd.receive())


def test_a_pool_node_without_a_job_is_ready_and_pings(
    systemd: FakeSystemd, redis_server: RedisServer, job_id: str, tmp_path: Path
) -> None:
    """A job-less pool node tells systemd it started (Type=notify would wait for ever) and
    keeps the watchdog fed while it serves nothing."""
    pool = PoolCluster(redis_server.url, tmp_path, pool=job_id)
    path = tmp_path / "free.yaml"
    path.write_text(yaml.safe_dump(pool.config("free")))
    env = {"NOTIFY_SOCKET": str(tmp_path / "notify.sock"), "WATCHDOG_USEC": "400000"}
    agent = start_agent("free", path, tmp_path, env=env)
    pool.agents["free"] = agent
    try:
        wait_for(lambda: sum(m == "WATCHDOG=1" for m in systemd.receive()) >= 3, 15, "pings")
        messages = systemd.receive()
        assert messages[0] == f"READY=1\nSTATUS=free in pool {job_id}", messages[:3]
        _stops_saying_so(agent, systemd)
    finally:
        pool.stop()


def test_a_pool_node_leaving_a_job_does_not_tell_systemd_it_stops(
    systemd: FakeSystemd, redis_server: RedisServer, job_id: str, tmp_path: Path
) -> None:
    """A pool node whose job ends (here: cancelled) goes on serving the pool: STOPPING=1 is the
    daemon's to say, when it stops. The job's agent said it as it left its job, and systemd
    took the whole service for stopping: TimeoutStopSec later it SIGKILLed the agent and the
    workers of the job it served by then (booted nodes, under the shipped unit)."""
    pool = PoolCluster(redis_server.url, tmp_path, pool=job_id)
    path = tmp_path / "a.yaml"
    path.write_text(yaml.safe_dump(pool.config("a")))
    env = {"NOTIFY_SOCKET": str(tmp_path / "notify.sock"), "WATCHDOG_USEC": "400000"}
    pool.agents["a"] = agent = start_agent("a", path, tmp_path, env=env)
    try:
        pool.wait_nodes(1)
        submitted = pool.ctl("submit", "--name", "short", "--nodes", "1", "--", "sleep", "600")
        assert submitted.returncode == 0, submitted.stderr
        wait_for(lambda: pool.placements().get("a") == "short", 30, "the job to be placed")
        wait_for(lambda: any("job running" in m for m in systemd.receive()), 30, "the job to run")
        said = len(systemd.receive())
        assert pool.ctl("cancel", "short").returncode == 0
        wait_for(lambda: not pool.placements().get("a"), 30, "the node to be free again")
        wait_for(
            lambda: any("free in pool" in m for m in systemd.receive()[said:]),
            30,
            "the node to say it is free",
        )
        assert not [m for m in systemd.receive() if "STOPPING=1" in m]
        _stops_saying_so(agent, systemd)
    finally:
        pool.stop()


def test_the_api_service_says_it_is_ready_once_it_serves_and_that_it_stops(
    systemd: FakeSystemd, redis_server: RedisServer, tmp_path: Path
) -> None:
    """nodeagent-api.service is Type=notify: READY=1 only once its socket accepts, so that
    `systemctl start` fails when the service exits first; STOPPING=1 on SIGTERM, then exit 0.
    A configuration error exits 78 having said nothing (systemd then reports the start failed)."""
    path = tmp_path / "api.yaml"
    sock = tmp_path / "api.sock"
    config = {"redis": {"url": redis_server.url}, "pool": "p", "socket": str(sock), "listen": ""}
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "NOTIFY_SOCKET": str(tmp_path / "notify.sock")}
    command = [sys.executable, "-m", "nodeagent", "api", "--config", str(path)]
    log = tmp_path / "api.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: systemd.receive() or proc.poll() is not None, 30, "READY=1")
        assert systemd.receive() == ["READY=1\nSTATUS=serving pool p"], log.read_text()
        with socket.socket(socket.AF_UNIX) as caller:
            caller.connect(str(sock))  # it serves by then
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
        assert systemd.receive()[1:] == ["STOPPING=1"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    path.write_text(yaml.safe_dump({**config, "pool": "no spaces allowed"}))
    failed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert failed.returncode == 78, failed.stderr
    assert systemd.receive()[2:] == []
