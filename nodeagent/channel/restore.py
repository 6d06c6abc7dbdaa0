"""What a worker restores from, and what it says it restored: the leader's restore order as
the worker receives it, and the worker's restore report as the agent reads it. One owner of
both formats; both sides import it. No torch here.

The order (`NODEAGENT_RESTORE`, and an in_place assignment's restore field) is a line of
sources, tried in turn: `memory:120@7 persistent:100@5 script start` (a tier, the step, and
after `@` the generation that saved it, where the leader knows it).

The report (`NODEAGENT_RESTORE_REPORT`, a JSON file in the job's log directory) says which
source a rank restored from, how long it took, and each source it refused and why: a
`RefusalKind`, whose members carry what the agent and the other ranks make of them. Adding a
kind is a member and its meaning here, and the worker's line that says it.
"""

from __future__ import annotations

import enum
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

RESTORE_ENV = "NODEAGENT_RESTORE"  # the leader's choice, `order_to_env`
RESTORE_REPORT_ENV = "NODEAGENT_RESTORE_REPORT"  # where the worker says what it restored
TIERS = ("memory", "persistent", "script", "start")
NON_FINITE = "non-finite value"  # how a worker says a state holds a NaN or an infinity
REPORT_MAX = 64 << 10  # bytes of a restore report the agent reads
REASON_MAX = 300  # characters of a refusal's reason kept
_SOURCE_MAX = 64  # characters of a refused source kept
_SOURCE = re.compile(r"(memory|persistent|script|start)(?::([0-9]{1,15})(?:@([0-9]{1,15}))?)?")


# -- the leader's choice, as a worker receives it -------------------------------------------


@dataclass(frozen=True)
class Source:
    """One place to restore from: a tier and a step (None for `script` and `start`), and the
    generation that saved it when the leader knows it: the same step number can exist in two
    timelines (a node that was cut off kept saves of a step the others saved again since)."""

    tier: str  # TIERS
    step: int | None = None
    generation: int | None = None

    def __str__(self) -> str:
        if self.step is None:
            return self.tier
        saved_by = f"@{self.generation}" if self.generation is not None else ""
        return f"{self.tier}:{self.step}{saved_by}"


def order_to_env(sources: tuple[Source, ...]) -> str:
    """The order a worker tries its sources in: `memory:120@7 persistent:100@5 script start`
    (the generation after `@` where the leader knows it)."""
    return " ".join(str(s) for s in sources)


def order_from_env(value: str) -> tuple[Source, ...]:
    """Raises: ValueError naming what is not a source."""
    sources = []
    for word in value.split():
        match = _SOURCE.fullmatch(word)
        if match is None:
            raise ValueError(
                f"{RESTORE_ENV}: {word!r} is not one of {TIERS} (with :STEP[@GENERATION])"
            )
        tier, step, generation = match.groups()
        sources.append(
            Source(
                tier,
                int(step) if step else None,
                int(generation) if generation else None,
            )
        )
    return tuple(sources)


def step_of(source: str) -> int | None:
    """The step a source names (`memory:120`), or None (`script`, or a worker's garbage)."""
    try:
        found = order_from_env(source)
    except ValueError:
        return None
    return found[0].step if len(found) == 1 else None


# -- why a source was refused ---------------------------------------------------------------


@dataclass(frozen=True)
class Meaning:
    """What a refusal tells the agent and the other ranks."""

    condemns_step: bool  # every copy of the step is bad: no node offers it again
    worth_an_event: bool  # something went wrong (not merely nothing to offer)
    verify_again: bool  # a copy on the worker's node is bad: the agent verifies them again
    kept_across_ranks: bool  # another rank's refusal of this kind is this rank's too


class RefusalKind(str, enum.Enum):
    """Why a worker did not restore from a source (its restore report's `kind`).

    ABSENT: the source had nothing for it (no such tier, no such step, another timeline's
        save, a state that is not this model's). Nothing is wrong with any copy.
    BAD_COPY: a copy it read did not verify, or could not be read: that node's copy to drop
        (its agent verifies every save again and stops offering the bad one).
    BAD_STATE: the state loaded holds a NaN or an infinity: the step's own fault, every copy of
        it holds the same, so the step is condemned everywhere.
    """

    ABSENT = "absent"
    BAD_COPY = "bad_copy"
    BAD_STATE = "bad_state"

    @property
    def meaning(self) -> Meaning:
        return _MEANINGS[self]

    def seen_by_another_rank(self) -> RefusalKind:
        """What another rank's refusal of this kind is to this rank: a bad state is every
        rank's; another rank's bad copy (or absent save) is only absent here (the node holding
        the copy reports it)."""
        return self if self.meaning.kept_across_ranks else RefusalKind.ABSENT


