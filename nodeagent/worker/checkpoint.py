"""Checkpoints that cannot be lost or half-read.

Each checkpoint is two files: `step-<N>.<random>.pt` (torch.save bytes, under a name no other
save uses) and `step-<N>.json`, a manifest naming that data file, with its sha256 and size plus
step, generation and world size. A save writes the data to a temporary file, fsyncs it and
renames it to its unique name, fsyncs the directory, then does the same for the manifest: that
one rename commits the save. A checkpoint exists once its manifest does; nothing a good
checkpoint needs is replaced or removed before that, so saving step 30 again and dying halfway
leaves the old step 30 whole. Only then is the old data file of the same step removed.

A checkpoint is used only if its manifest names a data file of its own step in its own directory
and that data still matches the checksum, so a crash mid-write, a truncated file, a flipped byte
or a manifest pointing elsewhere makes `load_latest` fall back to the previous one (and say so)
instead of loading garbage. Integrity is judged by checksum, never by size.

A failed save removes what it wrote; a manager that writes removes, when created, the temporary
files a killed save left and prunes data files no manifest names (orphans, see `_prune_orphans`).
It assumes one writer per set of files (rank 0 for a shared checkpoint, each rank for its own):
the agent stops a generation's workers before it starts the next one's.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodeagent.channel.manifests import fsync

log = logging.getLogger(__name__)
FORMAT = 1
_MANIFEST = re.compile(r"step-([0-9]+)(?:-rank-([0-9]+))?\.json")
_TOKEN_BYTES = 8  # the random part of a data file's name: 16 hex digits


@dataclass(frozen=True)
class Checkpoint:
    state: Any
    step: int
    generation: int | None
    world_size: int | None
    path: Path


def _temp_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def _remove(path: Path) -> None:
    """Delete `path` if it is there; a failure is logged, never raised (it is only cleanup)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("could not remove %s: %s", path, exc)


