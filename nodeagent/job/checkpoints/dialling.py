"""Which peers a node's share has it dial: only the listeners the job's nodes report.

A node's share (model/handout.py) names, for each peer it copies to or fetches from, that
peer's address; the leader writes it, but so can whoever holds the agents' Redis password. The
node dials only an address that is that node's own listener as its report in this job says
(replication.reported_listeners; not the record's members: the record a node reads names only
some of them); another is ignored and said once in the log. (The listener there would also
have to prove it is an agent before a byte is sent: checkpoint/peerauth.py.)
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from nodeagent.coord.bounded import CallRunner
from nodeagent.errors import CoordinationError
from nodeagent.job.checkpoints import replication
from nodeagent.model.handout import Handout
from nodeagent.model.job import NodeReport

log = logging.getLogger(__name__)
REMEMBERED = 1024  # ignored addresses said once each; past this many, forgotten


class PeerReports(Protocol):
    """What the copies read of the job's state (JobPort has it)."""

    def peer_reports(self, names: Sequence[str]) -> dict[str, NodeReport]:
        """The reports of the nodes named whose lease holds. Raises: CoordinationError."""


class CopyReads(PeerReports, Protocol):
    """What the copies read of the job's state (JobPort has it). Each may raise
    CoordinationError."""

    def handout(self, name: str) -> Handout | None:
        """Node `name`'s share of the copies (None: none written)."""


class Dialling:
    """The addresses of a share this node may dial (the module docstring)."""

    def __init__(self, store: PeerReports, call: CallRunner) -> None:
        self._store = store
        self._call = call
        self._said: set[tuple[str, str]] = set()

    def addresses(self, share: Handout) -> dict[str, str]:
        """Node -> address for the peers of `share` whose own reports (nodes of this job whose
        lease holds) name that listener; none where the reports cannot be read (the copies
        wait for the next read)."""
        given = share.address_map
        try:
            reports = self._call(
                lambda: self._store.peer_reports(sorted(given)), "read the peers' reports"
            )
        except CoordinationError as exc:
            log.info("cannot read the peers' reports to check this node's share: %s", exc)
            return {}
        kept = replication.reported_listeners(given, reports)
        for name in sorted(set(given) - set(kept)):
            if (name, given[name]) in self._said:
                continue
            if len(self._said) >= REMEMBERED:
                self._said.clear()
            self._said.add((name, given[name]))
            report = reports.get(name)
            said = report.tier.address if report is not None and report.tier else None
            log.warning(
                "checkpoint copies: ignoring %s at %s in this node's share: not the listener "
                "a member of the job reports (%s)",
                name,
                given[name],
                f"it reports {said}" if said else "no report of it with a listener",
            )
        return kept
