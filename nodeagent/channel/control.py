"""The control channel: a small file per worker, mapped by the agent and by the worker.

In-place recovery (issue 15) keeps a worker running through a re-form, so the agent cannot
hand it a new environment; it hands it an *assignment* through this file instead, and the worker
reports back through the same file. Like the progress file (nodeagent.channel.beats) it is plain
shared memory: checking for a new assignment between steps is one 8-byte read, no syscall.

Layout (344 bytes; little-endian, but each seq in the machine's own order, see SEQ):

    offset  0  magic b"NACT", version u32
    offset  8  message (agent -> worker), under a seqlock:
               seq u64 (odd while the agent writes; seq // 2 messages written so far),
               generation i64, kind i32 (1: an assignment, 2: leave), rank, local_rank,
               world_size, local_world_size, group_rank, group_world_size, master_port,
               restart_count (i32 each), master_addr (64 bytes, UTF-8, NUL-padded),
               restore (192 bytes, ASCII, NUL-padded: the leader's restore order for the
               generation, nodeagent.channel.restore's RESTORE_ENV; empty without tiers);
               a leave has zeros after its kind
    offset 316 finished (worker -> agent): u32, 0 until the worker's training returned,
               then the generation it returned in plus one; one aligned 4-byte store, once,
               so no seqlock. In bytes earlier versions left unused: a worker of this version
               and an agent of the last (or the reverse) still understand each other.
    offset 320 report (worker -> agent), under a seqlock of its own:
               seq u64, left_generation i64 (-1: none yet), committed_step i64 (-1: none yet)

Two messages: `Leave(g)`, "leave generation g's process group" (the job is re-forming; the
next generation's ranks are not known yet), and `Assignment`, "be this rank of generation g".
A seqlock: the writer makes `seq` odd, writes the body, makes `seq` even again; a reader reads
`seq`, the body, `seq` again, and retries unless both were the same even number. A reader never
sees a torn assignment, and a writer never waits. This relies on stores becoming visible in
program order (x86-64's TSO; CPython issues no barriers of its own here, so weaker memory
models such as ARM's are not covered by the tests, which run on x86-64). Each area has a
single writer (the agent, the worker). No torch here: the agent imports this module.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path

from nodeagent.channel.beats import worker_file
from nodeagent.channel.restore import RESTORE_ENV
from nodeagent.errors import NodeagentError

PATH_ENV = "NODEAGENT_CONTROL_FILE"  # where the agent tells a worker its channel is
TIMEOUT_ENV = "NODEAGENT_REFORM_TIMEOUT_S"  # the job's timing.reform_timeout
MAGIC = b"NACT"
VERSION = 3  # 3: assignments carry the restore order (sharded jobs recover in place)
ADDR_BYTES = 64
RESTORE_BYTES = 192  # the longest order the leader writes (5 sources) takes about 110
HEADER = struct.Struct("<4sI")
# A seq is stored and loaded whole, through a memoryview of 8-byte words ("Q", native order:
# both ends are on one machine): one aligned 8-byte memcpy. Never with struct.pack_into, which
# zeroes the field before writing it (and, for "<Q", writes a byte at a time): a reader then saw
# seq 0 in a file that had assignments.
SEQ = struct.Struct("Q")
MESSAGE = struct.Struct(f"<qi8i{ADDR_BYTES}s{RESTORE_BYTES}s")  # the body after its seq
ASSIGN, LEAVE = 1, 2  # its kinds
REPORT = struct.Struct("<qq")
MESSAGE_AT = HEADER.size  # 8
FINISHED_AT = MESSAGE_AT + SEQ.size + MESSAGE.size  # 316
FINISHED = struct.Struct("I")  # native order, stored whole (as SEQ is)
REPORT_AT = 320
SIZE = REPORT_AT + SEQ.size + REPORT.size  # 344
MODE = 0o660  # both ends write: the worker (its owner) and the agent (its group)
READ_PATIENCE_S = 1.0  # a seq odd for this long: the writer died mid-write

assert FINISHED_AT + FINISHED.size <= REPORT_AT and FINISHED_AT % FINISHED.size == 0


class ControlFileError(NodeagentError):
    """The file is not a control file this version wrote (wrong size, magic, version, values),
    or its writer stopped halfway through a write. Recreate it; do not trust what it holds."""


@dataclass(frozen=True)
class Assignment:
    """What the agent tells a worker to be in `generation`: torchrun's variables' new values."""

    generation: int
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    group_rank: int
    group_world_size: int
    master_addr: str
    master_port: int
    restart_count: int
    restore: str = ""  # the restore order (restore.RESTORE_ENV), "" when the job has no tiers

    def problems(self) -> list[str]:
        """Why this assignment is impossible (empty when it is fine)."""
        found = []
        if self.generation < 0:
            found.append(f"generation {self.generation} < 0")
        if not 0 <= self.rank < self.world_size:
            found.append(f"rank {self.rank} outside world {self.world_size}")
        if not 0 <= self.local_rank < self.local_world_size:
            found.append(f"local rank {self.local_rank} outside {self.local_world_size}")
        if not 0 <= self.group_rank < self.group_world_size:
            found.append(f"group rank {self.group_rank} outside {self.group_world_size}")
        if not 0 < self.master_port < 65536:
            found.append(f"master port {self.master_port}")
        if not self.master_addr or len(self.master_addr.encode()) > ADDR_BYTES:
            found.append(f"master address {self.master_addr!r} empty or over {ADDR_BYTES} bytes")
        if not self.restore.isascii() or len(self.restore) > RESTORE_BYTES:
            found.append(f"restore order {self.restore!r} not ASCII or over {RESTORE_BYTES} bytes")
        return found

    def environment(self) -> dict[str, str]:
        """The torchrun variables this assignment sets (ROLE_* as torchrun sets them: one role)."""
        return {
            "RANK": str(self.rank),
            "LOCAL_RANK": str(self.local_rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "GROUP_RANK": str(self.group_rank),
            "GROUP_WORLD_SIZE": str(self.group_world_size),
            "ROLE_RANK": str(self.rank),
            "ROLE_WORLD_SIZE": str(self.world_size),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
            "TORCHELASTIC_RESTART_COUNT": str(self.restart_count),
            "NODEAGENT_GENERATION": str(self.generation),
            RESTORE_ENV: self.restore,  # "" clears the last generation's
        }


@dataclass(frozen=True)
class Leave:
    """What the agent tells a worker when the job re-forms: leave generation `generation`'s
    process group (or an older one), report it, and wait for the next assignment."""

    generation: int


Message = Assignment | Leave


@dataclass(frozen=True)
class Report:
    """What the worker tells the agent: the generation it has left, its last committed step."""

    left_generation: int
    committed_step: int


def _initial() -> bytes:
    data = bytearray(SIZE)
    HEADER.pack_into(data, 0, MAGIC, VERSION)
    REPORT.pack_into(data, REPORT_AT + SEQ.size, -1, -1)
    return bytes(data)


def create(path: Path, owner: int | None = None) -> None:
    """An empty control file (no assignment, nothing reported), made by the agent before the
    worker starts. `owner` as in progress.create; the mode lets the agent's group write too."""
    worker_file(path, owner, _initial(), mode=MODE)


