"""Real slowness for the slow-node tests and bench: the kernel's CPU controller caps a node's
worker processes at a share of one CPU (cgroup v1 `cpu.cfs_quota_us`, or v2 `cpu.max`,
whichever this machine mounts). Never a flag in the training script.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import psutil

V1 = Path("/sys/fs/cgroup/cpu")
V2 = Path("/sys/fs/cgroup")
PERIOD_US = 100_000


def available() -> str | None:
    """Why processes cannot be throttled here (None: they can)."""
    if os.geteuid() != 0:
        return "moving processes between cgroups needs root"
    if (V1 / "cpu.cfs_quota_us").exists():
        return None
    controllers = V2 / "cgroup.controllers"
    if controllers.exists() and "cpu" in controllers.read_text().split():
        return None
    return "no cgroup CPU controller is mounted (v1 cpu, or v2 with cpu)"


def _tree(pids: Iterable[int]) -> list[int]:
    found = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            found += [proc.pid, *(c.pid for c in proc.children(recursive=True))]
        except psutil.Error:
            continue
    return found


@contextlib.contextmanager
def throttled(name: str, pids: Iterable[int], share: float) -> Iterator[Path]:
    """The processes `pids` and their children capped at `share` of one CPU (0.25: a quarter)
    until the block ends; the cgroup made for them, removed after."""
    if (V1 / "cpu.cfs_quota_us").exists():
        group, root = V1 / name, V1
        group.mkdir(exist_ok=True)
        (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (group / "cpu.cfs_quota_us").write_text(str(int(PERIOD_US * share)))
    else:
        group, root = V2 / name, V2
        control = V2 / "cgroup.subtree_control"
        if "cpu" not in control.read_text().split():
            control.write_text("+cpu")
        group.mkdir(exist_ok=True)
        (group / "cpu.max").write_text(f"{int(PERIOD_US * share)} {PERIOD_US}")
    moved = _tree(pids)
    try:
        for pid in moved:
            with contextlib.suppress(ProcessLookupError, OSError):
                (group / "cgroup.procs").write_text(str(pid))
        yield group
    finally:
        for left in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError, OSError):
                (root / "cgroup.procs").write_text(left)
        group.rmdir()
