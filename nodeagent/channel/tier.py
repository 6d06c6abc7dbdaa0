"""Where the checkpoint tiers lie on disk: the layout both sides find saves by. No torch here.

The worker (nodeagent.worker.checkpointer) saves into a tier and finds what it loads; the agent
(nodeagent.checkpoint) makes the tiers, verifies, copies and reports what each holds. What makes
a save whole (its manifest) is nodeagent.channel.manifests'; the restore order and report are
nodeagent.channel.restore's.

Layout:
    memory tier       <memory_dir>/<node>.<job>/rank-<R>/slot-0|slot-1/   (two slots per rank)
    replica area      <memory_dir>/<node>.<job>+replicas/<from>/rank-<R>/slot-0|slot-1/
                                                      (peers' saves, sent by node <from>)
    persistent tier   <dir>/step-<S>/rank-<R>/                      (also a script's own
                                                                      directory under torchrun)

Two slots per rank in the memory tier: a save goes to the slot that does not hold the rank's
newest save and removes that slot's manifest before writing, so a save killed half way leaves
the newest good one untouched (nodeagent.channel.pin keeps the committed one too).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

from nodeagent.channel.manifests import manifest_in, plain_name

SLOTS = ("slot-0", "slot-1")
# Environment the agent gives a worker (nodeagent.worker.checkpointer reads it).
MEMORY_ENV = "NODEAGENT_CKPT_MEMORY"  # this node's memory tier of the job
MEMORY_LIMIT_ENV = "NODEAGENT_CKPT_MEMORY_LIMIT"  # bytes one rank's save may take
PERSIST_ENV = "NODEAGENT_CKPT_PERSIST"  # the job's persistent tier (shared by its nodes)
REPLICAS_ENV = "NODEAGENT_CKPT_REPLICAS"  # this node's replica area of the job (read only)
_RANK_DIR = re.compile(r"rank-([0-9]{1,7})")
_STEP_DIR = re.compile(r"step-([0-9]{1,15})")


# -- the memory tier: <tier>/rank-<R>/slot-N ------------------------------------------------


def rank_dir(tier: Path, rank: int) -> Path:
    return tier / f"rank-{rank}"


def slots(tier: Path, rank: int) -> tuple[Path, ...]:
    return tuple(rank_dir(tier, rank) / slot for slot in SLOTS)


def _saved(directory: Path) -> tuple[int, int]:
    """(step, generation) of the save in `directory`, or (-1, -1)."""
    manifest = manifest_in(directory)
    return (manifest.step, manifest.generation) if manifest else (-1, -1)


def older(steps: Sequence[int]) -> int:
    """Which of two slots holding saves of `steps` (-1: none) the next save goes to: the one
    that does not hold the newest (nodeagent.channel.pin keeps the committed one too)."""
    return 1 if steps[0] > steps[1] else 0


def slot_for_save(tier: Path, rank: int) -> Path:
    """Where this rank's next save goes, nothing pinned: the slot that does not hold its newest
    save."""
    both = slots(tier, rank)
    return both[older([_saved(slot)[0] for slot in both])]


def newest_in_memory(
    tier: Path, rank: int, step: int | None = None, generation: int | None = None
) -> Path | None:
    """The slot holding this rank's newest save (of `step` only, and saved by `generation`
    only, if given); unverified."""
    found = [(saved, slot) for slot in slots(tier, rank) if (saved := _saved(slot))[0] >= 0]
    if step is not None:
        found = [(saved, slot) for saved, slot in found if saved[0] == step]
    if generation is not None:
        found = [(saved, slot) for saved, slot in found if saved[1] == generation]
    return max(found)[1] if found else None


def memory_saves(tier: Path) -> Iterator[tuple[Path, int]]:
    """Every slot of every rank in the memory tier, with its rank (unverified, unordered)."""
    if not tier.is_dir():
        return
    with os.scandir(tier) as entries:  # closed too when the caller stops early
        for entry in entries:
            match = _RANK_DIR.fullmatch(entry.name)
            if match and entry.is_dir(follow_symlinks=False):
                for slot in SLOTS:
                    yield Path(entry.path) / slot, int(match.group(1))


# -- a replica area: <area>/<node>/rank-<R>/slot-N (copies of peers' saves) ----------------


def area_saves(area: Path) -> Iterator[tuple[Path, int]]:
    """Every slot of every rank under a replica area, from every node (unverified)."""
    if not area.is_dir():
        return
    with os.scandir(area) as entries:  # closed too when the caller stops early
        for entry in entries:
            if entry.is_dir(follow_symlinks=False) and plain_name(entry.name):
                yield from memory_saves(Path(entry.path))


def find_save(
    memory: Path | None, area: Path | None, rank: int, step: int, generation: int | None
) -> Path | None:
    """A slot holding rank `rank`'s save of `step` (by `generation` if given): in the memory
    tier first, then in the replica area, from any node; unverified."""
    found = newest_in_memory(memory, rank, step, generation) if memory is not None else None
    if found is not None or area is None or not area.is_dir():
        return found
    for entry in sorted(os.scandir(area), key=lambda e: e.name):
        if entry.is_dir(follow_symlinks=False):
            found = newest_in_memory(Path(entry.path), rank, step, generation)
            if found is not None:
                return found
    return None


def any_save(
    memory: Path | None, area: Path | None, step: int, generation: int | None
) -> Path | None:
    """A slot holding any rank's save of `step` (by `generation` if given), in the memory tier
    or the replica area; unverified."""
    found: list[tuple[Path, int]] = []
    if memory is not None:
        found += memory_saves(memory)
    if area is not None:
        found += area_saves(area)
    for slot, _ in sorted(found, key=lambda f: f[1]):  # the lowest rank first
        saved = _saved(slot)
        if saved[0] == step and generation in (None, saved[1]):
            return slot
    return None


# -- a persistent tier: <dir>/step-<S>/rank-<R> ---------------------------------------------


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step}"


def steps(root: Path) -> list[int]:
    """The steps with a directory under `root`, newest first (complete or not)."""
    if not root.is_dir():
        return []
    found = [int(m.group(1)) for e in os.scandir(root) if (m := _STEP_DIR.fullmatch(e.name))]
    return sorted(found, reverse=True)
