"""Where a job's wall time went, from its events (issue 42; `nodeagentctl show`). Pure.

The job's stream holds, on Redis' one clock, each generation's announcement and start
(`generation_announced`, `generation_started`, with the world size), the stretches in between
when it waited for nodes (`job_waiting`), its end (`job_succeeded`, `job_failed`,
`job_stopped`), and what rank 0 trained in each generation (`training_started`,
`training_stopped`: job/progress.py, from the workers' progress beats). The wall time, from the
first announcement to the end (or now), is cut into consecutive pieces, each counted once:

- queued: a pool job's submission -> its first announcement (pending, held; given by the
  caller: the pool keeps it, not the job's stream);
- first start: the first announcement -> rank 0's first step (nodes stopping nothing, the
  rendezvous, the workers' start-up and restore);
- training: each generation's first step -> its last, split into
  - checkpoint stalls: the seconds its saves held the training step,
  - re-training: the steps the restart before it lost (the last step reached before it, less
    the step it resumed from), at its own pace,
  - slow ranks: while a member was slow (`node_slow`, job/slowness.py: from `began_s` before it
    was named to its `node_recovered_speed` or the generation's end), the share of the time the
    job would have saved at its pace before (`1 - pace_s / step_s`); not counted where the
    generation had no window without a slow node (no pace known),
  - productive: the rest;
- each re-form, by the reason announced, split into
  - detection: the last step read -> the announcement (for a failure: the time from the fault's
    effect to its detection, plus up to a tick of the beats' reading),
  - re-forming: the announcement -> the generation started (the workers stopped, the
    rendezvous), less any waiting for nodes,
  - start-up and restore: started -> its first step;
- waiting: `job_waiting` (below `min_nodes`) -> the next announcement;
- ending: the last step -> the end.

A pool job requeued or evicted (the pool's `job_requeued`, `job_evicted`, then `job_admitted`
again: `pending_spans`) was pending again from then until its re-admission: that time, within
the re-form that follows, counts as queued, not as detection, re-forming or waiting for
nodes (the agent leading the record as the job's agents leave finds nobody eligible).

The wall time starts at the submission where it is given, else at the first announcement. The
effective training time ratio (ETTR) is productive / wall. A generation whose rank 0 said
nothing (no beats, or its node lost before `training_stopped`) counts from its start to the next
announcement as training, all productive: the figures then overstate the goodput, and
`unaccounted` names those generations.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from nodeagent.model.job import Event

ENDS = frozenset({"job_succeeded", "job_failed", "job_stopped"})
PARTS = (
    "productive",
    "queued",
    "checkpoint_stalls",
    "retrained",
    "slow_ranks",
    "first_start",
    "detection",
    "reforming",
    "startup_restore",
    "waiting",
    "ending",
)


@dataclass(frozen=True)
class Reform:
    """One re-form: into which generation, why, and what it cost."""

    generation: int
    reason: str
    detection_s: float
    reforming_s: float
    startup_restore_s: float
    steps_lost: int | None  # None: a step it resumed from or reached before is not known
    retrained_s: float
    at_s: float = 0.0  # when the stretch it cost began: the last step read before it
    # re-forming_s split: the announcement -> the last node's ack of the new generation (the
    # old workers stopped), and -> the generation started (the rendezvous)
    stopping_s: float = 0.0
    rendezvous_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.detection_s + self.reforming_s + self.startup_restore_s + self.retrained_s


@dataclass(frozen=True)
class Trained:
    """What one generation trained, as rank 0 said: from its first step read to its last
    (seconds since the epoch; `last_s` None: still training, or never said)."""

    generation: int
    world: int
    first_s: float
    last_s: float | None
    steps: int

    @property
    def step_s(self) -> float | None:
        if self.last_s is None or self.steps < 2:
            return None
        return (self.last_s - self.first_s) / (self.steps - 1)


@dataclass(frozen=True)
class Slow:
    """A node named slow (job/slowness.py): when, its step time then, and the pace before."""

    node: str
    at_s: float
    step_s: float
    pace_s: float


@dataclass(frozen=True)
class Goodput:
    """The job's wall time cut into PARTS (seconds), and its re-forms."""

    wall_s: float
    parts: Mapping[str, float]
    reforms: tuple[Reform, ...] = ()
    rank_seconds: float = 0.0  # productive seconds times the world size trained at
    unaccounted: tuple[int, ...] = ()  # generations whose rank 0 said nothing of its training
    ended: bool = False
    # productive seconds times the ranks short of the target world (a job shrunk by a
    # preemption, or short of nodes): what the allocation it asked for did not train
    short_rank_seconds: float = 0.0
    trained: tuple[Trained, ...] = ()  # each generation's training, in order (step times)
    slow: tuple[Slow, ...] = ()

    @property
    def ettr(self) -> float | None:
        """The effective training time ratio: productive / wall."""
        return self.parts["productive"] / self.wall_s if self.wall_s > 0 else None

    @property
    def steps_lost(self) -> int:
        return sum(r.steps_lost or 0 for r in self.reforms)

    def to_data(self) -> dict[str, object]:
        return {
            "wall_s": round(self.wall_s, 3),
            "ettr": None if self.ettr is None else round(self.ettr, 4),
            "parts": {k: round(v, 3) for k, v in self.parts.items()},
            "steps_lost": self.steps_lost,
            "rank_hours": round(self.rank_seconds / 3600, 4),
            "short_rank_hours": round(self.short_rank_seconds / 3600, 4),
            "reforms": [
                {
                    "generation": r.generation,
                    "reason": r.reason,
                    "detection_s": round(r.detection_s, 3),
                    "reforming_s": round(r.reforming_s, 3),
                    "startup_restore_s": round(r.startup_restore_s, 3),
                    "steps_lost": r.steps_lost,
                    "retrained_s": round(r.retrained_s, 3),
                    "at_s": round(r.at_s, 3),
                    "stopping_s": round(r.stopping_s, 3),
                    "rendezvous_s": round(r.rendezvous_s, 3),
                }
                for r in self.reforms
            ],
            "trained": [
                {
                    "generation": t.generation,
                    "world": t.world,
                    "first_s": round(t.first_s, 3),
                    "last_s": None if t.last_s is None else round(t.last_s, 3),
                    "steps": t.steps,
                    "step_s": None if t.step_s is None else round(t.step_s, 4),
                }
                for t in self.trained
            ],
            "slow": [
                {"node": x.node, "at_s": round(x.at_s, 3), "step_s": x.step_s, "pace_s": x.pace_s}
                for x in self.slow
            ],
            "unaccounted": list(self.unaccounted),
            "ended": self.ended,
        }