def _fsync_write(path: Path, data: bytes) -> None:
    """Write `data` to a temporary file, fsync it and rename it to `path`.

    Raises:
        OSError: the write, fsync or rename failed; the temporary file is gone by then.
    """
    tmp = _temp_path(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        _remove(tmp)
        raise


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value and value.lstrip("-").isdigit() else None


class CheckpointManager:
    """Save and load a job's checkpoints in `directory`.

    Args:
        directory: where checkpoints live (shared by all ranks unless `per_rank`).
        keep: how many valid checkpoints to keep; older ones are deleted after each save.
        rank: this process's rank (default: $RANK, else 0). Only rank 0 writes a shared
            checkpoint; with `per_rank` every rank writes and reads its own.
    """

    def __init__(
        self, directory: str | Path, keep: int = 3, rank: int | None = None, per_rank: bool = False
    ) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.directory = Path(directory)
        self.keep = keep
        self.rank = rank if rank is not None else (_env_int("RANK") or 0)
        self.per_rank = per_rank
        rank_part = f"-rank-{self.rank}" if per_rank else ""
        # This manager's own files only: another rank's, or the shared ones, never match.
        self._data_name = re.compile(
            rf"step-(?P<step>[0-9]+){rank_part}(?:\.[0-9a-f]{{{2 * _TOKEN_BYTES}}})?\.pt"
        )
        self._temp_name = re.compile(
            rf"\.step-[0-9]+{rank_part}(?:\.[0-9a-f]{{{2 * _TOKEN_BYTES}}})?\.(?:pt|json)"
            r"\.[0-9]+\.tmp"
        )
        self.directory.mkdir(parents=True, exist_ok=True)
        if self.writes:
            self._remove_stale_temps()
            self._prune_orphans()

    def _stem(self, step: int) -> str:
        return f"step-{step:010d}" + (f"-rank-{self.rank}" if self.per_rank else "")

    @property
    def writes(self) -> bool:
        return self.per_rank or self.rank == 0

    def save(
        self,
        state: Any,
        step: int,
        generation: int | None = None,
        world_size: int | None = None,
    ) -> Path | None:
        """Write a checkpoint atomically; returns its manifest path (None on non-writing ranks).

        Raises:
            OSError: the checkpoint could not be written. If that happened before its manifest
                was renamed into place, nothing of it is left and the previous checkpoint of
                this step, if any, is untouched.
        """
        if not self.writes:
            return None
        import torch  # lazily: the agent imports nodeagent.worker's package, never torch

        buffer = io.BytesIO()
        torch.save(state, buffer)
        data = buffer.getvalue()
        stem = self._stem(step)
        data_path = self.directory / f"{stem}.{secrets.token_hex(_TOKEN_BYTES)}.pt"
        manifest_path = self.directory / f"{stem}.json"
        replaced = self._named_data(step, manifest_path)
        manifest = {
            "format": FORMAT,
            "step": step,
            "generation": generation
            if generation is not None
            else _env_int("NODEAGENT_GENERATION"),
            "world_size": world_size if world_size is not None else _env_int("WORLD_SIZE"),
            "rank": self.rank if self.per_rank else None,
            "file": data_path.name,
            "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "saved_at": time.time(),
        }
        self._commit(data_path, data, manifest_path, json.dumps(manifest, indent=1).encode())
        if replaced is not None:
            _remove(self.directory / replaced)  # no manifest names it any more
        self._prune()
        return manifest_path

    def _commit(self, data_path: Path, data: bytes, manifest_path: Path, manifest: bytes) -> None:
        """Write the data, then commit it by renaming its manifest into place.

        The directory is fsync'd between the two renames, so the manifest can never be durable
        while the data file it names is not. If anything fails before the manifest's rename,
        the new data file is removed again.
        """
        committed = False
        try:
            _fsync_write(data_path, data)
            fsync(self.directory)
            _fsync_write(manifest_path, manifest)
            committed = True
            fsync(self.directory)
        except BaseException:
            if not committed:
                _remove(data_path)
            raise

    def _manifests(self) -> list[tuple[int, Path]]:
        """This manager's manifests, newest step first."""
        found = []
        for path in self.directory.iterdir():
            match = _MANIFEST.fullmatch(path.name)
            if match and path.name == f"{self._stem(int(match.group(1)))}.json":
                found.append((int(match.group(1)), path))
        return sorted(found, reverse=True)

    def _data_step(self, name: str) -> int | None:
        """The step of this manager's data file called `name`, or None if it is not one."""
        match = self._data_name.fullmatch(name)
        if match is None:
            return None
        step = int(match.group("step"))
        return step if name.startswith(f"{self._stem(step)}.") else None

    def _read_manifest(self, step: int, manifest_path: Path) -> dict[str, Any]:
        """The manifest of `step`, or ValueError if it is unreadable or names the wrong file.

        A manifest may name only a data file of its own step in its own directory (a plain
        name, no `/` or `..`), and its `step` must be the one in its own file name.
        """
        try:
            manifest = json.loads(manifest_path.read_bytes())
        except (OSError, ValueError) as exc:
            raise ValueError(f"manifest unreadable: {exc}") from exc
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise ValueError("not a nodeagent checkpoint manifest")
        said = manifest.get("step")
        if type(said) is not int or said != step:
            raise ValueError(f"manifest says step {said!r}, its file name says {step}")
        name = manifest.get("file")
        if not isinstance(name, str) or self._data_step(name) != step:
            raise ValueError(f"manifest names {name!r}, not a data file of step {step} here")
        return manifest

    def _named_data(self, step: int, manifest_path: Path) -> str | None:
        """The data file the manifest of `step` names, or None if there is no valid one."""
        try:
            return str(self._read_manifest(step, manifest_path)["file"])
        except ValueError:
            return None

    def _verify(self, step: int, manifest_path: Path) -> tuple[dict[str, Any], bytes]:
        """The manifest and its data, or ValueError saying what is wrong."""
        manifest = self._read_manifest(step, manifest_path)
        data_path = self.directory / manifest["file"]
        try:
            data = data_path.read_bytes()
        except OSError as exc:
            raise ValueError(f"data file {data_path.name} unreadable: {exc.strerror}") from exc
        if len(data) != manifest.get("bytes"):
            raise ValueError(
                f"{data_path.name} has {len(data)} bytes, manifest says {manifest.get('bytes')}"
            )
        if hashlib.sha256(data).hexdigest() != manifest.get("sha256"):
            raise ValueError(f"{data_path.name} does not match its sha256")
        return manifest, data

    def load_latest(
        self, map_location: Any = "cpu", weights_only: bool = True
    ) -> Checkpoint | None:
        """The newest checkpoint whose data verifies; corrupt or partial ones are skipped."""
        import torch

        for step, manifest_path in self._manifests():
            try:
                manifest, data = self._verify(step, manifest_path)
                state = torch.load(
                    io.BytesIO(data), map_location=map_location, weights_only=weights_only
                )
            except Exception as exc:  # a corrupt pickle can raise anything
                log.warning("skipping checkpoint %s: %s", manifest_path.name, exc)
                continue
            return Checkpoint(
                state=state,
                step=step,
                generation=manifest.get("generation"),
                world_size=manifest.get("world_size"),
                path=self.directory / manifest["file"],
            )
        return None

    def _prune(self) -> None:
        """Keep the newest `keep` checkpoints that verify; delete the others and orphans."""
        kept = 0
        for step, manifest_path in self._manifests():
            if kept < self.keep:
                try:
                    self._verify(step, manifest_path)
                    kept += 1
                    continue
                except ValueError:
                    pass  # a corrupt checkpoint does not count toward `keep`
            named = self._named_data(step, manifest_path)  # only ever a file of this step
            _remove(manifest_path)  # first: a crash in between leaves an orphan, pruned later
            if named is not None:
                _remove(self.directory / named)
        self._prune_orphans()

    def _prune_orphans(self) -> None:
        """Delete this manager's data files that no manifest names, of steps already passed.

        Only orphans of steps older than the newest committed checkpoint go. A save in progress
        (its data renamed, its manifest not yet) is of a step newer than every committed one, as
        training moves forward, so a second writer that should not be there (a rank of the last
        generation still saving) at worst loses data no manifest needs yet. Deleting a stale
        temporary file, by contrast, only makes such a save fail before it commits.
        """
        named: set[str] = set()
        newest: int | None = None
        for step, manifest_path in self._manifests():
            name = self._named_data(step, manifest_path)
            if name is not None:
                named.add(name)
                newest = step if newest is None else max(newest, step)
        if newest is None:
            return
        for path in self.directory.iterdir():
            data_step = self._data_step(path.name)
            if data_step is not None and data_step < newest and path.name not in named:
                log.warning("removing %s: no manifest names it", path.name)
                _remove(path)

    def _remove_stale_temps(self) -> None:
        """Delete the temporary files of saves that were killed before they could clean up."""
        for path in self.directory.iterdir():
            if self._temp_name.fullmatch(path.name) and path.is_file():
                log.warning("removing %s, left by a save that did not finish", path.name)
                _remove(path)
