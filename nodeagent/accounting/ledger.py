"""The accounting database's tables, and the queries `history` and `report` make, for both
PostgreSQL and SQLite (their SQL differs only in the placeholder and the types' names).

- `nodeagent_jobs`: one row per run of a job, keyed by (pool, job, seq). Written with ON
  CONFLICT DO NOTHING, a record taken twice from the pool's ledger (two pool leaders, one after
  the other, each writing before it could remove it) is kept once. The columns are what
  `report` sums and filters on; the whole record is kept beside them as its JSON (`record`),
  for `history`.
- `nodeagent_usage`: the same sums by (pool, UTC day, user, queue), added to in the
  transaction that inserts a run, for the runs that were new only. `report` reads whole days
  from it and the part-days at its edges from `nodeagent_jobs`: a year of a million runs is a
  few tens of thousands of rows to add up, not a million (bench/report.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
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
        f"""CREATE TABLE IF NOT EXISTS {USAGE} (
            pool {text} NOT NULL,
            day {text} NOT NULL,
            user_name {text} NOT NULL,
            queue {text} NOT NULL,
            jobs {integer} NOT NULL,
            succeeded {integer} NOT NULL,
            node_hours {real} NOT NULL,
            gpu_hours {real},
            elapsed_s {real} NOT NULL,
            restarts {integer} NOT NULL,
            ettr_weighted {real} NOT NULL,
            ettr_weight {real} NOT NULL,
            PRIMARY KEY (pool, day, user_name, queue)
        )""",
    )


USAGE = "nodeagent_usage"
SUMS = (
    "jobs", "succeeded", "node_hours", "gpu_hours", "elapsed_s", "restarts", "ettr_weighted",
    "ettr_weight",
)  # fmt: skip


def add_usage(mark: str) -> str:
    """Add one new run's sums to its day's row (made if missing). gpu_hours stays empty
    until a run with GPU-hours is added."""
    columns = ("pool", "day", "user_name", "queue", *SUMS)
    marks = ", ".join(mark for _ in columns)
    added = ", ".join(f"{c} = {USAGE}.{c} + excluded.{c}" for c in SUMS if c != "gpu_hours")
    return (
        f"INSERT INTO {USAGE} ({', '.join(columns)}) VALUES ({marks}) "
        f"ON CONFLICT (pool, day, user_name, queue) DO UPDATE SET {added}, "
        f"gpu_hours = CASE WHEN excluded.gpu_hours IS NULL THEN {USAGE}.gpu_hours "
        f"ELSE COALESCE({USAGE}.gpu_hours, 0) + excluded.gpu_hours END"
    )


def usage_values(record: Record) -> tuple[Any, ...]:
    """A new run as its day's sums (add_usage's order); no user or queue is ''."""
    ettr = record.ettr
    return (
        record.pool, record.day, record.user or "", record.queue or "", 1,
        1 if record.state == "succeeded" else 0, record.node_hours, record.gpu_hours,
        record.elapsed_s or 0.0, record.restarts,
        0.0 if ettr is None else ettr * record.node_hours,
        0.0 if ettr is None else record.node_hours,
    )  # fmt: skip


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
SUMMED = (
    "COUNT(*), SUM(CASE WHEN state = 'succeeded' THEN 1 ELSE 0 END), SUM(node_hours), "
    "SUM(gpu_hours), SUM(COALESCE(elapsed_s, 0)), SUM(restarts), "
    "SUM(CASE WHEN ettr IS NULL THEN 0 ELSE ettr * node_hours END), "
    "SUM(CASE WHEN ettr IS NULL THEN 0 ELSE node_hours END)"
)


def report_query(mark: str, by: str, where: Filter) -> tuple[str, list[Any]]:
    """Usage by `by` (user, queue or day) of the runs `where` takes, from the runs' own rows:
    jobs, of which succeeded, node-hours, GPU-hours, elapsed seconds, restarts, and the
    ETTR's weighted sum and weight (Usage.of's order)."""
    column = GROUPS[by]
    clause, params = where.where(mark)
    sql = f"SELECT {column}, {SUMMED} FROM {TABLE} WHERE {clause} GROUP BY {column}"
    return sql, params


def usage_query(
    mark: str, by: str, pool: str, first_day: str | None, end_day: str | None, user: str | None
) -> tuple[str, list[Any]]:
    """As report_query, from the days' sums: the whole days in [first_day, end_day) (None:
    unbounded)."""
    column = {"user": "user_name", "queue": "queue", "day": "day"}[by]
    clauses, params = [f"pool = {mark}"], [pool]
    for clause, value in (("day >= ", first_day), ("day < ", end_day), ("user_name = ", user)):
        if value is not None:
            clauses.append(clause + mark)
            params.append(value)
    sums = ", ".join(f"SUM({c})" for c in SUMS)
    sql = f"SELECT {column}, {sums} FROM {USAGE} WHERE {' AND '.join(clauses)} GROUP BY {column}"
    return sql, params


@dataclass(frozen=True)
class Usage:
    """One line of a report."""

    key: str | None
    jobs: int
    succeeded: int
    node_hours: float
    gpu_hours: float | None
    elapsed_s: float
    restarts: int
    ettr_weighted: float  # the ETTR times node-hours, over the runs that have one
    ettr_weight: float  # their node-hours

    @classmethod
    def of(cls, row: Sequence[Any]) -> Usage:
        key, jobs, succeeded, node_h, gpu_h, elapsed, restarts, weighted, weight = row
        return cls(
            None if key is None or key == "" else str(key),
            int(jobs),
            int(succeeded or 0),
            float(node_h or 0.0),
            None if gpu_h is None else float(gpu_h),
            float(elapsed or 0.0),
            int(restarts or 0),
            float(weighted or 0.0),
            float(weight or 0.0),
        )

    def __add__(self, other: Usage) -> Usage:
        gpu = (
            None
            if self.gpu_hours is None and other.gpu_hours is None
            else (self.gpu_hours or 0.0) + (other.gpu_hours or 0.0)
        )
        return Usage(
            self.key,
            self.jobs + other.jobs,
            self.succeeded + other.succeeded,
            self.node_hours + other.node_hours,
            gpu,
            self.elapsed_s + other.elapsed_s,
            self.restarts + other.restarts,
            self.ettr_weighted + other.ettr_weighted,
            self.ettr_weight + other.ettr_weight,
        )

    @property
    def ettr(self) -> float | None:
        """Weighted by node-hours, over the runs that have one."""
        return self.ettr_weighted / self.ettr_weight if self.ettr_weight else None

    def to_data(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "jobs": self.jobs,
            "succeeded": self.succeeded,
            "failed": self.jobs - self.succeeded,
            "node_hours": round(self.node_hours, 4),
            "gpu_hours": None if self.gpu_hours is None else round(self.gpu_hours, 4),
            "elapsed_hours": round(self.elapsed_s / 3600, 4),
            "restarts": self.restarts,
            "ettr": None if self.ettr is None else round(self.ettr, 4),
        }


def merged(parts: Iterable[Usage]) -> list[Usage]:
    """The lines of several reads, one per key, in key order (no key first)."""
    found: dict[str | None, Usage] = {}
    for usage in parts:
        found[usage.key] = found[usage.key] + usage if usage.key in found else usage
    return sorted(found.values(), key=lambda u: (u.key is not None, u.key or ""))


DAY_MS = 86_400_000


@dataclass(frozen=True)
class Plan:
    """How `report` reads what a Filter takes: the whole UTC days in [first_day, end_day) from
    the days' sums (`days`: any to read; None: unbounded), and the part-days at the edges
    (`edges`) from the runs' rows."""

    days: bool
    first_day: str | None
    end_day: str | None
    edges: tuple[Filter, ...]


def plan(where: Filter) -> Plan:
    if where.state is not None:  # the days' sums are not kept by state
        return Plan(False, None, None, (where,))
    since, until = where.since_ms, where.until_ms
    start = None if since is None else -(-since // DAY_MS) * DAY_MS  # the first whole day
    end = None if until is None else until // DAY_MS * DAY_MS  # the end of the last
    if start is not None and end is not None and start >= end:
        return Plan(False, None, None, (where,))  # no whole day between them
    edges = []
    if since is not None and start is not None and since < start:
        edges.append(replace(where, until_ms=start))
    if until is not None and end is not None and end < until:
        edges.append(replace(where, since_ms=end))
    return Plan(True, _day(start), _day(end), tuple(edges))


def _day(ms: int | None) -> str | None:
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d")


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


@contextmanager
def opened(ledger: Ledger | None) -> Iterator[Ledger | None]:
    """`ledger` (None: no database named) for one read, closed after it."""
    try:
        yield ledger
    finally:
        if ledger is not None:
            ledger.close()