def encode(message: Message) -> bytes:
    """The message's body (what follows its seq).

    Raises:
        ValueError: the assignment is impossible (see Assignment.problems), or a negative
            generation.
    """
    if isinstance(message, Leave):
        if message.generation < 0:
            raise ValueError(f"generation {message.generation} < 0")
        return MESSAGE.pack(message.generation, LEAVE, *(0,) * 8, b"", b"")
    problems = message.problems()
    if problems:
        raise ValueError("; ".join(problems))
    a = message
    return MESSAGE.pack(
        *(a.generation, ASSIGN, a.rank, a.local_rank, a.world_size, a.local_world_size),
        *(a.group_rank, a.group_world_size, a.master_port, a.restart_count),
        a.master_addr.encode(),
        a.restore.encode("ascii"),
    )


def decode(body: bytes) -> Message:
    """Raises: ControlFileError: the bytes are not a message encode() could have written."""
    fields = MESSAGE.unpack(body)
    raw: bytes = fields[-2]
    generation, kind = fields[:2]
    if kind == LEAVE:
        if generation < 0 or any(fields[2:-2]) or raw.strip(b"\0") or fields[-1].strip(b"\0"):
            raise ControlFileError(f"a leave with values in its unused fields: {fields!r}")
        return Leave(generation)
    if kind != ASSIGN:
        raise ControlFileError(f"message kind {kind}, expected {ASSIGN} or {LEAVE}")
    rank, local_rank, world, local_world, group, groups, port, restarts = fields[2:10]
    assignment = Assignment(
        *(generation, rank, local_rank, world, local_world, group, groups),
        *(_text(raw, "master address"), port, restarts, _text(fields[-1], "restore order")),
    )
    problems = assignment.problems()
    if problems:
        raise ControlFileError("impossible assignment: " + "; ".join(problems))
    return assignment