@dataclass
class _Generation:
    number: int
    announced: float | None = None
    reason: str = ""
    started: float | None = None
    world: int = 0
    target_world: int = 0  # target_nodes x ranks a node, as announced (0: not said)
    first: float | None = None  # rank 0's first step read (seconds, Redis' clock)
    first_step: int | None = None
    last: float | None = None
    last_step: int | None = None
    steps: int = 0
    stalled_s: float = 0.0
    waits: list[float] = field(default_factory=list)  # job_waiting times after its announcement
    # node_slow: (node, since, the share of the time lost); node_recovered_speed: node -> when
    slow: list[tuple[str, float, float]] = field(default_factory=list)
    recovered: list[tuple[str, float]] = field(default_factory=list)
    acks: list[float] = field(default_factory=list)  # node_ready of this generation

    def acked(self, by: float) -> float | None:
        """When the last node acknowledged it, by `by` (its start): the old workers stopped."""
        return max((t for t in self.acks if t <= by), default=None)

    def slow_s(self, first: float, last: float) -> float:
        """The time its slow members cost within [first, last], each moment counted once (at
        the largest share lost then)."""
        stretches = []
        for node, since, share in self.slow:
            until = min((t for n, t in self.recovered if n == node and t > since), default=last)
            stretches.append((_clamp(since, first, last), _clamp(until, first, last), share))
        cost, cursor = 0.0, first
        for start, stop, share in sorted(stretches):
            start = max(start, cursor)
            if stop > start:
                cost += (stop - start) * share
                cursor = stop
        return cost


PENDING_AGAIN = frozenset({"job_requeued", "job_evicted"})


def pending_spans(pool_events: Sequence[Event], job: str) -> tuple[tuple[int, int | None], ...]:
    """When the pool put `job` back in its queue (requeued, evicted) and when it admitted it
    again (None: not yet), in ms, from the pool's events."""
    spans: list[tuple[int, int | None]] = []
    opened: int | None = None
    for event in sorted(pool_events, key=lambda e: e.at_ms or 0):
        if event.at_ms is None or event.data.get("job") != job:
            continue
        if event.type in PENDING_AGAIN and opened is None:
            opened = event.at_ms
        elif event.type == "job_admitted" and opened is not None:
            spans.append((opened, event.at_ms))
            opened = None
    if opened is not None:
        spans.append((opened, None))
    return tuple(spans)


