"""The workload of bench/recovery.py's framework systems: a Lightning or transformers `Trainer`
fit, DDP on gloo, with the framework's own checkpoints on disk or nodeagent's integration.

The same MLP as examples/train_ddp.py (16 inputs, --layers hidden layers of --hidden units, one
output) with AdamW, a batch of 20 a rank from fixed random samples, --step-time of sleep a
step. `--tier`: nodeagent.integrations' callback saves into the memory tier every --every steps
and restores what the leader chose; without it the framework checkpoints to --checkpoint-dir
every --every steps as its users set it up (Lightning: `ModelCheckpoint(every_n_train_steps,
save_last)` and `fit(ckpt_path="last")`; transformers: `save_steps` and
`train(resume_from_checkpoint=get_last_checkpoint(...))`), the directory shared by every node
(the best case for the disk: a node's loss loses none of it).

Prints the JSON lines bench/recovery.py reads: "initialized" (began, imported, rank, world) once
the process group is up, "resumed" (the step the fit goes on from) and "step" after each
optimizer step (step, rank, world, gen).
"""

from __future__ import annotations

import time

BEGAN = time.time()  # before the heavy imports, as examples/train_ddp.py

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import Dataset  # noqa: E402

FEATURES, SAMPLES, BATCH = 16, 100_000, 20
GEN = int(os.environ.get("NODEAGENT_GENERATION", "0"))


def emit(**fields: Any) -> None:
    print(json.dumps({"t": round(time.time(), 6), "pid": os.getpid(), **fields}), flush=True)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework", choices=("lightning", "transformers"), required=True)
    parser.add_argument("--tier", action="store_true", help="nodeagent.integrations' callback")
    parser.add_argument("--every", type=int, default=20, help="steps between saves")
    parser.add_argument("--checkpoint-dir", required=True)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--step-time", type=float, default=0.0, help="extra seconds per step")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    return parser.parse_args()


def mlp(hidden: int, layers: int) -> nn.Sequential:
    body: list[nn.Module] = [nn.Linear(FEATURES, hidden), nn.ReLU()]
    for _ in range(layers - 1):
        body += [nn.Linear(hidden, hidden), nn.ReLU()]
    return nn.Sequential(*body, nn.Linear(hidden, 1))


def samples() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(SAMPLES, FEATURES, generator=generator)
    return x, x.sum(dim=1, keepdim=True)


def world() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def fit_lightning(args: argparse.Namespace, imported: float) -> None:
    from lightning.pytorch import LightningModule, Trainer
    from lightning.pytorch.callbacks import Callback, ModelCheckpoint
    from torch.utils.data import DataLoader, TensorDataset

    class Module(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = mlp(args.hidden, args.layers)

        def setup(self, stage: str) -> None:  # the process group is up
            rank, size = self.trainer.global_rank, self.trainer.world_size
            emit(
                event="initialized", rank=rank, world=size, gen=GEN, began=BEGAN, imported=imported
            )

        def on_train_start(self) -> None:  # restored: by the fit (ckpt_path) or the callback
            emit(event="resumed", step=self.trainer.global_step, rank=self.trainer.global_rank)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
            trainer = self.trainer
            emit(
                event="step",
                step=trainer.global_step,
                rank=trainer.global_rank,
                world=trainer.world_size,
                gen=GEN,
            )
            time.sleep(args.step_time)

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

        def train_dataloader(self) -> DataLoader:  # type: ignore[type-arg]
            return DataLoader(TensorDataset(*samples()), batch_size=BATCH)

    callbacks: list[Callback]
    if args.tier:
        from nodeagent.integrations.lightning import NodeagentCallback

        callbacks = [NodeagentCallback(save_every=args.every)]
    else:
        checkpoint = ModelCheckpoint(
            dirpath=args.checkpoint_dir,
            every_n_train_steps=args.every,
            save_top_k=0,
            save_last=True,
        )
        callbacks = [checkpoint]
    trainer = Trainer(
        max_steps=args.steps,
        accelerator="cpu",
        strategy="ddp" if world() > 1 else "auto",
        num_nodes=int(os.environ.get("GROUP_WORLD_SIZE", "1")),
        devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=not args.tier,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Module(), ckpt_path=None if args.tier else "last")


def fit_transformers(args: argparse.Namespace, imported: float) -> None:
    from transformers import Trainer, TrainerCallback, TrainingArguments
    from transformers.trainer_utils import get_last_checkpoint

    x, y = samples()

    class Samples(Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return SAMPLES

        def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
            return {"x": x[index], "labels": y[index]}

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = mlp(args.hidden, args.layers)

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
            out = self.net(x)
            return {"loss": nn.functional.mse_loss(out, labels), "logits": out}

    step_time = args.step_time

    class Lines(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            emit(event="resumed", step=state.global_step, rank=args.process_index)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            rank, size = args.process_index, args.world_size
            emit(event="step", step=state.global_step, rank=rank, world=size, gen=GEN)
            time.sleep(step_time)

    training = TrainingArguments(
        output_dir=args.checkpoint_dir,
        max_steps=args.steps,
        per_device_train_batch_size=BATCH,
        learning_rate=1e-3,
        save_strategy="no" if args.tier else "steps",
        save_steps=args.every,
        save_total_limit=2,
        logging_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=0,
        ddp_backend="gloo" if world() > 1 else None,
        disable_tqdm=True,
    )
    callbacks: list[TrainerCallback] = [Lines()]
    resume: Callable[[Trainer], str | None] = lambda trainer: None  # noqa: E731
    if args.tier:
        from nodeagent.integrations.transformers import NodeagentCallback

        nodeagent = NodeagentCallback(save_every=args.every)
        callbacks.insert(0, nodeagent)
        resume = nodeagent.resume
    elif os.path.isdir(args.checkpoint_dir):
        last = get_last_checkpoint(args.checkpoint_dir)  # type: ignore[no-untyped-call]
        resume = lambda trainer: last  # noqa: E731
    trainer = Trainer(Model(), training, train_dataset=Samples(), callbacks=callbacks)
    rank, size = training.process_index, training.world_size  # the process group is up
    emit(event="initialized", rank=rank, world=size, gen=GEN, began=BEGAN, imported=imported)
    trainer.train(resume_from_checkpoint=resume(trainer))


def main() -> int:
    args = parse()
    torch.set_num_threads(1)
    if args.framework == "lightning":
        import lightning.pytorch  # noqa: F401
    else:
        import transformers as _  # noqa: F401
    imported = time.time()
    (fit_lightning if args.framework == "lightning" else fit_transformers)(args, imported)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
