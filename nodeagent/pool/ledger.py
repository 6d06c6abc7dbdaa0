"""The pool leader takes ended jobs' records from the pool's ledger into the accounting
database (pool.accounting; docs/accounting.md).

A record is put in the ledger (a sorted set in Redis, by end time) in the same fenced write as
its job's end (coord/poolscripts.POOL_COMMIT), so a record is made once per end, whoever leads.
After each round the leader removes what its thread has written, then, if the thread is idle,
reads the oldest BATCH records and hands them to it; the thread writes them in one transaction
(`(pool, job, seq)` is the table's key: a record a leader wrote but had no time to remove is
kept once when the next leader writes it again). The database down: the records wait in Redis,
the thread is tried again after RETRY_S (doubling up to RETRY_MAX_S), and the rounds go on;
nothing is written twice and nothing is lost.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from nodeagent.accounting.ledger import Ledger
from nodeagent.coord.errors import redis_errors
from nodeagent.coord.pool import PoolStore
from nodeagent.errors import AccountingError, CorruptStateError
from nodeagent.model.accounting import Record

log = logging.getLogger(__name__)
BATCH = 1000  # records read and written at once
RETRY_S = 5.0  # after the database failed, the first wait before trying it again
RETRY_MAX_S = 60.0


class Bookkeeper:
    def __init__(self, store: PoolStore, ledger: Ledger, clock: Callable[[], float]) -> None:
        self._store = store
        self._ledger = ledger
        self._clock = clock
        self._lock = threading.Lock()
        self._written: list[str] = []  # members the thread wrote, to remove from the ledger
        self._busy = False
        self._retry_at = 0.0
        self._wait = RETRY_S
        self._failing: str | None = None  # the database's error, said once while it lasts
        self.waiting = 0  # records in the ledger as the last tick read it (a gauge)
        self.written = 0  # records this agent wrote that were new (a counter)

    def tick(self) -> None:
        """Remove what was written; hand the next batch to the thread if it is idle (on the
        pool leader, after its round; never waits for the database).

        Raises:
            CoordinationError: Redis.
        """
        client, key = self._store.client, self._store.keys.ledger
        with self._lock:
            written, self._written = self._written, []
            busy = self._busy
        if written:
            with redis_errors("remove written accounting records"):
                client.zrem(key, *written)
        if busy or self._clock() < self._retry_at:
            return
        with redis_errors("read the pool's ledger"):
            members: Any = client.zrangebyscore(key, "-inf", "+inf", start=0, num=BATCH)
            # all of them, unless a batch is full (a backlog): then counted
            self.waiting = len(members) if len(members) < BATCH else int(client.zcard(key))
        if not members:
            return
        records, garbage = [], []
        for member in members:
            try:
                records.append((str(member), Record.from_json(member)))
            except CorruptStateError as exc:
                garbage.append(str(member))
                log.warning("accounting: dropping what nodeagent did not write: %s", exc)
        if garbage:
            with redis_errors("drop garbage from the pool's ledger"):
                client.zrem(key, *garbage)
        if records:
            with self._lock:
                self._busy = True
            threading.Thread(
                target=self._write, args=(records,), name="accounting", daemon=True
            ).start()

    def _write(self, records: list[tuple[str, Record]]) -> None:
        try:
            new = self._ledger.write([record for _, record in records])
        except AccountingError as exc:
            if self._failing is None:  # once an outage, whatever each try's words
                log.warning(
                    "accounting: %s; %d records wait in Redis, tried again in %.0fs",
                    exc, self.waiting, self._wait,
                )  # fmt: skip
            self._failing = str(exc)
            self._retry_at = self._clock() + self._wait
            self._wait = min(self._wait * 2, RETRY_MAX_S)
            with self._lock:
                self._busy = False
            return
        except Exception:  # a bug here must not stop every later record
            log.exception("accounting: writing %d records", len(records))
            self._retry_at = self._clock() + RETRY_MAX_S
            with self._lock:
                self._busy = False
            return
        if self._failing is not None:
            log.warning("accounting: the database answers again; writing what waited")
        self._failing, self._wait = None, RETRY_S
        self.written += new
        with self._lock:
            self._written.extend(member for member, _ in records)
            self._busy = False

    def close(self) -> None:
        self._ledger.close()
