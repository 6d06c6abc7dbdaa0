"""torchtitan's own Trainer with nodeagent's checkpoint manager: on a GPU.

examples/train_torchtitan.py runs torchtitan's components in the shape of `Trainer.train()` on
CPU; this runs `Trainer` itself, which picks "cuda" when it finds no accelerator: torchtitan's
llama3 debug model (6 layers, dim 256, vocab 2048, flex attention), its AdamW and warm-up
schedule, FSDP2 over the ranks, `config.checkpoint = NodeagentCheckpointManager.Config(...)`
as a user of the integration writes it (docs/frameworks.md). Two things stand in for a real
job's: the tokenizer (no files needed; the data is token ids already) and the data, a seeded
stream of random token ids in documents of random length, with its position saved like
torchtitan's text loader's.

Appends JSON lines to $RECORD_DIR/<pid>.jsonl, as the other framework examples do (read by
tests/helpers/frameworks.py): "restored" (the step `train()` goes on from, the world, a hash of
the whole model gathered), "step" after each step's save call (step, the batch's sum, the
learning rate, the hash), "final". MAX_STEPS (20), SAVE_EVERY (5), DUMP_DIR (torchtitan's dump
folder), SEQ_LEN (256), CRASH_AT=S: rank 0 exits 1 at once after step S (after its save);
FLAVOR (debugmodel: any of torchtitan's llama3 flavors, "1B" say), LOCAL_BATCH (4), and
CHECKPOINTER=torchtitan for torchtitan's own manager in its `async_with_pinned_mem` mode instead
of nodeagent's (the save's stall compared: each step line has `save_s`, the save call's time).
Deterministic (torchtitan's debug.deterministic, seed 0), so that a run resumed from a save
can be compared with the run never interrupted.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import IterableDataset
from torchtitan.components.dataloader import ParallelAwareDataloader
from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
from torchtitan.components.metrics import MetricsProcessor
from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw
from torchtitan.components.tokenizer import BaseTokenizer
from torchtitan.components.validate import Validator
from torchtitan.config import TrainingConfig
from torchtitan.config.configs import DebugConfig
from torchtitan.distributed.activation_checkpoint import SelectiveAC
from torchtitan.models.common.config_utils import decoder_vocab_size
from torchtitan.models.llama3 import model_registry
from torchtitan.trainer import Trainer

from nodeagent.integrations.torchtitan import NodeagentCheckpointManager

VOCAB = [2048]  # the model's, set by config()

FLAVOR = os.environ.get("FLAVOR", "debugmodel")

# torchtitan 0.3.0 is written against PyTorch nightly: its Trainer sets the process groups'
# timeouts after the first step with `torch.distributed.set_timeout`, which released PyTorch
# (2.11 to 2.13) has under its older, private name. Any torchtitan user on released PyTorch
# needs this line; it is not the integration's.
if not hasattr(torch.distributed, "set_timeout"):
    torch.distributed.set_timeout = torch.distributed.distributed_c10d._set_pg_timeout  # type: ignore[attr-defined]


def record(event: str, **fields: Any) -> None:
    line = {"t": time.time(), "pid": os.getpid(), "event": event, **fields}
    path = Path(os.environ["RECORD_DIR"]) / f"{os.getpid()}.jsonl"
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


class Ids(BaseTokenizer):  # type: ignore[misc]
    """The data is token ids already: nothing to read, nothing to encode."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseTokenizer.Config):  # type: ignore[misc]
        pass

    def __init__(self, config: Config, tokenizer_path: str = "") -> None:
        super().__init__()

    def encode(self, *args: Any, **kwargs: Any) -> list[int]:
        raise NotImplementedError("the data is token ids already")

    def decode(self, *args: Any, **kwargs: Any) -> str:
        raise NotImplementedError("the data is token ids already")

    def get_vocab_size(self) -> int:
        return VOCAB[0]


class Documents(IterableDataset):  # type: ignore[type-arg]
    """Sample i of the data-parallel rank's share: seeded token ids with per-document
    positions (documents 17 to 300 tokens long), as torchtitan's text loader yields them."""

    def __init__(self, seq_len: int, rank: int) -> None:
        self.seq_len, self.rank = seq_len, rank
        self.index = 0  # the next sample's (the loader's position: state_dict)

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        while True:
            generator = torch.Generator().manual_seed(self.index * 1009 + self.rank)
            tokens = torch.randint(0, VOCAB[0], (self.seq_len + 1,), generator=generator)
            positions: list[int] = []
            while len(positions) < self.seq_len:
                length = int(torch.randint(17, 300, (1,), generator=generator))
                positions += range(length)
            self.index += 1
            inputs = {"input": tokens[:-1], "positions": torch.tensor(positions[: self.seq_len])}
            yield inputs, tokens[1:]

    def state_dict(self) -> dict[str, int]:
        return {"index": self.index}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.index = state["index"]


