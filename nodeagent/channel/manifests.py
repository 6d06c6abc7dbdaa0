"""A rank's save made whole: its manifest, the checksums of its files, and how it is verified,
read, written and copied. One owner of the format; both sides import it: the worker
(nodeagent.worker.checkpointer) writes a manifest last and verifies what it loads; the agent
(nodeagent.checkpoint) verifies, copies and reports. No torch here.

A save is a directory of torch.distributed.checkpoint (DCP) files, saved by one rank alone
(DCP's `no_dist`: its own shards, with their global offsets, and its own `.metadata`), plus
`manifest.json`, written last and atomically (a temporary file, then a rename): the size and
SHA-256 of every file, the step, the generation, the world size and the rank. A directory
without a valid manifest holds no save. DCP itself has no end-to-end checksum (a flipped bit
loads silently), so every reader verifies every file it uses against the manifest first. Every
file name in a manifest is a plain name in its directory. Where the saves lie is
nodeagent.channel.tier's.

A cryptographic digest, not a CRC, because the manifest's `digest` is what binds a save to the
node that made it (issue 40): the node reports it through its fenced Redis record, and every
copy, fetch and restore checks the bytes against it. A CRC-32 is forged in milliseconds (append
four bytes); a SHA-256 is not. Manifests of format 1 (a CRC-32 per file, written before) are
still read where the bytes never left this node (a restore from its own tier after an upgrade);
they are never sent or taken over the wire (`cryptographic`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import shutil
import stat
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from nodeagent.channel.beneath import open_beneath

FORMAT = 2  # 1: a CRC-32 per file instead of a SHA-256 (read, never written)
MANIFEST = "manifest.json"
CHUNK = 8 << 20  # bytes read at a time while checksumming or copying
MANIFEST_MAX = 4 << 20  # a manifest of 10,000 files takes about 1 MB
_NAME = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.-]{0,254}")
_MAX_FILES = 10_000
_SHA256 = re.compile(r"[0-9a-f]{64}")


class BadCopy(Exception):
    """A save that must not be loaded: what is wrong, naming the file."""


class NoSave(BadCopy):
    """No save there at all (no manifest: none made, or one cut short), nothing wrong with it."""


@dataclass(frozen=True)
class FileSum:
    """A file's size and SHA-256 (hex); in a manifest of format 1, its CRC-32 instead."""

    size: int
    sha256: str = ""
    crc32: int | None = None

    def describe(self) -> str:
        """The checksum, as messages name it."""
        return f"CRC-32 {self.crc32:08x}" if self.crc32 is not None else f"SHA-256 {self.sha256}"


class Summer:
    """A file's checksum taken as its bytes go by: SHA-256, or the CRC-32 of a format-1 save."""

    def __init__(self, expected: FileSum | None = None) -> None:
        self._legacy = expected is not None and expected.crc32 is not None
        self._sha = hashlib.sha256()
        self._crc = 0
        self.size = 0

    def update(self, chunk: bytes) -> None:
        if self._legacy:
            self._crc = zlib.crc32(chunk, self._crc)
        else:
            self._sha.update(chunk)
        self.size += len(chunk)

    def result(self) -> FileSum:
        if self._legacy:
            return FileSum(self.size, crc32=self._crc)
        return FileSum(self.size, sha256=self._sha.hexdigest())


