"""What keeps the jobs on this node apart, checked at start: the node's job cgroups
(`node_cgroups`: the controllers it has, what earlier agents' jobs left ended) and a private
/dev/shm (`node_space`). Each job's own parts are runtime/joblimits.py's (docs/isolation.md).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
from pathlib import Path

from nodeagent.config.identity import WorkerUser
from nodeagent.config.settings import NodeSettings
from nodeagent.errors import ConfigError
from nodeagent.supervisor.asuser import run_as
from nodeagent.supervisor.devices import probe
from nodeagent.supervisor.jobcgroup import (
    CONTROLLERS,
    UNIFIED,
    JobCgroupError,
    Layout,
    read_layout,
    settle,
    sweep,
)
from nodeagent.supervisor.jobspace import JobSpace, JobSpaceError, probe_space

log = logging.getLogger(__name__)
# A limit file each controller has, in v2 and v1 (written back as read: the probe of a node)
_PROBED = {
    "memory": ("memory.max", "memory.limit_in_bytes"),
    "pids": ("pids.max", "pids.max"),
    "cpu": ("cpu.weight", "cpu.shares"),
    "cpuset": ("cpuset.cpus", "cpuset.cpus"),
}
_UNIT = (
    "under systemd, the shipped unit gives it (Delegate=yes, ProtectControlGroups=no); a "
    "kernel without a controller needs it enabled (cgroup_enable=memory, say)"
)


def node_cgroups(config: NodeSettings) -> Layout | None:
    """Where this node's job cgroups go, checked by making one: None where it makes none
    (isolation.cgroups: off and no device program). What earlier agents of this node left in
    job cgroups is ended here.

    Raises:
        ConfigError: the node lacks what `isolation.cgroups: required` or
            `health.constrain_devices` needs (exit 78: a restart cannot fix it).
    """
    isolation = config.isolation
    devices = config.health.constrain_devices
    if not isolation.on and not devices:
        return None
    wanted = CONTROLLERS if isolation.on else ()
    try:
        layout = read_layout(wanted)
        settle(layout)
    except JobCgroupError as exc:
        raise ConfigError(
            "isolation.cgroups",
            f"this node cannot keep its jobs apart: {exc.strerror}; {_UNIT}; or set "
            "isolation.cgroups: off",
        ) from None
    lacking = {name: "not mounted" for name in layout.missing()} if isolation.on else {}
    lacking.update(_unwritable(layout, config.node.name))
    if layout.unified is None and isolation.on:
        lacking[UNIFIED] = "no cgroup v2 hierarchy holds the agent"
    if lacking and isolation.cgroups == "required" and set(lacking) - _soft(layout):
        said = "; ".join(f"{name}: {why}" for name, why in sorted(lacking.items()))
        raise ConfigError(
            "isolation.cgroups",
            f"this node cannot limit its jobs' {', '.join(sorted(lacking))} ({said}); {_UNIT};"
            " or set isolation.cgroups: available to run with what it has",
        )
    if lacking:
        log.warning(
            "isolation.cgroups: available: jobs on this node are not limited in %s (%s)",
            ", ".join(sorted(lacking)),
            "; ".join(f"{name}: {why}" for name, why in sorted(lacking.items())),
        )
        layout = layout.without(lacking)
        if not layout.parents:
            return None
    if devices:
        _probe_devices(layout, config.node.name)
    killed = sweep(layout, config.node.name, config.job.id if config.job is not None else None)
    if killed:
        log.warning("ended %d processes an earlier agent's jobs left in their cgroups", killed)
    return layout


def _soft(layout: Layout) -> set[str]:
    """What `required` does without: on a v1/v2 hybrid, the v1 cpuset, which systemd never
    delegates (a unit stays in its root); jobs there share CPUs by weight, each worker started
    on its GPUs' CPUs."""
    hybrid = any(parent != layout.unified for parent in layout.parents)
    return {"cpuset"} if hybrid else set()


def _unwritable(layout: Layout, node: str) -> dict[str, str]:
    """The controllers of `layout` whose limits a job cgroup cannot be given here, and why: a
    trial cgroup made below each parent, each controller's limit file written back as read."""
    found: dict[str, str] = {}
    for parent, controllers in layout.parents.items():
        trial = parent / f"probe-{node}.{os.getpid()}"
        names = {*controllers, *((UNIFIED,) if parent == layout.unified else ())}
        try:
            trial.mkdir()
        except OSError as exc:
            found.update({name: f"cannot make {trial}: {exc.strerror}" for name in names})
            continue
        try:
            for name in controllers:
                file = trial / _PROBED[name][0 if parent == layout.unified else 1]
                try:
                    file.write_text(file.read_text())
                except OSError as exc:
                    found[name] = f"cannot write {file}: {exc.strerror}"
        finally:
            with contextlib.suppress(OSError):
                trial.rmdir()
    return found


def _probe_devices(layout: Layout, node: str) -> None:
    if layout.unified is None:
        raise ConfigError(
            "health.constrain_devices",
            "this node cannot confine workers to their GPUs' device nodes: no cgroup v2 "
            "hierarchy holds the agent; or set it false",
        )
    try:
        probe(layout.unified, node)
    except OSError as exc:
        raise ConfigError(
            "health.constrain_devices",
            f"this node cannot confine workers to their GPUs' device nodes: {exc.strerror or exc}."
            " It needs cgroup v2 with the agent's cgroup writable and CAP_BPF with CAP_NET_ADMIN:"
            " under systemd, the drop-in docs/gpu.md gives (Delegate=yes,"
            " ProtectControlGroups=no); or set it false",
        ) from None


_SPACE = (
    "it needs unprivileged user namespaces (Debian: sysctl kernel.unprivileged_userns_clone=1, "
    "and user.max_user_namespaces above 0) and, under systemd, the shipped unit's "
    "RestrictNamespaces= and SystemCallFilter= (they allow user and mount namespaces)"
)


def node_space(config: NodeSettings) -> None:
    """Check that this node can give a job's workers a /dev/shm of their own (isolation.shm:
    private), by giving one to a trial process as `nobody`. Nothing to check where the agent
    does not switch users (not root: its jobs run as itself) or has no `nobody`.

    Raises:
        ConfigError: it cannot (exit 78: a restart cannot fix it).
    """
    if config.isolation.shm != "private" or os.geteuid() != 0:
        return
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        log.warning("isolation.shm: no user nobody here to check private /dev/shm with")
        return
    user = WorkerUser("nobody", nobody.pw_uid, nobody.pw_gid, (), switch=True)
    try:
        probe_space(JobSpace(config.node.name, "probe", user, remove_as_user=remove_as))
    except JobSpaceError as exc:
        raise ConfigError(
            "isolation.shm",
            f"this node cannot give each job a /dev/shm of its own: {exc.strerror}; {_SPACE};"
            " or set isolation.shm: shared",
        ) from None


def remove_as(user: WorkerUser, path: Path) -> None:
    """Remove `path` as `user` (the agent, without CAP_DAC_OVERRIDE, cannot empty the user's
    0700 directory).

    Raises:
        OSError: it could not (what rm said).
    """
    argv = ["rm", "-rf", "--one-file-system", "--", str(path)]
    code, said = run_as(user, argv, b"", most=4096)
    if code != 0:
        raise OSError(f"rm exited {code}: {said.decode(errors='replace').strip()}")
