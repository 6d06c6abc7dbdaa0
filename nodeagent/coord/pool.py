"""PoolStore: a pool's state in Redis, read and written through coord/poolscripts.py.

Nothing read is trusted (nodeagent.model.decode): a node report, a job status or a placement that is
not what nodeagent writes is left out and described in `garbage`, so one bad value never stops
the pool. Jobs' own records are read from each job's keys (other hash tags: a pipeline, not a
script, so a pool spread over a Redis Cluster works).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import redis

from nodeagent.coord import poolreplies as replies
from nodeagent.coord import streams
from nodeagent.coord.cordons import lift_cordon, put_cordon
from nodeagent.coord.errors import redis_errors
from nodeagent.coord.keys import EVENTS_MAXLEN, PoolKeys
from nodeagent.coord.lua import Call
from nodeagent.coord.poolreplies import HeldJobs, status_of
from nodeagent.coord.poolscripts import (
    POOL_COMMIT,
    POOL_READ,
    POOL_REPLACE_SPEC,
    POOL_SUBMIT,
    POOL_SYNC,
    submit_call,
    submitted,
)
from nodeagent.coord.scripts import LEAVE, READ_PAGE, leave_call, read_page_call
from nodeagent.coord.view import (
    PAGE,
    SWEEP,
    LeaderView,
    Lease,
    ViewRead,
    parse_page,
    sweep_all,
)
from nodeagent.errors import CorruptStateError
from nodeagent.model.accounting import Record
from nodeagent.model.decode import NAME_RE
from nodeagent.model.fairshare import Usage
from nodeagent.model.gpus import read_placement, split_placements
from nodeagent.model.job import Cordon, Event, JobRecord
from nodeagent.model.pool import PoolJob, PoolNode, Requeue
from nodeagent.model.queues import QueueView
from nodeagent.model.spec import JobSpec


@dataclass(frozen=True)
class PoolBeat:
    """What a node's pool heartbeat returns."""

    now_ms: int
    leader: str | None  # "<node> <token>"
    leader_deadline_ms: int | None
    placement: str | None  # the job this node is placed on whole
    garbage: tuple[str, ...] = ()
    shares: Mapping[str, int] = field(default_factory=dict)  # or: the jobs sharing it, units

    @property
    def leader_name(self) -> str | None:
        return self.leader.split(" ", 1)[0] if self.leader else None


@dataclass(frozen=True)
class PoolSnapshot:
    """The whole pool at Redis server time `now_ms`."""

    now_ms: int
    leader: str | None
    deadlines: Mapping[str, int]  # node -> lease deadline (ms), live or lapsed
    nodes: Mapping[str, PoolNode]  # live leases with a readable report
    placements: Mapping[str, str]
    jobs: Mapping[str, PoolJob]
    cancels: Mapping[str, str]
    cordons: Mapping[str, Cordon]
    garbage: tuple[str, ...] = ()
    queues: Mapping[str, QueueView] = field(default_factory=dict)
    holds: Mapping[str, str] = field(default_factory=dict)  # job -> who holds it
    requeues: Mapping[str, Requeue] = field(default_factory=dict)  # job -> who asked, when
    shares: Mapping[str, Mapping[str, int]] = field(default_factory=dict)  # node -> job -> units
    # the jobs whose status or spec changed since the pool leader's last read, when it read
    # only those (coord/poolreplies.HeldJobs); None: every job was read
    jobs_changed: frozenset[str] | None = None

    def placements_of(self, job_id: str) -> list[str]:
        """The nodes `job_id` is placed on, whole or sharing them."""
        shared = (n for n, held in self.shares.items() if job_id in held)
        return sorted([*(n for n, j in self.placements.items() if j == job_id), *shared])

    @property
    def lapsed(self) -> tuple[str, ...]:
        return tuple(n for n, d in self.deadlines.items() if d <= self.now_ms)


@dataclass(frozen=True)
class PoolWrite:
    """One fenced write of the pool leader."""

    unplace: tuple[str, ...] = ()
    place: Mapping[str, str] = field(default_factory=dict)
    jobs: Mapping[str, PoolJob] = field(default_factory=dict)
    drop_leases: tuple[str, ...] = ()
    events: tuple[Event, ...] = ()
    booked: tuple[Record, ...] = ()  # the accounting records of the jobs that end in it
    usage: Usage | None = None  # fair share's, to keep (model/fairshare.py)


