"""Issue 40, part 4: a worker never unpickles what a tier holds. A save may have come from a
peer; DCP's own reader unpickles `.metadata` and loads values with `weights_only=False`, so a
forged save ran its payload as the job's user. Here each payload is refused as a bad copy, the
next source is restored, and the payload never runs. One process, no process group."""

from __future__ import annotations

import os
import pickle
import shlex
from pathlib import Path
from typing import Any

import pytest

from nodeagent.channel import tier
from tests.helpers.safeload import reseal, restored, saved

torch = pytest.importorskip("torch")


class Payload:
    """What a forger pickles: unpickling it runs a shell command (here: touch a marker)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


def test_a_payload_in_a_value_or_in_metadata_is_refused_and_never_runs(tmp_path: Path) -> None:
    from nodeagent.worker import dcpio

    marker = tmp_path / "payload-ran"
    memory = tmp_path / "m"
    state = saved(memory, 2, 4)
    # Step 4 rewritten by DCP itself with a payload for a value, the manifest resealed.
    slot = tier.newest_in_memory(memory, 0, step=4)
    assert slot is not None
    for written in [slot / ".metadata", *slot.glob("*.distcp")]:
        written.unlink()
    dcpio.save_rank({**state.state_dict(), "values": {"epoch": Payload(marker)}}, slot)
    reseal(slot)

    step, epoch, refused = restored(tmp_path, "memory:4 memory:2 start")
    assert not marker.exists()
    assert (step, epoch) == (2, 2)
    [(source, kind, reason)] = refused
    assert (source, kind) == ("memory:4", "bad_copy")
    assert "Unsafe" in reason and "system" in reason, reason

    # The metadata itself replaced by a payload, the manifest resealed over it.
    slot = tier.newest_in_memory(memory, 0, step=2)
    assert slot is not None
    (slot / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    reseal(slot)
    step, epoch, refused = restored(tmp_path, "memory:2 start")
    assert not marker.exists()
    assert (step, epoch) == (0, 0)
    [(source, kind, reason)] = refused
    assert (source, kind) == ("memory:2", "bad_copy")
    assert "system is not part of DCP's metadata" in reason, reason


def test_metadata_naming_a_file_outside_its_save_or_garbage_is_refused(tmp_path: Path) -> None:
    """A `.metadata` built only of DCP's classes but naming `../` data, or not a pickle at all:
    refused as a bad copy (the next source restored), never read, never a crash."""
    from nodeagent.worker import dcpio

    memory = tmp_path / "m"
    saved(memory, 2, 4)
    slot = tier.newest_in_memory(memory, 0, step=4)
    assert slot is not None
    metadata = dcpio.read_metadata(slot)
    for info in metadata.storage_data.values():
        info.relative_path = "../../outside.distcp"
    (slot / ".metadata").write_bytes(pickle.dumps(metadata))
    reseal(slot)
    step, _, refused = restored(tmp_path, "memory:4 memory:2 start")
    assert step == 2
    [(source, kind, reason)] = refused
    assert (source, kind) == ("memory:4", "bad_copy")
    assert "'../../outside.distcp'" in reason and "plain file name" in reason, reason

    slot = tier.newest_in_memory(memory, 0, step=2)
    assert slot is not None
    (slot / ".metadata").write_bytes(b"\x80\x05 not a pickle")
    reseal(slot)
    step, _, refused = restored(tmp_path, "memory:2 start")
    assert step == 0
    [(_, kind, reason)] = refused
    assert kind == "bad_copy" and "not DCP metadata" in reason, reason
