"""Reading a job's rank logs on this node (`nodeagentctl logs`): which ranks have one, their last
lines, and what is appended to them. No printing here (cli/ctllogs.py prints)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

RANK_LOG = re.compile(r"rank-(\d+)\.log")
BLOCK = 65536


def rank_logs(job_dir: Path) -> dict[int, Path]:
    """rank -> its log across generations (`<log_dir>/<job>/rank-R.log`), by rank."""
    try:
        names = os.listdir(job_dir)
    except OSError:
        return {}
    found = {int(m.group(1)): job_dir / n for n in names if (m := RANK_LOG.fullmatch(n))}
    return dict(sorted(found.items()))


def last_lines(path: Path, count: int) -> tuple[list[str], int]:
    """The last `count` lines of `path` and its size then (where following starts), reading
    from the end so a long log costs no more than its tail."""
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        data, start = b"", size
        while start > 0 and data.count(b"\n") <= count:
            start = max(0, start - BLOCK)
            f.seek(start)
            data = f.read(size - start)
    lines = data.decode("utf-8", "replace").splitlines()
    return (lines[-count:] if count else []), size


class Follower:
    """New whole lines appended to a file since `offset`; a truncated file starts over."""

    def __init__(self, path: Path, offset: int) -> None:
        self.path = path
        self._offset = offset
        self._partial = b""

    def read(self) -> Iterator[str]:
        try:
            with open(self.path, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                if size < self._offset:
                    self._offset, self._partial = 0, b""
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return
        self._offset += len(data)
        *whole, self._partial = (self._partial + data).split(b"\n")
        for line in whole:
            yield line.decode("utf-8", "replace")
