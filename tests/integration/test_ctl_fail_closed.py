"""nodeagentctl fails closed under pool.auth: munge (issue 40, part 7): a verb that only reads
writes nothing to Redis (seen by a real redis-server's MONITOR); a change goes only as a signed
request; a verb with neither form, or a change that names no job, is refused with nothing
written."""

from __future__ import annotations

import argparse
import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nodeagent.accounting.databases import open_ledger
from nodeagent.cli.ctl import nodeagentctl, targets, verbs
from nodeagent.config.database import Database
from nodeagent.coord.durable import Durability
from nodeagent.coord.keys import PoolKeys
from nodeagent.coord.requests import RequestStore
from nodeagent.errors import UsageError
from nodeagent.model.accounting import Record
from tests.helpers.cluster import RedisServer

pytestmark = pytest.mark.timeout(120)

EX_USAGE, EX_CONFIG = 2, 78


@contextlib.contextmanager
def commands_seen(redis_server: RedisServer) -> Iterator[list[list[str]]]:
    """Every command Redis runs while the block does (MONITOR), as [name, args...]."""
    seen: list[list[str]] = []
    client = redis_server.client()
    started = threading.Event()

    def watch() -> None:
        with client.monitor() as monitor:  # type: ignore[no-untyped-call]
            started.set()
            for command in monitor.listen():
                words = command["command"].split()
                if words[:2] == ["ECHO", "monitor-done"]:
                    return
                seen.append([words[0].upper(), *words[1:]])

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    assert started.wait(10)
    redis_server.client().ping()  # MONITOR answers OK before it relays: one round trip later
    try:
        yield seen
    finally:
        redis_server.client().echo("monitor-done")
        thread.join(10)


def writes(redis_server: RedisServer, seen: list[list[str]]) -> list[list[str]]:
    """The commands of `seen` that Redis flags as writes."""
    table: dict[str, Any] = redis_server.client().command()
    return [c for c in seen if "write" in table.get(c[0].lower(), {}).get("flags", ["write"])]


def ctl(redis_server: RedisServer, pool: str, *argv: str) -> int:
    return nodeagentctl.main(["--redis", redis_server.url, "--pool", pool, *argv], environ={})


def test_under_munge_reads_write_nothing_and_unsigned_changes_are_refused(
    redis_server: RedisServer, job_id: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pool = job_id
    submitted = ctl(redis_server, pool, "submit", "--name", "j1", "--nodes", "1", "--", "true")
    assert submitted == 0  # a pool with no leader yet: written directly
    RequestStore(redis_server.client(), PoolKeys("nodeagent", pool)).publish_auth(
        "munge", Durability()
    )

    database = tmp_path / "accounting.sqlite"  # report reads the accounting database only
    writer = open_ledger(Database("sqlite", str(database)))
    writer.write([Record(pool, "old", 1, "succeeded", 1_795_000_000_000, user="alice")])
    writer.close()
    reads = [
        ["jobs"],
        ["jobs", "--json"],
        ["show", "j1"],
        ["history"],
        ["share"],
        ["report", "--accounting", f"sqlite://{database}"],
        ["nodes"],
        ["queue", "list"],
        ["status", "j1"],
        ["--job", "j1", "events"],
        ["--job", "j1", "health", "--node", "n1"],
        ["logs", "j1"],
        ["stacks", "j1"],
        ["--job", "j1", "run", "--", "true"],
    ]
    named = {next(word for word in argv if word.isalpha() and word != "j1") for argv in reads}
    assert named == verbs.READS | {"queue"}
    with commands_seen(redis_server) as seen:
        codes = [ctl(redis_server, pool, *argv) for argv in reads]
    # n1 is no member; j1 has no ranks yet (logs, stacks, run)
    assert codes == [0] * (len(reads) - 4) + [3, 2, 2, 2]
    assert len(seen) > len(reads)  # the reads were seen
    assert writes(redis_server, seen) == []

    capsys.readouterr()
    missing = str(tmp_path / "no-munged.socket")
    with commands_seen(redis_server) as seen:
        assert ctl(redis_server, pool, "stop") == EX_USAGE  # a change with no job named
        assert targets.NO_JOB in capsys.readouterr().err
        # A change with its signed form, and no munged here to sign it: refused, not written.
        assert ctl(redis_server, pool, "--munge-socket", missing, "cancel", "j1") == EX_CONFIG
        assert ctl(redis_server, pool, "--munge-socket", missing, "scale", "j1", "2") == EX_CONFIG
    assert writes(redis_server, seen) == []
    assert "munge" in capsys.readouterr().err


def test_a_verb_without_a_signed_form_runs_only_where_the_pool_takes_plain_writes(
    redis_server: RedisServer, job_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A verb added to the table with a direct write and no signed form: under pool.auth: munge
    dispatch refuses it before it runs; under none it runs (what the gate is for)."""
    pool = job_id
    marker = f"test-written-{job_id}"

    def run(target: targets.Target, args: argparse.Namespace) -> int:
        target.client.set(marker, "1")
        return 0

    purge = argparse.Namespace(HELP="writes directly", add_arguments=print, run=run)
    monkeypatch.setattr(verbs, "VERBS", {**verbs.VERBS, "purge": purge})
    monkeypatch.setattr(nodeagentctl, "VERBS", verbs.VERBS)
    args = argparse.Namespace(
        command="purge", redis=redis_server.url, pool=pool, config=None, job=None,
        key_prefix=None, redis_password_file=None, munge_socket=None,
    )  # fmt: skip
    target = targets.target(args, {})
    store = RequestStore(redis_server.client(), PoolKeys("nodeagent", pool))
    store.publish_auth("munge", Durability())
    with pytest.raises(UsageError, match="purge has no signed form"):
        nodeagentctl.dispatch(target, args)
    assert redis_server.client().get(marker) is None
    store.publish_auth("none", Durability())
    assert nodeagentctl.dispatch(target, args) == 0
    assert redis_server.client().get(marker) == "1"