def account(
    events: Sequence[Event],
    now_ms: int,
    submitted_ms: int | None = None,
    pending: Sequence[tuple[int, int | None]] = (),
) -> Goodput | None:
    """Where the wall time went, from `events` (any order) and, for a pool job, when it was
    submitted and when it was pending again (`pending_spans`); None: no generation announced."""
    ordered = sorted((e for e in events if e.at_ms is not None), key=lambda e: e.at_ms or 0)
    gens: dict[int, _Generation] = {}
    begin: float | None = None
    end = now_ms / 1000
    ended = False
    announced: list[_Generation] = []  # in announcement order
    slow: list[Slow] = []
    for event in ordered:
        at = (event.at_ms or 0) / 1000
        if event.type in ENDS:
            end, ended = at, True
            break
        number = event.generation
        if number is None:
            continue
        gen = gens.setdefault(number, _Generation(number))
        data = event.data
        if event.type == "generation_announced":
            gen.announced, gen.reason = at, str(data.get("reason", ""))
            gen.target_world = _target_world(data)
            announced.append(gen)
            begin = at if begin is None else begin
        elif event.type == "generation_started":
            gen.started, gen.world = at, _int(data.get("world_size"))
            begin = at if begin is None else begin
        elif event.type == "job_waiting" and announced:
            announced[-1].waits.append(at)
        elif event.type == "training_started":
            gen.first, gen.first_step = at - _int(data.get("age_ms")) / 1000, _int(data.get("step"))
        elif event.type == "training_stopped":
            gen.last, gen.last_step = at - _int(data.get("age_ms")) / 1000, _int(data.get("step"))
            gen.steps = _int(data.get("steps"))
            gen.stalled_s = max(0.0, _float(data.get("stalled_s")))
        elif event.type == "node_slow" and event.node:
            step_s, pace_s = _float(data.get("step_s")), _float(data.get("pace_s"))
            share = 1 - pace_s / step_s if 0 < pace_s < step_s else 0.0
            gen.slow.append((event.node, at - max(0.0, _float(data.get("began_s"))), share))
            slow.append(Slow(event.node, at, step_s, pace_s))
        elif event.type == "node_ready":
            gen.acks.append(at)
        elif event.type == "node_recovered_speed" and event.node:
            gen.recovered.append((event.node, at))
    if begin is None:
        return None
    if not ended and ordered:  # `now_ms` read before the newest events were written
        end = max(end, (ordered[-1].at_ms or 0) / 1000)
    spans = [(a / 1000, end if b is None else b / 1000) for a, b in pending]
    ran = [g for g in gens.values() if g.started is not None]
    found = replace(_cut(begin, end, ended, announced, ran, spans), slow=tuple(slow))
    if submitted_ms is None or submitted_ms / 1000 >= begin:
        return found
    queued = begin - submitted_ms / 1000
    parts = {**found.parts, "queued": found.parts["queued"] + queued}
    return replace(found, wall_s=found.wall_s + queued, parts=parts)


