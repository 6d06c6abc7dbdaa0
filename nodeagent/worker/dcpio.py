"""torch.distributed.checkpoint (DCP) as the tiers use it: each rank saves and loads alone.

A rank saves its own state with DCP's `no_dist` (no collective: nothing to interleave with the
training's own, which is what crashes `dcp.async_save` on the default gloo group): its shards,
with their global offsets, and its own `.metadata`. At the same world a rank loads its own
directory. At another world, `MergedReader` reads every old rank's directory as one checkpoint
(their metadata merged: a replicated tensor's identical chunks kept once), and DCP reshards at
load time, again with no collective: each rank plans its own reads. torch is imported lazily.

Nothing read is unpickled freely (issue 40): a save may have come from a peer, and DCP's own
reader unpickles `.metadata` and loads non-tensor values with `torch.load(weights_only=False)`,
either of which runs whatever code a forged file names. Here `.metadata` goes through an
unpickler that builds only the classes DCP's metadata is made of, its file names must be plain
names in the save's own directory, and values load with `weights_only=True`. A file that asks
for anything else raises `Unsafe`: the source is refused, never a crash or code run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import pickle
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from nodeagent.channel import manifests

_NO_DIST = "torch.distributed is disabled"  # DCP warns so on every no_dist call


def save_rank(state_dict: dict[str, Any], directory: Path) -> None:
    """This rank's state into `directory`, alone (no collective)."""
    from torch.distributed.checkpoint.filesystem import FileSystemWriter
    from torch.distributed.checkpoint.state_dict_saver import save

    writer = FileSystemWriter(
        str(directory), single_file_per_rank=True, sync_files=False, thread_count=1
    )
    with warnings.catch_warnings(), _plain_errors("save"):
        warnings.filterwarnings("ignore", message=_NO_DIST)
        save(state_dict, storage_writer=writer, no_dist=True)


@contextlib.contextmanager
def _plain_errors(what: str) -> Iterator[None]:
    """DCP wraps whatever failed in a CheckpointException, a BaseException: past every
    `except Exception` (a failed save would end a re-form, a failed load the restore, instead
    of the next source being tried). Raise it as a RuntimeError naming the first cause."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        yield
    except CheckpointException as exc:
        causes = [failure[0] for failure in exc.failures.values()]  # (exception, traceback)
        first = causes[0] if causes else exc
        if isinstance(first, Unsafe | pickle.UnpicklingError):
            raise Unsafe(f"DCP could not {what}: {first}") from None
        raise RuntimeError(f"DCP could not {what}: {type(first).__name__}: {first}") from None


def load(state_dict: dict[str, Any], directories: Sequence[Path]) -> None:
    """Load in place into `state_dict` (its tensors say which shards this rank needs) from one
    rank's directory, or from several read as one checkpoint (resharding).

    Raises:
        NotCovered: they do not hold every element of this rank's shards (nothing loaded)."""
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    reader = merged_reader(directories)
    short = uncovered(state_dict, reader.read_metadata())
    if short is not None:
        raise NotCovered(f"the {len(directories)} saves read hold only part of {short}")
    with warnings.catch_warnings(), _plain_errors("load"):
        warnings.filterwarnings("ignore", message=_NO_DIST)
        dcp_load(state_dict, storage_reader=reader, planner=_planner(), no_dist=True)


class NotCovered(ValueError):
    """The saves read at another world do not hold every element this rank loads."""


class Unsafe(ValueError):
    """A save's file asks to build something a DCP checkpoint never holds (a class outside its
    format, a file outside its directory): forged or not DCP's; refused, never loaded."""


def uncovered(state_dict: dict[str, Any], metadata: Any) -> str | None:
    """The first tensor of `state_dict` (dotted path) of which the saves `metadata` describes
    hold only part of this rank's shard, planned as DCP plans the load; None if they hold all.
    DCP itself would leave such a part as it was (the freshly built model's values)."""
    import torch
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.planner import LoadItemType

    planner = DefaultLoadPlanner()
    planner.set_up_planner(state_dict, metadata, True)
    read: dict[str, int] = {}
    for item in planner.create_local_plan().items:
        if item.type == LoadItemType.TENSOR:
            fqn = item.dest_index.fqn
            read[fqn] = read.get(fqn, 0) + math.prod(item.lengths)
    for fqn, value in planner.state_dict.items():
        if isinstance(value, torch.Tensor):
            local = value.to_local() if hasattr(value, "to_local") else value
            if read.get(fqn, 0) < local.numel():
                return fqn
    return None


