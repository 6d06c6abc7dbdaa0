"""cordon, drain and uncordon of one of the pool's nodes: one body for nodeagentctl (pool.auth
none, cli/ctl/cordons.py) and for the pool leader taking signed requests (pool/requests.py).

A node the pool placed leaves its job when it is drained: the pool leader unplaces it. A node
pinned to a job by its config's `job:` section is not the pool's to place, so the pool's cordon
alone would leave it training (issue 62: `drain n2` said "drained" and n2 trained on). Its
drain is therefore also a drain in that job, as `--job JOB drain NODE` is (its workers get the
stop grace and checkpoint, the job re-forms without it), and its uncordon lifts that too.
"""

from __future__ import annotations

from dataclasses import dataclass

from nodeagent.coord.pool import PoolStore
from nodeagent.coord.store import JobStore
from nodeagent.model.job import Cordon

ACTIONS = ("cordon", "drain", "uncordon")


@dataclass(frozen=True)
class Done:
    """What an action did: `changed` (false only for an uncordon of a node with no cordon),
    and the job the node is pinned to, where it was drained or uncordoned too."""

    changed: bool
    pinned: str | None = None

    def said(self, node: str, action: str, where: str) -> str:
        """What the faces say, `where` after the verb (" in pool P", " by alice")."""
        if action == "uncordon" and not self.changed:
            return f"node {node}: was not cordoned"
        done = {"cordon": "cordoned", "drain": "drained", "uncordon": "uncordoned"}[action]
        also = ""
        if self.pinned is not None and action != "cordon":
            also = f", and in job {self.pinned}, which its job: section pins it to"
        return f"node {node}: {done}{where}{also}"


def apply(store: PoolStore, node: str, action: str, reason: str, by: str) -> Done:
    """Cordon, drain or uncordon `node` in the pool (and, pinned, in its job). The caller has
    checked that the node is the pool's and that `action` is one of ACTIONS."""
    report = store.report(node)
    pinned = report.pinned if report is not None else None
    jobs = JobStore(store.client, store.keys.job(pinned)) if pinned is not None else None
    if action == "uncordon":
        lifted = store.uncordon(node, by)
        if jobs is not None and node in jobs.cordons():
            lifted = jobs.uncordon(node, by) or lifted
        return Done(lifted, pinned)
    cordon = Cordon(reason=reason, by=by, drain=action == "drain")
    store.cordon(node, cordon)
    if jobs is not None and cordon.drain:
        jobs.cordon(node, cordon)
    return Done(True, pinned)