def _text(raw: bytes, what: str) -> str:
    value, _, padding = raw.partition(b"\0")
    try:
        text = value.decode()
    except UnicodeDecodeError:
        raise ControlFileError(f"{what} {raw!r} is not UTF-8") from None
    if padding.strip(b"\0"):
        raise ControlFileError(f"{what} field {raw!r} is not NUL-padded")
    return text


class ControlFile:
    """One end of a worker's channel, mapped. The agent calls assign(), leave() and report();
    the worker calls sequence(), message() and the report_* methods.

    Raises (constructor):
        ControlFileError: the file is not a control file of this version.
        OSError: it cannot be opened for reading and writing.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            if size != SIZE:
                raise ControlFileError(f"{path}: {size} bytes, a control file has {SIZE}")
            self._map = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)
        magic, version = HEADER.unpack_from(self._map)
        if magic != MAGIC or version != VERSION:
            self._map.close()
            raise ControlFileError(
                f"{path}: magic {magic!r} version {version}, expected {MAGIC!r} version {VERSION}"
            )
        self._words = memoryview(self._map).cast("Q")  # see SEQ
        self._finished = memoryview(self._map).cast("I")  # see FINISHED

    def close(self) -> None:
        self._words.release()
        self._finished.release()
        self._map.close()

    def _write(self, at: int, body: bytes) -> None:
        word = at // SEQ.size
        seq: int = self._words[word]
        if seq % 2:  # our own earlier write was cut short: carry on from its odd number
            seq -= 1
        self._words[word] = seq + 1
        self._map[at + SEQ.size : at + SEQ.size + len(body)] = body
        self._words[word] = seq + 2

    def _read(self, at: int, size: int) -> tuple[int, bytes]:
        deadline = time.monotonic() + READ_PATIENCE_S
        word = at // SEQ.size
        while True:
            before: int = self._words[word]
            body = self._map[at + SEQ.size : at + SEQ.size + size]
            after: int = self._words[word]
            if before == after and before % 2 == 0:
                return before, body
            if time.monotonic() > deadline:
                raise ControlFileError(
                    f"{self.path}: a write began and never finished (seq {after})"
                )
            time.sleep(0)

    # agent -> worker

    def assign(self, assignment: Assignment) -> int:
        """Publish `assignment` (agent side); returns its sequence number (1, 2, ...)."""
        return self._send(assignment)

    def leave(self, generation: int) -> int:
        """Tell the worker to leave `generation`'s process group (agent side)."""
        return self._send(Leave(generation))

    def _send(self, message: Message) -> int:
        self._write(MESSAGE_AT, encode(message))
        return self.sequence()

    def sequence(self) -> int:
        """How many messages were written: one 8-byte read, cheap enough for every step.
        Compare it with the number last read; odd while a write is in progress counts too."""
        seq: int = self._words[MESSAGE_AT // SEQ.size]
        return (seq + 1) // 2

    def message(self) -> tuple[int, Message | None]:
        """(sequence number, the latest message), or (0, None) before the first one.

        Raises:
            ControlFileError: the message area holds garbage, or a write never finished.
        """
        seq, body = self._read(MESSAGE_AT, MESSAGE.size)
        if seq == 0:
            if body.strip(b"\0"):
                raise ControlFileError(f"{self.path}: no message written but the area is not empty")
            return 0, None
        return seq // 2, decode(body)

    # worker -> agent

    def report(self) -> Report:
        """What the worker last reported (agent side)."""
        _, body = self._read(REPORT_AT, REPORT.size)
        return Report(*REPORT.unpack(body))

    def report_left(self, generation: int) -> None:
        """The worker is in no process group of `generation` any more."""
        self._write(REPORT_AT, REPORT.pack(generation, self.report().committed_step))

    def report_finished(self, generation: int) -> None:
        """The worker's training returned in `generation`: whatever its exit code then (a
        library's teardown may abort the interpreter), the rank reached its end."""
        self._finished[FINISHED_AT // FINISHED.size] = generation + 1

    def finished_generation(self) -> int:
        """The generation in which the worker's training returned; -1: not yet (agent side)."""
        return int(self._finished[FINISHED_AT // FINISHED.size]) - 1

    def report_step(self, step: int) -> None:
        """The worker committed `step` (its in-memory snapshot holds it)."""
        self._write(REPORT_AT, REPORT.pack(self.report().left_generation, step))
