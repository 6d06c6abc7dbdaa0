"""A job's cgroup on this node: where its bare workers run, what they may use, what an OOM
inside it did, and the end of everything in it when the job leaves the node.

Each job's workers on a node run in a cgroup of their own below the agent's (`job-<node>.<job>`),
with the job's limits written in it (model/resources.py): memory and swap, processes, CPU
weight, and the cores it holds of its own (`cpuset.cpus`, model/cores.py). The kernel's OOM
killer then acts inside the job's cgroup only: the job that went over its limit loses a
process, never a neighbour (and on cgroup v2 the whole job on the node goes,
`memory.oom.group`, as Kubernetes does for a container). The agent reads the cgroup's OOM kill
count to name a worker's death for what it was (`oom_kills`).

Which hierarchy holds each controller is the node's: on cgroup v2 (Debian 12) all of them, in
the unified hierarchy; on a v1/v2 hybrid, memory, pids, cpu and cpuset in their v1
hierarchies, and the job's v2 cgroup (its device program, its `cgroup.kill`) in the unified
one. `locate` reads that from /proc/self/cgroup and mountinfo; a job's cgroup is one directory
in each.

On cgroup v2 a cgroup whose children have controllers enabled may hold no process of its own,
so the agent moves itself into a leaf, `agent`, below its own cgroup first (`settle`), as
systemd's delegation asks of a delegated unit; its children (the fence keeper, the serving
process) start there, bounded by the leaf's own `pids.max` (the unit sets no TasksMax=, which
would count every job's threads together).

A worker enters the job's cgroups in the child between fork and exec, after the switch to the
job's user, by writing "0" to each `cgroup.procs` the agent opened: the kernel judges the write
by the opener's credentials (Linux 5.16 on), and the descriptors are close-on-exec, so no line
of the worker's code runs outside its cgroup and the worker never holds them.

At the job's end on the node, everything in its cgroup is killed (`cgroup.kill` on v2, then
SIGKILL to each process left in any hierarchy), however it detached (setsid, a double fork, a
daemon it started), and the cgroup goes. At the agent's start, what an earlier agent of this
node left is ended the same way (`sweep`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from nodeagent.model.resources import Limits, cpu_shares

log = logging.getLogger(__name__)
CONTROLLERS = ("memory", "pids", "cpu", "cpuset")
UNIFIED = "cgroup v2"  # what `without` drops to leave out the unified hierarchy itself
PREFIX = "job-"  # a job's cgroup below the agent's
AGENT_LEAF = "agent"  # the agent itself, on cgroup v2 with controllers (settle)
AGENT_PIDS_MAX = 4096  # its leaf's pids.max: the agent's threads and helpers, never a job's
KILL_ROUNDS = 100
REMOVE_WITHIN_S = 2.0  # what a kill left dying: waited for this long, else the next start's
_ATTEMPTS = 16  # names fresh() tries: `job-<node>.<job>`, then `+1`...


class JobCgroupError(OSError):
    """A job's cgroup cannot be made, limited or entered."""


@dataclass(frozen=True)
class Layout:
    """Where the agent's cgroups are: its directory in the v2 hierarchy (None: none mounted),
    and each directory a job's cgroups go below with the controllers used there (the unified
    one's may be none: its device program and `cgroup.kill` need none)."""

    unified: Path | None
    parents: Mapping[Path, frozenset[str]] = field(default_factory=dict)

    @property
    def controllers(self) -> frozenset[str]:
        return frozenset(c for used in self.parents.values() for c in used)

    def missing(self) -> list[str]:
        return [c for c in CONTROLLERS if c not in self.controllers]

    def without(self, controllers: Iterable[str]) -> Layout:
        """This layout not using `controllers` (a hierarchy left with none goes, but the
        unified one, unless UNIFIED is among them)."""
        dropped = set(controllers)
        unified = None if UNIFIED in dropped else self.unified
        parents = {p: used - dropped for p, used in self.parents.items()}
        kept = {p: used for p, used in parents.items() if used or (p == unified is not None)}
        return Layout(unified, kept)

    def v2(self) -> frozenset[str]:
        """The controllers used through the unified hierarchy."""
        return self.parents.get(self.unified, frozenset()) if self.unified else frozenset()


