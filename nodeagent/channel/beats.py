"""Progress beats: a 56-byte file per worker that it updates through mmap and the agent reads.

A beat is a store into shared memory (about a microsecond, no syscall, no Redis), so a training
loop can call it every step. The agent never trusts the worker's clock: it notes, on its own
clock, when the beat counter last changed.

Layout (little-endian): magic b"NAPB", version u32, beats u64, step i64, wall time f64, from
version 2 the seconds the rank spent in its marked compute sections, summed (f64: the worker's
`progress.compute()`; job/speed.py compares ranks by it), and from version 3 `finished` (u64, 1
once the rank's training reached its end: `progress.finished()`; a death by a signal after it
is not the job's failure, and a rank that lingers after it is not hung), and from version 4
`waiting` (u64, 1 from the end of a compute section to the next beat: the rank did its own
part of the next step and waits on its peers; job/watch.py). Older versions still read (the
file's version, not its length, says which), and a worker with an older nodeagent writes its
own version into the agent's longer file; a worker with a newer one writes the newest version
that fits into a shorter file an older agent made.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"NAPB"
VERSION = 4
LAYOUT = struct.Struct("<4sIQqddQQ")
SIZE = LAYOUT.size
LAYOUTS = {
    1: struct.Struct("<4sIQqd"),
    2: struct.Struct("<4sIQqdd"),
    3: struct.Struct("<4sIQqddQ"),
    VERSION: LAYOUT,
}
HEADER = struct.Struct("<4sI")


MODE = 0o640  # the worker (its owner) writes, the agent (its group) reads, nobody else


def create(path: Path, owner: int | None = None) -> None:
    """An empty progress file (no beats yet), written by the agent before the worker starts.

    `owner`: the uid of a worker that runs as another user. The file becomes that user's, so
    the worker can map it for writing; its group stays the agent's, so the agent reads it
    without overriding file permissions.
    """
    worker_file(path, owner, LAYOUT.pack(MAGIC, VERSION, 0, -1, 0.0, 0.0, 0, 0))


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
    finished: bool = False  # the rank's training reached its end (version 3)
    waiting: bool = False  # a compute section ended since the last beat (version 4)


def read(path: Path) -> Beat | None:
    """The current beat, or None if the file is missing or not a progress file."""
    try:
        with open(path, "rb") as f:
            data = f.read(SIZE)
    except OSError:
        return None
    if len(data) < HEADER.size:
        return None
    magic, version = HEADER.unpack_from(data)
    layout = LAYOUTS.get(version)
    if magic != MAGIC or layout is None or len(data) < layout.size:
        return None
    _, _, beats, step, wall, *more = layout.unpack_from(data)
    if version == 1:
        return Beat(beats, step, wall)
    compute, finished = more[0], bool(more[1]) if version >= 3 else False
    waiting = bool(more[2]) if version >= 4 else False
    if not 0.0 <= compute < 1e12:
        return None
    return Beat(beats, step, wall, compute, finished, waiting)


class BeatWriter:
    """The worker's end: `beat(step)` stores into the mapped file; `computed(seconds)` adds to
    the compute time it holds; `finish()` says the training reached its end."""

    def __init__(self, path: Path) -> None:
        fd = os.open(path, os.O_RDWR)
        try:
            # An older agent's file is shorter: written in the newest version that fits it.
            size = os.fstat(fd).st_size
            self._version = max(
                v for v, layout in LAYOUTS.items() if v >= 2 and layout.size <= size
            )
            self._layout = LAYOUTS[self._version]
            self._map = mmap.mmap(fd, self._layout.size)
        finally:
            os.close(fd)
        _, _, self._beats, self._step, self._wall, self._compute, *_ = self._layout.unpack_from(
            self._map
        )
        self._finished = 0
        self._waiting = 0

    def computed(self, seconds: float) -> None:
        """Add a compute section's time, stored at once: a rank whose compute moved on since
        its last beat has done its own part of the next step and waits on its peers (the
        agent's hang watch, job/watch.py). The beat count stays, so it is no beat."""
        self._compute += max(0.0, seconds)
        self._waiting = 1
        self._store()

    def beat(self, step: int) -> None:
        self._beats += 1
        self._step, self._wall = step, time.time()
        self._waiting = 0
        self._store()

    def finish(self) -> bool:
        """Say the training reached its end; False where the agent's file cannot say it."""
        self._finished = 1
        self._store()
        return self._version >= 3

    def _store(self) -> None:
        fields = (self._beats, self._step, self._wall, self._compute)
        more = (self._finished, self._waiting)[: self._version - 2]
        self._layout.pack_into(self._map, 0, MAGIC, self._version, *fields, *more)

    def close(self) -> None:
        self._map.close()
