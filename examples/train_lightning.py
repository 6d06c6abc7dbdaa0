"""A Lightning training script under nodeagent (nodeagent.integrations.lightning): the few lines
docs/frameworks.md shows, in a script the integration's tests run too.

A linear model, SGD with momentum and a StepLR scheduler stepped every optimizer step, on 64
fixed samples in batches of 4 (16 batches an epoch: 20 steps cross an epoch boundary), through
a data loader that can say where it is (state_dict/load_state_dict, as torchdata's
StatefulDataLoader can), so a mid-epoch resume goes on with the next batch.

The lines are written by a callback of the script's own (`Record`), given to the Trainer beside
the integration's. Appends JSON lines to $RECORD_DIR/<pid>.jsonl: "restored" (the step the fit
went on from), "step" after each optimizer step (global step, epoch, batch index, the batch's
sum, the learning rate, a hash of the parameters), and once `fit` returned, "stopped" (SIGTERM:
every rank stopped after the same step, saved) or "final" (the fit ran to its end), with the
parameters' hash. MAX_STEPS (20), SAVE_EVERY (5), CKPT_DIR (the script's own checkpoints),
STEP_TIME_S (0), and CRASH_AT=S: rank CRASH_RANK (0) exits 1 at once after step S. DEVICE (cpu;
cuda: one GPU a rank, tests/gpu/test_frameworks_cuda.py). DROPOUT=P (0): dropout on the inputs,
each step's mask drawn from torch's generator, which a resume must put back.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from nodeagent.integrations.lightning import NodeagentCallback, trainer_options

SAMPLES, BATCH, FEATURES = 64, 4, 8


def record(event: str, **fields: Any) -> None:
    line = {"t": time.time(), "pid": os.getpid(), "event": event, **fields}
    path = Path(os.environ["RECORD_DIR"]) / f"{os.getpid()}.jsonl"
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


class ResumableLoader(DataLoader):  # type: ignore[type-arg]
    """A DataLoader that knows how many batches of the current pass it has handed out."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.handed = 0
        self.skip = 0

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        skip, self.skip = self.skip, 0
        self.handed = 0
        for index, batch in enumerate(super().__iter__()):
            if index < skip:
                continue
            self.handed = index + 1
            yield batch

    def state_dict(self) -> dict[str, int]:
        return {"handed": self.handed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.skip = state["handed"]


class Model(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(FEATURES, 1)
        self.dropout = nn.Dropout(float(os.environ.get("DROPOUT", "0")))  # 0: draws nothing

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.layer(self.dropout(x)), y)
        self.batch_sum = float(x.sum())
        return loss

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.9)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }

    def train_dataloader(self) -> DataLoader:  # type: ignore[type-arg]
        generator = torch.Generator().manual_seed(1)
        x = torch.randn(SAMPLES, FEATURES, generator=generator)
        return ResumableLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=BATCH)


def params_sha256(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


class Record(Callback):
    """The script's own callback, beside the integration's (which comes first in the list: its
    restore and its saves come before these hooks)."""

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        record(
            "restored",
            step=trainer.global_step,
            epoch=trainer.current_epoch,
            rank=trainer.global_rank,
            world=trainer.world_size,
            generation=int(os.environ.get("NODEAGENT_GENERATION", "0")),
            hash=params_sha256(pl_module),
        )

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, index: int
    ) -> None:
        assert isinstance(pl_module, Model)
        record(
            "step",
            step=trainer.global_step,
            epoch=trainer.current_epoch,
            batch_idx=index,
            batch_sum=round(pl_module.batch_sum, 6),
            lr=trainer.optimizers[0].param_groups[0]["lr"],
            rank=trainer.global_rank,
            world=trainer.world_size,
            generation=int(os.environ.get("NODEAGENT_GENERATION", "0")),
            hash=params_sha256(pl_module),
        )
        crash = os.environ.get("CRASH_AT")
        rank = int(os.environ.get("CRASH_RANK", "0"))
        if crash and trainer.global_step == int(crash) and trainer.global_rank == rank:
            sys.stdout.flush()
            os._exit(1)
        time.sleep(float(os.environ.get("STEP_TIME_S", "0")))


def main() -> int:
    torch.set_num_threads(1)
    nodeagent = NodeagentCallback(
        save_every=int(os.environ.get("SAVE_EVERY", "5")), directory=os.environ.get("CKPT_DIR")
    )
    model = Model()
    # DDP that keeps its first buckets: a plain DDP made anew by a resumed process reduces its
    # first step in another layout than the uninterrupted fit's, and at 3 ranks gloo's sums
    # then differ in their last bits (docs/frameworks.md): the resume would not be bit for bit.
    ddp = (
        "ddp_find_unused_parameters_true" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else "auto"
    )
    trainer = Trainer(
        max_steps=int(os.environ.get("MAX_STEPS", "20")),
        accelerator=os.environ.get("DEVICE", "cpu"),
        strategy=ddp,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[nodeagent, Record()],
        **trainer_options(),  # num_nodes, devices
    )
    trainer.fit(model)
    # fit returns after a stop too: every rank stopped after the same step, saved
    event = "stopped" if nodeagent.stopped else "final"
    record(event, step=trainer.global_step, hash=params_sha256(model), rank=trainer.global_rank)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
