"""What this node acts on, checked against what it knows itself. Decided here, read by the store.

A RUNNING record is acted on only once its MASTER_ADDR is the address its rank-0 member
published (that member holding a live lease and having acknowledged the generation); until then
this node sees it as RESTARTING, so it acknowledges it and waits (READY, which the leader does
not take for a node gone), starting nothing. A record whose nproc_per_node differs from this
node's configuration is reported (supervisor/spec.py starts the configured number regardless).
A record that contradicts its rank-0 member is forged: garbage, never acted on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from nodeagent.coord.replies import NodeLease, Snapshot, master_problem
from nodeagent.errors import CoordinationError
from nodeagent.model.garbage import Garbage
from nodeagent.model.job import JobRecord
from nodeagent.state import JobState

log = logging.getLogger(__name__)
# One node's lease and report, read when the snapshot holds none (a follower's); garbage found
# reading it is added to the list. Raises CoordinationError when Redis cannot answer.
LeaseReader = Callable[[str, Snapshot, list[Garbage]], NodeLease | None]


class RecordCheck:
    """The snapshot with what this node must not act on taken out (see the module doc); called by
    the store (JobStore.check) before the garbage it finds is reported."""

    def __init__(self, record_key: str, local_nproc: int | None, read_lease: LeaseReader) -> None:
        self._record_key = record_key
        self._local_nproc = local_nproc
        self._read_lease = read_lease
        self._verified: tuple[object, ...] | None = None  # the last RUNNING record verified
        self._waiting: tuple[object, ...] | None = None  # the last one that could not be

    def __call__(self, snapshot: Snapshot, me: str) -> Snapshot:
        record = snapshot.record
        if record is None:
            return snapshot
        found: list[Garbage] = []
        if self._local_nproc is not None and record.nproc_per_node != self._local_nproc:
            found.append(
                Garbage(
                    "job",
                    self._record_key,
                    f"record: nproc_per_node {record.nproc_per_node} is not this node's "
                    f"{self._local_nproc} (job.nproc_per_node)",
                    "this node starts its configured number of workers",
                )
            )
        if record.state is JobState.RUNNING and not self._master_verified(
            record, snapshot, me, found
        ):
            snapshot = replace(snapshot, record=replace(record, state=JobState.RESTARTING))
        return replace(snapshot, garbage=(*snapshot.garbage, *found)) if found else snapshot

    def _master_verified(
        self, record: JobRecord, snapshot: Snapshot, me: str, found: list[Garbage]
    ) -> bool:
        ident = (record.generation, record.members[:1], record.master_addr, record.master_port)
        if ident == self._verified:
            return True
        master = record.members[0] if record.members else ""
        if snapshot.leader_name == me:
            lease = snapshot.lease(master)
        else:
            try:
                lease = self._read_lease(master, snapshot, found)
            except CoordinationError as exc:  # cannot tell now: try again at the next sync
                log.info("cannot verify the master of generation %d yet: %s", ident[0], exc)
                return False
        problem, forged = master_problem(record, lease, snapshot.now_ms)
        if not problem:
            self._verified = ident
            return True
        what = f"record of generation {record.generation}: {problem}"
        if forged:  # not a record a leader wrote: garbage (the leader rewrites it)
            found.append(Garbage("job", self._record_key, what, "not acted on"))
        elif ident != self._waiting:  # a member lost or restarting: the leader re-forms
            log.info("not starting workers yet: %s", what)
        self._waiting = ident
        return False
