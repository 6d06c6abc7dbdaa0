"""Opening a file of a tier the way the root agent must: beneath a directory of its own, one
path component at a time, never through a link, and only what the tier's owner or the agent
owns (issue 40). No torch here.

O_NOFOLLOW guards the last component only: a worker that makes its `slot-0` a link to another
directory would otherwise have the agent (root) verify, report and send files it must never
open. So every component below `root` (memory_dir: the agent's own, which nobody else may
write, checked when the tier is made: checkpoint/space.py) is opened with O_NOFOLLOW and
O_DIRECTORY relative to the one above (openat), and the file last with O_NOFOLLOW. The first
component is the tier (`<node>.<job>`, made by the agent and given to the job's user) or the
agent's replica area: every later component and the file itself must be owned by its owner
or by the agent, so a file of another user hard-linked into a tier is not read either.
openat2's RESOLVE_NO_SYMLINKS would do the walk in one call; Python has no binding for it, and
a walk of three components costs a few microseconds.

`remove_tree` removes a tier the workers' user may have closed to the agent (which holds no
CAP_DAC_OVERRIDE under its unit).
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from pathlib import Path

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_beneath(root: Path, path: Path, flags: int) -> int:
    """A descriptor of `path` (below `root`), opened with `flags` (and O_NOFOLLOW).

    Raises: OSError: a link on the way (ELOOP or ENOTDIR), a component owned by someone else
        (EPERM), `path` not below `root` (EXDEV), or what opening it raised."""
    try:
        parts = path.relative_to(root).parts
    except ValueError:
        raise OSError(errno.EXDEV, f"not below {root}") from None
    if not parts:
        raise OSError(errno.EISDIR, f"{root} itself")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    owners = {os.geteuid()}
    try:
        for depth, part in enumerate(parts[:-1]):
            below = os.open(part, _DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = below
            _owned(fd, owners, first=depth == 0)
        found = os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    finally:
        os.close(fd)
    try:
        _owned(found, owners, first=len(parts) == 1)
    except OSError:
        os.close(found)
        raise
    return found


def _owned(fd: int, owners: set[int], first: bool) -> None:
    """The first component below the root names the owner; the others must be one of them.
    Raises: OSError (EPERM)."""
    uid = os.fstat(fd).st_uid
    if first:
        owners.add(uid)
    elif uid not in owners:
        raise OSError(errno.EPERM, f"owned by uid {uid}, not by the tier's owner")


def remove_tree(directory: Path) -> None:
    """Remove `directory` (a direct child of memory_dir, the agent's alone), also where the
    workers' user closed part of it to the agent: under its unit the agent has no
    CAP_DAC_OVERRIDE, so a subdirectory a worker made 0700 cannot be entered or emptied. What
    plain removal leaves is taken back with CAP_CHOWN from the top down, each directory the
    agent's and 0700 before its entries are looked at (so none can be swapped for a link once
    looked at: its parent is the agent's alone by then), and removed again. Errors are left:
    what cannot be removed stays (the sweep of a later start tries again)."""
    shutil.rmtree(directory, ignore_errors=True)
    if os.path.lexists(directory):
        _take_back_tree(str(directory))
        shutil.rmtree(directory, ignore_errors=True)


def _take_back_tree(path: str) -> None:
    try:
        os.chown(path, os.geteuid(), os.getegid(), follow_symlinks=False)
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return
        os.chmod(path, 0o700)
        with os.scandir(path) as entries:
            below = [e.path for e in entries if e.is_dir(follow_symlinks=False)]
    except OSError:
        return
    for entry in below:
        _take_back_tree(entry)