def merged_reader(directories: Sequence[Path]) -> Any:
    """A DCP reader of the rank directories `directories` as one checkpoint (siblings in a
    persistent tier; on a node, some in its memory tier and some in its replica area); of one
    directory, that save as it is. Its metadata is read once, safely (`read_metadata`).

    Raises:
        Unsafe: a `.metadata` is not DCP's metadata."""
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    if len(directories) == 1:
        root, metadata = directories[0], read_metadata(directories[0])
    else:
        root = Path(os.path.commonpath([str(d) for d in directories]))
        parts = [(os.path.relpath(d, root), read_metadata(d)) for d in directories]
        metadata = merge_metadata(parts)

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id  # as FileSystemReader does
            return metadata

    return SafeReader(str(root))


def read_metadata(directory: Path) -> Any:
    """The DCP Metadata of the save in `directory`, unpickled with only its format's classes,
    every data file it names a plain name in that directory.

    Raises:
        Unsafe: anything else (a forged or foreign file); OSError: it cannot be read."""
    from torch.distributed.checkpoint.metadata import Metadata

    with open(directory / ".metadata", "rb") as f:
        try:
            metadata = _MetadataUnpickler(f).load()
        except Unsafe:
            raise
        except Exception as exc:  # a truncated or garbled pickle raises anything
            raise Unsafe(f"{directory}/.metadata is not DCP metadata: {exc}") from None
    if not isinstance(metadata, Metadata) or not isinstance(metadata.storage_data, dict):
        raise Unsafe(f"{directory}/.metadata holds a {type(metadata).__name__}, not DCP metadata")
    for info in metadata.storage_data.values():
        name = getattr(info, "relative_path", None)
        if not isinstance(name, str) or not manifests.plain_name(name):
            raise Unsafe(
                f"{directory}/.metadata names data file {name!r}: only a plain file name in "
                "the save's own directory is read"
            )
    return metadata


# What DCP's metadata pickles are made of (torch 2.4 to 2.13): its dataclasses, torch.Size, a
# dtype, a layout by name, an enum of memory formats, and the path a checkpoint was saved to.
_METADATA_CLASSES = frozenset(
    [
        ("torch.distributed.checkpoint.metadata", name)
        for name in (
            "Metadata",
            "MetadataIndex",
            "StorageMeta",
            "TensorProperties",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "_MEM_FORMAT_ENCODING",
        )
    ]
    + [
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch.distributed.checkpoint.planner", "LoadItemType"),
        ("torch.distributed.checkpoint.planner", "WriteItemType"),
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),
        ("pathlib", "PosixPath"),
        ("collections", "OrderedDict"),
    ]
)


class _MetadataUnpickler(pickle.Unpickler):
    """Builds only `_METADATA_CLASSES` and torch's dtypes: a payload naming anything else (the
    `os.system` of a forged `.metadata`) is refused before it is looked up.

    An enum member comes in one of two forms, depending on the CPython that wrote it: by value
    (`cls(value)`: 3.10, 3.11.7 and later, 3.12, 3.13) or by name (`getattr(cls, name)`: 3.11.0
    to 3.11.4, Debian 12's 3.11.2 among them). `builtins.getattr` is therefore answered with
    `_enum_member`, which looks up a member of an allowed enum and nothing else."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _METADATA_CLASSES:
            return super().find_class(module, name)
        if name == "getattr" and module in ("builtins", "__builtin__"):  # protocol 2: __builtin__
            return _enum_member
        if module == "torch":
            import torch

            found = getattr(torch, name, None)
            if isinstance(found, torch.dtype):
                return found
        raise Unsafe(f"{module}.{name} is not part of DCP's metadata: refused, not built")


def _enum_member(cls: Any, name: Any) -> Any:
    """`getattr(cls, name)` as a metadata pickle may ask it: only a member, by its name, of an
    enum `_METADATA_CLASSES` allows.

    Raises: Unsafe: any other target or name (a class's method, a module's function)."""
    import enum

    allowed = (
        isinstance(cls, type)
        and issubclass(cls, enum.Enum)
        and (cls.__module__, cls.__qualname__) in _METADATA_CLASSES
    )
    if not allowed or not isinstance(name, str) or name not in cls.__members__:
        target = getattr(cls, "__qualname__", type(cls).__name__)
        raise Unsafe(
            f"getattr({target}, {name!r}) is not a member of an enum of DCP's metadata: "
            "refused, not built"
        )
    return cls.__members__[name]


def _planner() -> Any:
    """DCP's default load planner but for non-tensor values (an epoch, a sampler's state):
    loaded with `weights_only=True`, torch's safe unpickler, not `weights_only=False`."""
    import io

    import torch
    from torch.distributed.checkpoint._traverse import set_element
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    class SafeLoadPlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            try:
                loaded = torch.load(value, weights_only=True)
            except pickle.UnpicklingError as exc:  # torch's long advice: keep what it refused
                lines = str(exc).splitlines()
                why = next((line for line in lines if "GLOBAL" in line), lines[0] if lines else "")
                raise Unsafe(
                    f"value {read_item.dest_index.fqn} is more than plain data: {why}"
                ) from None
            if self.flatten_state_dict:
                set_element(
                    self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded
                )
            else:
                self.state_dict[read_item.dest_index.fqn] = loaded

    return SafeLoadPlanner()