PLACEMENTS_REREAD = 60  # rounds between the pool leader's full reads of the placements
JOB_CHANGES_KEEP_MS = 600_000  # a change kept this long (ms): a read older reads every job
MAX_SPECS = 20_000  # decoded specs a store keeps (by job, with their text) between its reads


@dataclass(frozen=True)
class HeldPlacements:
    """The placements as one pool leader (its lease value) last read and wrote them: only the
    pool leader writes them, so it reads them in full only on a new term, after a failed
    write, and every PLACEMENTS_REREAD rounds (anything written by hand is seen then)."""

    leader: str
    rounds: int  # since they were read in full
    placements: dict[str, str]

    def fresh(self, leader: str | None) -> bool:
        return self.leader == leader and self.rounds < PLACEMENTS_REREAD


class PoolStore:
    """One pool's keys in one Redis, for one agent or one nodeagentctl."""

    def __init__(self, client: redis.Redis, keys: PoolKeys) -> None:
        self.client = client
        self.keys = keys
        self._sync = POOL_SYNC.bind(client)
        self._read = POOL_READ.bind(client)
        self._commit = POOL_COMMIT.bind(client)
        self._submit = POOL_SUBMIT.bind(client)
        self._leave = LEAVE.bind(client)  # a job's and a pool's: the same steps
        self._page = READ_PAGE.bind(client)  # and the same paged read of nodes
        self._view: LeaderView[PoolNode] = LeaderView()  # what it read while leading the pool
        self._records: dict[str, tuple[str, JobRecord | None]] = {}  # by revision as read
        self._specs: dict[str, tuple[str, JobSpec | str]] = {}  # by their text as read
        self._statuses = replies.StatusMemo()  # each job status decoded once, by its text
        self._reports = replies.ReportMemo()  # and each node's report
        self._placements: HeldPlacements | None = None
        self._jobs: HeldJobs | None = None  # the statuses it read while leading the pool
        self.last_read = 0  # node reports read by the last read(), every page of it

    def sync(self, report: PoolNode) -> PoolBeat:
        with redis_errors("pool heartbeat"):
            reply: Any = self._sync(self.sync_call(report))
        now, leader, deadline, placement, garbage = reply
        placed = read_placement(placement) if isinstance(placement, str) else None
        return PoolBeat(
            int(now),
            leader or None,
            int(deadline) if deadline else None,
            placed if isinstance(placed, str) else None,
            tuple(str(g) for g in garbage),
            placed if isinstance(placed, dict) else {},
        )

    def sync_many(self, reports: Sequence[PoolNode]) -> None:
        """Pool heartbeats of many nodes in one pipeline (the fleet simulator, bench/fleet.py)."""
        pipe = self.client.pipeline(transaction=False)
        for report in reports:
            self._sync(self.sync_call(report), client=pipe)
        with redis_errors("pool heartbeats"):
            pipe.execute()

    def sync_call(self, report: PoolNode) -> Call:
        """This node's call of the POOL_SYNC script (poolscripts.py), named."""
        k = self.keys
        return Call(
            {
                "node": k.node(report.name),
                "leases": k.leases,
                "leader": k.leader,
                "epoch": k.leader_epoch,
                "placements": k.placements,
                "changes": k.changes,
                "change_seq": k.change_seq,
                "digests": k.digests,
            },
            {
                "name": report.name,
                "report": report.to_json(),
                "ttl": report.lease_ttl_ms,
                "node_prefix": k.node_prefix(),
                "digest": report.digest,
            },
        )

    def read(
        self, led_by: str | None = None, jobs: bool = True, nodes: bool = True
    ) -> PoolSnapshot:
        """The whole pool: its hashes in one call, its nodes in pages. The pool leader (its
        lease value as `led_by`) keeps what it read and reads only the nodes changed since
        (coord/view.py); anyone else reads every node (a ZSCAN of the leases). `jobs` False:
        no job's status is read (`jobs` is empty), for a reader of the nodes alone; `nodes`
        False: no node's report nor lease (`nodes` and `deadlines` empty), for a reader of the
        jobs alone."""
        k = self.keys
        held = self._placements
        cached = held is not None and held.fresh(led_by)
        kept = self._jobs if jobs and led_by is not None else None
        since = kept.since(led_by) if kept is not None else None
        with redis_errors("read the pool"):
            reply: Any = self._read(
                Call(
                    {
                        "placements": k.placements,
                        "jobs": k.jobs,
                        "cancels": k.cancels,
                        "cordons": k.cordons,
                        "leader": k.leader,
                        "queues": k.queues,
                        "holds": k.holds,
                        "requeues": k.requeues,
                        "job_changes": k.job_changes,
                    },
                    {
                        "skip_placements": "1" if cached else "0",
                        "skip_jobs": "0" if jobs else "1",
                        "jobs_since": since if since is not None else "",
                        "changes_keep_ms": JOB_CHANGES_KEEP_MS,
                    },
                )
            )
        now, leader, raw_placements, statuses, cancels, cordons, queues, holds, requeues = reply[:9]
        noted, delta, now = reply[9], reply[10], int(now)
        garbage = [str(g) for g in noted]
        decoded, changed = None, None
        if jobs:
            decoded, changed = self._decode_jobs(statuses, kept if delta else None, led_by, now)
            garbage.extend(decoded.bad.values())
        if cached and held is not None:
            placements = held.placements
            self._placements = replace(held, rounds=held.rounds + 1)
        else:
            # (a value that is no placement is left out as split_placements reads it)
            placements = {
                n: text for n, text in replies.pairs(raw_placements or []) if NAME_RE.match(n)
            }
            self._placements = None if led_by is None else HeldPlacements(led_by, 0, placements)
        whole, shares = split_placements(placements)
        leases: tuple[Lease[PoolNode], ...] = ()
        if led_by is not None:
            leases = self._led(led_by, int(now), garbage)
        elif nodes:
            self._view = LeaderView()
            leases = self._all(int(now), garbage)
        deadlines = {lease.name: lease.deadline_ms for lease in leases}
        reports = {
            lease.name: lease.report
            for lease in leases
            if lease.report is not None and lease.deadline_ms > int(now)
        }
        return PoolSnapshot(
            now_ms=int(now),
            leader=leader or None,
            deadlines=deadlines,
            nodes=reports,
            placements=whole,
            shares=shares,
            jobs=decoded.statuses if decoded is not None else {},
            jobs_changed=changed,
            cancels={j: by[:256] for j, by in replies.pairs(cancels)},
            cordons=replies.decoded(cordons, Cordon.from_json, "pool cordon", garbage),
            garbage=tuple(dict.fromkeys(garbage)),
            queues={
                name: queue
                for name, queue in replies.decoded(
                    queues, QueueView.from_json, "pool queue", garbage
                ).items()
                if queue.name == name
            },
            holds={j: by[:256] for j, by in replies.pairs(holds)},
            requeues=replies.decoded(requeues, Requeue.from_json, "pool requeue", garbage),
        )

    def _decode_jobs(
        self, flat: Sequence[Any], held: HeldJobs | None, led_by: str | None, now: int
    ) -> tuple[HeldJobs, frozenset[str] | None]:
        """The statuses read, and the jobs changed when only those were read over `held`
        (None: every job was read); the pool leader keeps what it read."""
        if held is not None:
            statuses, bad, changed = self._statuses.changed(held, flat)
            self._jobs = HeldJobs(held.leader, now, held.full_ms, statuses, bad)
            return self._jobs, changed
        statuses, bad = self._statuses.decode(flat)
        whole = HeldJobs(led_by or "", now, now, statuses, bad)
        if led_by is not None:
            self._jobs = whole
        return whole, None

    def forget_jobs(self) -> None:
        """Read every job at the pool leader's next read (what it kept may be behind)."""
        self._jobs = None

    def now_ms(self) -> int:
        """Redis' time, the pool's one clock (ms)."""
        with redis_errors("read the pool's clock"):
            seconds, micros = self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def nodes(self) -> dict[str, PoolNode]:
        """The live nodes' reports, page by page at Redis server time, without the rest of the
        pool, and leaving the pool leader's view of them (`read(led_by)`) as it is."""
        now = self.now_ms()
        leases = self._all(now, [])
        return {x.name: x.report for x in leases if x.report is not None and x.deadline_ms > now}

    def report(self, name: str) -> PoolNode | None:
        """One node's report while its key lives (None: none, or not one nodeagent wrote),
        without reading the rest of the pool."""
        with redis_errors("read a node's report"):
            raw: Any = self.client.get(self.keys.node(name))
        if raw is None:
            return None
        try:
            report = PoolNode.from_json(raw)
        except CorruptStateError:
            return None
        return report if report.name == name else None

    def _led(self, token: str, now: int, garbage: list[str]) -> tuple[Lease[PoolNode], ...]:
        view = self._view
        first = self._read_page(now, view.cursor, view.sweep, SWEEP, 0, garbage)

        def more(cursor: int, expired: int) -> ViewRead[PoolNode]:
            return self._read_page(now, cursor, "", SWEEP, expired, garbage)

        self.last_read, _ = view.catch_up(replace(first, leader=token), more)
        return view.leases(now)

    def _all(self, now: int, garbage: list[str]) -> tuple[Lease[PoolNode], ...]:
        return sweep_all(lambda sweep: self._read_page(now, "+inf", sweep, PAGE, 0, garbage))

    def _read_page(
        self, now: int, cursor: int | str, sweep: str, count: int, expired: int, garbage: list[str]
    ) -> ViewRead[PoolNode]:
        k = self.keys
        with redis_errors("read the pool's nodes"):
            reply: Any = self._page(read_page_call(k, cursor, sweep, count, expired))
        garbage += (str(g) for g in reply[6])
        leases, gone = replies.leases(now, reply[7], reply[8], garbage, self._reports.decode)

        def check(name: str, score: str) -> int | None:
            deadline = replies.deadline(name, score, garbage)
            return deadline if deadline is not None and NAME_RE.match(name) else None

        return ViewRead(reply[1] or None, leases, gone, page=parse_page(reply, check))

    def placed(self, job_id: str) -> tuple[int, list[str]]:
        """Redis' time (ms) and the nodes placed on `job_id`, without reading the whole pool
        (what `show` needs of it)."""
        with redis_errors("read the placements"):
            pipe = self.client.pipeline(transaction=False)
            pipe.time()
            pipe.hgetall(self.keys.placements)
            (seconds, micros), raw = pipe.execute()
        whole, shares = split_placements({str(n): str(t) for n, t in raw.items()})
        placed = [n for n, j in whole.items() if j == job_id and NAME_RE.match(n)]
        placed = sorted([*placed, *(n for n, held in shares.items() if job_id in held)])
        return int(seconds) * 1000 + int(micros) // 1000, placed

    def status(self, job_id: str) -> PoolJob | None:
        """One job's pool status (None: no such job, or its status is unreadable), without
        reading the whole pool."""
        with redis_errors("read a job's status"):
            raw: Any = self.client.hget(self.keys.jobs, job_id)
        return status_of(raw)

    def specs(
        self, ids: Sequence[str], changed: frozenset[str] | None = None
    ) -> dict[str, JobSpec | str]:
        """Each job's spec, or why it cannot be read; one read before as the same text is not
        decoded again, whatever was read between (MAX_SPECS at most). `changed`: the jobs
        whose spec may have changed since the last read (PoolSnapshot.jobs_changed): the
        others' are not read again (None: all are)."""
        kept = dict(self._specs)  # a copy: another thread's read may be replacing it
        found: dict[str, JobSpec | str] = {}
        if changed is not None:
            for job_id in ids:
                if job_id not in changed and (held := kept.get(job_id)) is not None:
                    found[job_id] = held[1]
            ids = [job_id for job_id in ids if job_id not in found]
        if not ids:
            return found
        with redis_errors("read job specs"):
            raws: Any = self.client.hmget(self.keys.specs, list(ids))
        for job_id, raw in zip(ids, raws, strict=True):
            if raw is None:
                found[job_id] = "no spec stored"
            elif (held := kept.get(job_id)) is not None and held[0] == raw:
                found[job_id] = held[1]
            else:
                try:
                    found[job_id] = JobSpec.from_json(raw)
                except CorruptStateError as exc:
                    found[job_id] = str(exc)
                kept[job_id] = (raw, found[job_id])
        if len(kept) > MAX_SPECS:
            kept = {job_id: kept[job_id] for job_id in found if job_id in kept}
        self._specs = kept
        return found

    def made(self, spec: JobSpec, raw: str) -> None:
        """`spec`, stored as `raw` by this process: a read that finds that text takes it, not
        decoding it again (the leader's requests thread stores what its rounds then read)."""
        self._specs[spec.id] = (raw, spec)

    def spec(self, job_id: str) -> JobSpec | str | None:
        """One job's spec, why it is unreadable, or None when no such job was submitted."""
        with redis_errors("read a job spec"):
            raw: Any = self.client.hget(self.keys.specs, job_id)
        if raw is None:
            return None
        held = self._specs.get(job_id)  # the leader's round's (not replaced: it is theirs)
        if held is not None and held[0] == raw:
            return held[1]
        try:
            return JobSpec.from_json(raw)
        except CorruptStateError as exc:
            return str(exc)

    def records(self, ids: Iterable[str]) -> dict[str, JobRecord | None]:
        """Each job's own record (None: none yet, or unreadable: its leader rewrites it). A
        record is read again only at a new revision (one round trip for the revisions, one
        more for the records that moved)."""
        ids = list(ids)
        if not ids:
            return {}
        pipe = self.client.pipeline(transaction=False)
        for job_id in ids:
            pipe.hget(self.keys.job(job_id).record, "rev")
        with redis_errors("read job records"):
            revs = pipe.execute(raise_on_error=False)
        moved = [
            (job_id, rev)
            for job_id, rev in zip(ids, revs, strict=True)
            if not isinstance(rev, str) or self._records.get(job_id, ("",))[0] != rev
        ]
        for job_id, _ in moved:
            pipe.hget(self.keys.job(job_id).record, "record")
        with redis_errors("read job records"):
            raws = pipe.execute(raise_on_error=False) if moved else []
        for (job_id, rev), raw in zip(moved, raws, strict=True):
            try:
                record = JobRecord.from_json(raw) if isinstance(raw, str) else None
            except CorruptStateError:
                record = None
            self._records[job_id] = (rev if isinstance(rev, str) else "", record)
        return {job_id: self._records[job_id][1] for job_id in ids}

    def commit(self, leader: str, write: PoolWrite) -> None:
        """Raises: FencedError when another node leads the pool."""
        k = self.keys
        rest: list[Any] = [len(write.unplace), *write.unplace]
        rest += [len(write.place), *(x for pair in write.place.items() for x in pair)]
        rest += [len(write.jobs), *(x for j, s in write.jobs.items() for x in (j, s.to_json()))]
        rest += [len(write.booked), *(x for r in write.booked for x in (r.ended_ms, r.to_json()))]
        rest += [write.usage.to_json() if write.usage is not None else ""]
        rest += [len(write.drop_leases), *write.drop_leases]
        rest += [e.to_json() for e in write.events]
        held, self._placements = self._placements, None  # unknown if the write fails
        with redis_errors("pool leader write"):
            self._commit(
                Call(
                    {
                        "leader": k.leader,
                        "placements": k.placements,
                        "jobs": k.jobs,
                        "ledger": k.ledger,
                        "usage": k.usage,
                        "events": k.events,
                        "leases": k.leases,
                        "changes": k.changes,
                        "digests": k.digests,
                        "job_changes": k.job_changes,
                    },
                    {
                        "leader_value": leader,
                        "events_maxlen": EVENTS_MAXLEN,
                        "changes_keep_ms": JOB_CHANGES_KEEP_MS,
                    },
                    rest,
                )
            )
        self._view.forget(write.drop_leases)
        if held is not None and held.leader == leader:
            kept = {n: j for n, j in held.placements.items() if n not in write.unplace}
            self._placements = replace(held, placements={**kept, **write.place})

    def submit(
        self, spec: JobSpec, pinned: bool = False, held_by: str = ""
    ) -> tuple[bool, PoolJob | None]:
        """Store a new job (pending); (False, its status) when the id is in use by a job that
        has not ended (or a pinned one). The id of an ended job is taken over: that job moves to
        the history (poolscripts.POOL_SUBMIT). `held_by`: submitted held (submit --hold)."""
        call = submit_call(self.keys, spec, pinned, held_by, submitted(spec))
        with redis_errors("submit"):
            created, raw = self._submit(call)
        return bool(created), status_of(raw)

    def submit_many(
        self, specs: Sequence[JobSpec], held_by: str, event: Event
    ) -> list[tuple[bool, PoolJob | None]]:
        """Store the jobs of one submission (an array's tasks) in one round trip, as `submit`
        stores each; one event says so, not one per job."""
        pipe = self.client.pipeline(transaction=False)
        for i, spec in enumerate(specs):
            said = event if i == 0 else None
            self._submit(submit_call(self.keys, spec, False, held_by, said), pipe)
        with redis_errors("submit"):
            replies = pipe.execute()
        return [(bool(created), status_of(raw)) for created, raw in replies]

    def cordon(self, name: str, cordon: Cordon) -> None:
        """Keep `name` out of new placements (and, with drain, off its job now)."""
        put_cordon(self.client, self.keys, name, cordon, "pool cordon")

    def uncordon(self, name: str, by: str) -> bool:
        """Lift `name`'s pool cordon; False if it had none."""
        return lift_cordon(self.client, self.keys, name, by, "pool uncordon")

    def knows_node(self, name: str) -> bool:
        """The node holds a pool lease (live or lapsed), a placement or a pool cordon."""
        k = self.keys
        pipe = self.client.pipeline(transaction=False)
        pipe.zscore(k.leases, name)
        pipe.hexists(k.placements, name)
        pipe.hexists(k.cordons, name)
        with redis_errors("look a node up"):
            lease, placed, cordoned = pipe.execute()
        return lease is not None or bool(placed) or bool(cordoned)

    def replace_spec(self, spec: JobSpec) -> None:
        call = Call(
            {"specs": self.keys.specs, "job_changes": self.keys.job_changes},
            {"job": spec.id, "spec": spec.to_json()},
        )
        with redis_errors("update the job spec"):
            POOL_REPLACE_SPEC.bind(self.client)(call)

    def cancel(self, job_id: str, by: str) -> None:
        """Ask the pool leader to end `job_id`. The leader tells a running job to stop, so its
        workers get the stop grace to checkpoint (pool/lifecycle.Stopping)."""
        event = Event("job_cancel", message=f"job {job_id}: cancel by {by}", data={"job": job_id})
        streams.write_with_event(
            self.client,
            "cancel",
            lambda pipe: pipe.hset(self.keys.cancels, job_id, by),
            self.keys.events,
            event,
        )

    def keep_holder(self, job_id: str, ttl_ms: int) -> None:
        """An allocation's holder is alive: its lease runs `ttl_ms` from now (Redis's clock)."""
        until = self.now_ms() + ttl_ms
        with redis_errors("renew an allocation's holder"):
            self.client.hset(self.keys.holders, job_id, str(until))

    def holders(self, job_ids: Sequence[str]) -> dict[str, int | None]:
        """Until when each allocation's holder renewed it (None: never, or not a number)."""
        if not job_ids:
            return {}
        with redis_errors("read allocations' holders"):
            raw: list[Any] = self.client.hmget(self.keys.holders, list(job_ids))
        found: dict[str, int | None] = {}
        for job_id, value in zip(job_ids, raw, strict=True):
            text = value.decode() if isinstance(value, bytes) else value
            found[job_id] = int(text) if isinstance(text, str) and text.isdigit() else None
        return found

    def last_event_id(self, stream: str | None = None) -> str:
        return streams.last_id(self.client, stream or self.keys.events)

    def wait_events(self, after: dict[str, str], block_ms: int) -> list[tuple[str, str, Any]]:
        return streams.wait(self.client, after, block_ms)

    def leave(self, name: str) -> None:
        """Drop this node's pool lease (and the pool leader lease) at once; the event wakes the
        pool, whose leader reschedules without waiting for the lease to lapse."""
        k = self.keys
        event = Event("node_left", node=name, message=f"{name} left the pool")
        with redis_errors("leave the pool"):
            self._leave(leave_call(k, name, event))
