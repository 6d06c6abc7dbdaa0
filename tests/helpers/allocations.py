"""Allocations held by the tests' Unix users in a pool under pool.auth: munge (tests of `run`,
`ssh node`'s check): the pool, the options that reach it, an allocation held from a terminal."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator

from tests.helpers.cluster import wait_for
from tests.helpers.munge import MungeDaemon
from tests.helpers.pool import PoolCluster, munge_pool
from tests.helpers.users import User, reachable_dir


@contextlib.contextmanager
def users_pool(
    redis_url: str, job_id: str, munged: MungeDaemon, users: dict[str, User]
) -> Iterator[PoolCluster]:
    """A pool whose agents run under pool.auth: munge, in a directory `users` reach, each of
    whom may submit."""
    names = [user.name for user in users.values()]
    with (
        reachable_dir("na-run-") as shared,
        munge_pool(redis_url, shared, job_id, munged.socket, names) as cluster,
    ):
        yield cluster


def where(pool: PoolCluster, munged: MungeDaemon) -> list[str]:
    return ["--redis", pool.redis_url, "--pool", pool.pool, "--munge-socket", munged.socket]


def holding(
    pool: PoolCluster, munged: MungeDaemon, user: User, name: str, nodes: int
) -> subprocess.Popen[str]:
    """An allocation `user` holds from a terminal (its shell: a long sleep) until killed."""
    held = user.start_nodeagentctl(
        *where(pool, munged), "alloc", "--name", name, "--nodes", str(nodes),
        "--", "sleep", "600",
    )  # fmt: skip

    def running() -> bool:
        if held.poll() is not None:
            said = held.stdout.read() if held.stdout is not None else ""
            raise AssertionError(f"alloc ended with {held.returncode}: {said}")
        row = pool.jobs().get(name)
        return row is not None and row["state"] == "running" and row["world_size"] == nodes

    wait_for(running, 60, f"allocation {name} held")
    return held
