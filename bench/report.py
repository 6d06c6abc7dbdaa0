"""`nodeagentctl report` over a year of records: 1,000,000 ended jobs of 50 users in 8 queues.

    .venv/bin/python bench/report.py [--records 1000000] [--repeat 5]

A real PostgreSQL (initdb in a temporary directory, as the tests start it) and a SQLite file are
filled with the same synthetic year: each record as the pool leader makes it
(model/accounting.py: goodput parts and restarts by cause included), its end spread evenly over
365 days, its user skewed (a few users run most jobs). Both are filled through the pool
leader's own write (a transaction of 1,000 records at a time: its throughput is printed).
Then, for each database:
- `report --by user|queue|day` over the whole year and over the last 30 days (bounds not on a
  day's edge: the part-days are read from the runs, the whole days from their sums), through
  the ledger's report (accounting/), median and max of --repeat;
- the whole `nodeagentctl report --by user --since 365d` command (its Python start and its Redis
  read included), median of 3.
Writes bench/results/report.json.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nodeagent.accounting.databases import SqlLedger, open_ledger  # noqa: E402
from nodeagent.accounting.ledger import Filter  # noqa: E402
from nodeagent.config.database import Database, database_of  # noqa: E402
from nodeagent.model.accounting import Record  # noqa: E402
from nodeagent.pool.ledger import BATCH  # noqa: E402
from tests.helpers.cluster import RedisServer  # noqa: E402
from tests.helpers.postgres import Postgres  # noqa: E402

POOL = "bench"
DAY_MS = 86_400_000
USERS = [f"user{i:02d}" for i in range(50)]
QUEUES = ["research", "prod", "eval", "batch", "debug", "vision", "speech", "infra"]
PARTS = ("productive", "checkpoint_stalls", "retrained", "first_start", "detection")


def records(count: int, now_ms: int, seed: int = 7) -> list[Record]:
    rng = random.Random(seed)
    weights = [1 / (i + 1) for i in range(len(USERS))]  # Zipf-like: user00 runs the most
    users = rng.choices(USERS, weights, k=count)
    found = []
    for i in range(count):
        ended = now_ms - rng.randrange(365 * DAY_MS)
        elapsed = rng.uniform(60, 86_400)
        nodes = rng.choice((1, 1, 1, 2, 4, 8, 16))
        restarts = rng.choice((0, 0, 0, 1, 2))
        found.append(
            Record(
                pool=POOL, job=f"job-{i:07d}", seq=i + 1,
                state=rng.choice(("succeeded",) * 8 + ("failed", "cancelled")),
                ended_ms=ended, user=users[i], queue=rng.choice(QUEUES), name=f"job-{i:07d}",
                submitted_ms=ended - int(elapsed * 1000) - 30_000,
                started_ms=ended - int(elapsed * 1000), elapsed_s=elapsed, nodes=nodes,
                node_hours=nodes * elapsed / 3600, exit_code=0, reason="its workers succeeded",
                ettr=rng.uniform(0.6, 0.99), restarts=restarts,
                restarts_by_cause={"worker_failed": restarts} if restarts else {},
                goodput={"wall_s": elapsed, "parts": {p: elapsed / len(PARTS) for p in PARTS}},
            )
        )  # fmt: skip
    return found


def fill(database: Database, password: str | None, rows: list[Record]) -> None:
    """Through the pool leader's own write (accounting/databases.py), in its batches."""
    ledger = open_ledger(database, password)
    for start in range(0, len(rows), BATCH):
        ledger.write(rows[start : start + BATCH])
    ledger.close()


def timed(ledger: SqlLedger, by: str, where: Filter, repeat: int) -> dict[str, Any]:
    times, groups = [], 0
    for _ in range(repeat):
        began = time.perf_counter()
        groups = len(ledger.report(by, where))
        times.append(time.perf_counter() - began)
    return {"median_s": statistics.median(times), "max_s": max(times), "groups": groups}


def cli(redis_url: str, url: str, password: str | None) -> float:
    env = {"PATH": "/usr/bin:/bin", "PGPASSWORD": password} if password else None
    times = []
    for _ in range(3):
        began = time.perf_counter()
        done = subprocess.run(
            [str(ROOT / ".venv" / "bin" / "nodeagentctl"), "--redis", redis_url, "--pool", POOL,
             "report", "--by", "user", "--since", "365d", "--accounting", url],
            capture_output=True, text=True, env=env, check=False,
        )  # fmt: skip
        times.append(time.perf_counter() - began)
        assert done.returncode == 0, done.stderr
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "report.json"))
    args = parser.parse_args()
    now_ms = int(time.time() * 1000)
    began = time.perf_counter()
    rows = records(args.records, now_ms)
    print(f"{len(rows):,} records made in {time.perf_counter() - began:.1f}s")
    result: dict[str, Any] = {"records": len(rows), "users": len(USERS), "queues": len(QUEUES)}
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "redis").mkdir()
        redis = RedisServer(Path(tmp) / "redis")
        redis.start()
        postgres = Postgres().start()
        try:
            sqlite_path = Path(tmp) / "accounting.sqlite"
            databases = {"postgresql": postgres.url, "sqlite": f"sqlite://{sqlite_path}"}
            for kind in databases:
                database = database_of(databases[kind], "bench")
                assert database is not None
                began = time.perf_counter()
                fill(database, postgres.password, rows)
                took = time.perf_counter() - began
                print(f"{kind}: filled in {took:.1f}s ({len(rows) / took:,.0f} records/s)")
                ledger = open_ledger(database, postgres.password, writer=False)
                figures: dict[str, Any] = {"fill_records_per_s": len(rows) / took}
                for span, since in (("year", now_ms - 366 * DAY_MS), ("30d", now_ms - 30 * DAY_MS)):
                    for by in ("user", "queue", "day"):
                        found = timed(ledger, by, Filter(POOL, since_ms=since), args.repeat)
                        figures[f"{by}/{span}"] = found
                        print(
                            f"{kind}: report --by {by:<5} over {span:<4}: median "
                            f"{1000 * found['median_s']:7.1f} ms, max "
                            f"{1000 * found['max_s']:7.1f} ms ({found['groups']} groups)"
                        )
                ledger.close()
                figures["cli_by_user_year_s"] = cli(redis.url, databases[kind], postgres.password)
                print(f"{kind}: nodeagentctl report --by user --since 365d: median "
                      f"{figures['cli_by_user_year_s']:.2f} s (whole command)")  # fmt: skip
                result[kind] = figures
        finally:
            postgres.stop()
            redis.stop()
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
