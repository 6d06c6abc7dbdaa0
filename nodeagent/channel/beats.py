"""Progress beats: a 32-byte file per worker that it updates through mmap and the agent reads.

A beat is a store into shared memory (about a microsecond, no syscall, no Redis), so a training
loop can call it every step. The agent never trusts the worker's clock: it notes, on its own
clock, when the beat counter last changed.

Layout (little-endian): magic b"NAPB", version u32, beats u64, step i64, wall time f64, and
from version 2 the seconds the rank spent in its marked compute sections, summed (f64: the
worker's `progress.compute()`; job/speed.py compares ranks by it). A version 1 file (32 bytes)
still reads, with no compute time.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"NAPB"
VERSION = 2
LAYOUT = struct.Struct("<4sIQqdd")
SIZE = LAYOUT.size
LAYOUT_V1 = struct.Struct("<4sIQqd")


MODE = 0o640  # the worker (its owner) writes, the agent (its group) reads, nobody else


def create(path: Path, owner: int | None = None) -> None:
    """An empty progress file (no beats yet), written by the agent before the worker starts.

    `owner`: the uid of a worker that runs as another user. The file becomes that user's, so
    the worker can map it for writing; its group stays the agent's, so the agent reads it
    without overriding file permissions.
    """
    worker_file(path, owner, LAYOUT.pack(MAGIC, VERSION, 0, -1, 0.0, 0.0))


def worker_file(path: Path, owner: int | None, content: bytes = b"", mode: int = MODE) -> None:
    """A file the agent makes for a worker to write (its progress file, its error file, its
    control file): `mode`, `owner`'s (the worker's uid, when it runs as another user), holding
    `content`. Never a symbolic link: one is replaced, not followed. The mode is set before the
    owner: the agent holds no CAP_FOWNER under its unit, so it cannot chmod a worker's file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, mode)
        if os.fstat(fd).st_uid != os.geteuid():  # an earlier worker's: not the agent's to chmod
            os.close(fd)
            raise PermissionError(path)
    except OSError:  # a link (ELOOP), a file the agent cannot open or own: start afresh
        path.unlink(missing_ok=True)
        fd = os.open(path, flags | os.O_EXCL, mode)
    try:
        os.fchmod(fd, mode)  # a file left by an earlier run keeps its mode otherwise
        if owner is not None:
            os.fchown(fd, owner, -1)
        os.write(fd, content)
    finally:
        os.close(fd)


def discard_unused(path: Path) -> None:
    """Remove a progress file its worker never beat into, once the worker has ended: only
    scripts that call beat() leave one behind. One with beats stays (the hang post-mortem)."""
    beat = read(path)
    if beat is not None and beat.beats == 0:
        path.unlink(missing_ok=True)


@dataclass(frozen=True)
class Beat:
    beats: int
    step: int
    wall_time: float
    compute_s: float | None = None  # marked compute, summed; None: a version 1 file


def read(path: Path) -> Beat | None:
    """The current beat, or None if the file is missing or not a progress file."""
    try:
        with open(path, "rb") as f:
            data = f.read(SIZE)
    except OSError:
        return None
    if len(data) == LAYOUT_V1.size:
        magic, version, beats, step, wall = LAYOUT_V1.unpack(data)
        return Beat(beats, step, wall) if magic == MAGIC and version == 1 else None
    if len(data) != SIZE:
        return None
    magic, version, beats, step, wall, compute = LAYOUT.unpack(data)
    if magic != MAGIC or version != VERSION or not 0.0 <= compute < 1e12:
        return None
    return Beat(beats, step, wall, compute)


class BeatWriter:
    """The worker's end: `beat(step)` stores into the mapped file; `computed(seconds)` adds to
    the compute time the next beat stores."""

    def __init__(self, path: Path) -> None:
        fd = os.open(path, os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)
        _, _, self._beats, _, _, self._compute = LAYOUT.unpack_from(self._map)

    def computed(self, seconds: float) -> None:
        self._compute += max(0.0, seconds)

    def beat(self, step: int) -> None:
        self._beats += 1
        LAYOUT.pack_into(
            self._map, 0, MAGIC, VERSION, self._beats, step, time.time(), self._compute
        )

    def close(self) -> None:
        self._map.close()
