"""A rank's save in a memory tier, altered and restored by hand: what the tests of the
worker's safe reads (tests/integration/test_safe_load.py, test_metadata_pythons.py) share. One
process, no process group; torch imported lazily."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from nodeagent.channel import manifests, restore, tier


def reseal(slot: Path) -> None:
    """The manifest made to match the slot's files again: what a forger who got past the digest
    check would have; the worker must not depend on it to stay safe."""
    manifest = manifests.read_manifest(slot)
    manifests.write_manifest(slot, dataclasses.replace(manifest, files=manifests.summarize(slot)))
    manifests.verify(slot)


def saved(memory: Path, *steps: int) -> Any:
    """A rank's TrainState (epoch 2) saved at `steps` into the memory tier `memory`."""
    import torch

    from nodeagent.worker import Checkpointer, TrainState

    model = torch.nn.Linear(4, 3)
    state = TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1), epoch=2)
    ck = Checkpointer(env={"RANK": "0", "WORLD_SIZE": "1", tier.MEMORY_ENV: str(memory)})
    for step in steps:
        assert ck.save(state, step)
        ck.wait()
    return state


def restored(tmp_path: Path, order: str) -> tuple[int, int, list[tuple[str, str, str]]]:
    """(step restored, the epoch it carries, [(source, kind, reason) refused]) of a new rank."""
    import torch

    from nodeagent.worker import Checkpointer, TrainState

    model = torch.nn.Linear(4, 3)
    state = TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1), epoch=0)
    report = tmp_path / "report.json"
    env = {
        "RANK": "0",
        "WORLD_SIZE": "1",
        tier.MEMORY_ENV: str(tmp_path / "m"),
        restore.RESTORE_ENV: order,
        restore.RESTORE_REPORT_ENV: str(report),
    }
    step = Checkpointer(env=env).restore(state)
    refused = json.loads(report.read_text())["refused"]
    return step, state.epoch, [(r["source"], r["kind"], r["reason"]) for r in refused]
