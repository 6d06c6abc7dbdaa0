"""Which member is slow, and what the job's policy does about it: pure, the leader's (issue 42).

Once a window the leader reads every node's `NodeSpeed` (job/speed.py) and `judge()` compares
each member's own work per step with the median of the other members': its marked compute when
every node marks it, else its CPU time and wait for a CPU (`busy_s`). A member above
`threshold` times that median for `windows` windows in a row is named slow (`node_slow`); a node
named slow that stays below it for `windows` windows has recovered (`node_recovered_speed`).

Why the others' median and not the step time: in synchronous training every rank steps at the
pace of the slowest, so nodes that only wait for a third one step as slowly as it does, while
their own work (computing, running) stays short: they sleep in the collective. They are never
blamed. Comparing with the *others'* median, not everyone's, lets two nodes judge each other.

The policy (job.slow_node.policy):
- `report` names the node (an event, a metric, `nodeagentctl status`) and nothing more;
- `replace` drains it (a cordon, by `slow-node`, with the reason) when a spare stands by (an
  eligible node that is not a member): the plan re-forms with the spare in its place, in place
  for a job with `recovery: in_place`;
- `exclude` drains it without a spare when the job stays at or above `min_nodes` and fewer,
  faster nodes step more: with `n` members and the slow one at `r` times its peers' work, the
  others make `n - 1` ranks' worth of steps `r` times as fast, so exclude when `r > n/(n - 1)`.
Never more than one drain per window, and never one while the generation re-forms.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from nodeagent.job import members
from nodeagent.model.job import Cordon, Event, JobRecord, NodeReport
from nodeagent.model.speed import NodeSpeed, SlowVerdict
from nodeagent.state import JobState

POLICIES = ("report", "replace", "exclude")
BY = "slow-node"  # the cordon's author: the plan names the restart slow_node for it
MIN_FIGURE_S = 1e-6  # peers' work below this per step: nothing to compare with
CLOCK_SLOW = 0.9  # a GPU's SM clock below this share of its most is named in a slow node's why


@dataclass(frozen=True)
class SlowPolicy:
    policy: str = "report"
    threshold: float = 1.5  # a member's work over its peers' median
    windows: int = 3  # in a row, to name a node slow (and to clear it)
    window_s: float = 10.0

    @property
    def enabled(self) -> bool:
        return self.window_s > 0


@dataclass(frozen=True)
class SlowMemory:
    """What the leader remembers between windows (lost with the leadership: a new leader
    starts counting afresh, and reads the verdicts already written)."""

    generation: int | None = None
    above: Mapping[str, int] = field(default_factory=dict)  # windows in a row above threshold
    below: Mapping[str, int] = field(default_factory=dict)  # ... below, of nodes named slow
    # When the first window of a node's run above threshold began (this leader's clock, ms):
    # where its slowdown began, for the goodput, whenever the judgments ran (issue 52).
    since: Mapping[str, int] = field(default_factory=dict)
    seen: Mapping[str, int] = field(default_factory=dict)  # the last window judged, by node
    named: Mapping[str, SlowVerdict] = field(default_factory=dict)
    drained_ms: int | None = None  # when the policy last drained a node
    # The generation's fastest step time in a window with none slow: the window in which a node
    # became slow can still look healthy by its ratios (the throttle came late in it) while its
    # steps were already slower, and a pace taken from it hides the slow node's cost (goodput).
    pace_s: float | None = None


@dataclass(frozen=True)
class Judgment:
    memory: SlowMemory
    ratios: Mapping[str, float]  # this window's, by node
    events: tuple[Event, ...] = ()
    put: tuple[SlowVerdict, ...] = ()  # verdicts to write
    gone: tuple[str, ...] = ()  # verdicts to remove
    drain: tuple[str, Cordon] | None = None


def judge(
    speeds: Mapping[str, NodeSpeed],
    nodes: Mapping[str, NodeReport],
    record: JobRecord | None,
    policy: SlowPolicy,
    memory: SlowMemory,
    now_ms: int,
) -> Judgment:
    """This window's verdicts. `speeds`: every node's latest; `nodes`: the live reports."""
    if record is None or record.state is not JobState.RUNNING:
        return Judgment(memory, {})
    if memory.generation != record.generation:  # a new world, a new pace: count afresh
        memory = replace(
            memory, generation=record.generation, above={}, below={}, since={}, pace_s=None
        )
    fresh = {
        name: speed
        for name in record.members
        if (speed := speeds.get(name)) is not None
        and speed.generation == record.generation
        and speed.seq != memory.seen.get(name)
    }
    figures = _figures(fresh)
    found = _ratios(figures)
    above, below, since = dict(memory.above), dict(memory.below), dict(memory.since)
    for name, ratio in found.items():
        slow = ratio > policy.threshold
        above[name] = above.get(name, 0) + 1 if slow else 0
        below[name] = 0 if slow else below.get(name, 0) + 1
        if not slow:
            since.pop(name, None)
        elif above[name] == 1:  # the window just judged: it ended about now
            since[name] = now_ms - round(fresh[name].window_s * 1000)
    step_s = statistics.median(s.step_s for s in fresh.values()) if fresh else None
    pace_s = memory.pace_s
    if (
        step_s is not None
        and found
        and not memory.named
        and max(found.values()) <= policy.threshold
    ):
        pace_s = step_s if pace_s is None else min(pace_s, step_s)
    named = dict(memory.named)
    events: list[Event] = []
    put: list[SlowVerdict] = []
    gone = [n for n in named if n not in record.members]  # replaced, excluded, lost
    for name in gone:
        del named[name]
    for name, ratio in sorted(found.items()):
        if name not in named and above[name] >= policy.windows:
            why = _why(name, fresh, figures, ratio, nodes.get(name))
            named[name] = SlowVerdict(name, now_ms, round(ratio, 3), why)
            put.append(named[name])
            # for the goodput (model/goodput.py): since when it has been slow, how fast the
            # job steps now, and how fast it stepped before
            began_ms = since.get(name, now_ms - round(policy.windows * policy.window_s * 1000))
            pace = {"began_s": round((now_ms - began_ms) / 1000, 3)}
            pace |= {"step_s": round(step_s or 0.0, 6)}
            pace |= {"pace_s": round(pace_s, 6)} if pace_s is not None else {}
            events.append(_event("node_slow", record, name, why, ratio, pace))
        elif name in named and below[name] >= policy.windows:
            del named[name]
            gone.append(name)
            message = f"steps at its peers' pace again ({ratio:.2f}x their median)"
            events.append(_event("node_recovered_speed", record, name, message, ratio))
    seen = {**memory.seen, **{name: speed.seq for name, speed in fresh.items()}}
    memory = replace(
        memory,
        above=above,
        below=below,
        since=since,
        seen=seen,
        named=named,
        pace_s=pace_s,
    )
    drain = None
    if policy.policy != "report" and named:
        memory, drain, acted = _act(record, nodes, policy, memory, now_ms)
        put += acted
        events += [_event("slow_node_policy", record, v.node, v.action, v.ratio) for v in acted]
    return Judgment(memory, found, tuple(events), tuple(put), tuple(gone), drain)


def ratios(speeds: Mapping[str, NodeSpeed]) -> dict[str, float]:
    """Each node's own work a step over the median of the others', as `judge` compares them
    (for a bench or a dashboard reading the speed hash)."""
    return _ratios(_figures(speeds))


def _figures(fresh: Mapping[str, NodeSpeed]) -> dict[str, tuple[str, float]]:
    """Each node's own work a step, and what it is: marked compute when every node has it."""
    if fresh and all(s.compute_s is not None for s in fresh.values()):
        return {n: ("compute", s.compute_s or 0.0) for n, s in fresh.items()}
    return {n: ("busy", s.busy_s) for n, s in fresh.items() if s.busy_s is not None}