def _cut(
    begin: float,
    end: float,
    ended: bool,
    announced: list[_Generation],
    ran: list[_Generation],
    pending: Sequence[tuple[float, float]] = (),
) -> Goodput:
    ran.sort(key=lambda g: g.started or 0.0)
    parts = dict.fromkeys(PARTS, 0.0)
    reforms: list[Reform] = []
    unaccounted: list[int] = []
    trained: list[Trained] = []
    rank_seconds = short_rank_seconds = 0.0
    cursor = begin  # the end of what is cut so far
    previous: _Generation | None = None
    for i, gen in enumerate(ran):
        started = _clamp(gen.started or cursor, cursor, end)
        following = [g.announced for g in announced if g.announced and g.announced > started]
        stop = min(following[0] if following else end, end)
        first = _clamp(gen.first if gen.first is not None else started, started, stop)
        last = _clamp(gen.last if gen.last is not None else stop, first, stop)
        running = not ended and i == len(ran) - 1 and not following
        if gen.first is None or (gen.last is None and not running):
            unaccounted.append(gen.number)
        waiting = _waiting(announced, cursor, started, pending)
        lost, retrained = _lost(previous, gen, last - first)
        if previous is None:
            parts["first_start"] += first - cursor - waiting
        else:
            detection = _clamp(_announced_after(announced, cursor) or started, cursor, started)
            # pending again in the pool (requeued, evicted): queued, not the re-form's
            queued_detect = _overlap(pending, cursor, detection)
            queued_reform = min(
                _overlap(pending, detection, started), max(0.0, started - detection - waiting)
            )
            parts["queued"] += queued_detect + queued_reform
            reforming = started - detection - waiting - queued_reform
            acked = gen.acked(started)
            stopping = _clamp((acked or detection) - detection, 0.0, reforming)
            reform = Reform(
                gen.number,
                _reason(announced, cursor, started),
                detection - cursor - queued_detect,
                reforming,
                first - started,
                lost,
                retrained,
                at_s=cursor,
                stopping_s=stopping,
                rendezvous_s=reforming - stopping,
            )
            reforms.append(reform)
            parts["detection"] += reform.detection_s
            parts["reforming"] += reform.reforming_s
            parts["startup_restore"] += reform.startup_restore_s
        parts["waiting"] += waiting
        stalls = min(gen.stalled_s, last - first - retrained)
        slow = min(gen.slow_s(first, last), last - first - retrained - stalls)
        productive = last - first - stalls - retrained - slow
        parts["checkpoint_stalls"] += stalls
        parts["retrained"] += retrained
        parts["slow_ranks"] += slow
        parts["productive"] += productive
        rank_seconds += productive * gen.world
        if gen.first is not None:
            said = last if gen.last is not None else None  # None: still training, or lost
            trained.append(Trained(gen.number, gen.world, first, said, gen.steps))
        short_rank_seconds += productive * max(0, gen.target_world - gen.world)
        cursor, previous = last, gen
        if i == len(ran) - 1:
            tail = end - cursor - _waiting(announced, cursor, end, pending)
            queued = min(_overlap(pending, cursor, end), tail)  # pending again, not yet back
            parts["waiting"] += _waiting(announced, cursor, end, pending)
            parts["queued"] += queued
            parts["ending"] += tail - queued
    if not ran:
        parts["waiting"] += _waiting(announced, begin, end, pending)
        parts["first_start"] += end - begin - _waiting(announced, begin, end, pending)
    return Goodput(
        end - begin,
        parts,
        tuple(reforms),
        rank_seconds,
        tuple(unaccounted),
        ended,
        short_rank_seconds,
        tuple(trained),
    )


def _lost(
    previous: _Generation | None, gen: _Generation, trained_s: float
) -> tuple[int | None, float]:
    """Steps the re-form into `gen` lost, and the seconds `gen` took to train them again."""
    if previous is None or previous.last_step is None or gen.first_step is None:
        return None, 0.0
    lost = max(0, previous.last_step - (gen.first_step - 1))
    if lost == 0 or gen.steps < 2 or trained_s <= 0:
        return lost, 0.0
    pace = trained_s / (gen.steps - 1)
    return lost, min(lost * pace, trained_s)


def _overlap(spans: Sequence[tuple[float, float]], start: float, stop: float) -> float:
    """Seconds of [start, stop] inside `spans` (which do not overlap each other)."""
    return sum(max(0.0, min(b, stop) - max(a, start)) for a, b in spans)


def _waiting(
    announced: list[_Generation],
    after: float,
    before: float,
    pending: Sequence[tuple[float, float]] = (),
) -> float:
    """Seconds in (after, before) the job waited for nodes: each `job_waiting` to the next
    announcement (or `before`), but for what of it the pool held the job `pending` (requeued,
    evicted: its agents left it, and the one leading the record as it left saw nobody
    eligible): that is queued."""
    total = 0.0
    times = sorted(g.announced for g in announced if g.announced is not None)
    for gen in announced:
        for wait in gen.waits:
            if not after <= wait < before:
                continue
            nexts = [t for t in times if t > wait]
            until = min(nexts[0] if nexts else before, before)
            total += until - wait - _overlap(pending, wait, until)
    return total


def _announced_after(announced: list[_Generation], at: float) -> float | None:
    times = [g.announced for g in announced if g.announced is not None and g.announced >= at]
    return min(times, default=None)


def _reason(announced: list[_Generation], after: float, before: float) -> str:
    within = [g for g in announced if g.announced is not None and after <= g.announced <= before]
    return within[0].reason if within else ""


def _clamp(value: float, low: float, high: float) -> float:
    return min(max(value, low), max(low, high))


def _target_world(data: Mapping[str, object]) -> int:
    """The world the announcement's target asks for: target_nodes x the ranks a node runs."""
    members = data.get("members")
    nodes = (len(members) if isinstance(members, list) else 0) + _int(data.get("members_more"))
    world = _int(data.get("world_size"))
    return _int(data.get("target_nodes")) * (world // nodes) if nodes and world else 0


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _float(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    return float(value)
