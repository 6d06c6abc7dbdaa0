"""The checkpoint tiers on disk: their layout and the manifest that makes a rank's save whole.

Both sides read and write this format: the worker (nodeagent.worker.tiered) saves into a tier
and verifies what it loads; the agent (nodeagent.checkpoint) verifies the memory tier, copies
it to the persistent tier and reports what each tier holds. No torch here.

A rank's save is a directory of torch.distributed.checkpoint (DCP) files, saved by that rank
alone (DCP's `no_dist`: its own shards, with their global offsets, and its own `.metadata`),
plus `manifest.json`, written last and atomically (a temporary file, then a rename): the size
and CRC-32 of every file, the step, the generation, the world size and the rank. A directory
without a valid manifest holds no save. DCP itself has no end-to-end checksum (a flipped bit
loads silently), so every reader verifies every file it uses against the manifest first.

Layout:
    memory tier       <memory_dir>/<node>.<job>/rank-<R>/slot-0|slot-1/   (two slots per rank)
    replica area      <memory_dir>/<node>.<job>.replicas/<from>/rank-<R>/slot-0|slot-1/
                                                      (peers' saves, sent by node <from>)
    persistent tier   <dir>/step-<S>/rank-<R>/                      (also a script's own
                                                                      directory under torchrun)

Two slots per rank in the memory tier: a save goes to the slot that does not hold the rank's
newest save and removes that slot's manifest before writing, so a save killed half way leaves
the newest good one untouched. Every file name in a manifest is a plain name in its directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

FORMAT = 1
MANIFEST = "manifest.json"
SLOTS = ("slot-0", "slot-1")
CHUNK = 8 << 20  # bytes read at a time while checksumming or copying
MANIFEST_MAX = 4 << 20  # a manifest of 10,000 files takes about 1 MB
# Environment the agent gives a worker (nodeagent.worker.tiered reads it).
MEMORY_ENV = "NODEAGENT_CKPT_MEMORY"  # this node's memory tier of the job
MEMORY_LIMIT_ENV = "NODEAGENT_CKPT_MEMORY_LIMIT"  # bytes one rank's save may take
PERSIST_ENV = "NODEAGENT_CKPT_PERSIST"  # the job's persistent tier (shared by its nodes)
REPLICAS_ENV = "NODEAGENT_CKPT_REPLICAS"  # this node's replica area of the job (read only)
RESTORE_ENV = "NODEAGENT_RESTORE"  # the leader's choice, Restore.to_env()
RESTORE_REPORT_ENV = "NODEAGENT_RESTORE_REPORT"  # where the worker says what it restored
TIERS = ("memory", "persistent", "script", "start")
NON_FINITE = "non-finite value"  # how a worker says a state holds a NaN or an infinity
# Why a worker did not restore from a source (its restore report's "kind"): the source had
# nothing for it (no such tier, no such step, another timeline's save), a copy it read did not
# verify (that node's to drop), or the state loaded holds a NaN or an infinity (the step's own
# fault: every copy of it holds the same).
ABSENT, BAD_COPY, BAD_STATE = "absent", "bad_copy", "bad_state"
REFUSALS = (ABSENT, BAD_COPY, BAD_STATE)
_NAME = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.-]{0,254}")
_RANK_DIR = re.compile(r"rank-([0-9]{1,7})")
_STEP_DIR = re.compile(r"step-([0-9]{1,15})")
_SOURCE = re.compile(r"(memory|persistent|script|start)(?::([0-9]{1,15})(?:@([0-9]{1,15}))?)?")
_MAX_FILES = 10_000


def report_path(job_dir: Path, generation: int, rank: int) -> Path:
    """Where rank `rank` of `generation` says what it restored (RESTORE_REPORT_ENV): in the
    job's log directory, beside the generation's logs. An in_place survivor, told only its new
    generation and rank, finds its new one from its first (`moved_report`)."""
    return job_dir / str(generation) / f"rank-{rank}.restore.json"


def moved_report(first: Path, generation: int, rank: int) -> Path:
    """The report path of `generation`'s rank `rank`, given a report path of the same job."""
    return report_path(first.parent.parent, generation, rank)


