"""The committed save a node keeps: no save or copy is written over it (docs/checkpoints.md,
"Pinned").

A node's memory tier and its replica area keep two slots per rank, and a save (a copy) goes
to the slot that does not hold the newest. When saves outpace their copies, that slot can hold
the committed save, the one the leader counts on for a node loss: written over on one node, it
is on one node fewer, and a loss then finds it whole nowhere. So the agent writes the committed
save's key into its memory tier (`<memory tier>/pin.json`, from the job record, on every
change), and both writers read it before they choose a slot (`choose`):

- a copy a peer sends (or a fetch) goes to the other slot;
- a worker's save waits for the newer save in the other slot to commit: it is skipped (staged,
  not written) while that save, of the same generation, is younger than the worker's patience
  (a few save intervals, at least a minute), then written over it. A skipped save that no
  other follows is written over the newer one as the process ends (`Checkpointer.close`) or
  leaves its group when told to (in place), so the step a stopping worker reached is kept.
  The committed save stays either way. While nothing is committed (the pin names none), a
  save waits the same way for the newest to commit, then goes over the older one: the leader
  copies the newest save, and a save every interval would otherwise start its copies again
  before they end.

The agent writes the file; the workers only read it (a file they cannot parse pins nothing).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from nodeagent.channel.manifests import MANIFEST, BadCopy, manifest_in, open_plain
from nodeagent.channel.tier import older
from nodeagent.channel.tier import slots as tier_slots

FILE = "pin.json"
MAX_BYTES = 4096
SaveKey = tuple[int, int, int]  # (step, the generation that saved it, world size)


@dataclass(frozen=True)
class Pin:
    """What a node's slots must keep: the committed save (None: nothing is committed)."""

    key: SaveKey | None

    def to_json(self) -> str:
        return json.dumps({"committed": list(self.key) if self.key else None})

    @classmethod
    def from_json(cls, raw: str, where: str) -> Pin:
        """Raises: BadCopy naming `where` and what is wrong."""
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise BadCopy(f"{where}: not JSON ({exc})") from None
        if not isinstance(data, dict) or "committed" not in data:
            raise BadCopy(f"{where}: not a pin (an object with 'committed')")
        key = data["committed"]
        if key is None:
            return cls(None)
        if (
            not isinstance(key, list)
            or len(key) != 3
            or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in key)
        ):
            raise BadCopy(f"{where}: 'committed' must be [step, generation, world], got {key!r}")
        return cls((key[0], key[1], key[2]))


def write(memory: Path, pin: Pin) -> None:
    """Replace the pin of the memory tier `memory` at once (a temporary file renamed). The
    directory is the workers' user's and the agent writes as root: the temporary file is made
    anew, never opened through a link or a file a worker put in its place.

    Raises: OSError (a worker made the temporary file meanwhile: the next call tries again)."""
    tmp = memory / f".tmp-{FILE}.{os.getpid()}"
    tmp.unlink(missing_ok=True)  # a link is removed, not followed
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o644)
    with os.fdopen(fd, "w") as f:
        os.fchmod(fd, 0o644)
        f.write(pin.to_json())
    os.replace(tmp, memory / FILE)


def read(memory: Path) -> Pin | None:
    """The pin of the memory tier `memory`; None when there is none. Read only as a regular
    file, at most MAX_BYTES (the agent's listener reads it as root in the workers' directory).

    Raises: BadCopy for a file this module did not write."""
    path = memory / FILE
    try:
        os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise BadCopy(f"{path}: {exc.strerror}") from None
    with os.fdopen(open_plain(path), "rb") as f:
        raw = f.read(MAX_BYTES + 1)
    if len(raw) > MAX_BYTES:
        raise BadCopy(f"{path}: more than {MAX_BYTES} bytes, not a pin")
    try:
        return Pin.from_json(raw.decode(), str(path))
    except UnicodeDecodeError as exc:
        raise BadCopy(f"{path}: {exc}") from None


@dataclass(frozen=True)
class Slot:
    """What one slot holds: the save's key, and when its manifest was written (wall clock)."""

    key: SaveKey
    written: float


def look(slots: Sequence[Path]) -> tuple[Slot | None, ...]:
    """What each of `slots` holds (None: no save), from its manifest, unverified."""
    found: list[Slot | None] = []
    for path in slots:
        manifest = manifest_in(path)
        try:
            written = (path / MANIFEST).stat().st_mtime if manifest else 0.0
        except OSError:  # saved over meanwhile
            manifest = None
        if manifest is None:
            found.append(None)
        else:
            key = (manifest.step, manifest.generation, manifest.world_size)
            found.append(Slot(key, written))
    return tuple(found)


def choose(
    held: Sequence[Slot | None],
    pin: Pin | None,
    generation: int | None = None,
    now: float = 0.0,
    patience: float = 0.0,
) -> int | None:
    """The index of the slot the next save goes to; None: skip this save. Pure.

    Args:
        held: what the two slots hold.
        pin: the node's pin (None: no pin, nothing is kept; a pin of no key: nothing is
            committed yet).
        generation: the saving worker's generation (None: a copy, never skipped).
        now, patience: a worker's save is skipped while the newer save, of its generation,
            was written less than `patience` seconds before `now` (0: never skipped).
    """
    target = older([s.key[0] if s is not None else -1 for s in held])
    kept, newer = held[target], held[1 - target]
    if pin is None or kept is None:
        return target
    pinned = kept.key == pin.key
    if generation is None or not (pinned or pin.key is None):
        return 1 - target if pinned else target
    # A worker's save; the older slot holds the committed save, or nothing is committed yet
    # (the leader copies the newest save: written over, its copies would start again).
    # A wall clock set back makes the newer save look written later than now: not waited for.
    if newer is not None and newer.key[1] == generation and 0 <= now - newer.written < patience:
        return None
    return 1 - target if pinned else target


def slot_for_copy(directory: Path, rank: int, memory: Path | None) -> Path:
    """Where a copy of rank `rank`'s save goes in `directory` (one node's part of a replica
    area): the slot that does not hold the newest, unless that one holds the save pinned in
    the memory tier `memory`. A pin that cannot be read pins nothing."""
    slots = tier_slots(directory, rank)
    try:
        pinned = read(memory) if memory is not None else None
    except BadCopy:
        pinned = None
    index = choose(look(slots), pinned)
    assert index is not None  # a copy is never skipped
    return slots[index]
