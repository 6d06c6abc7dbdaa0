"""Whether this node can hold a job's memory tier: checked before the workers start
(`nodeagent config check`, `run`, and a pool node placed on a job)."""

from __future__ import annotations

import os
from pathlib import Path

from nodeagent.config.settings import CheckpointConfig
from nodeagent.errors import ConfigError

GiB = 1 << 30


def check_room(config: CheckpointConfig, node: str, job: str) -> None:
    """Raises: ConfigError naming job.checkpoint.memory_size (or memory_dir) and the numbers,
    when the file system under memory_dir has less room than memory_size (what the job's
    memory tier already holds there counts as room: an agent restarted)."""
    tier = Path(config.memory_tier(node, job))
    existing = tier
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        stat = os.statvfs(existing)
    except OSError as exc:
        raise ConfigError(
            "job.checkpoint.memory_dir", f"cannot look at {existing}: {exc.strerror}"
        ) from None
    free = stat.f_bavail * stat.f_frsize + _used(tier)
    if free < config.memory_size:
        raise ConfigError(
            "job.checkpoint.memory_size",
            f"{config.memory_size / GiB:.2f} GiB wanted for the memory tier, but "
            f"{existing} has {free / GiB:.2f} GiB free on this node (total "
            f"{stat.f_blocks * stat.f_frsize / GiB:.2f} GiB): lower memory_size, or give "
            "memory_dir a larger tmpfs (e.g. /dev/shm's size= mount option)",
        )


def _used(tier: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(tier):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total
