"""A cgroup of its own for each agent a test starts, as systemd's `Delegate=yes` gives the unit
one: made by the test (as full root) in every hierarchy the agent makes job cgroups in, the
agent moved into it before it drops to the unit's capabilities (tests/helpers/unitcaps.py).
Its v1 cpuset too, which systemd never delegates on a hybrid: here the agent's job cgroups get
real cpusets, as on a cgroup v2 node whose unit has them delegated.

The agent under its unit, without CAP_DAC_OVERRIDE, cannot make a cgroup in a hierarchy's root
(mode 0555): on a node it makes its jobs' below its own unit's, which systemd hands it; here
below the one this makes. What is left in them when the session ends (an agent killed with its
jobs' cgroups) is ended then (`remove_all`).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from nodeagent.supervisor.jobcgroup import CONTROLLERS, JobCgroupError, end, read_layout

_MADE: list[Path] = []
_UNITS: dict[tuple[str, str], list[Path]] = {}  # (node, test directory) -> its unit's cgroups
PREFIX = "nodeagent-unit-"


def unit_cgroups(name: str, directory: Path) -> list[Path]:
    """The cgroup of agent `name` of the test in `directory` below this process's own, in each
    hierarchy that holds a controller the agent limits jobs with, and in the unified one (none
    where not root): made at its first start, the same at each start after, as systemd's of a
    unit restarted."""
    if os.geteuid() != 0:
        return []
    known = _UNITS.get((name, str(directory)))
    if known is not None:
        return known
    try:
        layout = read_layout(CONTROLLERS)
    except JobCgroupError:
        return []
    tag = f"{PREFIX}{os.getpid()}-{name}-{uuid.uuid4().hex[:6]}"
    made = []
    for parent in layout.parents:
        path = parent / tag
        try:
            path.mkdir()
        except OSError:
            continue  # a read-only hierarchy: the agent says so itself
        _MADE.append(path)
        made.append(path)
        if "cpuset" in layout.parents[parent] and parent != layout.unified:
            for file in ("cpuset.cpus", "cpuset.mems"):  # a v1 cpuset starts with neither
                (path / file).write_text((parent / file).read_text())
    _UNITS[(name, str(directory))] = made
    return made


def enter(paths: list[Path]) -> list[str]:
    """A command prefix that moves what follows into each of `paths` (as root, before setpriv)."""
    if not paths:
        return []
    script = (
        'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1/cgroup.procs" || exit 1; '
        'shift; n=$((n-1)); done; exec "$@"'
    )
    return ["sh", "-c", script, "unit-cgroup", str(len(paths)), *map(str, paths)]


def cgroup_file(pid: int, controller: str, name: str) -> str:
    """A file of `pid`'s cgroup in `controller`'s hierarchy (v1 here, else the unified one)."""
    lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    v1 = [line.split(":", 2)[2] for line in lines if controller in line.split(":")[1].split(",")]
    if v1:
        return (Path("/sys/fs/cgroup") / controller / v1[0].lstrip("/") / name).read_text()
    v2 = next(line[3:] for line in lines if line.startswith("0::"))
    return (Path("/sys/fs/cgroup") / v2.lstrip("/") / name).read_text()


def remove_all() -> None:
    """End every cgroup this process made, and what is left in them."""
    _UNITS.clear()
    while _MADE:
        end([_MADE.pop()], within=5.0)
