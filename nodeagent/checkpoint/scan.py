"""What a node's tiers hold, verified, and the copy from the memory tier to the persistent one.

Verifying a save reads every byte of it (SHA-256, 2.1 GB/s on one core here), so a save is
verified once, remembered by its manifest's identity (inode, size, change time): a manifest is
only ever replaced by a rename, so a new save is a new identity.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from nodeagent.channel import manifests, tier
from nodeagent.channel.manifests import BadCopy, Manifest
from nodeagent.checkpoint import space
from nodeagent.model.tiers import Held

log = logging.getLogger(__name__)
Identity = tuple[int, int, int]


@dataclass(frozen=True)
class Save:
    """One rank's save found in the memory tier (or a replica area), verified."""

    slot: Path
    manifest: Manifest

    @functools.cached_property
    def digest(self) -> str:
        return manifests.digest(self.manifest)


def identity(slot: Path) -> Identity | None:
    try:
        st = os.stat(slot / manifests.MANIFEST)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_ctime_ns)


class Verified:
    """The memory tier's saves whose every file matched their manifest when last looked at
    (or a replica area's, with `slots=tier.area_saves`). `most`: the bytes one save may take
    there (a manifest naming more is refused unread)."""

    def __init__(
        self,
        memory: Path,
        slots: Callable[[Path], Iterator[tuple[Path, int]]] = tier.memory_saves,
        most: int | None = None,
    ) -> None:
        self.memory = memory
        self._slots = slots
        self._most = most
        self._seen: dict[Path, tuple[Identity, Save | None]] = {}

    def refresh(self) -> list[str]:
        """Verify every save not verified yet (blocking: run it off the agent's loop); the
        problems found, one line each (a save that does not verify is never reported)."""
        problems = []
        present = set()
        for slot, _rank in self._slots(self.memory):
            ident = identity(slot)
            if ident is None:
                continue
            present.add(slot)
            known = self._seen.get(slot)
            if known is not None and known[0] == ident:
                continue
            try:
                found = manifests.verify(slot, beneath=self.memory.parent, most=self._most)
                save: Save | None = Save(slot, found)
            except BadCopy as exc:
                if identity(slot) != ident:  # its worker is writing a new save there
                    continue
                save = None
                problems.append(str(exc))
            self._seen[slot] = (ident, save)
        for gone in set(self._seen) - present:
            del self._seen[gone]
        return problems

    def trust(self, slot: Path, manifest: Manifest) -> None:
        """Take the save in `slot` as verified without reading it again: it was checked byte by
        byte as it was written (a copy received from a peer)."""
        ident = identity(slot)
        if ident is not None:
            self._seen[slot] = (ident, Save(slot, manifest))

    def saves(self) -> list[Save]:
        """The verified saves whose manifest is still the one verified (cheap: a stat each)."""
        return [
            save
            for slot, (ident, save) in list(self._seen.items())
            if save is not None and identity(slot) == ident
        ]

    def pending(self) -> bool:
        """A manifest is there that was not verified yet (a save written since)."""
        for slot, _rank in self._slots(self.memory):
            ident = identity(slot)
            if ident is not None and self._seen.get(slot, (None,))[0] != ident:
                return True
        return False


def held(saves: Iterable[Save]) -> tuple[Held, ...]:
    """Saves grouped by step, world and the generation that saved them: which ranks hold
    each, newest first."""
    by_step: dict[tuple[int, int, int], dict[int, str]] = {}
    rows: dict[tuple[int, int, int], tuple[int, ...]] = {}
    for save in saves:
        m = save.manifest
        key = (m.step, m.generation, m.world_size)
        by_step.setdefault(key, {})[m.rank] = save.digest
        if m.dim0 is not None:  # every rank's manifest records the same row counts
            rows[key] = m.dim0
    return tuple(
        Held(
            step,
            world,
            tuple(sorted(ranks)),
            generation,
            tuple(dict(sorted(ranks.items())).values()),
            rows.get((step, generation, world), ()),
        )
        for (step, generation, world), ranks in sorted(by_step.items(), reverse=True)
    )


def completes_node(held: Iterable[Held], got: Manifest, per_node: int) -> bool:
    """Whether the copy `got` completes, among `held`, the saves of its step that one node of
    its world made (its rank's group of `per_node` ranks, as torchrun numbers them): the last
    copy its sender sends of that save, in the common case. A node that copies other ranks'
    saves (after a restore at another world) never completes one: its copies are reported at
    the next heartbeat instead."""
    first = got.rank - got.rank % per_node
    group = set(range(first, min(first + per_node, got.world_size)))
    return any(
        (h.step, h.generation, h.world_size) == (got.step, got.generation, got.world_size)
        and group <= set(h.ranks)
        for h in held
    )


