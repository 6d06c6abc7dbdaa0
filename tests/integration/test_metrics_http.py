"""/metrics and /healthz of real agents, scraped over HTTP as Prometheus would."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.helpers.cluster import LocalCluster, RedisServer, local_cluster, wait_for
from tests.helpers.scrape import AGENT_USER, scrape

TIMING = {"heartbeat_interval": "200ms", "lease_ttl": "1s"}


def sample(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def healthz(address: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{address}/healthz", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def addresses(cluster: LocalCluster) -> dict[str, str]:
    return {n["name"]: n["metrics"] for n in cluster.status()["nodes"] if n["metrics"]}


def test_scrape_counts_a_restart(redis_server: RedisServer, job_id: str, tmp_path: Path) -> None:
    with local_cluster(
        redis_server.url, tmp_path, job=job_id, max_nodes=2, timing=TIMING
    ) as cluster:
        cluster.start("a", "b")
        before = cluster.wait_running(2)

        def both() -> dict[str, str] | None:
            found = addresses(cluster)
            return found if len(found) == 2 else None

        where = wait_for(both, 10, "both metrics addresses")
        samples = scrape(where["a"])
        job = {"job_id": cluster.job, "user": AGENT_USER}  # whom it runs as: on every series
        assert sample(samples, "nodeagent_generation", **job) == before["generation"]
        assert sample(samples, "nodeagent_world_size", **job) == 2
        assert sample(samples, "nodeagent_node_state", nodeagent_node_state="running", **job) == 1
        assert sample(samples, "nodeagent_workers", state="running", **job) == 1
        assert sample(samples, "nodeagent_gpu_monitoring_available", **job) == 0  # no driver here
        assert healthz(where["a"])[0] == 200
        # A loaded machine may start the job on a alone and re-form it when b joins: count from
        # here.
        recoveries = sample(samples, "nodeagent_recovery_seconds_count", **job) or 0
        os.kill(cluster.worker_pids("b")[0], signal.SIGKILL)
        cluster.wait_running(2, after_generation=before["generation"])
        for name in ("a", "b"):

            def restarted(node: str = name) -> float | None:
                return sample(
                    scrape(where[node]), "nodeagent_restarts_total", reason="worker_failed", **job
                )

            assert wait_for(restarted, 10, f"{name} to count the restart") == 1
        assert (
            sample(scrape(where["b"]), "nodeagent_worker_failures_total", kind="signal", **job) == 1
        )
        assert (
            sample(scrape(where["a"]), "nodeagent_recovery_seconds_count", **job) == recoveries + 1
        )


def test_healthz_fails_without_redis(tmp_path: Path) -> None:
    server = RedisServer(tmp_path)
    server.start()
    try:
        with local_cluster(
            server.url, tmp_path, job="healthz", max_nodes=1, timing=TIMING
        ) as cluster:
            cluster.start("a")
            cluster.wait_running(1)
            where = wait_for(lambda: addresses(cluster).get("a"), 10, "address")
            assert healthz(where)[0] == 200
            server.stop()

            def unhealthy() -> str | None:
                code, reason = healthz(where)
                return reason if code == 503 else None

            assert "no lease renewal" in wait_for(unhealthy, 10, "/healthz to answer 503")
    finally:
        server.stop()


SERVE = """
import logging, resource, sys, time
from prometheus_client import CollectorRegistry, Counter
from nodeagent.telemetry.metrics import MetricsServer
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
registry = CollectorRegistry()
Counter("probe", "a probe", registry=registry).inc()
cap = int(sys.argv[2])
server = MetricsServer("127.0.0.1:0", registry, lambda: (True, "ok"), cap, timeout=60)
server.start()
print(server.address, flush=True)
time.sleep(120)
"""


def proc_status(pid: int) -> tuple[int, int]:
    """(threads, open descriptors) of a process."""
    threads = next(
        int(line.split()[1])
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith("Threads:")
    )
    return threads, len(os.listdir(f"/proc/{pid}/fd"))


def half_requests(address: str, count: int) -> list[socket.socket]:
    """`count` connections that each send half a request line and then nothing (slowloris)."""
    host, port = address.rsplit(":", 1)
    opened = []
    for _ in range(count):
        sock = socket.socket()
        sock.settimeout(2)
        try:
            sock.connect((host, int(port)))
            sock.sendall(b"GET /metr")
        except OSError:
            sock.close()
            continue
        opened.append(sock)
    return opened


@pytest.mark.parametrize(
    ("fd_limit", "cap", "why"),
    [
        (1024, 32, "the connection cap holds"),
        (48, 1000, "descriptors run out first: EMFILE on accept is a retry, not a crash"),
    ],
)
def test_slow_clients_cannot_exhaust_the_metrics_server(
    tmp_path: Path, fd_limit: int, cap: int, why: str
) -> None:
    stderr = (tmp_path / "server.log").open("w+")
    server = subprocess.Popen(
        [sys.executable, "-c", SERVE, str(fd_limit), str(cap)],
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
    )
    try:
        assert server.stdout is not None
        address = server.stdout.readline().strip()
        threads_before, _ = proc_status(server.pid)
        clients = half_requests(address, 300)
        try:
            assert len(clients) > 100, why  # the attack got through the kernel's backlog
            with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
                assert b"probe_total 1.0" in response.read(), why
            threads, fds = proc_status(server.pid)
            assert threads == threads_before, why  # no thread per connection
            assert fds <= min(fd_limit, cap + 16), why
            assert server.poll() is None, why
        finally:
            for sock in clients:
                sock.close()
        assert healthz(address) == (200, "ok\n"), why
        log = Path(stderr.name).read_text()
        if fd_limit < cap:
            assert "out of file descriptors" in log and "retrying" in log, log[-2000:]
    finally:
        server.kill()
        server.wait(10)
        if server.stdout is not None:
            server.stdout.close()
        stderr.close()
