"""job.checkpoint: the checkpoint tiers' settings (docs/checkpoints.md), from a `job:` section
or a job spec."""

from __future__ import annotations

from nodeagent.config.settings import CheckpointConfig
from nodeagent.config.values import (
    Section,
    optional_path,
    parse_size,
    path_value,
    positive_int,
)
from nodeagent.errors import ConfigError


def load_checkpoint(section: Section) -> CheckpointConfig | None:
    """job.checkpoint; None when the section is absent (or empty)."""
    if not section.present:
        return None
    memory_size = section.raw("memory_size")
    if memory_size is None:
        raise ConfigError(
            section.key("memory_size"),
            "required: the memory tier's size on each node, such as 8GiB (two saves per local "
            "rank: about twice the state a node holds)",
        )
    memory_dir = path_value(section, "memory_dir", CheckpointConfig.memory_dir)
    persist_dir = optional_path(section, "persist_dir")
    for key, path in (("memory_dir", memory_dir), ("persist_dir", persist_dir)):
        if path is not None and not path.startswith("/"):
            raise ConfigError(section.key(key), f"must be an absolute path, got {path!r}")
    checkpoint = CheckpointConfig(
        memory_size=parse_size(memory_size, section.key("memory_size")),
        memory_dir=memory_dir,
        persist_dir=persist_dir,
        persist_every=positive_int(section, "persist_every", CheckpointConfig.persist_every),
    )
    section.reject_unknown()
    return checkpoint
