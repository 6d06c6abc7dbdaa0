"""A transformers `Trainer` script under nodeagent (nodeagent.integrations.transformers): the
few lines docs/frameworks.md shows, in a script the integration's tests run too.

A small regression model (a plain nn.Module returning its loss, as `Trainer` accepts), AdamW
and a linear schedule with warm-up, 64 fixed samples in batches of 4 a rank (shuffled by
`Trainer`'s sampler, seeded), `max_steps` optimizer steps.

Appends JSON lines to $RECORD_DIR/<pid>.jsonl: "restored" (the step `train` went on from),
"step" after each optimizer step (global step, epoch, the batch's sum, the learning rate, a
hash of the parameters), and once `train` returned, "stopped" (SIGTERM: every rank stopped after
the same step, saved) or "final" (it ran to its end). MAX_STEPS (20), SAVE_EVERY (5), CKPT_DIR
(the script's own checkpoints), OUTPUT_DIR (Trainer's), STEP_TIME_S (0), CRASH_AT=S: rank
CRASH_RANK (0) exits 1 at once after step S. DEVICE (cpu; cuda: one GPU a rank,
tests/gpu/test_frameworks_cuda.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset
from transformers import Trainer, TrainerCallback, TrainingArguments

from nodeagent.integrations.transformers import NodeagentCallback

SAMPLES, FEATURES = 64, 8


def record(event: str, **fields: Any) -> None:
    line = {"t": time.time(), "pid": os.getpid(), "event": event, **fields}
    path = Path(os.environ["RECORD_DIR"]) / f"{os.getpid()}.jsonl"
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


class Samples(Dataset):  # type: ignore[type-arg]
    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(1)
        self.x = torch.randn(SAMPLES, FEATURES, generator=generator)

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[index], "labels": self.x[index].sum().unsqueeze(0)}


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(FEATURES, 1)
        self.batch_sum = 0.0

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        self.batch_sum = float(x.sum())
        out = self.layer(x)
        return {"loss": nn.functional.mse_loss(out, labels), "logits": out}


def params_sha256(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


class Record(TrainerCallback):
    def __init__(self, model: Model) -> None:
        self.model = model

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        record(
            "step",
            step=state.global_step,
            epoch=state.epoch,
            batch_sum=round(self.model.batch_sum, 6),
            lr=kwargs["lr_scheduler"].get_last_lr()[0],
            rank=args.process_index,
            world=args.world_size,
            generation=int(os.environ.get("NODEAGENT_GENERATION", "0")),
            hash=params_sha256(self.model),
        )
        crash = os.environ.get("CRASH_AT")
        crashing = args.process_index == int(os.environ.get("CRASH_RANK", "0"))
        if crash and state.global_step == int(crash) and crashing:
            sys.stdout.flush()
            os._exit(1)
        time.sleep(float(os.environ.get("STEP_TIME_S", "0")))


def main() -> int:
    torch.set_num_threads(1)
    model = Model()
    args = TrainingArguments(
        output_dir=os.environ.get("OUTPUT_DIR") or tempfile.mkdtemp(prefix="trainer-"),
        max_steps=int(os.environ.get("MAX_STEPS", "20")),
        per_device_train_batch_size=4,
        learning_rate=0.05,
        lr_scheduler_type="linear",
        warmup_steps=3,
        save_strategy="no",
        logging_strategy="no",
        report_to="none",
        use_cpu=os.environ.get("DEVICE", "cpu") == "cpu",
        seed=0,
        ddp_backend="gloo" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None,
        disable_tqdm=True,
    )
    nodeagent = NodeagentCallback(
        save_every=int(os.environ.get("SAVE_EVERY", "5")), directory=os.environ.get("CKPT_DIR")
    )
    trainer = Trainer(model, args, train_dataset=Samples(), callbacks=[nodeagent, Record(model)])
    resume = nodeagent.resume(trainer)
    record(
        "restored",
        step=nodeagent.restored_step,
        rank=args.process_index,
        world=args.world_size,
        generation=int(os.environ.get("NODEAGENT_GENERATION", "0")),
        hash=params_sha256(model),
    )
    trainer.train(resume_from_checkpoint=resume)
    # train returns after a stop too: every rank stopped after the same step, saved
    event = "stopped" if nodeagent.stopped else "final"
    record(
        event, step=trainer.state.global_step, hash=params_sha256(model), rank=args.process_index
    )
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
