"""What a wait after a change waits for, decided from one read (`nodeagentctl ... --wait`,
cli/ctl/wait.py, which polls and says): a job's end and its exit code, a job running every
rank, a job at a new size, a node out of its job, a node serving nothing; and which request an
event of the pool's stream answers (the pool leader writes one with every reply: what wakes
nodeagentctl and the API service waiting for an answer). Pure: the faces poll or follow; the
conditions are here once."""

from __future__ import annotations

from collections.abc import Mapping

from nodeagent.coord.pool import PoolSnapshot
from nodeagent.coord.store import Snapshot
from nodeagent.model.job import JobRecord
from nodeagent.model.pool import PoolJob, PoolJobState
from nodeagent.state import JobState, NodeState
from nodeagent.views.documents import decode
from nodeagent.views.status import status_document


def answered_request(entry_id: str, fields: Mapping[str, str]) -> str | None:
    """The request an entry of the pool's event stream answers, if it answers one."""
    event, _ = decode(entry_id, fields)
    data = event.data if isinstance(event.data, Mapping) else {}
    request_id = data.get("request")
    return request_id if isinstance(request_id, str) else None


def exit_code(status: PoolJob) -> int:
    """An ended job's exit code as `sbatch --wait` gives it: 0 if it succeeded, else its
    failing rank's, or 1."""
    return 0 if status.state is PoolJobState.SUCCEEDED else (status.exit_code or 1)


def every_rank_running(snapshot: Snapshot) -> JobRecord | None:
    """The job's record once it runs and every member's worker runs (None: not yet)."""
    record = snapshot.record
    if record is None or record.state is not JobState.RUNNING:
        return None
    states = {
        lease.name: lease.report.state for lease in snapshot.leases if lease.report is not None
    }
    running = all(states.get(m) is NodeState.RUNNING for m in record.members)
    return record if running else None


def runs_on(record: JobRecord | None, nodes: int) -> bool:
    """The job runs on `nodes` nodes, its target."""
    return (
        record is not None
        and record.state is JobState.RUNNING
        and record.target_nodes == nodes
        and len(record.members) == nodes
    )


def out_of_its_job(snapshot: Snapshot, job: str, name: str) -> bool:
    """Node `name`'s workers have stopped and the job went on without it. Its agent
    acknowledges the generation that leaves it out only once it persisted and handed over its
    workers' last save (docs/checkpoints.md): a rolling upgrade that restarts the agent as
    soon as this holds cuts neither short."""
    nodes = {n["name"]: n for n in status_document(snapshot, job)["nodes"]}
    node = nodes.get(name)
    if node is None:
        return True
    record = snapshot.record
    went_on = (
        record is None
        or record.state.terminal
        or (record.state is not JobState.RESTARTING and name not in record.members)
    )
    stopped = not any(w["state"] in ("running", "stopping") for w in node["workers"])
    return went_on and node["state"] in ("cordoned", "lost") and stopped


def serves_nothing(snap: PoolSnapshot, name: str) -> bool:
    """Node `name` is off every job of the pool: no placement, no share, none it reports."""
    report = snap.nodes.get(name)
    serving = report is not None and (report.serving is not None or report.sharing)
    return name not in snap.placements and name not in snap.shares and not serving