def merge_metadata(parts: Sequence[tuple[str, Any]]) -> Any:
    """One Metadata for the rank directories `parts` ((name, its Metadata), rank order): every
    tensor's chunks from all of them, each offset once (the lowest rank's copy), paths made
    relative to their common parent. An empty chunk (a rank with no rows of an unevenly
    sharded tensor) is dropped where the tensor has others."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    first = parts[0][1]
    tensors: dict[str, Any] = {}
    storage: dict[Any, Any] = {}
    for name, metadata in parts:
        for fqn, entry in metadata.state_dict_metadata.items():
            if not isinstance(entry, TensorStorageMetadata):
                tensors.setdefault(fqn, entry)
                continue
            merged = tensors.setdefault(fqn, dataclasses.replace(entry, chunks=[]))
            seen = {tuple(c.offsets) for c in merged.chunks}
            for chunk in entry.chunks:
                if tuple(chunk.offsets) not in seen and math.prod(chunk.sizes) > 0:
                    merged.chunks.append(chunk)
                    seen.add(tuple(chunk.offsets))
        for index, info in metadata.storage_data.items():
            if index not in storage:
                storage[index] = dataclasses.replace(
                    info, relative_path=f"{name}/{info.relative_path}"
                )
    for fqn, entry in tensors.items():
        if isinstance(entry, TensorStorageMetadata) and not entry.chunks:  # all empty
            original = first.state_dict_metadata.get(fqn, entry)
            entry.chunks.extend(original.chunks[:1])
    return dataclasses.replace(first, state_dict_metadata=tensors, storage_data=storage)


def tensors(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every tensor in a nested state dict, with its dotted path (a DTensor's local shard)."""
    for path, tensor in _tensors(value, prefix):
        yield path, tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _tensors(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    import torch

    if isinstance(value, torch.Tensor):
        yield prefix, value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _tensors(item, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from _tensors(item, f"{prefix}.{i}")


def row_counts(state_dict: Mapping[str, Any], world: int) -> tuple[int, ...] | None:
    """The distinct row counts of the sharded tensors of `state_dict` when each is split along
    dim 0 over a one-dimensional mesh of the whole world (FSDP2's layout) and every other
    tensor is whole; None for any other layout (channel/layout.py)."""
    counts: set[int] = set()
    for _, tensor in _tensors(state_dict):
        placements = getattr(tensor, "placements", None)
        if placements is None:
            continue  # a plain tensor: whole on every rank
        mesh = tensor.device_mesh
        if mesh.ndim != 1 or mesh.size() != world or len(placements) != 1:
            return None
        (placement,) = placements
        # type(), not isinstance(): _StridedShard, a Shard too, interleaves its rows
        if type(placement).__name__ != "Shard" or placement.dim != 0:
            return None
        counts.add(int(tensor.shape[0]))
    return tuple(sorted(counts))


def first_non_finite(state_dict: Mapping[str, Any]) -> str | None:
    """The path of the first floating-point tensor holding a NaN or an infinity; None if none."""
    import torch

    for path, tensor in tensors(state_dict):
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            return path
    return None
