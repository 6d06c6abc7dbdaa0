"""torchtitan's components under nodeagent (nodeagent.integrations.torchtitan), on CPU.

torchtitan's Trainer runs on a GPU only (it picks "cuda" when it finds no accelerator), so this
script runs what a Trainer's `train()` does with torchtitan's own parts: an FSDP2 model
(`fully_shard`, every Linear and the whole), `OptimizersContainer` (AdamW) and
`LRSchedulersContainer` (warm-up then linear decay) built from their configs, a
`ParallelAwareDataloader` (torchdata's StatefulDataLoader) over a stream of batches, the trainer
state `{"step", "ntokens_seen"}`, and the checkpoint manager built from
`NodeagentCheckpointManager.Config` exactly as torchtitan's Trainer builds its own:
`checkpointer.load()` before the loop, `checkpointer.save(step, last_step)` after each step.
On a GPU torchtitan's Trainer takes the same Config (docs/frameworks.md).

Appends JSON lines to $RECORD_DIR/<pid>.jsonl: "restored" (the step the loop went on from, the
world, a hash of the whole model gathered), "step" after each step (step, the batch's sum, the
learning rate, the hash), "final". MAX_STEPS (20), SAVE_EVERY (5), DUMP_DIR (torchtitan's dump
folder: saves without nodeagent), STEP_TIME_S (0), CRASH_AT=S: rank CRASH_RANK (0) exits 1 at
once after step S
(after its save).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.utils.data import IterableDataset
from torchtitan.components.dataloader import ParallelAwareDataloader
from torchtitan.components.optimizer import LRSchedulersContainer, OptimizersContainer
from torchtitan.components.optimizer.optimizer import ParamGroupConfig

from nodeagent.integrations.torchtitan import NodeagentCheckpointManager

FEATURES, HIDDEN, GLOBAL_BATCH = 16, 32, 12


def record(event: str, **fields: Any) -> None:
    line = {"t": time.time(), "pid": os.getpid(), "event": event, **fields}
    path = Path(os.environ["RECORD_DIR"]) / f"{os.getpid()}.jsonl"
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


class Stream(IterableDataset):  # type: ignore[type-arg]
    """Batch i of the data-parallel rank's share, the same whatever the world: the global
    batch i sliced by rank."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world
        self.index = 0  # the next batch's (the loader's position: state_dict)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            generator = torch.Generator().manual_seed(self.index)
            x = torch.randn(GLOBAL_BATCH, FEATURES, generator=generator)
            part = slice(
                self.rank * GLOBAL_BATCH // self.world, (self.rank + 1) * GLOBAL_BATCH // self.world
            )
            self.index += 1
            yield x[part], x[part].sum(dim=1, keepdim=True)

    def state_dict(self) -> dict[str, int]:
        return {"index": self.index}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.index = state["index"]


class TrainState:
    """What torchtitan's Trainer saves of itself."""

    def __init__(self) -> None:
        self.step = 0
        self.ntokens_seen = 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "ntokens_seen": self.ntokens_seen}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.ntokens_seen = state["step"], state["ntokens_seen"]


def model_sha256(model: nn.Module) -> str:
    """The whole model's, gathered (every rank must call it)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
        digest.update(name.encode() + full.detach().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def main() -> int:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    steps = int(os.environ.get("MAX_STEPS", "20"))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 1))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    adamw = ParamGroupConfig(pattern=".*", optimizer_name="AdamW", optimizer_kwargs={"lr": 0.01})
    optimizers = OptimizersContainer.Config(param_groups=[adamw], implementation="for-loop").build(
        model_parts=[model]
    )
    lr_schedulers = LRSchedulersContainer.Config(warmup_steps=3).build(
        optimizers=optimizers, training_steps=steps
    )
    dataloader = ParallelAwareDataloader(Stream(rank, world), rank, world, batch_size=None)
    state = TrainState()
    checkpointer = NodeagentCheckpointManager.Config(
        enable=True, interval=int(os.environ.get("SAVE_EVERY", "5")), keep_latest_k=2
    ).build(
        dataloader=dataloader,
        model_parts=[model],
        optimizers=optimizers,
        lr_schedulers=lr_schedulers,
        states={"train_state": state},
        sd_adapter=None,
        base_folder=os.environ.get("DUMP_DIR") or tempfile.mkdtemp(prefix="torchtitan-"),
    )

    checkpointer.load()
    generation = int(os.environ.get("NODEAGENT_GENERATION", "0"))
    record(
        "restored",
        step=state.step,
        rank=rank,
        world=world,
        generation=generation,
        hash=model_sha256(model),
    )
    batches = iter(dataloader)
    loss_fn = nn.MSELoss()
    while state.step < steps:
        state.step += 1
        x, y = next(batches)
        optimizers.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizers.step()
        lr_schedulers.step()
        state.ntokens_seen += x.numel()
        fields = {
            "step": state.step,
            "batch_sum": round(float(x.sum()), 6),
            "lr": lr_schedulers.schedulers[0].get_last_lr()[0],
            "rank": rank,
            "world": world,
            "generation": generation,
            "hash": model_sha256(model),
        }
        record("step", **fields)
        checkpointer.save(state.step, last_step=state.step == steps)
        crash = os.environ.get("CRASH_AT")
        if crash and state.step == int(crash) and rank == int(os.environ.get("CRASH_RANK", "0")):
            os._exit(1)
        time.sleep(float(os.environ.get("STEP_TIME_S", "0")))
    checkpointer.close()
    record("final", step=state.step, rank=rank, hash=model_sha256(model))
    return 0


if __name__ == "__main__":
    sys.exit(main())
