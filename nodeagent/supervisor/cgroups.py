"""Killing a worker by its container's cgroup: what a container runtime starts escapes its
process group.

`podman run` asks the node's podman service to start the container (supervisor/container.py);
conmon and the container's processes are the service's, not the agent's children, and not in
the worker's process group: SIGKILL to the `podman run` process (what the fence keeper,
PR_SET_PDEATHSIG and a stop's deadline do to a worker's process group) leaves the container
running. So each worker's `podman run` writes its container's id to a file the agent names (its
cidfile), and fencing it kills every process of that container's cgroup: `cgroup.kill` on cgroup
v2 where the cgroup tree is writable, then SIGKILL to each process listed in `cgroup.procs` of
every hierarchy mounted, round after round until none is left. Reading `cgroup.procs` and
signalling are all that takes: it works under systemd's ProtectControlGroups= (a read-only
/sys/fs/cgroup), which is why the agent needs nothing of the cgroup tree but to read it.

Where the container's cgroup is follows from its id alone: podman puts it below the parent the
agent names (`--cgroup-parent`, `parent_flag`): `nodeagent/libpod-<id>` with podman's cgroupfs
manager, `nodeagent.slice/libpod-<id>.scope` with its systemd one. The runtime removes it when
the container exits. A cidfile is read only if nobody but the agent could have written it
(`container_id`), and names are checked (`check_name`): a cidfile or a record read back can only
lead to a podman container's cgroup below those parents, never another service's.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import stat
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
PARENT = "nodeagent"  # cgroupfs: /nodeagent; systemd: nodeagent.slice
CIDFILE_SUFFIX = ".cid"
KILL_ROUNDS = 100  # a tree that forks faster than it dies is still killed by cgroup.kill
_ID = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(
    rf"^(?:{PARENT}/libpod-[0-9a-f]{{64}}|{PARENT}\.slice/libpod-[0-9a-f]{{64}}\.scope)$"
)


class CgroupNameError(ValueError):
    """Not a cgroup or a cidfile of the agent's workers."""


def check_name(name: str) -> str:
    """`name`, if it is the cgroup of a container the agent started (`container_names`)."""
    if not _NAME.match(name):
        raise CgroupNameError(
            f"not a worker container's cgroup: {name!r} (expected {PARENT}/libpod-<id> or "
            f"{PARENT}.slice/libpod-<id>.scope, <id> 64 hex digits)"
        )
    return name


def parent_flag(manager: str) -> str:
    """podman's `--cgroup-parent` for its cgroup manager (`podman info`'s Host.CgroupManager):
    a slice for systemd's, a path for cgroupfs."""
    return f"{PARENT}.slice" if manager == "systemd" else f"/{PARENT}"


def container_names(container_id: str) -> tuple[str, str]:
    """Where a container with this id has its cgroup (cgroupfs manager, systemd manager)."""
    return f"{PARENT}/libpod-{container_id}", f"{PARENT}.slice/libpod-{container_id}.scope"


def check_cidfile(path: str) -> str:
    """`path`, if it is a cidfile as the agent names them: absolute, `<name>.cid`, no `..`."""
    parts = path.split("/")
    if not path.startswith("/") or not path.endswith(CIDFILE_SUFFIX) or ".." in parts:
        raise CgroupNameError(
            f"not a worker's cidfile: {path!r} (expected an absolute path ending {CIDFILE_SUFFIX})"
        )
    return path


def container_id(cidfile: str) -> str | None:
    """The container id `podman run --cidfile` wrote (None: none yet, or not an id).

    Only a file nobody but the agent could have put there is read: a regular file of the
    agent's (never through a link, never blocking on a FIFO), in a directory of the agent's
    that only it may write, under another such directory (memory_dir). A leftovers record
    outlives a reboot, /dev/shm does not: a user who made memory_dir first must not steer the
    record's kill at another job's container, nor hang the agent's start."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(cidfile, flags)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            return None
        directory = os.path.dirname(cidfile)
        if not (_agents_own(directory) and _agents_own(os.path.dirname(directory))):
            return None
        text = os.read(fd, 128).decode(errors="replace").strip()
    except OSError:
        return None
    finally:
        os.close(fd)
    return text if _ID.match(text) else None


def _agents_own(directory: str) -> bool:
    """A real directory (not a link) of the agent's that no one else may write."""
    try:
        info = os.lstat(directory)
    except OSError:
        return False
    return (
        stat.S_ISDIR(info.st_mode)
        and info.st_uid == os.geteuid()
        and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


def container_cgroup(cidfile: str, root: Path = ROOT) -> str | None:
    """The cgroup of the container `cidfile` names, if it exists (None: not created or started
    yet, or gone)."""
    found = container_id(cidfile)
    if found is None:
        return None
    bases = hierarchies(root)
    for name in container_names(found):
        if any((base / name).is_dir() for base in bases):
            return name
    return None


def kill_container(cidfile: str, root: Path = ROOT) -> bool:
    """SIGKILL everything in the container `cidfile` names; True if anything was killed."""
    name = container_cgroup(cidfile, root)
    return name is not None and kill(name, root)


def container_alive(cidfile: str, root: Path = ROOT) -> bool:
    """Whether a process that is not a zombie is left in the container `cidfile` names."""
    name = container_cgroup(cidfile, root)
    return name is not None and alive(name, root)


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
    (podman: the container's init, then the worker). None until it runs.
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
