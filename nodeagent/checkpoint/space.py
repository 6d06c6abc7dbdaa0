"""Whether this node can hold a job's memory tier: checked before the workers start
(`nodeagent config check`, `run`, and a pool node placed on a job)."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import struct
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path

from nodeagent.channel import beneath
from nodeagent.channel.manifests import BadCopy, open_plain
from nodeagent.config.settings import CheckpointConfig
from nodeagent.errors import ConfigError

GiB = 1 << 30


def check_room(
    config: CheckpointConfig,
    node: str,
    job: str,
    beside: Mapping[str, CheckpointConfig] | None = None,
) -> None:
    """Raises: ConfigError naming job.checkpoint.memory_size (or memory_dir) and the numbers,
    when the file system under memory_dir has less room than memory_size for the node's own
    saves and as much again for each of `replicas` peers' (what the job's memory tier and
    replica area already hold there counts as room: an agent restarted). `beside`: the other
    jobs this node serves (on a node jobs share), by id: what each asked for and has not yet
    filled is promised to it, so not room for this one."""
    tier = Path(config.memory_tier(node, job))
    check_parent(tier.parent)
    existing = tier
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        stat = os.statvfs(existing)
    except OSError as exc:
        raise ConfigError(
            "job.checkpoint.memory_dir", f"cannot look at {existing}: {exc.strerror}"
        ) from None
    area = Path(config.replica_area(node, job))
    free = stat.f_bavail * stat.f_frsize + _used(tier) + _used(area)
    promised = {
        other: max(0, _wanted(theirs) - _held(theirs, node, other))
        for other, theirs in (beside or {}).items()
        if Path(theirs.memory_dir) == Path(config.memory_dir)
    }
    free -= sum(promised.values())
    wanted = _wanted(config)  # peers' copies beside its own
    if free < wanted:
        replicas = f" and {config.replicas} peers' copies" if config.replicas else ""
        others = ""
        if any(promised.values()):
            names = ", ".join(sorted(j for j, n in promised.items() if n))
            others = f" beside the {sum(promised.values()) / GiB:.2f} GiB promised to {names}"
        raise ConfigError(
            "job.checkpoint.memory_size",
            f"{wanted / GiB:.2f} GiB wanted for the memory tier{replicas}, but "
            f"{existing} has {max(0, free) / GiB:.2f} GiB free on this node{others} (total "
            f"{stat.f_blocks * stat.f_frsize / GiB:.2f} GiB): lower memory_size, or give "
            "memory_dir a larger tmpfs (e.g. /dev/shm's size= mount option)"
            + (", or lower replicas" if config.replicas else ""),
        )


def _wanted(config: CheckpointConfig) -> int:
    return config.memory_size * (1 + config.replicas)


def _held(config: CheckpointConfig, node: str, job: str) -> int:
    return _used(Path(config.memory_tier(node, job))) + _used(Path(config.replica_area(node, job)))


def check_parent(parent: Path) -> None:
    """memory_dir, if it exists already, is a real directory of the agent's own that nobody
    else may write: the agent runs as root and sets a tier's owner below it, so a workers' user
    who made it first (on a shared tmpfs such as /dev/shm) must not control what that reaches.

    Raises: ConfigError naming job.checkpoint.memory_dir and what is wrong."""
    try:
        st = os.lstat(parent)
    except FileNotFoundError:
        return  # the agent makes it
    if (
        not stat.S_ISDIR(st.st_mode)
        or st.st_uid != os.geteuid()
        or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    ):
        raise ConfigError(
            "job.checkpoint.memory_dir",
            f"{parent} must be a directory of the agent's user (uid {os.geteuid()}) that no "
            f"one else may write; it is uid {st.st_uid}, mode {stat.filemode(st.st_mode)}: "
            "remove it (the agent makes it) or choose another memory_dir",
        )


def make_searchable(directory: Path) -> None:
    """Make `directory` and the parents it lacks, each 0755 whatever the agent's umask: the
    unit's UMask=0027 would make memory_dir 0750, and the workers' user could not reach its
    tier below it."""
    if directory.exists():
        return
    make_searchable(directory.parent)
    with contextlib.suppress(FileExistsError):
        os.mkdir(directory)
        os.chmod(directory, 0o755)


OWNER = ".owner"  # in a tier: "<node>\n<job>\n", written by the agent that made it


def make_marked(
    directory: Path,
    what: str,
    mode: int,
    node: str,
    job: str,
    uid: int = -1,
    gid: int = -1,
    inherit: bool = True,
) -> None:
    """Make `directory` (a job's memory tier, replica area or container files, below
    memory_dir) with `mode`, owned by `uid`:`gid` (-1: the agent's), and mark it as `node`'s of
    `job`; with `inherit`, what is made in it later is `gid`'s too (`_grant`). Not for a job's
    /dev/shm: podman makes the mount points of the tiers in it, which the workers must cross.

    The agent runs as root and the workers as a user: that user must not be able to turn this
    into a chown or a removal of anything else. So the parent (memory_dir) must be a real
    directory of the agent's own that nobody else may write (refused otherwise: a user could
    have made it first on a shared tmpfs), and nothing is done through a link.

    Under the shipped unit the agent has no CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH or
    CAP_FOWNER: it can neither enter nor chmod a directory of the workers' user. So a tier is
    the workers' user's with the agent's group (`gid`: the agent's) granted by ACL, and a
    directory left in another state (an earlier agent's, a worker's chmod) is first taken back
    with CAP_CHOWN (`_take_back`). One already as wanted is left alone: running workers use it.

    Raises: ConfigError naming job.checkpoint.memory_dir and what is wrong (`what`: the tier,
        the replica area), also when the directory is marked as another node's or job's."""
    parent = directory.parent
    make_searchable(parent)
    check_parent(parent)
    with contextlib.suppress(FileExistsError):
        os.mkdir(directory, 0o700)
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(
            "job.checkpoint.memory_dir",
            f"{directory}: a {'link' if stat.S_ISLNK(st.st_mode) else 'file'} where {what} "
            "goes, not a directory: remove it",
        )
    marked = owner(directory)
    if marked is not None and marked != (node, job):
        raise ConfigError(
            "job.checkpoint.memory_dir",
            f"{directory} is job {marked[1]}'s on node {marked[0]}, not {job}'s: refused, "
            "not taken over (choose another memory_dir, or another node name or job id)",
        )
    want_uid = os.geteuid() if uid == -1 else uid
    want_gid = os.getegid() if gid == -1 else gid
    as_wanted = (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (want_uid, want_gid, mode)
    if as_wanted and marked == (node, job):
        return
    _take_back(directory)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchmod(fd, mode)
        if inherit:
            _grant(fd, mode, want_gid)
        mark(fd, node, job)
        os.fchown(fd, want_uid, want_gid)
    finally:
        os.close(fd)


def _take_back(directory: Path) -> None:
    """Make `directory` (a direct child of memory_dir, a directory) the agent's own, mode 0700:
    lchown needs only CAP_CHOWN, and nobody but the agent can put a link in its place
    (memory_dir is the agent's alone), so the chmod that follows reaches the directory looked
    at.

    Raises: ConfigError: the agent cannot chown it."""
    try:
        os.chown(directory, os.geteuid(), os.getegid(), follow_symlinks=False)
        os.chmod(directory, 0o700)
    except OSError as exc:
        raise ConfigError(
            "job.checkpoint.memory_dir",
            f"{directory}: cannot make it the agent's to set it up ({exc.strerror}); the agent "
            "needs CAP_CHOWN (the shipped unit keeps it)",
        ) from None


SHARED_MODE = 0o750  # a step of the persistent tier: the agent writes, the workers' group reads


def shared_dir(directory: Path, gid: int) -> None:
    """Make `directory` (and its parents) for the agent to write and the workers' group `gid`
    (-1: the agent's) to read, and what is made in it too (`_grant`): under its unit the
    agent's umask (0027) would make its copies the agent's group's alone, which the workers
    cannot read. One that exists already is set again only if it is the agent's (someone
    else's is left as it is); parents made here are 0755."""
    make_searchable(directory.parent)
    with contextlib.suppress(FileExistsError):
        os.mkdir(directory)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if os.fstat(fd).st_uid != os.geteuid():
            return
        group = os.getegid() if gid == -1 else gid
        os.fchmod(fd, SHARED_MODE)
        _grant(fd, SHARED_MODE, group)
        os.fchown(fd, -1, group)
    finally:
        os.close(fd)


# POSIX ACL xattr (linux/posix_acl_xattr.h): a version, then (tag, permissions, id) entries,
# sorted by tag.
_ACL_VERSION = 2
_USER_OBJ, _GROUP_OBJ, _GROUP, _MASK, _OTHER = 0x01, 0x04, 0x08, 0x10, 0x20
_NO_ID = 0xFFFFFFFF


def _grant(fd: int, mode: int, gid: int) -> None:
    """An access and a default ACL on the directory `fd`: its owner and group `gid` get
    `mode`'s user and group permissions, on it and on whatever is made in it later, whoever
    makes it and whatever their umask; the owning group of what is made (its maker's) and
    others get nothing (`mode`'s other bits, 0 here).

    So the agent reads and removes what a worker with umask 077 saved in its tier, and the
    workers read the copies the agent made with umask 0027, without CAP_DAC_OVERRIDE. Not
    setgid directories: the unit's RestrictSUIDSGID=yes refuses to set the bit, on a
    directory too. A file system without POSIX ACLs (tmpfs, ext4 and xfs have them) is left
    to the umask, said in docs/operations.md."""
    entries = [
        (_USER_OBJ, mode >> 6, _NO_ID),
        (_GROUP_OBJ, 0, _NO_ID),
        (_GROUP, mode >> 3, gid),
        (_MASK, mode >> 3, _NO_ID),
        (_OTHER, mode, _NO_ID),
    ]
    acl = struct.pack("<I", _ACL_VERSION) + b"".join(
        struct.pack("<HHI", tag, perms & 0o7, ident) for tag, perms, ident in entries
    )
    try:
        os.setxattr(fd, "system.posix_acl_access", acl)
        os.setxattr(fd, "system.posix_acl_default", acl)
    except OSError as exc:
        if exc.errno not in (errno.ENOTSUP, errno.EOPNOTSUPP):
            raise


def mark(tier_fd: int, node: str, job: str) -> None:
    """Say in the tier (an open directory) whose it is: a node name may contain dots, so
    `<node>.<job>` alone cannot tell node `a`'s tier of job `b.c` from node `a.b`'s of job
    `c` (two agents sharing memory_dir). Never through a link a worker put there."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(OWNER, dir_fd=tier_fd)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(OWNER, flags, 0o644, dir_fd=tier_fd)
    with os.fdopen(fd, "w") as f:
        f.write(f"{node}\n{job}\n")


def owner(tier: Path) -> tuple[str, str] | None:
    """(node, job) as the tier's mark says, or None (no mark, or not one an agent wrote)."""
    try:
        fd = open_plain(tier / OWNER)
    except BadCopy:
        return None
    with os.fdopen(fd, "rb") as f:
        words = f.read(1024).decode(errors="replace").split("\n")
    return (words[0], words[1]) if len(words) == 3 and not words[2] else None


def sweep(memory_dirs: Iterable[str], node: str, serving: Collection[str]) -> list[Path]:
    """Remove this node's memory tiers of jobs other than those `serving` (under each of
    `memory_dirs`); the paths removed.

    A tier normally goes when its job ends or the pool moves the node off it; one outlives that
    only if the agent was down at that moment (stopped, crashed) and was not placed back on the
    job: it would hold tmpfs for good. Called with what the node serves as the pool says,
    never before the node has heard from the pool (it would not know what it serves). Only
    tiers whose mark names this node go (`mark`); a memory_dir someone else controls is left
    alone (check_parent), as is anything that is not a directory of its own."""
    removed = []
    prefix = f"{node}."
    for memory_dir in dict.fromkeys(memory_dirs):
        parent = Path(memory_dir)
        try:
            check_parent(parent)
            entries = list(os.scandir(parent))
        except (ConfigError, OSError):
            continue
        for entry in entries:
            if not entry.name.startswith(prefix) or not entry.is_dir(follow_symlinks=False):
                continue
            marked = owner(Path(entry.path))
            if marked is None or marked[0] != node or marked[1] in serving:
                continue
            beneath.remove_tree(Path(entry.path))
            removed.append(Path(entry.path))
    return removed


def _used(tier: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(tier):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total