def _ratios(figures: Mapping[str, tuple[str, float]]) -> dict[str, float]:
    """Each node's figure over the median of the others' (two nodes or more)."""
    ratios = {}
    for name, (_, value) in figures.items():
        others = [v for n, (_, v) in figures.items() if n != name]
        if not others:
            continue
        median = statistics.median(others)
        if median >= MIN_FIGURE_S:
            ratios[name] = value / median
    return ratios


def _why(
    name: str,
    fresh: Mapping[str, NodeSpeed],
    figures: Mapping[str, tuple[str, float]],
    ratio: float,
    report: NodeReport | None,
) -> str:
    kind, value = figures[name]
    speed = fresh[name]
    median = statistics.median(v for n, (_, v) in figures.items() if n != name)
    if kind == "compute":
        what = f"computes {_ms(value)} a step"
    else:
        what = (
            f"busy {_ms(value)} a step (on a CPU {_ms(speed.cpu_s)}, "
            f"waiting for one {_ms(speed.delay_s)})"
        )
    why = f"{what}: {ratio:.2f}x its peers' median {_ms(median)}"
    why += f"; the job steps in {_ms(speed.step_s)}"
    if report is not None and report.gpu is not None:
        gpus = report.gpu.gpus
        limited = sorted({g.reason for g in gpus if g.reason.startswith("clocks")})
        slowest = min(
            (g for g in gpus if g.sm_clock_mhz is not None and g.sm_clock_max_mhz),
            key=lambda g: (g.sm_clock_mhz or 0) / (g.sm_clock_max_mhz or 1),
            default=None,
        )
        if slowest is not None and slowest.sm_clock_mhz is not None:
            max_mhz = slowest.sm_clock_max_mhz or 1
            if slowest.sm_clock_mhz < CLOCK_SLOW * max_mhz:
                limited.append(f"GPU {slowest.index} SM clock {slowest.sm_clock_mhz}/{max_mhz} MHz")
        if limited:
            why += f"; its GPUs: {', '.join(limited)}"
    return why


