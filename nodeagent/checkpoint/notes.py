"""What a worker says it restored (its restore report, nodeagent.worker.tiered), as the agent
reads it: no more trusted than any other input."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from nodeagent.channel import tier

log = logging.getLogger(__name__)
NOTE_MAX = 64 << 10  # bytes of a restore report the agent reads


@dataclass(frozen=True)
class RestoreNote:
    """What one local rank restored (its report file, nodeagent.worker.tiered)."""

    rank: int
    tier: str
    step: int | None
    seconds: float
    refused: tuple[Refusal, ...]
    saves: int = 0  # how many ranks' saves it read (0: not said)


@dataclass(frozen=True)
class Refusal:
    """A source a rank did not restore from: its kind (tier.REFUSALS) and why."""

    source: str
    kind: str
    reason: str

    @property
    def condemned(self) -> int | None:
        """The step this refusal condemns: one whose state holds a NaN or an infinity (so does
        every copy of it). A copy that does not verify condemns that copy only (its node
        verifies again and stops offering it); an absent source condemns nothing."""
        return _step_of(self.source) if self.kind == tier.BAD_STATE else None

    @property
    def worth_an_event(self) -> bool:
        """A copy that did not verify or a state that is not finite, not a source that had
        nothing to offer (an empty directory, a save this rank lacks)."""
        return self.kind != tier.ABSENT


def _step_of(source: str) -> int | None:
    """The step a source names (`memory:120`), or None (`script`, or a worker's garbage)."""
    try:
        found = tier.restore_from_env(source)
    except ValueError:
        return None
    return found[0].step if len(found) == 1 else None


def _kind(value: object) -> str:
    if value not in tier.REFUSALS:
        raise ValueError(f"refusal kind {value!r}, not one of {tier.REFUSALS}")
    return str(value)


def _count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 20:
        raise ValueError(f"'saves' must be a count of saves, got {value!r}")
    return value


def read_note(path: Path) -> RestoreNote | None:
    """A worker's restore report, which the agent trusts no more than any other input: at most
    NOTE_MAX bytes, strictly typed; anything else is said and dropped."""
    try:
        with open(path, "rb") as f:
            raw = f.read(NOTE_MAX + 1)
        if len(raw) > NOTE_MAX:
            raise ValueError(f"more than {NOTE_MAX} bytes")
        text = raw.decode()
        if not text:  # made by the agent for a worker of another user; not written yet
            return None
        data = json.loads(text)
        refused = tuple(
            Refusal(str(r["source"])[:64], _kind(r["kind"]), str(r["reason"])[:300])
            for r in data["refused"]
        )
        if len(refused) > len(tier.TIERS) * 8:
            raise ValueError(f"{len(refused)} refused sources")
        step = data["step"]
        return RestoreNote(
            rank=int(data["rank"]),
            tier=str(data["tier"]),
            step=int(step) if step is not None else None,
            seconds=float(data["seconds"]),
            refused=refused,
            saves=_count(data.get("saves", 0)),
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("restore report %s unreadable: %s", path, exc)
        path.unlink(missing_ok=True)
        return None