def locate(
    proc_cgroup: str,
    mountinfo: str,
    v2_controllers: Callable[[Path], Iterable[str]],
    wanted: Iterable[str] = CONTROLLERS,
) -> Layout:
    """The agent's layout, from its /proc/self/cgroup and /proc/self/mountinfo and what the
    unified hierarchy offers at a directory (its `cgroup.controllers`): each of `wanted`
    through v2 where it is offered there, else through its v1 hierarchy, else not at all.

    Raises:
        JobCgroupError: no cgroup hierarchy holds this process.
    """
    where: dict[str, str] = {}  # "" (v2) or a v1 controller -> this process's path
    for line in proc_cgroup.splitlines():
        number, _, rest = line.partition(":")
        names, _, path = rest.partition(":")
        if number == "0" and not names:
            where[""] = path
        for name in names.split(",") if names else ():
            where[name] = path
    mounts: dict[str, Path] = {}  # the same keys -> this process's directory
    for line in mountinfo.splitlines():
        fields, _, after = line.partition(" - ")
        kind, _, rest = after.partition(" ")
        parts = fields.split(" ")
        if kind not in ("cgroup", "cgroup2") or len(parts) < 5:
            continue
        root, point = parts[3], parts[4]
        held = [""] if kind == "cgroup2" else rest.rpartition(" ")[2].split(",")
        for name in held:
            inside = where.get(name)
            if inside is not None and _below(inside, root):
                mounts[name] = Path(point) / inside[len(root.rstrip("/")) :].lstrip("/")
    unified = mounts.get("")
    if unified is None and not any(name in mounts for name in wanted):
        raise JobCgroupError(
            errno.ENOENT, "no cgroup hierarchy holds this process (/proc/self/cgroup, mountinfo)"
        )
    offered = set(v2_controllers(unified)) if unified is not None else set()
    parents: dict[Path, set[str]] = {unified: set()} if unified is not None else {}
    for name in wanted:
        directory = unified if name in offered else mounts.get(name)
        if directory is not None:
            parents.setdefault(directory, set()).add(name)
    return Layout(unified, {p: frozenset(used) for p, used in parents.items()})


