"""Saves made by hand in the checkpoint tiers' format (nodeagent/channel/tier.py), no torch."""

from __future__ import annotations

from pathlib import Path

from nodeagent.channel import tier
from nodeagent.channel.tier import Manifest


def fake_save(
    directory: Path, step: int, rank: int = 0, world: int = 2, size: int = 1000, generation: int = 3
) -> None:
    """What a rank's save leaves: two files, then its manifest."""
    tier.begin(directory)
    (directory / "__0_0.distcp").write_bytes(bytes(range(256)) * (size // 256) + b"x" * step)
    (directory / ".metadata").write_bytes(b"meta" + str(step).encode())
    manifest = Manifest(step, generation, world, rank, tier.summarize(directory), job="j")
    tier.write_manifest(directory, manifest)
