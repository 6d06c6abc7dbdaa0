"""The working state of one schedule() call (pool/schedule.py's rules; pool/sharing.py's for
the nodes that jobs asking for GPUs share): placements, statuses and events as the round makes
them, indexed so that a decision costs about nodes + jobs, not nodes x jobs."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import replace

from nodeagent.model.job import Event
from nodeagent.model.pool import PoolJob, PoolJobState
from nodeagent.model.queues import DEFAULT, Ledger
from nodeagent.pool import preempt
from nodeagent.pool.schedview import JobView, Lacking, PoolView, Short, Small


class Run:
    """The working state of one schedule() call, indexed so that a decision costs about
    nodes + jobs, not nodes x jobs (bench/schedule.py)."""

    def __init__(self, view: PoolView, cooldown_ms: int = 60_000) -> None:
        self.view = view
        self.cooldown_ms = cooldown_ms  # SchedulePolicy.resize_cooldown_ms
        self.placements: dict[str, str] = {}
        self.by_job: dict[str, set[str]] = {}
        self.jobs: dict[str, PoolJob] = {}
        self.events: list[Event] = []
        nodes = view.nodes.values()
        self.eligible = sorted(n.name for n in nodes if n.eligible)  # handed out in this order
        self._eligible = {name: i for i, name in enumerate(self.eligible)}  # -> its index
        self._head = 0  # every node of eligible[:_head] is placed
        self._free = len(self.eligible)  # eligible nodes not placed
        self.refusers: dict[str, set[str]] = {}  # nodes that refuse a job, or lack its labels
        self.unmatched: dict[str, int] = {}  # of those, how many lack its labels
        self.short: dict[str, int] = {}  # ... and how many offer fewer GPUs than it asks for
        for node in nodes:
            for job_id in node.refused:
                self.refusers.setdefault(job_id, set()).add(node.name)
        lacking_of = Lacking(nodes)
        for job in view.jobs.values():
            if job.selector:
                lacking = lacking_of(job.selector)
                self.refusers.setdefault(job.id, set()).update(lacking)
                self.unmatched[job.id] = len(lacking)
        short_of = Short(nodes)
        for job in view.jobs.values():
            if job.gpus_per_node is not None:
                short = short_of(job.gpus_per_node) - self.refusers.get(job.id, set())
                if short:
                    self.refusers.setdefault(job.id, set()).update(short)
                    self.short[job.id] = len(short)
        self.few: dict[str, int] = {}  # ... and how many hold fewer CPUs per GPU than it asks
        few_of = Short(nodes, lambda node: node.cpus_per_gpu or None)
        for job in view.jobs.values():
            if job.cpus_per_gpu is not None and job.shared:  # (a whole node: all its CPUs)
                few = few_of(job.cpus_per_gpu) - self.refusers.get(job.id, set())
                if few:
                    self.refusers.setdefault(job.id, set()).update(few)
                    self.few[job.id] = len(few)
        self.small: dict[str, int] = {}  # ... and how many have less memory than it asks for
        small_of = Small(nodes)
        for job in view.jobs.values():
            if job.asks_memory:
                small = small_of(job) - self.refusers.get(job.id, set())
                if small:
                    self.refusers.setdefault(job.id, set()).update(small)
                    self.small[job.id] = len(small)
        self.serving: dict[str, set[str]] = {}  # job -> the nodes whose agent still runs it
        for node in nodes:
            served = node.sharing if node.serving is None else (node.serving, *node.sharing)
            for job_id in served:
                self.serving.setdefault(job_id, set()).add(node.name)
        # The nodes jobs that asked for GPUs share (pool/sharing.py): node -> job -> units,
        # and each such job's nodes. A shared node is taken, for a whole-node job, as a placed
        # one is.
        self.shares: dict[str, dict[str, int]] = {}
        self.shared_by_job: dict[str, set[str]] = {}
        self._units: dict[str, int] = {}  # a shared node -> its units no job holds
        self._memory: dict[str, int] = {}  # ... -> the memory its sharers have (fits_memory)
        self.by_free: dict[int, dict[str, None]] = {}  # free units -> the shared nodes (ordered)
        self.healthy = {
            n.name for n in nodes if n.pinned is None and n.unfit is None and n.cordoned is None
        }
        self.ledger = Ledger(view.queues)
        self._queue_of = {job.id: job.queue for job in view.jobs.values()}
        # the queues with a GPU quota or a guaranteed GPU share: only their whole-node jobs'
        # GPUs are counted (a node's units looked up for each of 10,000 placements would cost
        # every round)
        self._gpu_queues = {
            q.name for q in view.queues.values() if q.gpu_quota is not None or q.gpu_guaranteed
        }
        self.widest = max((n.gpus for n in nodes if n.eligible), default=0)  # most units a node
        self._victims: list[JobView] | None = None  # see victims()
        self._running: set[str] | None = None  # see running()
        self.givers: list[JobView] | None = None  # GPU jobs that could shrink (pool/sharing.py)
        # (priority, the queue reclaiming GPUs or None, version) -> their nodes
        self.givers_nodes: dict[tuple[int, str | None, int], set[str]] = {}
        self._namesakes: dict[tuple[str, str], list[tuple[int, str]]] | None = None
        # Counts the changes to placements, shares and statuses: a verdict on a pending job
        # stays true while it does not move (schedule._admit's memo of blocked shapes).
        self.version = 0

    def status(self, job: JobView) -> PoolJob:
        return self.jobs.get(job.id, job.status)

    def move(
        self,
        job: JobView,
        state: PoolJobState,
        reason: str,
        event: str,
        data: Mapping[str, object] | None = None,
    ) -> None:
        self.version += 1
        if self._running is not None:  # (kept, not made again: moves come in the thousands)
            if state is PoolJobState.RUNNING:
                self._running.add(job.id)
            else:
                self._running.discard(job.id)
        moved = self.status(job).moved(state, self.view.now_ms, reason)
        self.jobs[job.id] = replace(moved, exit_code=job.exit_code) if state.ended else moved
        message = f"job {job.id}: {reason}"
        said: dict[str, object] = {**(data or {"job": job.id}), "state": state.value}
        if job.user:  # whom it runs as, and what they asked to be told of (pool/notify.py),
            said["user"] = job.user  # as they were when it happened: the id may be reused
        if job.notify:
            said["notify"] = list(job.notify)
        self.events.append(Event(event, message=message, data=said))

    def note(self, job: JobView, reason: str) -> None:
        """Say why a job waits (written only when the reason changes); an evicted job says so
        first."""
        status = self.status(job)
        if status.evicted is not None:
            reason = f"evicted {status.evicted}; {reason}"
        if status.reason != reason:
            self.jobs[job.id] = status.with_reason(reason)

    def place(self, node: str, job: str) -> None:
        self.unplace(node)
        self.keep([node], job)

    def keep(self, nodes: list[str], job: str) -> None:
        """Place nodes that are placed nowhere yet (place() moves one from its job first); a
        job's nodes at once (at 10,000 nodes, node by node took most of a steady round)."""
        self.version += 1
        self.placements.update(dict.fromkeys(nodes, job))
        self.by_job.setdefault(job, set()).update(nodes)
        self._free -= sum(1 for node in nodes if node in self._eligible)
        queue = self._queue_of.get(job, DEFAULT)
        self.ledger.add(queue, len(nodes))
        if queue in self._gpu_queues:
            self.ledger.add_gpus(queue, sum(self.view.whole_gpus(node, job) for node in nodes))

    def per_node_gpus(self, job: JobView) -> int:
        """The GPU units `job` holds on each node, as a quota counts them ahead of placing it:
        what it asks for where it shares nodes, else the most any node offers."""
        return (job.gpus_per_node or 0) if job.shared else self.widest

    def room(self, job: JobView) -> int | None:
        """How many more nodes `job`'s queue lets it hold: its quota in nodes and its GPU quota
        (per_node_gpus a node); None: no limit."""
        rooms = [self.ledger.room(job.queue)]
        gpus, per_node = self.ledger.gpu_room(job.queue), self.per_node_gpus(job)
        if gpus is not None and per_node > 0:
            rooms.append(gpus // per_node)
        limits = [r for r in rooms if r is not None]
        return min(limits) if limits else None

    def share(self, node: str, job: str, units: int) -> None:
        """`job` holds `units` GPUs of `node`, which no whole-node job is placed on."""
        self.version += 1
        held = self.shares.get(node)
        if held is None:
            held = self.shares[node] = {}
            if node in self._eligible:
                self._free -= 1
        queue = self._queue_of.get(job, DEFAULT)
        if job not in held:
            self.shared_by_job.setdefault(job, set()).add(node)
            self.ledger.add(queue, 1)
        self.ledger.add_gpus(queue, units - held.get(job, 0))
        held[job] = units
        self.refile(node)

    def keep_shares(self, kept: dict[str, dict[str, int]]) -> None:
        """The first shares of the round (node -> job -> units), at once: share() a share at a
        time took a fifth of a round at 1,000 nodes x 8 GPUs (bench/schedule.py's gpus-1k)."""
        self.version += 1
        nodes: Counter[str] = Counter()  # queue -> nodes its jobs share
        units: Counter[str] = Counter()  # queue -> the units they hold
        queue_of, by_job = self._queue_of, self.shared_by_job
        for node, held in kept.items():
            self.shares[node] = held
            for job, count in held.items():
                by_job.setdefault(job, set()).add(node)
                queue = queue_of.get(job, DEFAULT)
                nodes[queue] += 1
                units[queue] += count
            self.refile(node)
        self._free -= sum(1 for node in kept if node in self._eligible)
        for queue, count in nodes.items():
            self.ledger.add(queue, count)
            self.ledger.add_gpus(queue, units[queue])

    def unshare(self, node: str, job: str) -> None:
        self.version += 1
        held = self.shares.get(node, {})
        units = held.pop(job, None)
        if units is None:
            return
        self.shared_by_job[job].discard(node)
        self.ledger.add(self._queue_of.get(job, DEFAULT), -1)
        self.ledger.add_gpus(self._queue_of.get(job, DEFAULT), -units)
        if held:
            self.refile(node)
            return
        del self.shares[node]
        self._memory.pop(node, None)
        self.by_free.get(self._units.pop(node), {}).pop(node, None)
        if node in self._eligible:
            self._free += 1
            self._head = min(self._head, self._eligible[node])

    def refile(self, node: str) -> None:
        """File a shared node under its free units now (by_free: the packing's best fit)."""
        self._memory.pop(node, None)
        before = self._units.get(node)
        if before is not None:
            self.by_free.get(before, {}).pop(node, None)
        offered = self.view.nodes[node].gpus if node in self.view.nodes else 0
        free = self._units[node] = offered - sum(self.shares[node].values())
        self.by_free.setdefault(free, {})[node] = None

    def free_units(self, node: str) -> int:
        """The GPU units of `node` no job holds (a node no job is placed on: all it offers)."""
        if node in self._units:
            return self._units[node]
        return self.view.nodes[node].gpus if node in self.view.nodes else 0

    def memory_free(self, node: str) -> int | None:
        """The memory of `node` its sharers leave, each counted at its limit there (as its
        agent limits it: model/resources.py); None: the node says nothing of its memory."""
        view = self.view.nodes.get(node)
        if view is None or view.memory == 0:
            return None
        used = self._memory.get(node)
        if used is None:  # (kept until the node's shares change: refile)
            used = sum(self.share_memory(node, other) for other in self.shares.get(node, {}))
            self._memory[node] = used
        return view.memory - used

    def share_memory(self, node: str, job: str) -> int:
        """The memory `job`'s share of `node` holds (0: the node says nothing of it)."""
        view, units = self.view.nodes.get(node), self.shares.get(node, {}).get(job, 0)
        if view is None or view.memory == 0:
            return 0
        found = self.view.jobs.get(job)
        return found.memory_on(view, units) if found else view.mem_per_gpu * max(units, 1)

    def fits_memory(self, job: JobView, node: str) -> bool:
        """`job`, sharing `node` on its units, fits in the memory the node's sharers leave; a
        node that says nothing of its memory always does."""
        free = self.memory_free(node)
        return free is None or job.memory_on(self.view.nodes[node], job.gpus_per_node or 0) <= free

    def holds(self, job: str) -> int:
        """The nodes `job` holds: placed on it whole, or sharing them."""
        return len(self.by_job.get(job, ())) + len(self.shared_by_job.get(job, ()))

    def running(self) -> set[str]:
        """The jobs running now (as this round has settled them; made once, then kept up to
        date by move(): the set itself, which changes as jobs move)."""
        if self._running is None:
            jobs = self.view.jobs.values()
            self._running = {j.id for j in jobs if self.status(j).state is PoolJobState.RUNNING}
        return self._running

    def unplace(self, node: str) -> None:
        self.version += 1
        job = self.placements.pop(node, None)
        if job is not None:
            self.by_job[job].discard(node)
            queue = self._queue_of.get(job, DEFAULT)
            self.ledger.add(queue, -1)
            if queue in self._gpu_queues:
                self.ledger.add_gpus(queue, -self.view.whole_gpus(node, job))
            if node in self._eligible:
                self._free += 1
                self._head = min(self._head, self._eligible[node])  # freed: the cursor sees it

    def namesakes(self) -> dict[tuple[str, str], list[tuple[int, str]]]:
        """The jobs not ended, by (user, name): what `singleton` waits for. Made once a round,
        when first asked."""
        if self._namesakes is None:
            self._namesakes = {}
            for j in self.view.jobs.values():
                if not self.status(j).state.ended:
                    self._namesakes.setdefault((j.user, j.name), []).append((j.status.seq, j.id))
        return self._namesakes

    def placed(self, job: str) -> list[str]:
        return sorted(self.by_job.get(job, ()))

    def victims(self) -> list[JobView]:
        """The jobs that may give nodes to a pending one: running, not pinned, in victim order.
        Taken once, when first needed: jobs admitted later in the round are not among them
        (they come in priority order, so no job after them outranks them; and a job is not
        shrunk in the round that admitted it)."""
        if self._victims is None:
            now = self.running()
            running = [
                j
                for j in self.view.jobs.values()
                if j.id in now
                and not j.shared  # (it holds no whole node to give)
                and not self.status(j).pinned
            ]
            self._victims = sorted(running, key=preempt.order)
        return self._victims

    def could_preempt(self, job: JobView) -> bool:
        """A cheap bound: some running job has a lower priority than `job`, or its queue is
        below its guaranteed share (nodes, or GPUs by whole nodes) while another is above its
        own."""
        victims = self.victims()
        if victims and job.priority > victims[0].priority:
            return True
        short = self.ledger.deficit(job.queue) or preempt.reclaim_by_gpus(
            job, self.ledger, self.widest
        )
        return short > 0 and self.ledger.any_above_share(job.queue)

    def preemption(
        self, claimant: JobView, need: int, ledger: Ledger | None = None
    ) -> list[preempt.Victim] | None:
        """The whole-node jobs' nodes to take for `claimant`, `need` of them (nodeagent.pool.
        preempt), as the queues stand in `ledger` (default: now), or None."""
        return preempt.victims(
            claimant,
            need,
            self.victims(),
            self.status,
            self.placed,
            lambda node: self.usable(claimant, node),
            ledger or self.ledger,
            self.view.now_ms,
            self.cooldown_ms,
            self.widest,
        )

    def give_up(self, claimant: JobView, found: list[preempt.Victim]) -> None:
        """The victims give up their nodes for `claimant`: each shrinks, or is evicted (back to
        pending), saying why."""
        for victim in found:
            before = len(self.by_job.get(victim.job.id, ()))
            for node in victim.nodes:
                self.unplace(node)
            data = {"job": victim.job.id, "for": claimant.id, "nodes": list(victim.nodes)}
            if victim.evict:
                self.evict(victim.job, claimant, victim.why, data)
                continue
            after = before - len(victim.nodes)
            reason = f"shrunk {before} -> {after} nodes for job {claimant.id}: {victim.why}"
            self.shrunk(victim.job, reason)
            message = f"job {victim.job.id}: {reason}"
            self.events.append(Event("job_shrunk", message=message, data=data))

    def evict(
        self, victim: JobView, claimant: JobView, why: str, data: Mapping[str, object]
    ) -> None:
        """`victim`, whose nodes were taken, goes back to pending for `claimant`, saying why
        (`job_evicted`, `data` its fields) until it is admitted again."""
        said = f"by job {claimant.id} ({why})"
        self.move(victim, PoolJobState.PENDING, f"evicted {said}", "job_evicted", data)
        self.jobs[victim.id] = replace(self.status(victim), evicted=said)

    def usable(self, job: JobView, node: str) -> bool:
        """`node` could serve `job`: eligible, not refusing it, carrying its labels."""
        return node in self._eligible and node not in self.refusers.get(job.id, ())

    def shrunk(self, job: JobView, reason: str) -> None:
        self.version += 1
        status = self.status(job)
        self.jobs[job.id] = replace(status, shrunk_ms=self.view.now_ms, reason=reason)

    def grown(self, job: JobView) -> None:
        self.jobs[job.id] = replace(self.status(job), grown_ms=self.view.now_ms)

    def free_count(self, job: JobView) -> int:
        """Free eligible nodes that do not refuse `job`."""
        refusing = self.refusers.get(job.id, set())
        free = refusing & self._eligible.keys()
        return self._free - sum(
            1 for n in free if n not in self.placements and n not in self.shares
        )

    def take(self, job: JobView, limit: int) -> list[str]:
        """Place up to `limit` free nodes (in name order) that do not refuse `job` on it."""
        taken = self.free_nodes(job, limit)
        for name in taken:
            self.place(name, job.id)
        return taken

    def _advance(self) -> None:
        eligible = self.eligible
        while self._head < len(eligible) and (
            eligible[self._head] in self.placements or eligible[self._head] in self.shares
        ):
            self._head += 1

    def free_nodes(self, job: JobView, limit: int) -> list[str]:
        """Up to `limit` free eligible nodes (no job placed on them, none sharing them) that do
        not refuse `job`, in the order take() hands them out."""
        self._advance()
        refusing = self.refusers.get(job.id, set())
        found: list[str] = []
        for name in self.eligible[self._head :]:
            if len(found) >= limit:
                break
            if name not in self.placements and name not in self.shares and name not in refusing:
                found.append(name)
        return found
