"""The pool leader's bookkeeper (pool/ledger.py) between a real redis-server and a real
PostgreSQL the test starts (initdb in a temporary directory): records taken from the pool's
ledger into the database once, however many leaders take them; the database down, they wait in
Redis and are written when it returns; what nodeagent did not write is dropped, not written."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest

from nodeagent.accounting.databases import open_ledger
from nodeagent.accounting.ledger import Filter
from nodeagent.config.database import database_of
from nodeagent.coord.keys import PoolKeys
from nodeagent.coord.pool import PoolStore
from nodeagent.model.accounting import Record
from nodeagent.pool.ledger import RETRY_S, Bookkeeper
from tests.helpers.cluster import RedisServer, wait_for
from tests.helpers.postgres import Postgres, missing

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(missing() is not None, reason=str(missing())),
]


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    server = Postgres().start()
    yield server
    server.stop()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _keeper(redis_server: RedisServer, pool: str, postgres: Postgres, clock: Clock) -> Bookkeeper:
    database = database_of(postgres.url, "test")
    assert database is not None
    store = PoolStore(redis_server.client(), PoolKeys("nodeagent", pool))
    return Bookkeeper(store, open_ledger(database, postgres.password), clock)


def _ledger(redis_server: RedisServer, pool: str, *records: Record | str) -> None:
    """Records in the pool's ledger, as POOL_COMMIT puts them (garbage as given)."""
    client = redis_server.client()
    for i, record in enumerate(records):
        member = record if isinstance(record, str) else record.to_json()
        client.zadd(PoolKeys("nodeagent", pool).ledger, {member: i})


def _runs(postgres: Postgres, pool: str) -> list[tuple[Any, ...]]:
    with postgres.connect() as conn:  # type: ignore[attr-defined]
        return list(
            conn.execute(
                "SELECT job, seq, COUNT(*) FROM nodeagent_jobs WHERE pool = %s "
                "GROUP BY job, seq ORDER BY seq",
                [pool],
            ).fetchall()
        )


def _idle(keeper: Bookkeeper) -> bool:
    return not keeper._busy  # the thread's write is over


def _records(pool: str, n: int) -> list[Record]:
    now = int(time.time() * 1000)
    return [
        Record(pool, f"job{i}", i, "succeeded", now, user="alice", nodes=1, node_hours=0.25)
        for i in range(1, n + 1)
    ]


def test_a_record_two_leaders_write_is_kept_once(
    redis_server: RedisServer, postgres: Postgres, job_id: str
) -> None:
    clock = Clock()
    _ledger(redis_server, job_id, *_records(job_id, 3))
    first = _keeper(redis_server, job_id, postgres, clock)
    first.tick()  # hands them to its thread, which writes them...
    wait_for(lambda: _idle(first), 30, "the first leader's write")
    assert first.written == 3
    # ... and the leader is gone before its next round removed them: the next one takes them.
    second = _keeper(redis_server, job_id, postgres, clock)
    second.tick()
    wait_for(lambda: _idle(second), 30, "the second leader's write")
    second.tick()  # removes what it wrote
    assert second.written == 0  # every one was there already
    assert _runs(postgres, job_id) == [("job1", 1, 1), ("job2", 2, 1), ("job3", 3, 1)]
    assert redis_server.client().zcard(PoolKeys("nodeagent", job_id).ledger) == 0
    first.close()
    second.close()


def test_records_wait_in_redis_while_the_database_is_down_and_are_written_when_it_returns(
    redis_server: RedisServer, postgres: Postgres, job_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    keeper = _keeper(redis_server, job_id, postgres, clock)
    _ledger(redis_server, job_id, *_records(job_id, 2))
    ledger = PoolKeys("nodeagent", job_id).ledger
    postgres.pause()
    try:
        with caplog.at_level(logging.WARNING, "nodeagent.pool.ledger"):
            keeper.tick()
            wait_for(lambda: _idle(keeper), 30, "the failed write")
        assert "2 records wait in Redis" in caplog.text
        keeper.tick()  # within the retry's wait: nothing is tried
        assert redis_server.client().zcard(ledger) == 2
        clock.now += RETRY_S  # tried again, still down: said once for the whole outage
        keeper.tick()
        wait_for(lambda: _idle(keeper), 30, "the second failed write")
        assert caplog.text.count("wait in Redis") == 1, caplog.text
        _ledger(redis_server, job_id, *_records(job_id, 4)[2:])  # more jobs end meanwhile
    finally:
        postgres.resume()
    clock.now += 2 * RETRY_S
    keeper.tick()
    wait_for(lambda: _idle(keeper), 30, "the write once the database is back")
    keeper.tick()
    assert [(job, n) for job, _, n in _runs(postgres, job_id)] == [
        ("job1", 1), ("job2", 1), ("job3", 1), ("job4", 1),
    ]  # fmt: skip
    assert redis_server.client().zcard(ledger) == 0
    keeper.close()


def test_what_nodeagent_did_not_write_is_dropped_and_the_rest_written(
    redis_server: RedisServer, postgres: Postgres, job_id: str
) -> None:
    keeper = _keeper(redis_server, job_id, postgres, Clock())
    good = _records(job_id, 1)[0]
    _ledger(redis_server, job_id, '{"pool": 1}', "not json", good)
    keeper.tick()
    wait_for(lambda: _idle(keeper), 30, "the write")
    keeper.tick()
    assert _runs(postgres, job_id) == [("job1", 1, 1)]
    assert redis_server.client().zcard(PoolKeys("nodeagent", job_id).ledger) == 0
    database = database_of(postgres.url, "test")
    assert database is not None
    reader = open_ledger(database, postgres.password, writer=False)
    assert [r.run for r in reader.runs(Filter(job_id), 10)] == ["job1:1"]
    reader.close()
    keeper.close()
