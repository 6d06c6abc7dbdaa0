"""Where a real job's time went (issue 42, part 1): two real agents, a real redis-server, workers
that step at a fixed pace, beat, and resume from rank 0's last save (tests/helpers/worker.py).
A worker is SIGKILLed mid-run; `nodeagentctl show JOB --json` then cuts the wall time into
pieces that add up to it, and counts the steps the kill lost as the workers' own records do."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.cluster import LocalCluster, RedisServer, check_records, local_cluster, wait_for

TIMING = {"heartbeat_interval": "250ms", "lease_ttl": "1500ms"}
STEP_S, EVERY = 0.05, 20
# The agent reads the beats once a tick (250 ms): that many steps behind, twice that when a
# loaded machine runs the tick late (CI, load 9: 7 steps).
BEAT_READ = 2 * 0.25 / STEP_S + 1


@pytest.fixture
def cluster(redis_server: RedisServer, job_id: str, tmp_path: Path) -> Iterator[LocalCluster]:
    with local_cluster(
        redis_server.url, tmp_path, job=job_id, max_nodes=2, target_nodes=2, timing=TIMING
    ) as c:
        # Both nodes in every generation: with min_nodes 1 a loaded machine formed a first
        # generation of one node before the other agent joined, which ended before rank 0 said
        # it trained (CI: `unaccounted` [1], an extra re-form)
        c.min_nodes = 2
        (c.records_dir / "train").write_text(f"{STEP_S} {EVERY}")
        yield c
        check_records(c)


def saved(cluster: LocalCluster) -> int:
    path = cluster.records_dir / "saved"
    return int(path.read_text()) if path.exists() else 0


def of(cluster: LocalCluster, event: str, generation: int, rank: int = 0) -> dict[str, Any]:
    [found] = [
        r
        for r in cluster.records()
        if r["event"] == event and r["generation"] == generation and r["rank"] == rank
    ]
    return found


def test_a_killed_workers_job_accounts_for_its_wall_time_and_the_steps_it_lost(
    cluster: LocalCluster,
) -> None:
    cluster.start("a", "b")
    first = cluster.wait_running(2)["generation"]
    wait_for(lambda: saved(cluster) >= 3 * EVERY, 30, "three saves")
    kill_mid_interval(cluster, "b")
    second = cluster.wait_running(2, after_generation=first)["generation"]
    resumed = of(cluster, "start", second)["resumed"]
    wait_for(lambda: saved(cluster) >= resumed + 2 * EVERY, 30, "two saves after the re-form")
    cluster.exit_generation(second, 0)
    cluster.wait_status(lambda d: d["state"] == "succeeded", 30, "the job succeeded")

    shown = cluster.ctl("show", cluster.job, "--json")
    assert shown.returncode == 0, shown.stderr
    doc = json.loads(shown.stdout)
    found = doc["goodput"]
    assert found["ended"] and found["unaccounted"] == []
    parts = found["parts"]
    assert sum(parts.values()) == pytest.approx(found["wall_s"], abs=0.01)
    assert parts["productive"] > 0 and parts["first_start"] > 0
    assert 0 < found["ettr"] < 1
    [reform] = found["reforms"]
    assert (reform["generation"], reform["reason"]) == (second, "worker_failed")
    assert reform["reforming_s"] > 0 and reform["startup_restore_s"] > 0
    # rank 0 (on a) stepped on until its SIGTERM; the new generation resumed from its save
    reached = of(cluster, "stop", first)["step"]
    assert resumed == saved_before(reached)
    assert reached - BEAT_READ <= resumed + reform["steps_lost"] <= reached
    # Counted (the beats read last may trail rank 0's last step by BEAT_READ on a loaded
    # machine: CI saw 4 of the 10 or more lost)
    assert reform["steps_lost"] > 0
    assert reform["retrained_s"] == pytest.approx(reform["steps_lost"] * STEP_S, rel=0.5, abs=0.3)
    text = cluster.ctl("show", cluster.job).stdout
    assert "goodput:" in text and "ETTR" in text and "worker_failed" in text


def kill_mid_interval(cluster: LocalCluster, node: str) -> None:
    """SIGKILL `node`'s worker half a save interval after rank 0's last save, about 10 steps to
    lose: timed from the save file's mtime (the workers step at a wall-clock pace), not from
    when this process saw it, which a loaded machine makes late."""
    path, half = cluster.records_dir / "saved", EVERY * STEP_S / 2
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        wait = path.stat().st_mtime + half - time.time()
        if wait > 0.1:  # else too late for this save: the next one
            time.sleep(wait)
            os.kill(cluster.worker_pids(node)[0], signal.SIGKILL)
            return
        time.sleep(0.02)
    raise AssertionError("no save seen early enough to kill half an interval after it")


def saved_before(step: int) -> int:
    return step - step % EVERY
