"""The pool's queues: how many nodes each may hold, and how many it is guaranteed. Pure.

Every job belongs to one queue (`queue` in its spec, default `default`). A queue has a quota,
the most nodes its jobs hold at once (none: no limit), a GPU quota, the most GPU units its jobs
hold at once (a whole-node job holds every unit of its nodes, a job sharing nodes those it
asked for: model/gpus.py), and guaranteed shares, in nodes and in GPU units: while it holds
fewer nodes than its share, its pending jobs may take nodes back from queues that hold more
than their own, whatever those jobs' priorities (nodeagent.pool.preempt); while it holds fewer
GPU units than its GPU share, its pending jobs that share nodes may take the shares of jobs of
queues above their own GPU share likewise (nodeagent.pool.sharetake), and its jobs of either
kind whole-node jobs' nodes, each counted as the units it gives them (nodeagent.pool.preempt).
`default` always exists, with no quota and no guarantee, unless an operator sets one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from nodeagent.errors import CorruptStateError
from nodeagent.model.decode import Reader

DEFAULT = "default"
MAX_NODES = 1_000_000
MAX_GPUS = 128 * MAX_NODES
MAX_PRIORITY = 1_000_000  # as model/spec.py's


@dataclass(frozen=True)
class QueueView:
    name: str
    quota: int | None = None  # at most this many nodes at once; None: no limit
    guaranteed: int = 0  # nodes it may reclaim from queues above their own share
    max_priority: int | None = None  # the highest priority a job may be submitted with
    gpu_quota: int | None = None  # at most this many GPU units at once; None: no limit
    gpu_guaranteed: int = 0  # GPU units its jobs sharing nodes may reclaim likewise

    def describe(self) -> str:
        ceiling = "none" if self.max_priority is None else str(self.max_priority)
        gpus = "" if self.gpu_quota is None else f", GPU quota {self.gpu_quota}"
        if self.gpu_guaranteed:
            gpus += f", GPUs guaranteed {self.gpu_guaranteed}"
        return (
            f"quota {self.quota or 'none'}{gpus}, guaranteed {self.guaranteed}, "
            f"max priority {ceiling}"
        )

    def problems(self) -> list[str]:
        """Why this queue is impossible (empty when it is fine)."""
        found = []
        if self.quota is not None and not 1 <= self.quota <= MAX_NODES:
            found.append(f"quota {self.quota}: expected 1 to {MAX_NODES} nodes, or none")
        if not 0 <= self.guaranteed <= MAX_NODES:
            found.append(f"guaranteed {self.guaranteed}: expected 0 to {MAX_NODES} nodes")
        if self.max_priority is not None and abs(self.max_priority) > MAX_PRIORITY:
            found.append(f"max priority {self.max_priority}: expected within +-{MAX_PRIORITY}")
        if self.gpu_quota is not None and not 0 <= self.gpu_quota <= MAX_GPUS:
            found.append(f"GPU quota {self.gpu_quota}: expected 0 to {MAX_GPUS} GPUs, or none")
        if not 0 <= self.gpu_guaranteed <= MAX_GPUS:
            found.append(f"GPUs guaranteed {self.gpu_guaranteed}: expected 0 to {MAX_GPUS} GPUs")
        if self.quota is not None and self.guaranteed > self.quota:
            found.append(f"guaranteed {self.guaranteed} above its quota of {self.quota}")
        if self.gpu_quota is not None and self.gpu_guaranteed > self.gpu_quota:
            found.append(
                f"GPUs guaranteed {self.gpu_guaranteed} above its GPU quota of {self.gpu_quota}"
            )
        return found

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, raw: str | bytes) -> QueueView:
        """Raises: CorruptStateError, and nothing else."""
        r = Reader.of(raw, "pool queue")
        queue = cls(
            name=r.name("name"),
            quota=r.opt_integer("quota", 1, MAX_NODES),
            guaranteed=r.integer("guaranteed", 0, 0, MAX_NODES),
            max_priority=r.opt_integer("max_priority", -MAX_PRIORITY, MAX_PRIORITY),
            gpu_quota=r.opt_integer("gpu_quota", 0, MAX_GPUS),
            gpu_guaranteed=r.integer("gpu_guaranteed", 0, 0, MAX_GPUS),
        )
        if queue.problems():
            raise CorruptStateError(f"pool queue: {'; '.join(queue.problems())}")
        return queue


class Ledger:
    """Nodes and GPU units held per queue during one schedule() call, kept up to date as nodes
    move."""

    def __init__(self, queues: Mapping[str, QueueView]) -> None:
        self._queues = {DEFAULT: QueueView(DEFAULT), **queues}
        self._used: dict[str, int] = {}
        self._gpus: dict[str, int] = {}

    def copy(self) -> Ledger:
        """A ledger of its own with what this one counts now (a plan's what-if)."""
        other = Ledger(self._queues)
        other._used, other._gpus = dict(self._used), dict(self._gpus)
        return other

    def add_gpus(self, name: str, count: int) -> None:
        self._gpus[name] = self._gpus.get(name, 0) + count

    def gpus_used(self, name: str) -> int:
        return self._gpus.get(name, 0)

    def gpu_quota(self, name: str) -> int | None:
        return self._queues[name].gpu_quota if name in self._queues else None

    def gpu_room(self, name: str) -> int | None:
        """How many more GPU units the queue may hold; None: no limit."""
        quota = self.gpu_quota(name)
        return None if quota is None else max(0, quota - self.gpus_used(name))

    def exists(self, name: str) -> bool:
        return name in self._queues

    def add(self, name: str, count: int) -> None:
        self._used[name] = self._used.get(name, 0) + count

    def used(self, name: str) -> int:
        return self._used.get(name, 0)

    def room(self, name: str) -> int | None:
        """How many more nodes the queue may hold; None: no limit."""
        quota = self._queues[name].quota if name in self._queues else None
        return None if quota is None else max(0, quota - self.used(name))

    def quota(self, name: str) -> int | None:
        return self._queues[name].quota if name in self._queues else None

    def guaranteed(self, name: str) -> int:
        return self._queues[name].guaranteed if name in self._queues else 0

    def deficit(self, name: str) -> int:
        """Nodes the queue is short of its guaranteed share (0 at or above it)."""
        return max(0, self.guaranteed(name) - self.used(name))

    def any_above_share(self, besides: str) -> bool:
        """Some queue other than `besides` holds more than its guaranteed share."""
        return any(self.surplus(name) > 0 for name in self._used if name != besides)

    def surplus(self, name: str) -> int:
        """Nodes the queue holds above its guaranteed share (0 at or below it)."""
        return max(0, self.used(name) - self.guaranteed(name))

    def gpu_queues(self) -> list[str]:
        """The queues holding GPU units now."""
        return [name for name, held in self._gpus.items() if held > 0]

    def gpu_guaranteed(self, name: str) -> int:
        return self._queues[name].gpu_guaranteed if name in self._queues else 0

    def gpu_deficit(self, name: str) -> int:
        """GPU units the queue is short of its guaranteed GPU share (0 at or above it)."""
        return max(0, self.gpu_guaranteed(name) - self.gpus_used(name))

    def gpu_surplus(self, name: str) -> int:
        """GPU units the queue holds above its guaranteed GPU share (0 at or below it)."""
        return max(0, self.gpus_used(name) - self.gpu_guaranteed(name))
