"""The two accounting databases behind one Ledger (ledger.py): PostgreSQL through psycopg (the
`accounting` extra), SQLite from Python's own sqlite3. Each connects on first use and again
after an error, so a database that comes back is used again without a restart."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from nodeagent.accounting.ledger import (
    Filter,
    Usage,
    add_usage,
    decoded,
    insert,
    merged,
    plan,
    report_query,
    runs_query,
    schema,
    usage_query,
    usage_values,
    values,
)
from nodeagent.config.database import Database
from nodeagent.errors import AccountingError, ConfigError
from nodeagent.model.accounting import Record

CONNECT_TIMEOUT_S = 5
BUSY_TIMEOUT_S = 10.0  # SQLite: how long a writer waits for another's lock


class SqlLedger:
    """A DB-API connection made by `connect`, with `mark` for a placeholder. `errors`: what
    the driver raises when the database fails (said as AccountingError)."""

    def __init__(
        self,
        database: Database,
        connect: Callable[[], Any],
        mark: str,
        errors: tuple[type[Exception], ...],
        ddl: Sequence[str],
    ) -> None:
        self.database = database
        self._connect = connect
        self._mark = mark
        self._errors = errors
        self._ddl = ddl
        self._conn: Any = None

    @contextmanager
    def _cursor(self, what: str) -> Any:
        """A cursor, committed after the block; a driver's failure said as AccountingError.
        A reader (no DDL) of a database the pool leader has not written to yet finds no
        tables there: NoTables, which its readers take for no records."""
        try:
            if self._conn is None:
                conn = self._connect()
                cursor = conn.cursor()
                for statement in self._ddl:
                    cursor.execute(statement)
                conn.commit()
                self._conn = conn
            cursor = self._conn.cursor()
            try:
                yield cursor
                self._conn.commit()
            except BaseException:
                self._conn.rollback()
                raise
        except self._errors as exc:
            self.close()
            if not self._ddl and _no_table(exc):
                raise NoTables(str(exc)) from exc
            raise AccountingError(f"{what} ({self.database}): {exc}".strip()) from exc

    def write(self, records: Sequence[Record]) -> int:
        new = 0
        with self._cursor("write accounting records") as cursor:
            for record in records:
                cursor.execute(insert(self._mark), values(record))
                if cursor.rowcount == 1:  # not there yet: its sums go to its day's
                    cursor.execute(add_usage(self._mark), usage_values(record))
                    new += 1
        return new

    def runs(self, where: Filter, limit: int) -> list[Record]:
        sql, params = runs_query(self._mark, where, limit)
        with suppress(NoTables), self._cursor("read accounting records") as cursor:
            cursor.execute(sql, params)
            return list(decoded(cursor.fetchall()))
        return []

    def report(self, by: str, where: Filter) -> list[Usage]:
        how = plan(where)
        found: list[Usage] = []
        with suppress(NoTables), self._cursor("report usage") as cursor:
            if how.days:
                sql, params = usage_query(
                    self._mark, by, where.pool, how.first_day, how.end_day, where.user
                )
                cursor.execute(sql, params)
                found += [Usage.of(row) for row in cursor.fetchall()]
            for edge in how.edges:
                sql, params = report_query(self._mark, by, edge)
                cursor.execute(sql, params)
                found += [Usage.of(row) for row in cursor.fetchall()]
        return merged(found)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with suppress(*self._errors):
                conn.close()


class NoTables(Exception):
    """The database holds none of the ledger's tables yet: nothing was ever written to it."""


def _no_table(exc: Exception) -> bool:
    """SQLite's "no such table", PostgreSQL's undefined_table (SQLSTATE 42P01)."""
    return "no such table" in str(exc) or getattr(exc, "sqlstate", None) == "42P01"


def open_ledger(database: Database, password: str | None = None, writer: bool = True) -> SqlLedger:
    """The ledger of `database` (not connected yet). `password`: PostgreSQL's, if not in the
    URL nor libpq's own places (~/.pgpass, PGPASSWORD). `writer`: the pool leader's, which
    makes the table (and the SQLite file) if missing; a reader's opens a SQLite file read-only.

    Raises:
        ConfigError: PostgreSQL is named but psycopg is not installed.
    """
    if database.kind == "sqlite":
        path = Path(database.where)
        return SqlLedger(
            database,
            (lambda: _sqlite(path)) if writer else (lambda: _sqlite_read(path)),
            "?",
            (sqlite3.Error, OSError),
            schema("TEXT", "INTEGER", "REAL") if writer else (),
        )
    try:
        import psycopg
    except ImportError:
        raise ConfigError(
            "pool.accounting.database",
            "PostgreSQL needs psycopg: install nodeagent with its accounting extra "
            "(pip install 'nodeagent[accounting]')",
        ) from None

    def connect() -> Any:
        extra: dict[str, Any] = {"password": password} if password else {}
        return psycopg.connect(database.where, connect_timeout=CONNECT_TIMEOUT_S, **extra)

    ddl = schema("TEXT", "BIGINT", "DOUBLE PRECISION") if writer else ()
    return SqlLedger(database, connect, "%s", (psycopg.Error,), ddl)


def _sqlite(path: Path) -> sqlite3.Connection:
    """The file, made readable by whoever may read the pool (its records are what `jobs` and
    `history` show anyone who reads Redis) and written by its owner alone."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_NOFOLLOW, 0o644)
        try:
            os.fchmod(fd, 0o644)  # whatever the umask
        finally:
            os.close(fd)
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    return conn


def _sqlite_read(path: Path) -> sqlite3.Connection:
    if not path.is_file():
        raise OSError(f"no such file: {path}")
    # A URI of the absolute path, quoted: a path's '?' or '#' is not the URI's
    return sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S)
