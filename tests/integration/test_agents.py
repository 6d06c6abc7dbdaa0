"""Several real agent processes, one real redis-server, real worker processes.

Every test ends by checking the workers' own records: no worker ever started while a worker of
an older generation was alive, and every worker saw a consistent torchrun environment.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.helpers.cluster import LocalCluster, RedisServer, check_records, local_cluster, wait_for

HEARTBEAT_MS, LEASE_MS = 250, 1500
TIMING = {"heartbeat_interval": f"{HEARTBEAT_MS}ms", "lease_ttl": f"{LEASE_MS}ms"}


@pytest.fixture
def cluster(redis_server: RedisServer, job_id: str, tmp_path: Path) -> Iterator[LocalCluster]:
    with local_cluster(
        redis_server.url, tmp_path, job=job_id, max_nodes=4, target_nodes=3, timing=TIMING
    ) as c:
        yield c
        check_records(c)


def events_of(cluster: LocalCluster, kind: str) -> list[dict[str, Any]]:
    return [e for e in cluster.events() if e["type"] == kind]


def test_job_forms_with_unique_consistent_ranks(cluster: LocalCluster) -> None:
    cluster.start("a", "b", "c")
    doc = cluster.wait_running(3)
    starts = cluster.starts(doc["generation"])
    assert sorted(s["rank"] for s in starts) == [0, 1, 2]
    assert {s["world_size"] for s in starts} == {3}
    assert len({s["master"] for s in starts}) == 1
    assert doc["master"] == starts[0]["master"]
    nodes = {n["name"]: n for n in doc["nodes"]}
    assert sorted(n["group_rank"] for n in nodes.values()) == [0, 1, 2]
    rank_of = {s["node"]: s["rank"] for s in starts}
    assert all(nodes[name]["group_rank"] == rank for name, rank in rank_of.items())
    assert doc["leader"] in nodes and doc["restart_count"] == 0
    assert all(n["workers"][0]["state"] == "running" for n in nodes.values())
    log_dir = cluster.directory / "logs" / cluster.job / str(doc["generation"])
    assert sorted(p.name for p in log_dir.glob("*.log")) == [
        "rank-0.log",
        "rank-1.log",
        "rank-2.log",
    ]


def test_worker_sigkill_reforms_everyone_and_counts_a_restart(cluster: LocalCluster) -> None:
    cluster.start("a", "b", "c")
    before = cluster.wait_running(3)
    os.kill(cluster.worker_pids("b")[0], signal.SIGKILL)
    after = cluster.wait_running(3, after_generation=before["generation"])
    assert after["generation"] == before["generation"] + 1
    assert after["restart_count"] == 1
    assert {s["node"] for s in cluster.starts(after["generation"])} == {"a", "b", "c"}
    assert {s["restart_count"] for s in cluster.starts(after["generation"])} == {1}
    failed = events_of(cluster, "worker_failed")
    assert failed and failed[0]["data"]["signal"] == "SIGKILL" and failed[0]["node"] == "b"


def test_agent_sigkill_reforms_as_world_two_within_the_lease(cluster: LocalCluster) -> None:
    cluster.start("a", "b", "c")
    before = cluster.wait_running(3)
    cluster.kill_tree("c")
    lease = next(lease for lease in cluster.store.snapshot().leases if lease.name == "c")
    last_heartbeat_ms = lease.deadline_ms - LEASE_MS  # the agent is dead: this deadline is final
    after = cluster.wait_running(2, after_generation=before["generation"])
    assert after["restart_count"] == 0  # node loss does not consume restarts
    lost = events_of(cluster, "node_lost")
    assert [e["node"] for e in lost] == ["c"]
    started = [
        e
        for e in events_of(cluster, "generation_started")
        if e["generation"] == after["generation"]
    ]
    # Measured in Redis server time, from the stream IDs: noticed and re-formed within the
    # lease plus two heartbeats of the dead node's last heartbeat.
    assert lost[0]["at_ms"] - last_heartbeat_ms <= LEASE_MS + 2 * HEARTBEAT_MS
    assert started[0]["at_ms"] - last_heartbeat_ms <= LEASE_MS + 2 * HEARTBEAT_MS
    assert sorted(after["members"]) == ["a", "b"]
    # a and b held c out as its agent's beat connections closed (job/suspicion.py), before its
    # lease lapsed: its lease is reaped at its deadline
    assert "suspected lost by 2 of 3 members" in lost[0]["message"]
    cluster.wait_status(
        lambda d: {n["name"] for n in d["nodes"]} == {"a", "b"}, LEASE_MS / 1000 + 10, "reaped"
    )


def test_fourth_agent_is_standby_until_scaled_up(cluster: LocalCluster) -> None:
    cluster.start("a", "b", "c")
    before = cluster.wait_running(3)
    cluster.start("d")
    doc = cluster.wait_status(
        lambda d: any(n["name"] == "d" and n["state"] == "standby" for n in d["nodes"]),
        20,
        "d standby",
    )
    assert doc["generation"] == before["generation"] and doc["world_size"] == 3
    result = cluster.ctl("scale", "4", "--wait", "--timeout", "30s")
    assert result.returncode == 0, result.stderr
    assert "runs on 4 nodes" in result.stdout
    after = cluster.status()
    assert after["world_size"] == 4 and after["target_nodes"] == 4 and after["restart_count"] == 0
    nodes = {n["name"]: n for n in after["nodes"]}
    assert nodes["d"]["group_rank"] == 3  # the newcomer goes last, survivors keep their ranks
    assert [e["data"]["to"] for e in events_of(cluster, "scale_requested")] == [4]


def test_impossible_scale_is_refused(cluster: LocalCluster) -> None:
    cluster.start("a")
    cluster.wait_status(
        lambda d: d["generation"] >= 0 and d["max_nodes"] == 4, 20, "record written"
    )
    beyond = cluster.ctl("scale", "9")
    assert beyond.returncode == 2
    assert "within [min_nodes, max_nodes] = [1, 4]" in beyond.stderr
    not_a_number = cluster.ctl("scale", "lots")
    assert not_a_number.returncode == 2 and "expected N, +N or -N" in not_a_number.stderr
    assert cluster.status()["target_nodes"] == 3


def test_exceeding_max_restarts_fails_the_job(
    redis_server: RedisServer, job_id: str, tmp_path: Path
) -> None:
    with local_cluster(
        redis_server.url, tmp_path, job=job_id, max_nodes=2, max_restarts=1, timing=TIMING
    ) as cluster:
        cluster.start("a", "b")
        doc = cluster.wait_running(2)
        cluster.exit_generation(doc["generation"], 1)  # every worker fails
        doc = cluster.wait_running(2, after_generation=doc["generation"])
        assert doc["restart_count"] == 1
        cluster.exit_generation(doc["generation"], 1)
        failed = cluster.wait_status(lambda d: d["state"] == "failed", 20, "job failed")
        assert failed["restart_count"] == 1 and failed["reason"] == "max_restarts exceeded"
        assert "exit code 1" in failed["detail"]
        assert events_of(cluster, "job_failed")
        time.sleep(1.0)  # failed stays failed: nothing restarts
        assert cluster.status()["generation"] == failed["generation"]
        assert all(not any(w["state"] == "running" for w in n["workers"]) for n in failed["nodes"])
        check_records(cluster)


def test_all_workers_exiting_zero_succeeds(cluster: LocalCluster) -> None:
    cluster.start("a", "b", "c")
    doc = cluster.wait_running(3)
    cluster.exit_generation(doc["generation"], 0)
    done = cluster.wait_status(lambda d: d["state"] == "succeeded", 20, "job succeeded")
    assert done["generation"] == doc["generation"] and done["restart_count"] == 0
    wait_for(
        lambda: all(n["state"] == "succeeded" for n in cluster.status()["nodes"]),
        10,
        "nodes report succeeded",
    )
    assert events_of(cluster, "job_succeeded")


def test_sigterm_leaves_at_once_instead_of_waiting_for_the_ttl(
    redis_server: RedisServer, job_id: str, tmp_path: Path
) -> None:
    slow_lease = {"heartbeat_interval": "1s", "lease_ttl": "20s"}
    with local_cluster(
        redis_server.url, tmp_path, job=job_id, max_nodes=3, timing=slow_lease
    ) as cluster:
        cluster.start("a", "b", "c")
        before = cluster.wait_running(3)
        sent = time.time()
        cluster.agents["c"].proc.send_signal(signal.SIGTERM)
        assert cluster.agents["c"].proc.wait(15) == 0
        after = cluster.wait_running(2, after_generation=before["generation"])
        started = [
            e
            for e in events_of(cluster, "generation_started")
            if e["generation"] == after["generation"]
        ]
        assert started[0]["at_ms"] / 1000 - sent < 10  # well inside the 20 s lease
        assert [e["node"] for e in events_of(cluster, "node_left")] == ["c"]
        assert not events_of(cluster, "node_lost")
        assert any(r["event"] == "stop" and r["node"] == "c" for r in cluster.records())
        check_records(cluster)


def test_operator_stop_and_restart(cluster: LocalCluster) -> None:
    cluster.start("a", "b", "c")
    before = cluster.wait_running(3)
    assert cluster.ctl("stop").returncode == 0
    cluster.wait_status(
        lambda d: (
            d["state"] == "stopped"
            and all(
                not n["workers"] or all(w["state"] != "running" for w in n["workers"])
                for n in d["nodes"]
            )
        ),
        20,
        "job stopped everywhere",
    )
    assert cluster.ctl("restart").returncode == 0
    after = cluster.wait_running(3, after_generation=before["generation"])
    assert after["restart_count"] == 0
    events = cluster.ctl("events", "--json")
    assert events.returncode == 0 and '"type": "stop_requested"' in events.stdout
    assert [e["type"] for e in events_of(cluster, "job_stopped")] == ["job_stopped"]


def test_killing_the_leader_hands_leadership_over(
    redis_server: RedisServer, job_id: str, tmp_path: Path
) -> None:
    """Under a 10 s lease: the two others hold the dead leader out, and one of them takes its
    lease at once (job/peers.py `depose`), so the job re-forms long before the dead leader's
    leases (its node's and its leader lease) would have lapsed."""
    timing = {"heartbeat_interval": f"{HEARTBEAT_MS}ms", "lease_ttl": "10s"}
    with local_cluster(
        redis_server.url, tmp_path, job=job_id, max_nodes=4, target_nodes=3, timing=timing
    ) as cluster:
        cluster.start("a", "b", "c")
        before = cluster.wait_running(3)
        leader = before["leader"]
        cluster.kill_tree(leader)
        lease = next(lease for lease in cluster.store.snapshot().leases if lease.name == leader)
        after = cluster.wait_running(2, after_generation=before["generation"])
        deposed = events_of(cluster, "leader_deposed")
        assert [e["node"] for e in deposed] == [leader]
        started = [
            e
            for e in events_of(cluster, "generation_started")
            if e["generation"] == after["generation"]
        ]
        assert started[0]["at_ms"] < lease.deadline_ms
        assert after["leader"] not in (None, leader)
        assert leader in {n["name"] for n in after["nodes"]}  # its lease still held
        lost = events_of(cluster, "node_lost")
        assert [e["node"] for e in lost] == [leader]
        assert "suspected lost by 2 of 3 members" in lost[0]["message"]
        check_records(cluster)


def test_second_sigterm_kills_workers_that_ignore_the_first(
    redis_server: RedisServer, job_id: str, tmp_path: Path
) -> None:
    stubborn = [
        sys.executable,
        "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ignoring SIGTERM', flush=True); time.sleep(600)",
    ]
    timing = {**TIMING, "stop_grace_period": "10m"}
    with local_cluster(
        redis_server.url, tmp_path, job=job_id, max_nodes=1, timing=timing, entrypoint=stubborn
    ) as cluster:
        cluster.start("a")
        rank_log = tmp_path / "logs" / job_id / "1" / "rank-0.log"
        wait_for(
            lambda: rank_log.exists() and "ignoring SIGTERM" in rank_log.read_text(),
            20,
            "the worker to ignore SIGTERM",
        )
        worker = psutil.Process(cluster.worker_pids("a")[0])
        agent = cluster.agents["a"].proc
        agent.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert agent.poll() is None and worker.is_running()  # waiting out the 10 min grace
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(15) == 0
        assert not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE


def test_scale_wait_times_out_and_rolls_back(cluster: LocalCluster) -> None:
    cluster.start("a", "b", "c")
    cluster.wait_running(3)
    result = cluster.ctl("scale", "4", "--wait", "--timeout", "2s", "--rollback")
    assert result.returncode == 1  # only three nodes exist
    assert (
        "does not run on 4 nodes" in result.stderr and "rolled back: target 4 -> 3" in result.stderr
    )
    cluster.wait_status(lambda d: d["target_nodes"] == 3, 10, "the target to be restored")
    assert [e["data"]["to"] for e in events_of(cluster, "scale_requested")] == [4, 3]
