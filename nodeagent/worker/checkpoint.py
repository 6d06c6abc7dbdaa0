"""Checkpoints that cannot be lost or half-read.

Each checkpoint is two files: `step-<N>.pt` (torch.save bytes) and `step-<N>.json`, a manifest
with the sha256 and size of the data plus step, generation and world size. Both are written to a
temporary name, fsync'd and renamed, the data first; then the directory is fsync'd. A checkpoint
exists once its manifest does, and is used only if its data still matches the checksum, so a
crash mid-write, a truncated file or a flipped byte makes `load_latest` fall back to the previous
one (and say so) instead of loading garbage. Integrity is judged by checksum, never by size.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
FORMAT = 1
_MANIFEST = re.compile(r"^step-(\d+)(?:-rank-(\d+))?\.json$")


@dataclass(frozen=True)
class Checkpoint:
    state: Any
    step: int
    generation: int | None
    world_size: int | None
    path: Path


def _fsync_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
        self.directory.mkdir(parents=True, exist_ok=True)

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
        """Write a checkpoint atomically; returns its manifest path (None on non-writing ranks)."""
        if not self.writes:
            return None
        import torch  # lazily: the agent imports nodeagent.worker's package, never torch

        buffer = io.BytesIO()
        torch.save(state, buffer)
        data = buffer.getvalue()
        stem = self._stem(step)
        data_path = self.directory / f"{stem}.pt"
        manifest_path = self.directory / f"{stem}.json"
        _fsync_write(data_path, data)
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
        _fsync_write(manifest_path, json.dumps(manifest, indent=1).encode())
        _fsync_dir(self.directory)
        self._prune()
        return manifest_path

    def _manifests(self) -> list[tuple[int, Path]]:
        found = []
        for path in self.directory.iterdir():
            match = _MANIFEST.match(path.name)
            if not match:
                continue
            rank = match.group(2)
            if self.per_rank != (rank is not None) or (rank is not None and int(rank) != self.rank):
                continue
            found.append((int(match.group(1)), path))
        return sorted(found, reverse=True)

    def _verify(self, manifest_path: Path) -> tuple[dict[str, Any], bytes]:
        """The manifest and its data, or ValueError saying what is wrong."""
        try:
            manifest = json.loads(manifest_path.read_bytes())
        except (OSError, ValueError) as exc:
            raise ValueError(f"manifest unreadable: {exc}") from exc
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise ValueError("not a nodeagent checkpoint manifest")
        data_path = self.directory / str(manifest.get("file"))
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
                manifest, data = self._verify(manifest_path)
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
        kept = 0
        for _, manifest_path in self._manifests():
            if kept < self.keep:
                try:
                    self._verify(manifest_path)
                    kept += 1
                    continue
                except ValueError:
                    pass  # a corrupt checkpoint does not count toward `keep`
            data_path = manifest_path.with_suffix(".pt")
            manifest_path.unlink(missing_ok=True)
            data_path.unlink(missing_ok=True)
