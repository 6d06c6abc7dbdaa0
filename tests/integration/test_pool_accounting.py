"""Accounting (issue 67) with real agents and a real redis-server: every ended job's record is
written once to the accounting database, SQLite by default or a real PostgreSQL the test starts;
`history` reads it beyond the pool's window and `report` sums it; PostgreSQL stopped mid-run and
the pool leader killed, the jobs run on, their records wait in Redis and are written once. Fair
share's usage goes on from what the last leader saved."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from nodeagent.coord.keys import PoolKeys
from nodeagent.model.fairshare import FairShare, Usage
from tests.helpers.cluster import RedisServer, nodeagentctl, wait_for
from tests.helpers.pool import PoolCluster, pool_cluster
from tests.helpers.postgres import Postgres
from tests.helpers.postgres import missing as postgres_missing
from tests.helpers.runas import AS_TESTER

pytestmark = pytest.mark.timeout(240)


def _end(pool: PoolCluster, job: str, code: str) -> None:
    generation = pool.wait_job(job, "running", world=1, timeout=60)["generation"]
    (pool.job_records(job) / f"exit-{generation}").write_text(code)


def _sqlite_runs(path: Path) -> list[tuple[str, int, str]]:
    if not path.exists():
        return []
    with sqlite3.connect(path) as conn:
        try:
            rows = conn.execute("SELECT job, seq, state FROM nodeagent_jobs ORDER BY seq")
            return [(str(j), int(s), str(st)) for j, s, st in rows.fetchall()]
        except sqlite3.OperationalError:  # no table yet
            return []


def test_ended_jobs_are_kept_in_sqlite_and_read_beyond_the_pools_window(
    redis_server: RedisServer, tmp_path: Path, job_id: str
) -> None:
    """The default database: accounting.sqlite in the agent's state directory. The pool keeps
    ended jobs for 2 s here; `history` goes on listing them from the file, and `report` sums
    them."""
    ok, failing = f"{job_id}-ok"[:63], f"{job_id}-fail"[:63]
    with pool_cluster(
        redis_server.url, tmp_path, pool=job_id, scheduling={"keep_ended": "2s"}
    ) as pool:
        pool.start("a")
        pool.wait_nodes(1)
        pool.submit(ok, "1")
        _end(pool, ok, "0")
        pool.submit(failing, "1", "--max-restarts", "0")
        _end(pool, failing, "3")
        database = tmp_path / "state" / "accounting.sqlite"
        wait_for(lambda: len(_sqlite_runs(database)) == 2, 30, "two records in the file")
        assert [(j, st) for j, _, st in _sqlite_runs(database)] == [
            (ok, "succeeded"), (failing, "failed"),
        ]  # fmt: skip
        wait_for(lambda: not ({ok, failing} & set(pool.jobs())), 30, "both pruned from the pool")

        url = f"sqlite://{database}"
        window = pool.ctl("history", "--json", "--accounting", "none")
        assert window.returncode == 0 and json.loads(window.stdout)["jobs"] == []
        kept = pool.ctl("history", "--json", "--accounting", url)
        assert kept.returncode == 0, kept.stderr
        rows = {r["job"]: r for r in json.loads(kept.stdout)["jobs"]}
        assert (rows[ok]["state"], rows[ok]["exit_code"]) == ("succeeded", 0)
        assert (rows[failing]["state"], rows[failing]["exit_code"]) == ("failed", 3)
        assert rows[ok]["user"] and rows[ok]["node_hours"] > 0 and rows[ok]["elapsed_s"] > 0
        # --config finds the default file in the config's state directory
        by_config = nodeagentctl("--config", str(tmp_path / "a.yaml"), "history", "--json")
        assert by_config.returncode == 0, by_config.stderr
        assert {r["job"] for r in json.loads(by_config.stdout)["jobs"]} == {ok, failing}

        report = pool.ctl("report", "--by", "user", "--since", "1h", "--json", "--accounting", url)
        assert report.returncode == 0, report.stderr
        (usage,) = json.loads(report.stdout)["rows"]
        assert (usage["key"], usage["jobs"], usage["failed"]) == (rows[ok]["user"], 2, 1)
        text = pool.ctl("report", "--by", "day", "--accounting", url)
        assert text.returncode == 0 and "NODE-H" in text.stdout, text.stderr
        nowhere = pool.ctl("report", "--accounting", "none")
        assert nowhere.returncode == 2 and "report reads the accounting database" in nowhere.stderr


@pytest.fixture
def postgres() -> Iterator[Postgres]:
    if postgres_missing() is not None:
        pytest.skip(str(postgres_missing()))
    server = Postgres().start()
    yield server
    server.stop()


def test_postgres_down_and_a_leader_killed_mid_run_lose_no_record_and_write_none_twice(
    redis_server: RedisServer, tmp_path: Path, job_id: str, postgres: Postgres
) -> None:
    accounting = {"database": postgres.url, "password_file": str(postgres.password_file)}
    jobs = [f"{job_id}-{i}"[:63] for i in range(3)]
    with pool_cluster(
        redis_server.url, tmp_path, pool=job_id, scheduling={"accounting": accounting}
    ) as pool:
        pool.start("a", "b")
        pool.wait_nodes(2)
        pool.submit(jobs[0], "1")
        _end(pool, jobs[0], "0")
        wait_for(lambda: len(_pg_runs(postgres, job_id)) == 1, 30, "the first record")

        postgres.pause()  # the database down: the jobs run on, their records wait in Redis
        try:
            for job in jobs[1:]:
                pool.submit(job, "1")
            for job in jobs[1:]:
                _end(pool, job, "0")
            for job in jobs[1:]:
                pool.wait_job(job, "succeeded")
            ledger = PoolKeys("nodeagent", job_id).ledger
            waiting = redis_server.client().zrange(ledger, 0, -1)
            assert sorted(json.loads(str(r))["job"] for r in waiting) == jobs[1:]
            leader = str(redis_server.client().get(PoolKeys("nodeagent", job_id).leader))
            pool.kill_tree(leader.split()[0])  # and the pool leader with them
        finally:
            postgres.resume()
        wait_for(lambda: len(_pg_runs(postgres, job_id)) == 3, 60, "every record, once back")
        # ... and taken from the ledger at the round after
        wait_for(lambda: redis_server.client().zcard(ledger) == 0, 30, "the ledger emptied")
    runs = _pg_runs(postgres, job_id)
    assert sorted(job for job, _ in runs) == jobs and all(n == 1 for _, n in runs)


def _pg_runs(postgres: Postgres, pool: str) -> list[tuple[str, Any]]:
    with postgres.connect() as conn:  # type: ignore[attr-defined]
        try:
            rows = conn.execute(
                "SELECT job, COUNT(*) FROM nodeagent_jobs WHERE pool = %s GROUP BY job, seq",
                [pool],
            ).fetchall()
        except psycopg.errors.UndefinedTable:  # not made yet
            return []
    return [(str(job), n) for job, n in rows]


def test_fair_share_charges_the_user_and_a_new_leader_goes_on_from_the_saved_usage(
    redis_server: RedisServer, tmp_path: Path, job_id: str
) -> None:
    """pool.fair_share on: a leader taking the pool goes on from the usage the last one saved
    (5 node-hours of the user here), charges the running job's user and queue for its node,
    and saves the usage again within 10 s (fenced); `share` shows it."""
    fair = {"fair_share": {"weight": 1000, "half_life": "1h"}}
    job = f"{job_id}-fs"[:63]
    client, key = redis_server.client(), PoolKeys("nodeagent", job_id).usage
    seconds, _ = client.time()
    user = str(AS_TESTER["user"])
    saved = Usage(int(seconds) * 1000, {user: 5 * 3600.0}, FairShare(1000, 3600))
    client.set(key, saved.to_json())  # as the last leader left it
    with pool_cluster(redis_server.url, tmp_path, pool=job_id, scheduling=fair) as pool:
        pool.start("a")
        pool.wait_nodes(1)
        pool.submit(job, "1")
        pool.wait_job(job, "running", world=1, timeout=60)

        def charged() -> Usage | None:
            usage = _usage(client.get(key))
            return usage if "queue:default" in usage.users else None

        after = wait_for(charged, 40, "the job's user and queue charged and saved")
        # the 5 node-hours, decayed for seconds (half-life 1 h), plus what the job held since
        assert 0.99 * 5 * 3600 < after.users[user] < 5 * 3600 + 60, after
        assert 0 < after.users["queue:default"] < 60, after
        shown = json.loads(pool.ctl("share", "--json").stdout)
        assert shown["on"] and shown["weight"] == 1000 and shown["half_life_s"] == 3600
        (row,) = shown["users"]
        assert (row["user"], row["usage"], row["factor"]) == (user, 1.0, 0.5)
        assert 4.9 < row["usage_node_hours"] <= 5.02, row
        (queue,) = shown["queues"]
        assert (queue["queue"], queue["usage"], queue["factor"]) == ("default", 1.0, 0.5)
        text = pool.ctl("share")
        assert text.returncode == 0 and "QUEUE" in text.stdout, text.stderr


def _usage(raw: Any) -> Usage:
    assert raw is not None, "no usage saved"
    return Usage.from_json(str(raw))
