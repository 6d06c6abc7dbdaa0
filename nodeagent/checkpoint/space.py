"""Whether this node can hold a job's memory tier: checked before the workers start
(`nodeagent config check`, `run`, and a pool node placed on a job)."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from collections.abc import Iterable
from pathlib import Path

from nodeagent.channel.manifests import BadCopy, open_plain
from nodeagent.config.settings import CheckpointConfig
from nodeagent.errors import ConfigError

GiB = 1 << 30


def check_room(config: CheckpointConfig, node: str, job: str) -> None:
    """Raises: ConfigError naming job.checkpoint.memory_size (or memory_dir) and the numbers,
    when the file system under memory_dir has less room than memory_size for the node's own
    saves and as much again for each of `replicas` peers' (what the job's memory tier and
    replica area already hold there counts as room: an agent restarted)."""
    tier = Path(config.memory_tier(node, job))
    check_parent(tier.parent)
    existing = tier
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        stat = os.statvfs(existing)
    except OSError as exc:
        raise ConfigError(
            "job.checkpoint.memory_dir", f"cannot look at {existing}: {exc.strerror}"
        ) from None
    area = Path(config.replica_area(node, job))
    free = stat.f_bavail * stat.f_frsize + _used(tier) + _used(area)
    wanted = config.memory_size * (1 + config.replicas)  # peers' copies beside its own
    if free < wanted:
        replicas = f" and {config.replicas} peers' copies" if config.replicas else ""
        raise ConfigError(
            "job.checkpoint.memory_size",
            f"{wanted / GiB:.2f} GiB wanted for the memory tier{replicas}, but "
            f"{existing} has {free / GiB:.2f} GiB free on this node (total "
            f"{stat.f_blocks * stat.f_frsize / GiB:.2f} GiB): lower memory_size, or give "
            "memory_dir a larger tmpfs (e.g. /dev/shm's size= mount option)"
            + (", or lower replicas" if config.replicas else ""),
        )


def check_parent(parent: Path) -> None:
    """memory_dir, if it exists already, is a real directory of the agent's own that nobody
    else may write: the agent runs as root and sets a tier's owner below it, so a workers' user
    who made it first (on a shared tmpfs such as /dev/shm) must not control what that reaches.

    Raises: ConfigError naming job.checkpoint.memory_dir and what is wrong."""
    try:
        st = os.lstat(parent)
    except FileNotFoundError:
        return  # the agent makes it
    if (
        not stat.S_ISDIR(st.st_mode)
        or st.st_uid != os.geteuid()
        or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    ):
        raise ConfigError(
            "job.checkpoint.memory_dir",
            f"{parent} must be a directory of the agent's user (uid {os.geteuid()}) that no "
            f"one else may write; it is uid {st.st_uid}, mode {stat.filemode(st.st_mode)}: "
            "remove it (the agent makes it) or choose another memory_dir",
        )


OWNER = ".owner"  # in a tier: "<node>\n<job>\n", written by the agent that made it


def make_marked(
    directory: Path, what: str, mode: int, node: str, job: str, uid: int = -1, gid: int = -1
) -> None:
    """Make `directory` (a job's memory tier or replica area, below memory_dir) with `mode`, owned
    by `uid`:`gid` (-1: the agent's), and mark it as `node`'s of `job`.

    The agent runs as root and the workers as a user: that user must not be able to turn this
    into a chown or a removal of anything else. So the parent (memory_dir) must be a real
    directory of the agent's own that nobody else may write (refused otherwise: a user could
    have made it first on a shared tmpfs), and the directory is opened without following links
    before its mode and owner are set.

    Raises: ConfigError naming job.checkpoint.memory_dir and what is wrong (`what`: the tier,
        the replica area)."""
    parent = directory.parent
    parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    check_parent(parent)
    with contextlib.suppress(FileExistsError):
        os.mkdir(directory, mode)
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        raise ConfigError(
            "job.checkpoint.memory_dir",
            f"{directory}: {exc.strerror} (a link or a file where {what} goes: remove it)",
        ) from None
    try:
        os.fchmod(fd, mode)
        if uid != -1 or gid != -1:
            os.fchown(fd, uid, gid)
        mark(fd, node, job)
    finally:
        os.close(fd)


def mark(tier_fd: int, node: str, job: str) -> None:
    """Say in the tier (an open directory) whose it is: a node name may contain dots, so
    `<node>.<job>` alone cannot tell node `a`'s tier of job `b.c` from node `a.b`'s of job
    `c` (two agents sharing memory_dir). Never through a link a worker put there."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(OWNER, dir_fd=tier_fd)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(OWNER, flags, 0o644, dir_fd=tier_fd)
    with os.fdopen(fd, "w") as f:
        f.write(f"{node}\n{job}\n")


def owner(tier: Path) -> tuple[str, str] | None:
    """(node, job) as the tier's mark says, or None (no mark, or not one an agent wrote)."""
    try:
        fd = open_plain(tier / OWNER)
    except BadCopy:
        return None
    with os.fdopen(fd, "rb") as f:
        words = f.read(1024).decode(errors="replace").split("\n")
    return (words[0], words[1]) if len(words) == 3 and not words[2] else None


def sweep(memory_dirs: Iterable[str], node: str, serving: str | None) -> list[Path]:
    """Remove this node's memory tiers of jobs other than `serving` (under each of
    `memory_dirs`); the paths removed.

    A tier normally goes when its job ends or the pool moves the node off it; one outlives that
    only if the agent was down at that moment (stopped, crashed) and was not placed back on the
    job: it would hold tmpfs for good. Called with what the node serves as the pool says,
    never before the node has heard from the pool (it would not know what it serves). Only
    tiers whose mark names this node go (`mark`); a memory_dir someone else controls is left
    alone (check_parent), as is anything that is not a directory of its own."""
    removed = []
    prefix = f"{node}."
    for memory_dir in dict.fromkeys(memory_dirs):
        parent = Path(memory_dir)
        try:
            check_parent(parent)
            entries = list(os.scandir(parent))
        except (ConfigError, OSError):
            continue
        for entry in entries:
            if not entry.name.startswith(prefix) or not entry.is_dir(follow_symlinks=False):
                continue
            marked = owner(Path(entry.path))
            if marked is None or marked[0] != node or marked[1] == serving:
                continue
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(Path(entry.path))
    return removed


def _used(tier: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(tier):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total