def mismatch(name: object, found: FileSum, expected: FileSum) -> str | None:
    """Why the file `name` summed as `found` is not the one the manifest names; None if it is."""
    if found.size != expected.size:
        return f"{name}: {found.size} bytes, the manifest says {expected.size}"
    if found.crc32 != expected.crc32 or not hmac.compare_digest(found.sha256, expected.sha256):
        return f"{name}: checksum {found.describe()}, the manifest says {expected.describe()}"
    return None


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

    @property
    def cryptographic(self) -> bool:
        """Every file is bound by a SHA-256 (format 2): a save that may cross the wire."""
        return all(s.crc32 is None and s.sha256 for s in self.files.values())

    def to_json(self) -> str:
        legacy = not self.cryptographic
        files = {
            name: {"size": s.size, **({"crc32": s.crc32} if legacy else {"sha256": s.sha256})}
            for name, s in sorted(self.files.items())
        }
        body = {
            "format": 1 if legacy else FORMAT,
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
        if not isinstance(data, dict) or data.get("format") not in (1, FORMAT):
            raise BadCopy(f"{where}: not a manifest of format 1 or {FORMAT}")
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
            sums[name] = _file_sum(entry, data["format"], where)
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


def _file_sum(entry: Mapping[str, object], form: object, where: str) -> FileSum:
    size = _count(entry, "size", where)
    if form == 1:
        return FileSum(size, crc32=_count(entry, "crc32", where))
    sha = entry.get("sha256")
    if not isinstance(sha, str) or not _SHA256.fullmatch(sha):
        raise BadCopy(f"{where}: 'sha256' must be 64 lowercase hex digits, got {sha!r}")
    return FileSum(size, sha256=sha)


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
    """The SHA-256 (64 hex digits) of the manifest's canonical form, which names one save
    exactly (every file's size and SHA-256): what its node reports in Redis, and what a peer
    checks a copy offered to it, or sent to it, against."""
    return hashlib.sha256(manifest.to_json().encode()).hexdigest()


def plain_name(name: str) -> bool:
    """A name that is one plain path component (a file of a save, a node's directory)."""
    return bool(_NAME.fullmatch(name)) and name not in (".", "..")


def _count(data: Mapping[str, object], key: str, where: str) -> int:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 53:
        raise BadCopy(f"{where}: {key!r} must be a non-negative integer, got {value!r}")
    return value


def checksum(path: Path, expected: FileSum | None = None, beneath: Path | None = None) -> FileSum:
    """Size and SHA-256 of a file (its CRC-32 where `expected` is of a format-1 manifest), read
    in chunks (SHA-256: 2.1 GB/s on one core here). `beneath`: as open_plain's.

    With `expected`, a file of another size is not read (its size alone is returned: it cannot
    match; a worker's 2 GiB sparse file under a manifest of a few bytes was read whole by the
    root agent: issue 52), and no more than that size and one byte (it may grow meanwhile)."""
    summer = Summer(expected)
    with os.fdopen(open_plain(path, beneath), "rb") as f:
        if expected is not None:
            size = os.fstat(f.fileno()).st_size
            if size != expected.size:
                return FileSum(size)
        for chunk in _chunks(f, None if expected is None else expected.size + 1):
            summer.update(chunk)
    return summer.result()


def _chunks(f: BinaryIO, most: int | None) -> Iterator[bytes]:
    """The bytes of the open file `f` in chunks of CHUNK, no more than `most` (None: all)."""
    left = most
    while left is None or left > 0:
        chunk = f.read(CHUNK if left is None else min(CHUNK, left))
        if not chunk:
            return
        if left is not None:
            left -= len(chunk)
        yield chunk


def summarize(directory: Path) -> dict[str, FileSum]:
    """The checksums of every file a save wrote into `directory` (the manifest excepted)."""
    return {
        entry.name: checksum(Path(entry.path))
        for entry in os.scandir(directory)
        if entry.is_file(follow_symlinks=False)
        and entry.name != MANIFEST
        and not entry.name.startswith(".tmp-")
    }


def read_manifest(
    directory: Path, beneath: Path | None = None, most: int | None = None
) -> Manifest:
    """The manifest of a save, not yet verified against its files (`beneath`: as open_plain's).
    `most`: the bytes a rank's save may take where it lies (the tier's bound): a manifest
    naming more is refused before any file of it is read. Raises: BadCopy."""
    path = directory / MANIFEST
    if not os.path.lexists(path):
        raise NoSave(f"{directory}: no {MANIFEST} (no save, or one cut short)")
    try:
        with os.fdopen(open_plain(path, beneath), "rb") as f:
            raw = f.read(MANIFEST_MAX + 1)
    except OSError as exc:
        raise BadCopy(f"{path}: {exc.strerror}") from None
    if len(raw) > MANIFEST_MAX:
        raise BadCopy(f"{path}: more than {MANIFEST_MAX} bytes, not a manifest nodeagent wrote")
    manifest = Manifest.from_json(raw, str(path))
    if most is not None and manifest.size > most:
        raise BadCopy(
            f"{path}: names {manifest.size:,} bytes, more than the {most:,} a rank's save may "
            "take here (checkpoint.memory_size): not read"
        )
    return manifest


def verify(
    directory: Path,
    names: Iterable[str] | None = None,
    beneath: Path | None = None,
    most: int | None = None,
) -> Manifest:
    """The manifest of the save in `directory` once every file it names (or only `names`)
    matches its size and checksum (`beneath`, `most`: as read_manifest's). Raises: BadCopy
    naming the first file that does not."""
    manifest = read_manifest(directory, beneath, most)
    wanted = manifest.files if names is None else {n: manifest.files[n] for n in names}
    for name, expected in wanted.items():
        path = directory / name
        try:
            if path.is_symlink():
                raise BadCopy(f"{path}: a symbolic link, not a file of the save")
            found = checksum(path, expected, beneath)
        except FileNotFoundError:
            raise BadCopy(f"{path}: missing (named by {MANIFEST})") from None
        except OSError as exc:
            raise BadCopy(f"{path}: {exc.strerror}") from None
        why = mismatch(path, found, expected)
        if why is not None:
            raise BadCopy(why)
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


def manifest_in(directory: Path) -> Manifest | None:
    """The manifest of the save in `directory`, unverified; None where there is none (no save,
    one cut short, or a manifest nodeagent did not write)."""
    try:
        return read_manifest(directory)
    except BadCopy:
        return None


def open_plain(path: Path, beneath: Path | None = None) -> int:
    """A descriptor of `path` for reading, only if it is a regular file: never through a
    symbolic link, never blocking on a FIFO a worker put in its place (the agent reads the
    workers' files as root). `beneath`: a directory of the agent's own above `path`
    (memory_dir): then no component below it is followed either, and each must be the tier
    owner's or the agent's (channel/beneath.py). Raises: BadCopy."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags) if beneath is None else open_beneath(beneath, path, flags)
    except FileNotFoundError:
        raise BadCopy(f"{path}: missing (named by {MANIFEST})") from None
    except OSError as exc:
        raise BadCopy(
            f"{path}: {exc.strerror} (a link, something else than a file, or another user's)"
        ) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise BadCopy(f"{path}: not a regular file")
    return fd


def copy_verified(
    source: Path,
    target: Path,
    durable: bool = True,
    expected: Manifest | None = None,
    beneath: Path | None = None,
) -> Manifest:
    """Copy the save in `source` to `target` (made anew), checking every byte copied against
    the source's manifest (which must be `expected`, the one verified, when given: the worker
    may have saved over the slot since) before the copy's manifest is written (last). A copy
    that does not match is removed. `beneath`: as open_plain's, for the source. Raises:
    BadCopy; OSError (a full disk)."""
    manifest = read_manifest(source, beneath)
    if expected is not None and manifest != expected:
        raise BadCopy(f"{source}: now holds step {manifest.step}, not the {expected.step} verified")
    begin(target)
    try:
        for name, want in manifest.files.items():
            summer = Summer(want)
            with (
                os.fdopen(open_plain(source / name, beneath), "rb") as src,
                open(target / name, "xb") as dst,
            ):
                size = os.fstat(src.fileno()).st_size
                if size != want.size:  # not read (see checksum)
                    raise BadCopy(str(mismatch(source / name, FileSum(size), want)))
                for chunk in _chunks(src, want.size + 1):
                    summer.update(chunk)
                    dst.write(chunk)
            why = mismatch(source / name, summer.result(), want)
            if why is not None:
                raise BadCopy(why)
        write_manifest(target, manifest, durable=durable)
    except BaseException:
        begin(target)  # nothing of a copy that failed stays
        raise
    return manifest
