"""Killing a worker by its cgroup: what a container runtime starts escapes its process group.

`podman run` starts the container through conmon, which leaves the caller's session, and the
container's processes are conmon's children: SIGKILL to the `podman run` process (what the fence
keeper, PR_SET_PDEATHSIG and a stop's deadline do to a worker's process group) leaves the
container running. So a containerised worker is started in a cgroup the agent names
(`nodeagent/<job>/<worker>`, podman's `--cgroup-parent`), and fencing it kills every process of
that cgroup and below: `cgroup.kill` on cgroup v2 (Linux 5.14: the kernel kills the whole tree at
once, forks included), then SIGKILL to each process listed in `cgroup.procs` of every hierarchy
mounted (cgroup v1, a v2 `unified` mount beside v1 controllers, or a read-only /sys/fs/cgroup
under systemd's ProtectControlGroups=), round after round until none is left.

Names are checked (`check_name`): a name read back from the leftovers record can only reach
below `nodeagent/`, never another service's cgroup.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
PREFIX = "nodeagent"
KILL_ROUNDS = 100  # a tree that forks faster than it dies is still killed by cgroup.kill
_COMPONENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class CgroupNameError(ValueError):
    """Not a cgroup the agent makes for its workers."""


def check_name(name: str) -> str:
    """`name`, if it is a cgroup of the agent's own: `nodeagent/` and plain components below."""
    parts = name.split("/")
    if len(parts) < 2 or parts[0] != PREFIX or not all(_COMPONENT.match(p) for p in parts[1:]):
        raise CgroupNameError(
            f"not a worker cgroup: {name!r} (expected {PREFIX}/<job>/<worker>: letters, digits "
            "and ._- in each component)"
        )
    return name


def worker_cgroup(job: str, node: str, generation: int, rank: int) -> str:
    """The cgroup a containerised worker is started in: one per spawn (a rank starts once a
    generation), so fencing one worker never reaches a survivor of another generation, nor
    another agent's worker on the same machine."""
    return check_name(f"{PREFIX}/{job}/{node}-g{generation}-rank{rank}")


def hierarchies(root: Path = ROOT) -> list[Path]:
    """Every cgroup hierarchy mounted: `root` itself on a pure v2 machine, else each v1
    controller's directory and the v2 `unified` one."""
    if (root / "cgroup.controllers").exists():
        return [root]
    try:
        entries = sorted(root.iterdir())
    except OSError:
        return []
    return [d for d in entries if (d / "cgroup.procs").exists() and not d.is_symlink()]


def members(name: str, root: Path = ROOT) -> set[int]:
    """The processes in cgroup `name` and below, in any hierarchy."""
    check_name(name)
    found: set[int] = set()
    for base in hierarchies(root):
        for directory, _, _ in os.walk(base / name):
            with contextlib.suppress(OSError, ValueError):
                found.update(int(p) for p in (Path(directory) / "cgroup.procs").read_text().split())
    return found


def kill(name: str, root: Path = ROOT) -> bool:
    """SIGKILL everything in cgroup `name` and below; True if anything was there to kill."""
    check_name(name)
    hit = False
    for base in hierarchies(root):
        with contextlib.suppress(OSError):  # no such cgroup, read-only, or no cgroup.kill (v1)
            (base / name / "cgroup.kill").write_text("1")
            hit = True
    for _ in range(KILL_ROUNDS):
        pids = members(name, root)
        if not pids:
            break
        hit = True
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    return hit


def alive(name: str, root: Path = ROOT) -> bool:
    """Whether a process that is not a zombie is left in cgroup `name` or below."""
    for pid in members(name, root):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if stat[stat.rindex(")") + 2] != "Z":
            return True
    return False


def main_process(
    name: str, depth: int, root: Path = ROOT, proc: Path = Path("/proc")
) -> int | None:
    """The process `depth` generations below the first process of cgroup `name` (the one whose
    parent is outside it), the lowest pid where several are: a runtime's helpers come first
    (podman: conmon, then the container's init, then the worker). None until it runs.
    """
    parents = {pid: _parent(pid, proc) for pid in members(name, root)}
    level = sorted(pid for pid, parent in parents.items() if parent not in parents)
    if len(level) != 1:
        return None
    for _ in range(depth):
        level = sorted(pid for pid, parent in parents.items() if parent in level)
    return level[0] if level else None


def _parent(pid: int, proc: Path) -> int | None:
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def remove(name: str, root: Path = ROOT) -> None:
    """Remove cgroup `name`, what is below it and its parents below `nodeagent/` that are left
    empty, in every hierarchy; a cgroup that still holds a process stays (EBUSY)."""
    check_name(name)
    parts = name.split("/")
    for base in hierarchies(root):
        for directory, _, _ in os.walk(base / name, topdown=False):
            with contextlib.suppress(OSError):
                Path(directory).rmdir()
        for depth in range(len(parts) - 1, 1, -1):
            with contextlib.suppress(OSError):
                (base / "/".join(parts[:depth])).rmdir()
