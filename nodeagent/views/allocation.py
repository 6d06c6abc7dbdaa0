"""An allocation (nodeagentctl alloc, as salloc; POST /v1/allocations), pure: the spec the
pool admits (`allocation_doc`: a job of kind allocation, one holder a node in place of a
program), and what a shell in it is told of it (`allocation_env`: its id, its nodes and the
GPUs each gave it, a master address for a torchrun started by hand, and the `SLURM_*` names a
Slurm user's scripts read) (docs/interactive.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from nodeagent.errors import UsageError
from nodeagent.model.pool import PoolNode
from nodeagent.model.spec import ALLOCATION

MASTER_PORT = "29500"  # torchrun's own default, where the record names none
HOLDER = ("sleep", "infinity")  # each node's worker: the allocation's processes hold it
# What an allocation is: one holder a node, handed no GPU of its own (the commands run in it
# use the node's grant), never restarted in place of another.
FIXED: Mapping[str, object] = {
    "kind": ALLOCATION,
    "entrypoint": list(HOLDER),
    "nproc_per_node": 1,
    "gpus_per_worker": 0,
    "max_restarts": 0,
}
# What its submitter says of it: the spec keys of its shape and of its place in the pool.
SHAPE = (
    "id", "min_nodes", "max_nodes", "target_nodes", "gpus_per_node", "exclusive", "mem",
    "mem_per_gpu", "cpus_per_gpu", "queue", "priority", "time_limit", "selector", "name",
    "user", "group", "preemptible", "dependency", "notify", "working_dir", "env",
)  # fmt: skip


def allocation_doc(given: Mapping[str, object]) -> dict[str, object]:
    """The spec document of an allocation of `given`'s shape.

    Raises:
        UsageError: `given` names a key an allocation does not take.
    """
    extra = sorted(set(given) - set(SHAPE))
    if extra:
        raise UsageError(
            f"an allocation does not take {', '.join(extra)} (its nodes hold it with a "
            f"holder of the pool's); it takes {', '.join(SHAPE)}"
        )
    return {**given, **FIXED}


def node_gpus(
    job_id: str, nodes: Mapping[str, PoolNode], members: Sequence[str]
) -> dict[str, list[str]]:
    """The GPU units each member gave `job_id`, as the nodes report them (each unit with the
    job holding it: its grant, or every unit of a node it holds whole)."""
    found = {name: nodes[name].gpus if name in nodes else () for name in members}
    return {name: [u.uuid for u in units if u.job == job_id] for name, units in found.items()}


def allocation_env(
    job_id: str,
    pool: str,
    queue: str,
    members: Sequence[str],
    master: str | None,
    gpus: Mapping[str, Sequence[str]],
) -> dict[str, str]:
    """The variables of a shell (or command) run in the allocation."""
    nodes = ",".join(members)
    host, _, port = (master or "").rpartition(":")
    counts = {len(gpus.get(name, ())) for name in members}
    env = {
        "NODEAGENT_JOB_ID": job_id,
        "NODEAGENT_POOL": pool,
        "NODEAGENT_NODELIST": nodes,
        "NODEAGENT_NNODES": str(len(members)),
        "NODEAGENT_GPUS": " ".join(f"{n}={','.join(gpus.get(n, ()))}" for n in members),
        "MASTER_ADDR": host or (members[0] if members else ""),
        "MASTER_PORT": port or MASTER_PORT,
        "SLURM_JOB_ID": job_id,
        "SLURM_JOBID": job_id,
        "SLURM_JOB_NODELIST": nodes,
        "SLURM_NODELIST": nodes,
        "SLURM_JOB_NUM_NODES": str(len(members)),
        "SLURM_NNODES": str(len(members)),
        "SLURM_JOB_PARTITION": queue,
    }
    if len(counts) == 1 and 0 not in counts:  # the same on every node, as Slurm says it
        env["SLURM_GPUS_PER_NODE"] = str(counts.pop())
    return env
