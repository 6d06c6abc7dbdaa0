"""Accounting records (model/accounting.py), the database URL (config/database.py), and the
ledger's SQL on a real SQLite file (accounting/): a record kept once by its key, the history
and report queries, a reader that never makes the file."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path
from urllib.parse import quote

import pytest

from nodeagent.accounting.databases import open_ledger
from nodeagent.accounting.ledger import Filter, Plan, plan
from nodeagent.config.database import Database, database_of, default_database
from nodeagent.errors import AccountingError, ConfigError, CorruptStateError
from nodeagent.model.accounting import Record, record_of
from nodeagent.model.pool import PoolJob, PoolJobState
from nodeagent.views.accounting import row_of

DAY_MS = 86_400_000
T0 = 1_795_000_000_000  # 2026-11-18 (UTC)


def _record(job: str, seq: int, **more: object) -> Record:
    fields: dict[str, object] = {
        "pool": "gpu", "job": job, "seq": seq, "state": "succeeded", "ended_ms": T0,
        "user": "alice", "queue": "research", "nodes": 2, "node_hours": 1.5,
    }  # fmt: skip
    fields.update(more)
    return Record(**fields)  # type: ignore[arg-type]


def test_a_record_of_an_ended_run_carries_what_history_and_show_report() -> None:
    status = PoolJob(
        PoolJobState.FAILED, seq=7, submitted_ms=T0 - 9_000, reason="its workers failed",
        admitted_ms=T0 - 8_000, ended_ms=T0, exit_code=3, node_ms=16_000, peak_nodes=2,
        ettr=0.5,
    )  # fmt: skip
    record = record_of(
        "gpu", "train", status, {"worker_failed": 2}, None,
        user="alice", queue="research", name="train", array=None,
    )  # fmt: skip
    assert (record.run, record.state, record.exit_code) == ("train:7", "failed", 3)
    assert (record.elapsed_s, record.nodes, record.restarts) == (8.0, 2, 2)
    assert record.node_hours == pytest.approx(16_000 / 3_600_000)
    assert Record.from_json(record.to_json()) == record
    assert row_of(record)["ended"].startswith("2026-11-")
    succeeded = record_of(
        "gpu", "t", PoolJob(PoolJobState.SUCCEEDED, 1, T0, ended_ms=T0), {}, None,
        user=None, queue=None, name=None, array=None,
    )  # fmt: skip
    assert succeeded.exit_code == 0 and succeeded.elapsed_s is None


@pytest.mark.parametrize("raw", ["", "[]", '{"pool": "gpu"}', '{"job": 1}'])
def test_a_record_nodeagent_did_not_write_is_refused_as_corrupt(raw: str) -> None:
    with pytest.raises(CorruptStateError):
        Record.from_json(raw)


def test_a_database_url_names_postgresql_a_sqlite_file_or_none() -> None:
    pg = database_of("postgresql://acct:secret@db.example:5433/nodeagent", "k")
    assert pg is not None and pg.kind == "postgresql"
    assert str(pg) == "postgresql://db.example:5433/nodeagent"  # never the password
    assert database_of("sqlite:///var/lib/nodeagent/a.sqlite", "k") == Database(
        "sqlite", "/var/lib/nodeagent/a.sqlite"
    )
    assert database_of("none", "k") is None and database_of("", "k") is None
    assert default_database("", Path("/var/lib/x"), "k") == Database(
        "sqlite", "/var/lib/x/accounting.sqlite"
    )
    assert default_database("", None, "k") is None
    for bad in ("mysql://db/x", "sqlite://relative.db", "postgresql://db", "/tmp/a.sqlite"):
        with pytest.raises(ConfigError, match="expected postgresql://USER@HOST"):
            database_of(bad, "pool.accounting.database")


def test_sqlite_keeps_each_run_once_and_reports_usage(tmp_path: Path) -> None:
    ledger = open_ledger(Database("sqlite", str(tmp_path / "acct" / "a.sqlite")))
    records = [
        _record("a", 1, ettr=0.8),
        _record("b", 2, user="bob", queue="prod", node_hours=3.0, ettr=0.5, restarts=2),
        _record("c", 3, state="failed", ended_ms=T0 + DAY_MS, node_hours=0.5),
        _record("a", 4, ended_ms=T0 + DAY_MS, ettr=1.0),  # a's id again: another run
    ]
    assert ledger.write(records) == 4
    assert ledger.write([records[0], records[1], _record("d", 5)]) == 1  # a leader again
    assert ledger.write([]) == 0
    every = ledger.runs(Filter("gpu"), 100)
    assert sorted(r.run for r in every) == ["a:1", "a:4", "b:2", "c:3", "d:5"]
    assert every[0].ended_ms >= every[-1].ended_ms  # newest first
    assert [r.run for r in ledger.runs(Filter("gpu", user="bob"), 100)] == ["b:2"]
    assert [r.run for r in ledger.runs(Filter("gpu", state="failed"), 100)] == ["c:3"]
    assert {r.run for r in ledger.runs(Filter("gpu", since_ms=T0 + 1), 100)} == {"a:4", "c:3"}
    assert ledger.runs(Filter("other"), 100) == []
    assert len(ledger.runs(Filter("gpu"), 2)) == 2

    by_user = {u.key: u for u in ledger.report("user", Filter("gpu"))}
    assert set(by_user) == {"alice", "bob"}
    alice = by_user["alice"]
    assert (alice.jobs, alice.succeeded) == (4, 3)
    assert alice.node_hours == pytest.approx(1.5 + 0.5 + 1.5 + 1.5)
    assert alice.ettr == pytest.approx((0.8 * 1.5 + 1.0 * 1.5) / 3.0)  # weighted, known only
    assert (by_user["bob"].restarts, by_user["bob"].ettr) == (2, 0.5)
    by_day = ledger.report("day", Filter("gpu"))
    assert [u.jobs for u in by_day] == [3, 2] and str(by_day[0].key) < str(by_day[1].key)
    queues = {u.key: u.jobs for u in ledger.report("queue", Filter("gpu", until_ms=T0 + 1))}
    assert queues == {"research": 2, "prod": 1}
    ledger.close()


def test_a_reader_never_makes_the_file_nor_writes(tmp_path: Path) -> None:
    path = tmp_path / "a.sqlite"
    reader = open_ledger(Database("sqlite", str(path)), writer=False)
    with pytest.raises(AccountingError, match="no such file"):
        reader.runs(Filter("gpu"), 10)
    assert not path.exists()
    writer = open_ledger(Database("sqlite", str(path)))
    writer.write([_record("a", 1)])
    assert path.stat().st_mode & 0o777 == 0o644  # readable as the pool is, written by its owner
    assert [r.run for r in reader.runs(Filter("gpu"), 10)] == ["a:1"]
    with pytest.raises(AccountingError, match="readonly"):
        reader.write([_record("b", 2)])
    writer.close()
    reader.close()


def test_the_url_an_absolute_path_gives_is_read_as_it_is_written(tmp_path: Path) -> None:
    """sqlite:/// followed by an absolute path (four slashes, as docs/accounting.md's example
    filled in gives) names the file the agents write and `report` reads, and so does a path
    with a character a URI would take for its own."""
    path = tmp_path / "acct dir" / "a?b#c.sqlite"
    quoted = quote(str(path))  # a '?' or '#' in a URL's path is written %3F, %23
    three, four = f"sqlite://{quoted}", f"sqlite:///{quoted}"  # the path's own "/" is the third
    assert four.startswith("sqlite:////")
    assert database_of(three, "k") == database_of(four, "k") == Database("sqlite", str(path))
    named = database_of(four, "k")
    assert named is not None
    writer = open_ledger(named)
    writer.write([_record("a", 1)])
    reader = open_ledger(named, writer=False)
    assert [r.run for r in reader.runs(Filter("gpu"), 10)] == ["a:1"]
    writer.close()
    reader.close()


def test_a_reader_of_a_database_with_no_tables_yet_finds_no_records(tmp_path: Path) -> None:
    """The file exists (made by another program, or by a writer that has not made its tables
    yet) and holds none of the ledger's tables: nothing was ever written, so nothing is read,
    not "the database cannot be read" (the API service answered 503 for a fresh pool)."""
    path = tmp_path / "a.sqlite"
    sqlite3.connect(path).close()
    reader = open_ledger(Database("sqlite", str(path)), writer=False)
    assert reader.runs(Filter("gpu"), 10) == []
    assert reader.report("user", Filter("gpu", since_ms=0, until_ms=86_400_000)) == []
    reader.close()


def test_a_report_over_whole_days_and_their_edges_adds_up_as_the_runs_do(tmp_path: Path) -> None:
    """The days' sums (whole days) and the runs' rows (the part-days at the edges) together
    give what adding up the runs themselves gives, for any bounds; a run written twice counts
    once in both."""
    rng = random.Random(3)
    records = [
        _record(
            f"j{i}", i, ended_ms=T0 + rng.randrange(6 * DAY_MS), user=rng.choice(["al", "bo"]),
            queue=rng.choice(["q1", "q2", None]), node_hours=rng.uniform(0, 4),
            ettr=rng.choice([None, rng.random()]), state=rng.choice(["succeeded", "failed"]),
            restarts=rng.randrange(3), elapsed_s=rng.uniform(0, 3600),
        )
        for i in range(300)
    ]  # fmt: skip
    ledger = open_ledger(Database("sqlite", str(tmp_path / "a.sqlite")))
    assert ledger.write(records) == 300
    assert ledger.write(records[:50]) == 0
    bounds = [None, T0, T0 + DAY_MS, T0 + 5 * DAY_MS // 2, T0 + 5 * DAY_MS + 7, T0 + 9 * DAY_MS]
    for _ in range(40):
        since, until = rng.choice(bounds), rng.choice(bounds)
        for by in ("user", "queue", "day"):
            where = Filter("gpu", since_ms=since, until_ms=until)
            got = {u.key: u for u in ledger.report(by, where)}
            taken = [
                r for r in records
                if (since is None or r.ended_ms >= since) and (until is None or r.ended_ms < until)
            ]  # fmt: skip
            keys = {"user": lambda r: r.user, "queue": lambda r: r.queue, "day": lambda r: r.day}
            expected: dict[str | None, list[Record]] = {}
            for r in taken:
                expected.setdefault(keys[by](r), []).append(r)
            assert set(got) == set(expected), (by, since, until)
            for key, runs in expected.items():
                usage = got[key]
                assert usage.jobs == len(runs)
                assert usage.succeeded == sum(r.state == "succeeded" for r in runs)
                assert usage.node_hours == pytest.approx(sum(r.node_hours for r in runs))
                assert usage.restarts == sum(r.restarts for r in runs)
                weighted = [r for r in runs if r.ettr is not None]
                if weighted and sum(r.node_hours for r in weighted):
                    total = sum(r.node_hours for r in weighted)
                    mean = sum(r.ettr * r.node_hours for r in weighted if r.ettr) / total
                    assert usage.ettr == pytest.approx(mean)
    ledger.close()


def test_a_report_reads_whole_days_from_their_sums_and_the_edges_from_the_runs() -> None:
    assert plan(Filter("p")) == Plan(True, None, None, ())
    since, until = T0 + 1000, T0 + 3 * DAY_MS + 5  # T0 is 2026-11-18T11:06:40Z
    found = plan(Filter("p", since_ms=since, until_ms=until))
    assert (found.days, found.first_day, found.end_day) == (True, "2026-11-19", "2026-11-21")
    assert [(e.since_ms, e.until_ms) for e in found.edges] == [
        (since, 1_795_046_400_000), (1_795_219_200_000, until),
    ]  # fmt: skip
    assert plan(Filter("p", since_ms=T0, until_ms=T0 + 60_000)).days is False  # within a day
    assert plan(Filter("p", state="failed")).days is False  # the sums are not kept by state
