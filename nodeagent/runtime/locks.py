"""One agent per node and job: the record of this agent's worker process groups (read by the
fence keeper), the lock held on it for the agent's life, and what a dead predecessor left."""

from __future__ import annotations

import fcntl
import logging
import os
import time
from pathlib import Path

from nodeagent.config.settings import NodeSettings
from nodeagent.errors import ConfigError
from nodeagent.runtime.preflight import NodeCheck
from nodeagent.supervisor.fence import kill_leftovers, leftover_alive


def worker_record(config: NodeSettings, node: NodeCheck) -> Path | None:
    """Where this agent's worker process groups are recorded (fencing.Keeper): one file per
    node and pinned job (two `nodeagent launch`es on one machine share its host name), one per
    node for a pool's agent; None if nowhere (the default state directory cannot be written:
    check_node warned about it)."""
    if node.state_dir is None:
        return None
    owner = config.node.name if config.job is None else f"{config.node.name}.{config.job.id}"
    return node.state_dir / f"{owner}.workers.json"


_held_locks: list[int] = []  # the record locks this process holds, open until it exits


def hold(record: Path) -> None:
    """Lock `record` for the rest of this process's life (see `lock`).

    Raises:
        ConfigError: another live agent holds it.
    """
    _held_locks.append(lock(record))


def lock(record: Path) -> int:
    """Lock `record` (its open lock file, held until closed: the agent keeps its own for its
    life). Each agent kills the groups its record names at start (a previous agent's
    leftovers): a second agent of the same node and job would kill the first's running workers.

    Raises:
        ConfigError: another live agent holds it.
    """
    lock = record.with_name(record.name + ".lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ConfigError(
            "node.name",
            f"another nodeagent on this machine runs {record.name.removesuffix('.workers.json')}"
            f" (it holds {lock}); give this one another node.name or job id, or stop that one",
        ) from None
    return fd


def clean_legacy(config: NodeSettings, node: NodeCheck) -> None:
    """A pinned agent's record was `<node>.workers.json` before it was per job: what an agent
    of an older version left there is killed too, unless a live agent (a pool's, which still
    uses that name) holds it."""
    if node.state_dir is None or config.job is None:
        return
    legacy = node.state_dir / f"{config.node.name}.workers.json"
    if not legacy.exists():
        return
    try:
        fd = lock(legacy)
    except ConfigError:
        return  # a live pool agent's
    try:
        clean_leftovers(legacy)
        legacy.unlink(missing_ok=True)
    finally:
        os.close(fd)


def clean_leftovers(record: Path | None) -> None:
    """Kill what a previous agent of this node left running (it died with its keeper)."""
    if record is None:
        return
    killed = kill_leftovers(record)
    if not killed:
        return
    logging.getLogger(__name__).warning(
        "killed worker process groups %s left by a previous agent",
        [g.cidfile or g.pgid for g in killed],
    )
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(leftover_alive(g) for g in killed):
        time.sleep(0.01)