class BadCopy(Exception):
    """A save that must not be loaded: what is wrong, naming the file."""


class NoSave(BadCopy):
    """No save there at all (no manifest: none made, or one cut short), nothing wrong with it."""


@dataclass(frozen=True)
class FileSum:
    size: int
    crc32: int


@dataclass(frozen=True)
class Manifest:
    """One rank's save of one step (see the module docstring)."""

    step: int
    generation: int
    world_size: int
    rank: int
    files: Mapping[str, FileSum] = field(default_factory=dict)
    job: str = ""
    blocked_s: float = 0.0  # how long the save held the training step (staging)
    # The distinct row counts of its tensors when the whole state is sharded row-wise over
    # the world (channel/layout.py); None: another layout, every rank read at another world.
    dim0: tuple[int, ...] | None = None

    @property
    def size(self) -> int:
        """Bytes of every file of the save."""
        return sum(f.size for f in self.files.values())

    def to_json(self) -> str:
        files = {name: {"size": s.size, "crc32": s.crc32} for name, s in sorted(self.files.items())}
        body = {
            "format": FORMAT,
            "job": self.job,
            "step": self.step,
            "generation": self.generation,
            "world_size": self.world_size,
            "rank": self.rank,
            "files": files,
            "blocked_s": round(self.blocked_s, 6),
        }
        if self.dim0 is not None:
            body["dim0"] = list(self.dim0)
        return json.dumps(body, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: bytes | str, where: str) -> Manifest:
        """Raises: BadCopy naming `where` and the field, for anything this module did not write."""
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise BadCopy(f"{where}: not JSON ({exc})") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise BadCopy(f"{where}: not a manifest of format {FORMAT}")
        count = {k: _count(data, k, where) for k in ("step", "generation", "world_size", "rank")}
        if count["rank"] >= max(count["world_size"], 1):
            raise BadCopy(f"{where}: rank {count['rank']} of world {count['world_size']}")
        files = data.get("files")
        if not isinstance(files, dict) or not 0 < len(files) <= _MAX_FILES:
            raise BadCopy(f"{where}: 'files' must name 1 to {_MAX_FILES} files")
        sums = {}
        for name, entry in files.items():
            if not isinstance(name, str) or not plain_name(name) or name == MANIFEST:
                raise BadCopy(f"{where}: {name!r} is not a plain file name of a save")
            if not isinstance(entry, dict):
                raise BadCopy(f"{where}: the entry of {name} is not an object")
            sums[name] = FileSum(_count(entry, "size", where), _count(entry, "crc32", where))
        job = data.get("job", "")
        if not isinstance(job, str):
            raise BadCopy(f"{where}: 'job' is not a string")
        blocked = data.get("blocked_s", 0.0)
        if (
            isinstance(blocked, bool)
            or not isinstance(blocked, int | float)
            or not (0 <= blocked < 1e6)
        ):
            raise BadCopy(f"{where}: 'blocked_s' must be a number of seconds, got {blocked!r}")
        dim0 = _row_counts(data.get("dim0"), where)
        return cls(files=sums, job=job, blocked_s=float(blocked), dim0=dim0, **count)