def _below(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def read_layout(wanted: Iterable[str] = CONTROLLERS, proc: Path = Path("/proc/self")) -> Layout:
    """This process's layout (`locate`).

    Raises:
        JobCgroupError: no cgroup hierarchy holds it.
    """

    def offered(directory: Path) -> list[str]:
        try:
            return (directory / "cgroup.controllers").read_text().split()
        except OSError:
            return []

    return locate((proc / "cgroup").read_text(), (proc / "mountinfo").read_text(), offered, wanted)


def settle(layout: Layout) -> None:
    """On cgroup v2 with controllers to hand to jobs: every process of the agent's cgroup moved
    into its leaf `agent`, then those controllers enabled for its children.

    Raises:
        JobCgroupError: the kernel refused (naming the file).
    """
    wanted, parent = layout.v2(), layout.unified
    if not wanted or parent is None:
        return
    control = parent / "cgroup.subtree_control"
    leaf = parent / AGENT_LEAF
    try:
        if wanted <= set(control.read_text().split()):
            return
        leaf.mkdir(exist_ok=True)
        for pid in (parent / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError):
                (leaf / "cgroup.procs").write_text(pid)
        control.write_text(" ".join(f"+{name}" for name in sorted(wanted)))
        if "pids" in wanted:  # the unit's TasksMax= is off: the agent's own bound is here
            (leaf / "pids.max").write_text(str(AGENT_PIDS_MAX))
    except OSError as exc:
        raise JobCgroupError(
            exc.errno,
            f"cannot hand {', '.join(sorted(wanted))} to jobs below {parent}: {exc.strerror}",
        ) from None


class JobCgroup:
    """One job's cgroup on this node, in every hierarchy of `layout`, limited to `limits` (None:
    none written: the device program's cgroup alone)."""

    def __init__(self, layout: Layout, node: str, job: str, limits: Limits | None) -> None:
        self.layout = layout
        self.limits = limits
        self.name = f"{PREFIX}{node}.{job}"
        self._paths: dict[Path, Path] = {}  # parent -> the job's cgroup there, once made
        self._procs: list[int] = []
        self._unified_fd = -1

    @property
    def made(self) -> bool:
        return bool(self._paths)

    @property
    def unified(self) -> Path | None:
        """Its directory in the v2 hierarchy, once made."""
        parent = self.layout.unified
        return self._paths.get(parent) if parent is not None else None

    def make(self) -> None:
        """Make it and write its limits (once; nothing when it is made).

        Raises:
            JobCgroupError: the kernel refused a directory or a limit (naming it).
        """
        if self._paths:
            return
        try:
            for parent, controllers in self.layout.parents.items():
                path = self._paths[parent] = fresh(parent / self.name)
                if self.limits is not None:
                    _write_limits(path, controllers, self.limits, parent == self.layout.unified)
                self._procs.append(_open(path / "cgroup.procs", os.O_WRONLY))
            if self.unified is not None:
                self._unified_fd = _open(self.unified, os.O_RDONLY | os.O_DIRECTORY)
        except JobCgroupError:
            self.close()
            raise

    def procs_fds(self) -> tuple[int, ...]:
        """Its `cgroup.procs` in each hierarchy, open for writing (make first)."""
        return tuple(self._procs)

    def enter(self, pid: int) -> None:
        """Move process `pid` into it in each hierarchy (make first): a login of the job's user
        (Spawner.adopt); the kernel judges it by the agent's credentials of when it opened them.

        Raises:
            JobCgroupError: the kernel refused (naming the hierarchy).
        """
        for path, fd in zip(self._paths.values(), self._procs, strict=True):
            try:
                os.write(fd, str(pid).encode())
            except OSError as exc:
                raise JobCgroupError(
                    exc.errno, f"cannot move process {pid} into {path}: {exc.strerror}"
                ) from None

    def unified_fd(self) -> int:
        """Its v2 directory, open (a device program is attached to it).

        Raises:
            JobCgroupError: it has none (not made, or no v2 hierarchy here).
        """
        if self._unified_fd < 0:
            raise JobCgroupError(errno.ENOENT, f"{self.name}: no cgroup v2 directory")
        return self._unified_fd

    def oom_kills(self) -> int:
        """The processes the kernel's OOM killer took in it so far (0: none, or no memory
        controller here)."""
        for parent, controllers in self.layout.parents.items():
            path = self._paths.get(parent)
            if path is None or "memory" not in controllers:
                continue
            name = "memory.events" if parent == self.layout.unified else "memory.oom_control"
            with contextlib.suppress(OSError, ValueError):
                for line in (path / name).read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        return 0

    def pids(self) -> set[int]:
        """Every process in it now, in any hierarchy."""
        return members(self._paths.values())

    def close(self) -> None:
        """The job leaves the node: everything in it killed, its directories removed (what is
        still dying after REMOVE_WITHIN_S is left for the next start's `sweep`)."""
        for fd in (*self._procs, self._unified_fd):
            if fd >= 0:
                os.close(fd)
        self._procs, self._unified_fd = [], -1
        paths = list(self._paths.values())
        self._paths = {}
        if paths:
            end(paths)


def _open(path: Path, flags: int) -> int:
    try:
        return os.open(path, flags | os.O_CLOEXEC)
    except OSError as exc:
        raise JobCgroupError(exc.errno, f"cannot open {path}: {exc.strerror}") from None


def _write_limits(path: Path, controllers: frozenset[str], limits: Limits, v2: bool) -> None:
    """`limits` into the job's cgroup at `path`, in the files of its hierarchy's version."""
    writes: list[tuple[str, str]] = []
    if "memory" in controllers and v2:
        writes += [
            ("memory.max", str(limits.memory)),
            ("memory.swap.max", str(limits.swap)),
            ("memory.oom.group", "1"),
        ]
    elif "memory" in controllers:  # memsw is memory and swap together, and at least memory
        writes += [
            ("memory.limit_in_bytes", str(limits.memory)),
            ("memory.memsw.limit_in_bytes", str(limits.memory + limits.swap)),
        ]
    if "pids" in controllers:
        writes.append(("pids.max", str(limits.pids)))
    if "cpu" in controllers and v2:
        writes.append(("cpu.weight", str(limits.cpu_weight)))
    elif "cpu" in controllers:
        writes.append(("cpu.shares", str(cpu_shares(limits.cpu_weight))))
    own = ",".join(map(str, limits.cpus))
    if "cpuset" in controllers and v2 and own:  # (empty: its parent's)
        writes.append(("cpuset.cpus", own))
    elif "cpuset" in controllers:  # v1 takes no process before it has CPUs and memory nodes
        writes.append(("cpuset.mems", _read(path.parent / "cpuset.mems")))
        writes.append(("cpuset.cpus", own or _read(path.parent / "cpuset.cpus")))
    for name, value in writes:
        try:
            (path / name).write_text(value)
        except FileNotFoundError:
            if name in ("memory.memsw.limit_in_bytes", "memory.swap.max"):
                continue  # no swap accounting (swapaccount=0, no swap): no swap to limit
            raise JobCgroupError(errno.ENOENT, f"cannot limit {path}: no {name}") from None
        except OSError as exc:
            raise JobCgroupError(
                exc.errno, f"cannot write {value} to {path / name}: {exc.strerror}"
            ) from None


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError as exc:
        raise JobCgroupError(exc.errno, f"cannot read {path}: {exc.strerror}") from None


def members(paths: Iterable[Path]) -> set[int]:
    """The processes in these cgroups and below."""
    found: set[int] = set()
    for path in paths:
        for directory, _, _ in os.walk(path):
            with contextlib.suppress(OSError, ValueError):
                found.update(int(p) for p in (Path(directory) / "cgroup.procs").read_text().split())
    return found


def kill(paths: Iterable[Path]) -> int:
    """SIGKILL everything in these cgroups (one job's, in each hierarchy) and below: at once
    through `cgroup.kill` where there is one (v2: a tree that forks faster than it dies is
    killed whole), then each process left, round after round. Returns how many were there."""
    paths = list(paths)
    seen = members(paths)
    for path in paths:
        with contextlib.suppress(OSError):  # v1, or a kernel before 5.14
            (path / "cgroup.kill").write_text("1")
    for _ in range(KILL_ROUNDS):
        left = members(paths)
        if not left:
            break
        seen |= left
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    return len(seen)


def end(paths: Iterable[Path], within: float = REMOVE_WITHIN_S) -> int:
    """Kill everything in these cgroups and remove them (below first), waiting `within`
    seconds at most for the killed to exit. Returns how many processes were killed."""
    paths = [p for p in paths if p.is_dir()]
    killed = kill(paths)
    deadline = time.monotonic() + within
    for path in paths:
        below = sorted((Path(d) for d, _, _ in os.walk(path)), key=lambda d: -len(d.parts))
        for directory in below:
            while True:
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                        log.warning("cannot remove %s yet: %s", directory, exc.strerror)
                        break
                    time.sleep(0.01)
    return killed


def sweep(layout: Layout, node: str, job: str | None = None) -> int:
    """End what earlier agents of `node` left in job cgroups: an agent of one pinned `job`
    only that job's (agents of several nodes, or of several jobs of one node, can share a
    cgroup: two `nodeagent run`s outside systemd, the tests'; CI saw one end another's
    running worker). Returns how many processes were killed."""
    names = (f"{PREFIX}{node}.{job}", f"{PREFIX}{node}.{job}+*") if job else (f"{PREFIX}{node}.*",)
    left = [
        path
        for parent in layout.parents
        for name in names
        for path in parent.glob(name)
        if path.is_dir()
    ]
    return end(left) if left else 0


def fresh(path: Path) -> Path:
    """A new, empty cgroup named `path`, or `path+1`, `path+2`... when what the job left there
    is still dying: one left empty is removed first (its device program, still attached,
    would go on refusing, its limits would be an earlier spec's).

    Raises:
        JobCgroupError: none can be made.
    """
    for attempt in range(_ATTEMPTS):
        candidate = path if attempt == 0 else path.with_name(f"{path.name}+{attempt}")
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            pass
        except OSError as exc:
            raise JobCgroupError(exc.errno, f"cannot make {candidate}: {exc.strerror}") from None
        try:
            candidate.rmdir()
            candidate.mkdir()
            return candidate
        except OSError as exc:
            if exc.errno not in (errno.EBUSY, errno.EEXIST, errno.ENOTEMPTY):
                raise JobCgroupError(
                    exc.errno, f"cannot replace {candidate}, an earlier agent's: {exc.strerror}"
                ) from None
    raise JobCgroupError(errno.EBUSY, f"{path} and {_ATTEMPTS - 1} more are all in use")
