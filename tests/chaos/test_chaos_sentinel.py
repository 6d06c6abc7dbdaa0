"""A pool on Redis with Sentinel (a primary, a replica, three sentinels: tests/helpers/sentinel.py)
through a failover at full submission rate, as issue 79 measured it: running jobs and clients
submitting as fast as nodeagentctl goes; the primary killed, or frozen until a sentinel promoted
the replica and then resumed (made a replica, losing what it took meanwhile). With
pool.durability asking one replica and ride-through on: no acknowledged submission lost, none
doubled, no running job restarted. A submission answered "not acknowledged" or "cannot reach
Redis" (exit 69) is run again with the request id it printed, as the message says, once the old
primary serves as the new one's replica (until then nothing can be acknowledged: one replica
asked, none left), and is then stored once."""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from nodeagent.coord.keys import PoolKeys
from tests.helpers.cluster import nodeagentctl, wait_for
from tests.helpers.pool import PoolCluster, pool_cluster
from tests.helpers.sentinel import SentinelSet, sentinel_set

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.timeout(300)]
CLIENTS = 4
POOL = "sentinel"


@dataclass
class Tried:
    name: str
    request_id: str
    code: int
    said: str


def _submit(url: str, name: str, request_id: str) -> Tried:
    result = nodeagentctl(
        *("--redis", url, "--pool", POOL, "--request-id", request_id),
        *("submit", "--name", name, "--nodes", "1000", "--hold", "--", "true"),
    )
    return Tried(name, request_id, result.returncode, result.stdout + result.stderr)


class Burst:
    """CLIENTS threads submitting one held job after another until stopped."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.tried: list[Tried] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(CLIENTS)
        ]

    def _run(self, client: int) -> None:
        count = 0
        while not self._stop.is_set():
            count += 1
            name = f"burst-{client}-{count}"
            self.tried.append(_submit(self.url, name, f"rid-{name}"))

    def __enter__(self) -> Burst:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[tuple[SentinelSet, PoolCluster]]:
    with (
        sentinel_set(tmp_path / "redis") as redis_set,
        pool_cluster(
            redis_set.url,
            tmp_path,
            pool=POOL,
            scheduling={"durability": {"replicas": 1, "timeout": "1s"}},
        ) as cluster,
    ):
        yield redis_set, cluster


@pytest.mark.parametrize("fault", ["kill", "freeze"])
def test_a_failover_at_full_submission_rate_loses_no_acknowledged_job_and_moves_none(
    pool: tuple[SentinelSet, PoolCluster], fault: str
) -> None:
    redis_set, cluster = pool
    cluster.start("a", "b", "c")
    cluster.wait_nodes(3)
    wait_for(
        lambda: redis_set.primary.client().get(PoolKeys("nodeagent", POOL).durability),
        30,
        "the pool leader to publish pool.durability",
    )
    cluster.submit("one", "2")
    cluster.submit("two", "1")
    # Running at its world, not only admitted: an admitted job's row says running before its
    # first generation is in it (CI read `two` at generation None, then 1).
    before = {
        job: cluster.wait_job(job, "running", world=world, timeout=60)["generation"]
        for job, world in (("one", 2), ("two", 1))
    }
    starts = {job: cluster.wait_started(job, world) for job, world in (("one", 2), ("two", 1))}
    with Burst(redis_set.url) as burst:
        time.sleep(2.0)  # under way
        if fault == "kill":
            assert redis_set.primary.proc is not None
            redis_set.primary.proc.kill()
            redis_set.promoted()
        else:
            redis_set.signal_primary(signal.SIGSTOP)
            try:
                redis_set.promoted()
            finally:
                redis_set.signal_primary(signal.SIGCONT)
        time.sleep(3.0)  # submissions go on on the new primary
    redis_set.rejoined()  # (with one replica, nothing is acknowledged until it is back)
    new = redis_set.promoted().client()
    keys = PoolKeys("nodeagent", POOL)

    # Every submission that was not answered done is run again with its request id, as the
    # message says; none of them was refused.
    unknown = [t for t in burst.tried if t.code == 69]
    assert all(f"--request-id {t.request_id}" in t.said for t in unknown), unknown[:3]
    again = [_submit(redis_set.url, t.name, t.request_id) for t in unknown]
    assert [t for t in again if t.code != 0] == [], again[:3]
    others = [t for t in burst.tried if t.code not in (0, 69)]
    assert others == [], others[:3]

    acknowledged = {t.name for t in burst.tried if t.code == 0} | {t.name for t in again}
    stored = {str(name) for name in new.hkeys(keys.jobs) if str(name).startswith("burst-")}
    lost, extra = sorted(acknowledged - stored), sorted(stored - acknowledged)
    assert stored == acknowledged, f"lost {lost[:5]}, never acknowledged {extra[:5]}"
    specs = [json.loads(raw) for raw in new.hvals(keys.specs)]
    requests = [s.get("request") for s in specs if s["id"].startswith("burst-")]
    assert len(requests) == len(set(requests)) == len(stored)  # one job per request
    print(
        f"{fault}: {len(burst.tried)} submissions, {len(unknown)} not acknowledged and run "
        f"again, {len(stored)} stored",
        file=sys.stderr,
    )

    # No running job moved: the same generation, no new worker started.
    rows = cluster.jobs()
    assert {job: rows[job]["generation"] for job in ("one", "two")} == before
    assert {job: cluster.starts(job) for job in ("one", "two")} == starts