def _row_counts(value: object, where: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    if (
        not isinstance(value, list)
        or len(value) > _MAX_FILES
        or not all(
            isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 1 << 53 for n in value
        )
    ):
        raise BadCopy(f"{where}: 'dim0' must be a list of at most {_MAX_FILES} row counts")
    return tuple(value)


def digest(manifest: Manifest) -> str:
    """16 hex digits that name one save exactly (its manifest: every file's size and checksum):
    what its node reports in Redis, and what a peer checks a copy offered to it against."""
    return hashlib.blake2b(manifest.to_json().encode(), digest_size=8).hexdigest()


def plain_name(name: str) -> bool:
    """A name that is one plain path component (a file of a save, a node's directory)."""
    return bool(_NAME.fullmatch(name)) and name not in (".", "..")


def _count(data: Mapping[str, object], key: str, where: str) -> int:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 53:
        raise BadCopy(f"{where}: {key!r} must be a non-negative integer, got {value!r}")
    return value


def checksum(path: Path) -> FileSum:
    """Size and CRC-32 of a file, read in chunks (3.6 GB/s here)."""
    crc, size = 0, 0
    with os.fdopen(open_plain(path), "rb") as f:
        while chunk := f.read(CHUNK):
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
    return FileSum(size, crc)


def summarize(directory: Path) -> dict[str, FileSum]:
    """The checksums of every file a save wrote into `directory` (the manifest excepted)."""
    return {
        entry.name: checksum(Path(entry.path))
        for entry in os.scandir(directory)
        if entry.is_file(follow_symlinks=False)
        and entry.name != MANIFEST
        and not entry.name.startswith(".tmp-")
    }


def read_manifest(directory: Path) -> Manifest:
    """The manifest of a save, not yet verified against its files. Raises: BadCopy."""
    path = directory / MANIFEST
    if not os.path.lexists(path):
        raise NoSave(f"{directory}: no {MANIFEST} (no save, or one cut short)")
    try:
        with os.fdopen(open_plain(path), "rb") as f:
            raw = f.read(MANIFEST_MAX + 1)
    except OSError as exc:
        raise BadCopy(f"{path}: {exc.strerror}") from None
    if len(raw) > MANIFEST_MAX:
        raise BadCopy(f"{path}: more than {MANIFEST_MAX} bytes, not a manifest nodeagent wrote")
    return Manifest.from_json(raw, str(path))


def verify(directory: Path, names: Iterable[str] | None = None) -> Manifest:
    """The manifest of the save in `directory` once every file it names (or only `names`)
    matches its size and checksum. Raises: BadCopy naming the first file that does not."""
    manifest = read_manifest(directory)
    wanted = manifest.files if names is None else {n: manifest.files[n] for n in names}
    for name, expected in wanted.items():
        path = directory / name
        try:
            if path.is_symlink():
                raise BadCopy(f"{path}: a symbolic link, not a file of the save")
            found = checksum(path)
        except FileNotFoundError:
            raise BadCopy(f"{path}: missing (named by {MANIFEST})") from None
        except OSError as exc:
            raise BadCopy(f"{path}: {exc.strerror}") from None
        if found.size != expected.size:
            raise BadCopy(f"{path}: {found.size} bytes, the manifest says {expected.size}")
        if found.crc32 != expected.crc32:
            raise BadCopy(
                f"{path}: checksum {found.crc32:08x}, the manifest says {expected.crc32:08x}"
            )
    return manifest


def write_manifest(directory: Path, manifest: Manifest, durable: bool = False) -> None:
    """Commit a save: the manifest written to a temporary file and renamed into place.
    `durable`: fsync the files, the manifest and the directory (a disk; tmpfs needs none)."""
    if durable:
        for name in manifest.files:
            fsync(directory / name)
    tmp = directory / f".tmp-{MANIFEST}.{os.getpid()}"
    tmp.write_text(manifest.to_json())
    if durable:
        fsync(tmp)
    os.replace(tmp, directory / MANIFEST)
    if durable:
        fsync(directory)


def fsync(path: Path) -> None:
    """fsync a file or a directory by its path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def begin(directory: Path) -> None:
    """Make `directory` an empty place for a new save: its manifest goes first (so what is
    left of an older save there is never taken for a save), then everything else."""
    if directory.is_symlink():
        raise BadCopy(f"{directory}: a symbolic link, not a directory of saves")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / MANIFEST).unlink(missing_ok=True)
    for entry in os.scandir(directory):
        path = Path(entry.path)
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(path)
        else:
            path.unlink()


# -- the memory tier: <tier>/rank-<R>/slot-N ------------------------------------------------


def rank_dir(tier: Path, rank: int) -> Path:
    return tier / f"rank-{rank}"


def slots(tier: Path, rank: int) -> tuple[Path, ...]:
    return tuple(rank_dir(tier, rank) / slot for slot in SLOTS)


def manifest_in(directory: Path) -> Manifest | None:
    """The manifest of the save in `directory`, unverified; None where there is none (no save,
    one cut short, or a manifest nodeagent did not write)."""
    try:
        return read_manifest(directory)
    except BadCopy:
        return None


def _saved(directory: Path) -> tuple[int, int]:
    """(step, generation) of the save in `directory`, or (-1, -1)."""
    manifest = manifest_in(directory)
    return (manifest.step, manifest.generation) if manifest else (-1, -1)


def older(steps: Sequence[int]) -> int:
    """Which of two slots holding saves of `steps` (-1: none) the next save goes to: the one
    that does not hold the newest (nodeagent.channel.pin keeps the committed one too)."""
    return 1 if steps[0] > steps[1] else 0


def slot_for_save(tier: Path, rank: int) -> Path:
    """Where this rank's next save goes, nothing pinned: the slot that does not hold its newest
    save."""
    both = slots(tier, rank)
    return both[older([_saved(slot)[0] for slot in both])]


def newest_in_memory(
    tier: Path, rank: int, step: int | None = None, generation: int | None = None
) -> Path | None:
    """The slot holding this rank's newest save (of `step` only, and saved by `generation`
    only, if given); unverified."""
    found = [(saved, slot) for slot in slots(tier, rank) if (saved := _saved(slot))[0] >= 0]
    if step is not None:
        found = [(saved, slot) for saved, slot in found if saved[0] == step]
    if generation is not None:
        found = [(saved, slot) for saved, slot in found if saved[1] == generation]
    return max(found)[1] if found else None


def memory_saves(tier: Path) -> Iterator[tuple[Path, int]]:
    """Every slot of every rank in the memory tier, with its rank (unverified, unordered)."""
    if not tier.is_dir():
        return
    for entry in os.scandir(tier):
        match = _RANK_DIR.fullmatch(entry.name)
        if match and entry.is_dir(follow_symlinks=False):
            for slot in SLOTS:
                yield Path(entry.path) / slot, int(match.group(1))


# -- a replica area: <area>/<node>/rank-<R>/slot-N (copies of peers' saves) ----------------


def area_saves(area: Path) -> Iterator[tuple[Path, int]]:
    """Every slot of every rank under a replica area, from every node (unverified)."""
    if not area.is_dir():
        return
    for entry in os.scandir(area):
        if entry.is_dir(follow_symlinks=False) and plain_name(entry.name):
            yield from memory_saves(Path(entry.path))


def find_save(
    memory: Path | None, area: Path | None, rank: int, step: int, generation: int | None
) -> Path | None:
    """A slot holding rank `rank`'s save of `step` (by `generation` if given): in the memory
    tier first, then in the replica area, from any node; unverified."""
    found = newest_in_memory(memory, rank, step, generation) if memory is not None else None
    if found is not None or area is None or not area.is_dir():
        return found
    for entry in sorted(os.scandir(area), key=lambda e: e.name):
        if entry.is_dir(follow_symlinks=False):
            found = newest_in_memory(Path(entry.path), rank, step, generation)
            if found is not None:
                return found
    return None


def any_save(
    memory: Path | None, area: Path | None, step: int, generation: int | None
) -> Path | None:
    """A slot holding any rank's save of `step` (by `generation` if given), in the memory tier
    or the replica area; unverified."""
    found: list[tuple[Path, int]] = []
    if memory is not None:
        found += memory_saves(memory)
    if area is not None:
        found += area_saves(area)
    for slot, _ in sorted(found, key=lambda f: f[1]):  # the lowest rank first
        saved = _saved(slot)
        if saved[0] == step and generation in (None, saved[1]):
            return slot
    return None


# -- a persistent tier: <dir>/step-<S>/rank-<R> ---------------------------------------------


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step}"


def steps(root: Path) -> list[int]:
    """The steps with a directory under `root`, newest first (complete or not)."""
    if not root.is_dir():
        return []
    found = [int(m.group(1)) for e in os.scandir(root) if (m := _STEP_DIR.fullmatch(e.name))]
    return sorted(found, reverse=True)


def open_plain(path: Path) -> int:
    """A descriptor of `path` for reading, only if it is a regular file: never through a
    symbolic link, never blocking on a FIFO a worker put in its place (the agent reads the
    workers' files as root). Raises: BadCopy."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise BadCopy(f"{path}: missing (named by {MANIFEST})") from None
    except OSError as exc:
        raise BadCopy(f"{path}: {exc.strerror} (a link or something else than a file)") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise BadCopy(f"{path}: not a regular file")
    return fd


def copy_verified(
    source: Path, target: Path, durable: bool = True, expected: Manifest | None = None
) -> Manifest:
    """Copy the save in `source` to `target` (made anew), checking every byte copied against
    the source's manifest (which must be `expected`, the one verified, when given: the worker
    may have saved over the slot since) before the copy's manifest is written (last). A copy
    that does not match is removed. Raises: BadCopy; OSError (a full disk)."""
    manifest = read_manifest(source)
    if expected is not None and manifest != expected:
        raise BadCopy(f"{source}: now holds step {manifest.step}, not the {expected.step} verified")
    begin(target)
    try:
        for name, want in manifest.files.items():
            crc, size = 0, 0
            with (
                os.fdopen(open_plain(source / name), "rb") as src,
                open(target / name, "xb") as dst,
            ):
                while chunk := src.read(CHUNK):
                    crc = zlib.crc32(chunk, crc)
                    size += len(chunk)
                    dst.write(chunk)
            if (size, crc) != (want.size, want.crc32):
                raise BadCopy(
                    f"{source / name}: {size} bytes, checksum {crc:08x}; the manifest says "
                    f"{want.size} bytes, {want.crc32:08x}"
                )
        write_manifest(target, manifest, durable=durable)
    except BaseException:
        begin(target)  # nothing of a copy that failed stays
        raise
    return manifest


# -- the leader's choice, as a worker receives it -------------------------------------------


@dataclass(frozen=True)
class Source:
    """One place to restore from: a tier and a step (None for `script` and `start`), and the
    generation that saved it when the leader knows it: the same step number can exist in two
    timelines (a node that was cut off kept saves of a step the others saved again since)."""

    tier: str  # TIERS
    step: int | None = None
    generation: int | None = None

    def __str__(self) -> str:
        if self.step is None:
            return self.tier
        saved_by = f"@{self.generation}" if self.generation is not None else ""
        return f"{self.tier}:{self.step}{saved_by}"


def restore_to_env(sources: tuple[Source, ...]) -> str:
    """The order a worker tries its sources in: `memory:120@7 persistent:100@5 script start`
    (the generation after `@` where the leader knows it)."""
    return " ".join(str(s) for s in sources)


def restore_from_env(value: str) -> tuple[Source, ...]:
    """Raises: ValueError naming what is not a source."""
    sources = []
    for word in value.split():
        match = _SOURCE.fullmatch(word)
        if match is None:
            raise ValueError(
                f"{RESTORE_ENV}: {word!r} is not one of {TIERS} (with :STEP[@GENERATION])"
            )
        tier, step, generation = match.groups()
        sources.append(
            Source(
                tier,
                int(step) if step else None,
                int(generation) if generation else None,
            )
        )
    return tuple(sources)
