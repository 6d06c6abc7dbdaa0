"""A node's GPUs as the pool sees them, and what a job asks of them. Pure.

A node advertises the units it offers (pool/member.py, in its `PoolNode` report): each healthy
GPU by its UUID, or, for a GPU in MIG mode, each of its MIG instances by its own `MIG-` UUID
instead (a unit of its own, as Slurm's GRES counts them). A GPU whose health drains it is not
offered. Each unit says which job holds it now, as the node's agent gave it to that job's
workers.

A job asks for `gpus_per_node` units on each node it runs on (`submit --gpus-per-node K`;
None: the whole node, as before), or `exclusive` for the whole node whatever it asks. A job
that asks for units and is not exclusive shares its nodes with other such jobs, each on units
of its own; which units is the node's choice (as a kubelet's device manager picks the devices
for the count the Kubernetes scheduler placed).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nodeagent.errors import CorruptStateError
from nodeagent.model.decode import NAME_RE, Reader

MAX_UNITS = 128  # 8 GPUs x 7 MIG instances is 56; a report bounds what it holds
MAX_GPUS_PER_NODE = MAX_UNITS
UUID_RE = re.compile(r"^(GPU|MIG)-[A-Za-z0-9][A-Za-z0-9/.:_-]{0,94}$")


@dataclass(frozen=True)
class GpuUnit:
    """One unit a node offers: a whole GPU or a MIG instance. `job`: the job whose workers hold
    it now (None: free)."""

    uuid: str
    model: str = ""
    memory_mib: int | None = None
    job: str | None = None

    def to_data(self) -> dict[str, Any]:
        return {
            "uuid": self.uuid,
            "model": self.model,
            "memory_mib": self.memory_mib,
            "job": self.job,
        }

    @classmethod
    def read(cls, r: Reader) -> GpuUnit:
        """Raises: CorruptStateError, and nothing else."""
        uuid = r.text("uuid", max_len=100)
        if not UUID_RE.match(uuid):
            raise CorruptStateError(f"{r.what}: uuid {uuid[:40]!r} is not a GPU or MIG UUID")
        return cls(
            uuid=uuid,
            model=r.text("model", "", max_len=96),
            memory_mib=r.opt_integer("memory_mib", high=1 << 24),
            job=r.opt_text("job", 63),
        )


def read_units(r: Reader, name: str) -> tuple[GpuUnit, ...]:
    """A report's list of units, at most MAX_UNITS, each UUID once. Raises: CorruptStateError."""
    units = tuple(GpuUnit.read(item) for item in r.objects(name, MAX_UNITS))
    if len({u.uuid for u in units}) != len(units):
        raise CorruptStateError(f"{r.what}: {name} names a GPU twice")
    return units


def gpus_needed(gpus_per_node: int | None, offered: int, exclusive: bool) -> int:
    """The units a job holds on a node offering `offered`: all of them for a whole-node or
    exclusive job, else what it asked for."""
    if gpus_per_node is None or exclusive:
        return offered
    return gpus_per_node


# -- a shared node's placement ----------------------------------------------------------------
#
# A node a whole-node job is placed on holds that job's id in the pool's placements hash, as it
# always did. A node shared by jobs that asked for GPUs holds their shares instead: each job's
# id and the units it holds there, "llama:2 eval:1" (sorted by job). An agent of an earlier
# version reads that as no name at all (':' is not in one) and serves nothing there.

Shares = Mapping[str, int]  # job -> the units it holds on one node


def share_text(shares: Shares) -> str:
    return " ".join(f"{job}:{count}" for job, count in sorted(shares.items()))


def read_placement(text: str) -> str | dict[str, int] | None:
    """A placements hash value: a whole-node job's id, a shared node's shares, or None for
    anything else (garbage: not what a pool leader writes)."""
    if NAME_RE.match(text):
        return text
    shares: dict[str, int] = {}
    for entry in text.split(" ")[:MAX_UNITS]:
        job, colon, count = entry.rpartition(":")
        if not colon or not NAME_RE.match(job) or not count.isdigit() or job in shares:
            return None
        if not 1 <= int(count) <= MAX_UNITS:
            return None
        shares[job] = int(count)
    return shares or None


def shares_nodes(gpus_per_node: int | None, exclusive: bool) -> bool:
    """A job that asked for units, and not for whole nodes, shares its nodes."""
    return gpus_per_node is not None and not exclusive


def split_placements(
    texts: Mapping[str, str],
) -> tuple[dict[str, str], dict[str, dict[str, int]]]:
    """The placements hash as read (node -> its value's text, each readable): the nodes placed
    whole (node -> job) and the nodes shared (node -> job -> units)."""
    whole: dict[str, str] = {}
    shares: dict[str, dict[str, int]] = {}
    for node, text in texts.items():
        placed = read_placement(text)
        if isinstance(placed, str):
            whole[node] = placed
        elif placed is not None:
            shares[node] = placed
    return whole, shares


def placement_texts(whole: Mapping[str, str], shares: Mapping[str, Shares]) -> dict[str, str]:
    """What split_placements reads back: the placements hash's values."""
    return {**whole, **{node: share_text(held) for node, held in shares.items() if held}}
