"""The accounting database's one table, and the queries `history` and `report` make, for both
PostgreSQL and SQLite (their SQL differs only in the placeholder and the types' names).

A record's key is (pool, job, seq): a job's run in its pool. Written with ON CONFLICT DO
NOTHING, a record taken twice from the pool's ledger (two pool leaders, one after the other,
each writing before it could remove it) is kept once. The columns are what `report` sums and
filters on; the whole record is kept beside them as its JSON (`record`), for `history`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from nodeagent.errors import CorruptStateError
from nodeagent.model.accounting import BY, Record

TABLE = "nodeagent_jobs"
COLUMNS = (
    "pool", "job", "seq", "user_name", "queue", "state", "ended_ms", "ended_day", "nodes",
    "node_hours", "gpu_hours", "elapsed_s", "ettr", "restarts", "record",
)  # fmt: skip


def schema(text: str, integer: str, real: str) -> tuple[str, ...]:
    """The table and its indexes, with the database's names for a text, a 64-bit integer and
    a double."""
    return (
        f"""CREATE TABLE IF NOT EXISTS {TABLE} (
            pool {text} NOT NULL,
            job {text} NOT NULL,
            seq {integer} NOT NULL,
            user_name {text},
            queue {text},
            state {text} NOT NULL,
            ended_ms {integer} NOT NULL,
            ended_day {text} NOT NULL,
            nodes {integer} NOT NULL,
            node_hours {real} NOT NULL,
            gpu_hours {real},
            elapsed_s {real},
            ettr {real},
            restarts {integer} NOT NULL,
            record {text} NOT NULL,
            PRIMARY KEY (pool, job, seq)
        )""",
        f"CREATE INDEX IF NOT EXISTS {TABLE}_ended ON {TABLE} (pool, ended_ms)",
    )


def values(record: Record) -> tuple[Any, ...]:
    """A record as the table's row (COLUMNS' order)."""
    return (
        record.pool, record.job, record.seq, record.user, record.queue, record.state,
        record.ended_ms, record.day, record.nodes, record.node_hours, record.gpu_hours,
        record.elapsed_s, record.ettr, record.restarts, record.to_json(),
    )  # fmt: skip


def insert(mark: str) -> str:
    """The insert of one row, kept once by its key; `mark`: the placeholder (? or %s)."""
    marks = ", ".join(mark for _ in COLUMNS)
    return (
        f"INSERT INTO {TABLE} ({', '.join(COLUMNS)}) VALUES ({marks}) "
        "ON CONFLICT (pool, job, seq) DO NOTHING"
    )


@dataclass(frozen=True)
class Filter:
    """Which records a query takes: of `pool`, ended in [since_ms, until_ms), of `user`, in
    `state` (None: any)."""

    pool: str
    since_ms: int | None = None
    until_ms: int | None = None
    user: str | None = None
    state: str | None = None

    def where(self, mark: str) -> tuple[str, list[Any]]:
        clauses: list[str] = ["pool = " + mark]
        params: list[Any] = [self.pool]
        for clause, value in (
            ("ended_ms >= ", self.since_ms),
            ("ended_ms < ", self.until_ms),
            ("user_name = ", self.user),
            ("state = ", self.state),
        ):
            if value is not None:
                clauses.append(clause + mark)
                params.append(value)
        return " AND ".join(clauses), params


def runs_query(mark: str, where: Filter, limit: int) -> tuple[str, list[Any]]:
    """The records `where` takes, newest end first, at most `limit`."""
    clause, params = where.where(mark)
    sql = f"SELECT record FROM {TABLE} WHERE {clause} ORDER BY ended_ms DESC, job LIMIT {mark}"
    return sql, [*params, limit]


GROUPS = {"user": "user_name", "queue": "queue", "day": "ended_day"}
assert tuple(GROUPS) == BY


def report_query(mark: str, by: str, where: Filter) -> tuple[str, list[Any]]:
    """Usage by `by` (user, queue or day): jobs, of which succeeded, node-hours, GPU-hours,
    elapsed hours, restarts, and the ETTR weighted by node-hours, over what `where` takes."""
    column = GROUPS[by]
    clause, params = where.where(mark)
    sql = (
        f"SELECT {column}, COUNT(*), SUM(CASE WHEN state = 'succeeded' THEN 1 ELSE 0 END), "
        "SUM(node_hours), SUM(gpu_hours), SUM(elapsed_s) / 3600.0, SUM(restarts), "
        "SUM(CASE WHEN ettr IS NULL THEN 0 ELSE ettr * node_hours END), "
        "SUM(CASE WHEN ettr IS NULL THEN 0 ELSE node_hours END) "
        f"FROM {TABLE} WHERE {clause} GROUP BY {column} ORDER BY {column}"
    )
    return sql, params


@dataclass(frozen=True)
class Usage:
    """One line of a report."""

    key: str | None
    jobs: int
    succeeded: int
    node_hours: float
    gpu_hours: float | None
    elapsed_hours: float
    restarts: int
    ettr: float | None  # weighted by node-hours, over the jobs that have one

    @classmethod
    def of(cls, row: Sequence[Any]) -> Usage:
        key, jobs, succeeded, node_h, gpu_h, elapsed_h, restarts, weighted, weight = row
        return cls(
            None if key is None else str(key),
            int(jobs),
            int(succeeded or 0),
            float(node_h or 0.0),
            None if gpu_h is None else float(gpu_h),
            float(elapsed_h or 0.0),
            int(restarts or 0),
            float(weighted) / float(weight) if weight else None,
        )

    def to_data(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "jobs": self.jobs,
            "succeeded": self.succeeded,
            "failed": self.jobs - self.succeeded,
            "node_hours": round(self.node_hours, 4),
            "gpu_hours": None if self.gpu_hours is None else round(self.gpu_hours, 4),
            "elapsed_hours": round(self.elapsed_hours, 4),
            "restarts": self.restarts,
            "ettr": None if self.ettr is None else round(self.ettr, 4),
        }


def decoded(rows: Sequence[Sequence[Any]]) -> Iterator[Record]:
    """The records of `runs_query`'s rows; one that does not decode is left out."""
    for (raw,) in rows:
        try:
            yield Record.from_json(raw)
        except CorruptStateError:
            continue


class Ledger(Protocol):
    """An accounting database, opened."""

    def write(self, records: Sequence[Record]) -> int:
        """Store `records`, each once (one already there is left as it is), in one
        transaction; how many were new.

        Raises:
            AccountingError: the database could not be reached or written.
        """

    def runs(self, where: Filter, limit: int) -> list[Record]:
        """The records `where` takes, newest end first.

        Raises:
            AccountingError: the database could not be read.
        """

    def report(self, by: str, where: Filter) -> list[Usage]:
        """Usage by user, queue or day.

        Raises:
            AccountingError: the database could not be read.
        """

    def close(self) -> None: ...
