"""End to end, a pool job's slow node (issue 52): a submitted job with `slow_node.policy:
replace` has no spare of its own (the pool gives it `target_nodes` nodes), so the pool lends it
a free node beyond its target as a standby. One member's worker throttled by the kernel's CPU
controller is named slow and drained, and the standby takes its place in place, the other
members keeping their processes; the drained node leaves the job and the pool frees it."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from tests.helpers import throttle
from tests.helpers.cluster import RedisServer, is_keeper, is_serving, wait_for
from tests.helpers.inplace import Lines
from tests.helpers.pool import PoolCluster, pool_cluster
from tests.helpers.runas import AS_TESTER
from tests.helpers.slowjob import NODES, SCRIPT, workload_env

pytest.importorskip("torch")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

WINDOW_S, WINDOWS = 2.0, 3
SHARE = 0.15  # of one CPU (as tests/e2e/test_slow_node.py)


def status(pool: PoolCluster, job: str) -> dict[str, Any]:
    done = pool.ctl("--job", job, "status", "--json")
    assert done.returncode == 0, done.stderr
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def events(pool: PoolCluster, job: str, kind: str) -> list[dict[str, Any]]:
    done = pool.ctl("--job", job, "events", "--json")
    assert done.returncode == 0, done.stderr
    said = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    return [e for e in said if e["type"] == kind]


def worker(pool: PoolCluster, node: str) -> int:
    agent = psutil.Process(pool.agents[node].proc.pid)
    [pid] = [p.pid for p in agent.children() if not is_keeper(p) and not is_serving(p)]
    return pid


def running(pool: PoolCluster, job: str, after: int, records: Path) -> dict[str, Any]:
    """The job's status once a generation after `after` runs at 3 with every member's worker
    stepping in it."""

    def probe() -> dict[str, Any] | None:
        found = status(pool, job)
        at_three = found["state"] == "running" and found["world_size"] == 3
        return found if at_three and found["generation"] > after else None

    doc = wait_for(probe, 120, f"a generation after {after} at world 3")
    pids = [worker(pool, n) for n in doc["members"]]
    lines = Lines(records)
    wait_for(lambda: lines.stepping(pids, doc["generation"]), 90, "every member stepping")
    return doc


@pytest.mark.skipif(throttle.available() is not None, reason=str(throttle.available()))
def test_a_pool_jobs_slow_node_is_replaced_by_the_standby_the_pool_lends(
    redis_server: RedisServer, job_id: str, tmp_path: Path
) -> None:
    records = tmp_path / "records"
    records.mkdir()
    spec = {
        "id": job_id,
        "entrypoint": [sys.executable, str(SCRIPT)],
        "min_nodes": 2,
        "max_nodes": 3,
        "target_nodes": 3,
        "max_restarts": 5,
        "recovery": "in_place",
        "env": workload_env(records),
        "slow_node": {"policy": "replace", "window": f"{WINDOW_S:g}s", "windows": WINDOWS},
        "user": AS_TESTER["user"],
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    with pool_cluster(redis_server.url, tmp_path, pool=job_id) as pool:
        pool.timing["reform_timeout"] = "30s"
        pool.start(*NODES)
        pool.wait_nodes(len(NODES))
        submitted = pool.ctl("submit", str(path))
        assert submitted.returncode == 0, submitted.stderr
        # Admitted on three; the fourth, free, is lent as the standby and joins the job.
        wait_for(
            lambda: list(pool.placements().values()) == [job_id] * len(NODES),
            60,
            "every node placed on the job",
        )
        doc = running(pool, job_id, 0, records)
        members = doc["members"]
        (standby,) = set(NODES) - set(members)
        victim, kept = members[1], [members[0], members[2]]
        before = {n: worker(pool, n) for n in kept}

        with throttle.throttled(f"nodeagent-test-{job_id}", [worker(pool, victim)], SHARE):
            slow = wait_for(lambda: events(pool, job_id, "node_slow"), 90, "a node named slow")
            assert [e["node"] for e in slow] == [victim], pool.diagnostics()
            doc = running(pool, job_id, doc["generation"], records)
        assert doc["members"] == [*kept, standby]
        assert {n: worker(pool, n) for n in kept} == before  # in place: the same processes
        acted = events(pool, job_id, "slow_node_policy")
        assert [e["node"] for e in acted] == [victim], acted
        # Drained from the job, the node refuses it from now on: the pool frees it at once
        # and never lends it back to the job as its standby.
        wait_for(lambda: pool.placements().get(victim) is None, 30, "the slow node freed")
        assert "it drained this node (slow-node: slow: busy" in pool.agents[victim].log()
        time.sleep(2.0)  # a few pool rounds: still free
        assert pool.placements().get(victim) is None
