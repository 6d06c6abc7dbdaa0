"""How fast a node's ranks stepped in one window, and the leader's verdict on a slow node.

A node writes its `NodeSpeed` once a window (job/speed.py) into the job's speed hash; the leader
reads them all once a window, compares each node with its peers (job/slowness.py) and writes a
`SlowVerdict` for every node it names slow (coord/keys.py SPEEDS_KEY, SLOW_KEY). All figures are
seconds per training step of the node's slowest local rank in the window.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from nodeagent.model.decode import Reader

MAX_STEP_S = 86_400.0  # a day a step: more is garbage


@dataclass(frozen=True)
class NodeSpeed:
    """One window of one node. `busy_s`: the seconds a step that the rank ran on a CPU or was
    ready to and waited for one (the kernel's schedstat: a rank throttled or crowded out is
    busy all the step, one waiting on its peers in a collective sleeps); `compute_s`: the
    seconds a step of the sections the script marked (`progress.compute()`), None: unmarked."""

    node: str
    generation: int
    seq: int  # the node's window count: the leader judges each window once
    window_s: float
    steps: int
    step_s: float
    busy_s: float | None = None
    cpu_s: float | None = None
    delay_s: float | None = None
    compute_s: float | None = None

    def to_json(self) -> str:
        data = {k: v for k, v in asdict(self).items() if v is not None}
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> NodeSpeed:
        r = Reader.of(raw, "node speed")
        return cls(
            node=r.name("node"),
            generation=r.integer("generation"),
            seq=r.integer("seq"),
            window_s=r.real("window_s", 0, MAX_STEP_S),
            steps=r.integer("steps", low=1),
            step_s=r.real("step_s", 0, MAX_STEP_S),
            busy_s=r.number("busy_s", 0, MAX_STEP_S),
            cpu_s=r.number("cpu_s", 0, MAX_STEP_S),
            delay_s=r.number("delay_s", 0, MAX_STEP_S),
            compute_s=r.number("compute_s", 0, MAX_STEP_S),
        )


@dataclass(frozen=True)
class SlowVerdict:
    """The leader named `node` slow: since (Redis ms), why (the figures compared), and what the
    policy did about it (report, replaced, excluded, or why it could not)."""

    node: str
    since_ms: int
    ratio: float  # the node's figure over its peers' median
    why: str
    action: str = "report"

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> SlowVerdict:
        r = Reader.of(raw, "slow verdict")
        return cls(
            node=r.name("node"),
            since_ms=r.integer("since_ms"),
            ratio=r.real("ratio", 0, 1e6),
            why=r.text("why", max_len=1000),
            action=r.text("action", "report", max_len=200),
        )
