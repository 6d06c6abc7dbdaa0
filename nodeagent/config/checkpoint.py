"""job.checkpoint: the checkpoint tiers' settings (docs/checkpoints.md), from a `job:` section
or a job spec."""

from __future__ import annotations

from typing import TypedDict

from nodeagent.config.settings import CheckpointConfig
from nodeagent.config.values import (
    Section,
    optional_path,
    parse_size,
    path_value,
    positive_int,
)
from nodeagent.errors import ConfigError

MAX_REPLICAS = 8  # as model/tiers.py reads a record


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
        replicas=_replicas(section),
        **_replication(section.section("replication")),
    )
    section.reject_unknown()
    return checkpoint


def _replicas(section: Section) -> int:
    replicas = positive_int(section, "replicas", CheckpointConfig.replicas, minimum=0)
    if replicas > MAX_REPLICAS:
        raise ConfigError(
            section.key("replicas"),
            f"at most {MAX_REPLICAS} peers hold a copy of a node's saves, got {replicas} "
            "(1 survives one lost node, 2 two at once)",
        )
    return replicas


REPLICA_AUTH = ("munge", "none")


class _Replication(TypedDict):
    max_rate: int
    replica_port: int
    replica_auth: str


def _replication(section: Section) -> _Replication:
    """job.checkpoint.replication: how this node sends copies to its peers."""
    rate = section.raw("max_rate")
    max_rate = 0
    if rate is not None and rate != 0:
        text = rate.removesuffix("/s") if isinstance(rate, str) else rate
        try:
            max_rate = parse_size(text, section.key("max_rate"))
        except ConfigError:
            raise ConfigError(
                section.key("max_rate"),
                f"expected bytes a second such as 500MiB/s (0: unbounded), got {rate!r}",
            ) from None
    port = section.get("port", int, 0)
    if not 0 <= port <= 65535:
        raise ConfigError(section.key("port"), f"must be a TCP port (0: any free one), got {port}")
    auth = section.get("auth", str, "munge")
    if auth not in REPLICA_AUTH:
        raise ConfigError(
            section.key("auth"),
            f"expected munge (peers prove they are agents with a MUNGE credential) or none "
            f"(anyone who reaches the listener may send and fetch copies), got {auth!r}",
        )
    section.reject_unknown()
    return {"max_rate": max_rate, "replica_port": port, "replica_auth": auth}