def newest_whole(saves: Iterable[Save], ranks: Iterable[int]) -> list[Save]:
    """The saves of the newest step, all of one generation, that every one of `ranks` holds
    (empty if there is none)."""
    wanted = set(ranks)
    by_step: dict[tuple[int, int], dict[int, Save]] = {}
    for save in saves:
        m = save.manifest
        by_step.setdefault((m.step, m.generation), {})[m.rank] = save
    for key in sorted(by_step, reverse=True):
        if wanted and wanted <= set(by_step[key]):
            return [by_step[key][r] for r in sorted(wanted)]
    return []


class Superseded(manifests.BadCopy):
    """The persistent tier holds a newer generation's save of the step and rank: this one is of
    a timeline the job abandoned (a node held out while alive, a zombie, copying what its old
    generation saved before its lease fenced it) and must not replace it (docs/design.md)."""


def generation_there(directory: Path) -> int | None:
    """The generation a persisted rank directory's manifest names; None without a readable
    one (nothing there, a copy cut short, or garbage: a newer save cannot be told there)."""
    try:
        return manifests.read_manifest(directory).generation
    except (manifests.BadCopy, ValueError):
        return None


def _newer_there(directory: Path, generation: int) -> int | None:
    """The generation of the save in `directory` if it is newer than `generation`."""
    there = generation_there(directory)
    return there if there is not None and there > generation else None


def persist(saves: list[Save], root: Path, group: int = -1) -> Held:
    """Copy `saves` (one step) to the persistent tier at `root`, each verified byte by byte
    and fsync'd (manifests.copy_verified), readable by the workers' `group` (-1: the agent's)
    whatever the agent's umask (space.shared_dir); never over a newer generation's save of
    the step. Raises: Superseded (before anything is copied), BadCopy, OSError."""
    step = saves[0].manifest.step
    for save in saves:
        target = tier.rank_dir(tier.step_dir(root, step), save.manifest.rank)
        there = _newer_there(target, save.manifest.generation)
        if there is not None:
            raise Superseded(
                f"step {step} of generation {save.manifest.generation}: {target} holds "
                f"generation {there}'s (this node's timeline was abandoned)"
            )
    space.shared_dir(tier.step_dir(root, step), group)
    for save in saves:
        target = tier.rank_dir(tier.step_dir(root, step), save.manifest.rank)
        manifests.copy_verified(
            save.slot, target, durable=True, expected=save.manifest, beneath=save.slot.parents[2]
        )
    first = saves[0].manifest
    return Held(step, first.world_size, tuple(s.manifest.rank for s in saves), first.generation)


def prune(
    root: Path,
    mine: list[Held],
    keep: int,
    protected: int | None = None,
    ranks: Iterable[int] = (),
    generation: int | None = None,
) -> list[Held]:
    """Remove this node's copies of all but its `keep` newest persisted steps and `protected`;
    what is left of `mine`. `mine` is what this agent copied; `ranks`, the ranks it copies now:
    their directories of older steps go too, whoever made them (this node before its agent
    restarted, which `mine` does not know of, would otherwise keep them for good), except
    those of a generation after `generation`, this node's newest: a node of the job's newer
    timeline made them, and this one's may be abandoned (a zombie's: docs/design.md)."""
    held: dict[int, set[int]] = {}
    for h in mine:
        held.setdefault(h.step, set()).update(h.ranks)
    wanted = set(ranks)
    for step in tier.steps(root) if wanted else ():
        step_path = tier.step_dir(root, step)
        present = {r for r in wanted if tier.rank_dir(step_path, r).is_dir()}
        if present:
            held.setdefault(step, set()).update(present)
    ordered = sorted(held, reverse=True)
    kept = set(ordered[:keep]) | ({protected} if protected is not None else set())
    for step in ordered:
        if step in kept:
            continue
        step_path = tier.step_dir(root, step)
        for rank in held[step]:
            doomed = tier.rank_dir(step_path, rank)
            if generation is None or _newer_there(doomed, generation) is None:
                shutil.rmtree(doomed, ignore_errors=True)
        with contextlib.suppress(OSError):  # another node's ranks are still there
            step_path.rmdir()
    return [h for h in mine if h.step in kept]


def keep_ranks(memory: Path, ranks: Iterable[int]) -> list[int]:
    """Remove the memory tier's rank directories not in `ranks` (ranks this node no longer
    runs: a restore from memory only ever reads a rank's own node); the ranks removed."""
    wanted, removed = set(ranks), []
    for entry in os.scandir(memory) if memory.is_dir() else ():
        name = entry.name
        if name.startswith("rank-") and name[5:].isdigit() and int(name[5:]) not in wanted:
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(int(name[5:]))
    return sorted(removed)