class RandomDocuments(ParallelAwareDataloader):  # type: ignore[misc]
    """torchtitan's stateful data-parallel loader over `Documents`."""

    @dataclass(kw_only=True, slots=True)
    class Config(ParallelAwareDataloader.Config):  # type: ignore[misc]
        pass

    def __init__(
        self,
        config: Config,
        *,
        dp_world_size: int,
        dp_rank: int,
        tokenizer: BaseTokenizer,
        seq_len: int,
        local_batch_size: int,
        snapshot_every_n_steps: int | None = 1,
    ) -> None:
        super().__init__(
            Documents(seq_len, dp_rank),
            dp_rank,
            dp_world_size,
            batch_size=local_batch_size,
            snapshot_every_n_steps=snapshot_every_n_steps,
        )


def model_sha256(trainer: Trainer) -> str:
    """The whole model's, gathered (every rank must call it)."""
    digest = hashlib.sha256()
    for part in trainer.model_parts:
        for name, tensor in sorted(part.state_dict().items()):
            full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
            digest.update(name.encode() + full.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def checkpointing() -> Any:
    """nodeagent's manager, as docs/frameworks.md says to set it, or torchtitan's own."""
    interval = int(os.environ.get("SAVE_EVERY", "5"))
    if os.environ.get("CHECKPOINTER") == "torchtitan":
        from torchtitan.components.checkpoint import CheckpointManager

        return CheckpointManager.Config(
            enable=True, interval=interval, keep_latest_k=2, async_mode="async_with_pinned_mem"
        )
    return NodeagentCheckpointManager.Config(enable=True, interval=interval, keep_latest_k=2)


def config(steps: int) -> Trainer.Config:
    """torchtitan's llama3_debugmodel config (its config_registry), with this script's
    tokenizer and data, and nodeagent's checkpoint manager."""
    spec = model_registry(FLAVOR)
    VOCAB[0] = decoder_vocab_size(spec)
    return Trainer.Config(
        hf_assets_path="",
        dump_folder=os.environ.get("DUMP_DIR", "./outputs"),
        model_spec=spec,
        loss=ChunkedLossWrapper.Config(
            loss_fn=CrossEntropyLoss.Config(global_vocab_size=decoder_vocab_size(spec))
        ),
        tokenizer=Ids.Config(),
        dataloader=RandomDocuments.Config(),
        optimizer=default_adamw(lr=8e-4),
        lr_scheduler=LRSchedulersContainer.Config(
            warmup_steps=2, decay_ratio=0.8, decay_type="linear", min_lr_factor=0.0
        ),
        training=TrainingConfig(
            local_batch_size=int(os.environ.get("LOCAL_BATCH", "4")),
            seq_len=int(os.environ.get("SEQ_LEN", "256")),
            steps=steps,
        ),
        metrics=MetricsProcessor.Config(log_freq=1),
        checkpoint=checkpointing(),
        activation_checkpoint=SelectiveAC.Config(),
        validator=Validator.Config(enable=False),
        debug=DebugConfig(seed=0, deterministic=True, deterministic_warn_only=True),
    )


class Recorded(Trainer):  # type: ignore[misc]
    """torchtitan's Trainer, its checkpointer's save followed by a line of what the step did."""

    def __init__(self, config: Trainer.Config) -> None:
        super().__init__(config)
        self.last_batch_sum = 0.0
        self.losses: list[torch.Tensor] = []
        save = self.checkpointer.save

        def saved(curr_step: int, last_step: bool = False) -> bool:
            began = time.perf_counter()
            done = save(curr_step, last_step)
            took = time.perf_counter() - began
            rank = torch.distributed.get_rank()
            fields = {
                "step": curr_step,
                "batch_sum": self.last_batch_sum,
                "lr": self.lr_schedulers.schedulers[0].get_last_lr()[0],
                "rank": rank,
                "world": torch.distributed.get_world_size(),
                "hash": model_sha256(self),
                "save_s": round(took, 4),
                "loss": self.last_loss(),
            }
            record("step", **fields)
            if os.environ.get("CRASH_AT") == str(curr_step) and rank == 0:
                os._exit(1)
            return bool(done)

        self.checkpointer.save = saved

    def post_dataloading_process(self, input_dict: dict[str, torch.Tensor], labels: Any) -> Any:
        self.last_batch_sum = float(input_dict["input"].sum())
        return super().post_dataloading_process(input_dict, labels)

    def forward_backward_step(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        loss: torch.Tensor = super().forward_backward_step(*args, **kwargs)
        self.losses.append(loss.detach())
        return loss

    def last_loss(self) -> float:
        """The step's loss (summed over its microbatches), read once the step is done."""
        loss = float(sum(float(x) for x in self.losses))
        self.losses.clear()
        return loss

    def train(self) -> None:
        load = self.checkpointer.load

        def loaded(step: int = -1) -> bool:
            done = load(step)
            rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
            record("restored", step=self.step, rank=rank, world=world, hash=model_sha256(self))
            return bool(done)

        self.checkpointer.load = loaded
        super().train()


def main() -> int:
    trainer = Recorded(config(int(os.environ.get("MAX_STEPS", "20"))))
    try:
        trainer.train()
        record(
            "final",
            step=trainer.step,
            rank=torch.distributed.get_rank(),
            hash=model_sha256(trainer),
        )
    finally:
        trainer.close()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
