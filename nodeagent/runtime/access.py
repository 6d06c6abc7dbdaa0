"""Whether the job's user can reach a path, told from stat results without switching users.

The agent (root) checks for the workers (job.user) before starting any: a log_dir they cannot
enter makes every progress beat fail, an unreadable script every generation exit 2. The rule is
the kernel's for mode bits: the owner's bits for the owner, else the group's for a member of the
file's group, else the others'; root may read, write and enter anything, and execute a file
with any execute bit. Reaching a path needs search (execute) permission on every directory
above it, on the path as written and on the one its symbolic links lead to. A path with a
POSIX ACL is not judged (its mode bits do not tell the whole rule): it passes.

`denial` is pure (stat results in, the first refusal out); `steps` reads the file system.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

READ, WRITE, SEARCH = 4, 2, 1  # the mode bits' values; SEARCH is execute on a file
ACL_XATTR = "system.posix_acl_access"


@dataclass(frozen=True)
class Who:
    """A user as the kernel checks it: the uid and every group (primary and supplementary)."""

    uid: int
    groups: frozenset[int]


@dataclass(frozen=True)
class Entry:
    """What stat(2) says about one path (following symbolic links)."""

    path: Path
    mode: int
    uid: int
    gid: int
    acl: bool = False  # has a POSIX access ACL: not judged

    def describe(self) -> str:
        return f"{self.path} (mode {stat.S_IMODE(self.mode):04o}, uid {self.uid}, gid {self.gid})"


@dataclass(frozen=True)
class Step:
    """One path on the way and the permission it must grant."""

    entry: Entry
    want: int


def allows(entry: Entry, who: Who, want: int) -> bool:
    """Whether `who` has every permission bit in `want` on `entry`."""
    if entry.acl:
        return True
    if who.uid == 0:
        return not (want & SEARCH) or stat.S_ISDIR(entry.mode) or bool(entry.mode & 0o111)
    if who.uid == entry.uid:
        bits = entry.mode >> 6
    elif entry.gid in who.groups:
        bits = entry.mode >> 3
    else:
        bits = entry.mode
    return bits & want == want


def denial(path_steps: Iterable[Step], who: Who) -> Step | None:
    """The first step `who` is refused, or None when the whole way is open."""
    return next((step for step in path_steps if not allows(step.entry, who, step.want)), None)


def explain(step: Step, who: str) -> str:
    """What was refused and how to fix it, for a ConfigError."""
    entry = step.entry
    if stat.S_ISDIR(entry.mode) and step.want == SEARCH:
        verb, flag = "enter", "x"
    else:
        verb = " and ".join(
            name
            for bit, name in ((READ, "read"), (WRITE, "write"), (SEARCH, "execute"))
            if step.want & bit
        )
        flag = "".join(
            f for bit, f in ((READ, "r"), (WRITE, "w"), (SEARCH, "x")) if step.want & bit
        )
    return (
        f"{who} cannot {verb} {entry.describe()}; let it, e.g. chmod o+{flag} {entry.path}, "
        f"or chgrp it to a group of {who} and chmod g+{flag}"
    )


def steps(path: Path, want: int) -> list[Step]:
    """Every directory from / down to `path` (search) and `path` itself (`want`), along the
    path as written and along where its links lead, each directory once.

    Raises:
        OSError: a path on the way cannot be stat'ed (it does not exist, say).
    """
    absolute = Path(os.path.abspath(path))
    ways = [absolute, absolute.resolve()]
    seen: set[tuple[Path, int]] = set()
    found: list[Step] = []
    for way in ways:
        for directory, bits in (*((d, SEARCH) for d in reversed(way.parents)), (way, want)):
            if (directory, bits) not in seen:
                seen.add((directory, bits))
                found.append(Step(_entry(directory), bits))
    return found


def blocked(path: Path, want: int, who: Who) -> Step | None:
    """The first step on the way to `path` that `who` is refused (see `steps`, `denial`)."""
    return denial(steps(path, want), who)


def _entry(path: Path) -> Entry:
    st = os.stat(path)
    return Entry(path, st.st_mode, st.st_uid, st.st_gid, acl=_has_acl(path))


def _has_acl(path: Path) -> bool:
    try:
        os.getxattr(path, ACL_XATTR)
    except OSError:  # none (ENODATA), or a file system without ACLs
        return False
    return True
