"""Whether the copies keep up with the saves: `replication_behind`'s verdict, as a pure function
(issue 41).

The save interval cannot be read off the two slots a rank holds: with the committed save pinned
(channel/pin.py) they are exactly the newest and the committed one, so their difference is never
more than one interval, and a worker that skips a save (both slots taken, the newer not
committed yet) leaves no trace there at all. So the agent remembers the newest saves it saw and
when it first saw each (`Saves`): the smallest gap between two is the interval, in steps and in
seconds. The copies are behind when the committed step trails the newest save by more than one
interval, or when the newest save has waited longer than an interval (and a half: the cadence
is measured, not known) to be committed: the worker's next save was due meanwhile, and found no
slot to go to.
"""

from __future__ import annotations

from dataclasses import dataclass

KEPT = 8  # newest saves remembered
SLACK = 1.5  # intervals a save may wait for its commit before the next one counts as skipped


@dataclass(frozen=True)
class Saves:
    """The newest saves this node held, oldest first, each (step, when it was first seen)."""

    seen: tuple[tuple[int, float], ...] = ()

    def saw(self, step: int | None, now: float) -> Saves:
        """With `step` (the newest save held now) remembered, if it is new."""
        if step is None or (self.seen and self.seen[-1][0] == step):
            return self
        if self.seen and step < self.seen[-1][0]:  # a restore went back: start over
            return Saves(((step, now),))
        return Saves((*self.seen, (step, now))[-KEPT:])

    def interval(self) -> tuple[int, float] | None:
        """The save interval, in steps and in seconds: the smallest gaps seen (None: fewer than
        two saves seen)."""
        pairs = list(zip(self.seen, self.seen[1:], strict=False))
        if not pairs:
            return None
        return min(b[0] - a[0] for a, b in pairs), min(b[1] - a[1] for a, b in pairs)


def behind(saves: Saves, committed: int | None, now: float) -> str | None:
    """Why the committed step is behind the newest save (`saves`), at `now`; None if it is not
    (or it cannot be told yet)."""
    interval = saves.interval()
    if not saves.seen or interval is None:
        return None
    newest, since = saves.seen[-1]
    if committed is not None and committed >= newest:
        return None
    steps, seconds = interval
    if committed is None or newest - committed > steps:
        held = "nothing" if committed is None else f"step {committed}"
        return f"{held} committed, more than one save interval ({steps} steps) behind {newest}"
    waited = now - since
    if waited > SLACK * seconds:
        return (
            f"step {newest} not committed {waited:.1f}s after it was saved, with a save every "
            f"{seconds:.1f}s: the saves due meanwhile were skipped"
        )
    return None