def _act(
    record: JobRecord,
    nodes: Mapping[str, NodeReport],
    policy: SlowPolicy,
    memory: SlowMemory,
    now_ms: int,
) -> tuple[SlowMemory, tuple[str, Cordon] | None, list[SlowVerdict]]:
    """At most one drain a window: the slowest named member still undrained, if the policy
    allows it now. Returns the memory, the drain, and the verdicts whose action changed."""
    recent = memory.drained_ms is not None and now_ms - memory.drained_ms < policy.window_s * 1000
    pending = [
        v
        for v in memory.named.values()
        if v.node in record.members and not v.action.startswith(("replaced", "excluded"))
    ]
    if recent or not pending:
        return memory, None, []
    slowest = max(pending, key=lambda v: v.ratio)
    world = len(record.members)
    if policy.policy == "replace":
        spares = [
            n for n in members.ready(members.eligible(nodes), nodes) if n not in record.members
        ]
        done = f"replaced by a spare ({spares[0]} stands by)" if spares else None
        refused = "report: no spare stands by to replace it"
    else:
        worth = world / (world - 1) if world > 1 else float("inf")
        fits = world - 1 >= record.min_nodes
        done = "excluded" if fits and slowest.ratio > worth else None
        refused = (
            f"report: excluding it would leave {world - 1} nodes, min_nodes is {record.min_nodes}"
            if not fits
            else f"report: {world - 1} nodes without it would step less ({slowest.ratio:.2f}x "
            f"is not above {worth:.2f}x)"
        )
    action = done or refused
    if action == slowest.action:
        return memory, None, []
    verdict = replace(slowest, action=action)
    memory = replace(memory, named={**memory.named, slowest.node: verdict})
    if done is None:
        return memory, None, [verdict]
    memory = replace(memory, drained_ms=now_ms)
    cordon = Cordon(f"slow: {slowest.why}", BY, drain=True)
    return memory, (slowest.node, cordon), [verdict]


def _event(
    kind: str,
    record: JobRecord,
    node: str,
    message: str,
    ratio: float,
    more: Mapping[str, float] | None = None,
) -> Event:
    data = {"ratio": round(ratio, 3), **(more or {})}
    return Event(kind, generation=record.generation, node=node, message=message, data=data)


def _ms(seconds: float | None) -> str:
    return "?" if seconds is None else f"{seconds * 1000:.1f} ms"