_MEANINGS: dict[RefusalKind, Meaning] = {
    RefusalKind.ABSENT: Meaning(False, False, False, False),
    RefusalKind.BAD_COPY: Meaning(False, True, True, False),
    RefusalKind.BAD_STATE: Meaning(True, True, False, True),
}


@dataclass(frozen=True)
class Refusal:
    """A source a rank did not restore from: its kind and why."""

    source: str
    kind: RefusalKind
    reason: str

    @property
    def condemned(self) -> int | None:
        """The step this refusal condemns (RefusalKind.meaning), or None."""
        return step_of(self.source) if self.kind.meaning.condemns_step else None

    @property
    def worth_an_event(self) -> bool:
        return self.kind.meaning.worth_an_event


# -- what a worker says it restored ---------------------------------------------------------


@dataclass(frozen=True)
class RestoreReport:
    """What one rank restored: the tier and step (None: the start or a script's own), how long
    it took, the sources it refused, and how many ranks' saves it read (0: not said)."""

    rank: int
    tier: str
    step: int | None
    seconds: float
    refused: tuple[Refusal, ...] = ()
    saves: int = 0

    def to_json(self) -> str:
        return json.dumps(
            {
                "rank": self.rank,
                "tier": self.tier,
                "step": self.step,
                "seconds": round(self.seconds, 4),
                "saves": self.saves,
                "refused": [
                    {"source": r.source, "kind": r.kind.value, "reason": r.reason[:REASON_MAX]}
                    for r in self.refused
                ],
            }
        )

    @classmethod
    def from_json(cls, text: str) -> RestoreReport:
        """A report the agent trusts no more than any other input: strictly typed, bounded.

        Raises: ValueError, KeyError or TypeError naming what is wrong."""
        data = json.loads(text)
        refused = tuple(
            Refusal(
                str(r["source"])[:_SOURCE_MAX],
                _kind(r["kind"]),
                str(r["reason"])[:REASON_MAX],
            )
            for r in data["refused"]
        )
        if len(refused) > len(TIERS) * 8:
            raise ValueError(f"{len(refused)} refused sources")
        step = data["step"]
        return cls(
            rank=int(data["rank"]),
            tier=str(data["tier"]),
            step=int(step) if step is not None else None,
            seconds=float(data["seconds"]),
            refused=refused,
            saves=_count(data.get("saves", 0)),
        )


def _kind(value: object) -> RefusalKind:
    try:
        return RefusalKind(value)
    except ValueError:
        known = tuple(k.value for k in RefusalKind)
        raise ValueError(f"refusal kind {value!r}, not one of {known}") from None


def _count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 20:
        raise ValueError(f"'saves' must be a count of saves, got {value!r}")
    return value


def report_path(job_dir: Path, generation: int, rank: int) -> Path:
    """Where rank `rank` of `generation` says what it restored (RESTORE_REPORT_ENV): in the
    job's log directory, beside the generation's logs. An in_place survivor, told only its new
    generation and rank, finds its new one from its first (`moved_report`)."""
    return job_dir / str(generation) / f"rank-{rank}.restore.json"


def moved_report(first: Path, generation: int, rank: int) -> Path:
    """The report path of `generation`'s rank `rank`, given a report path of the same job."""
    return report_path(first.parent.parent, generation, rank)


def write_report(path: Path, report: RestoreReport) -> None:
    """The worker's side: into the file the agent made for this rank (a directory of another
    user), else a new one, renamed into place whole."""
    text = report.to_json()
    if path.exists():
        path.write_text(text)
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def read_report(path: Path) -> RestoreReport | None:
    """The agent's side: None while the file is missing or empty (made by the agent for a
    worker of another user, not written yet).

    Raises: OSError; ValueError (more than REPORT_MAX bytes, not a report), KeyError,
    TypeError."""
    with open(path, "rb") as f:
        raw = f.read(REPORT_MAX + 1)
    if len(raw) > REPORT_MAX:
        raise ValueError(f"more than {REPORT_MAX} bytes")
    text = raw.decode()
    return RestoreReport.from_json(text) if text else None
