"""examples/train_ddp.py's workload under DLRover: DDP over gloo with flash checkpoints in memory.

Run by DLRover's own interpreter under `dlrover-run` (bench/peers/dlrover_launch.py), which
gives torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, TORCHELASTIC_RESTART_COUNT...).
The same MLP (16 -> 64 -> 1), SGD with momentum, the step's global batch of 60 sliced by rank,
--step-time of sleep a step; DistributedDataParallel as is. Every --save-every steps the state
goes to the node's memory through DLRover's DdpCheckpointer (StorageType.MEMORY: a copy into
the shared memory its agent holds, as DLRover's examples/pytorch/fcp_demo.py and
examples/pytorch/mnist/cnn_train.py do); a process that starts loads the latest one from there
(`load_checkpoint`, which checks that every rank has the same step). Nothing is written to disk.

Prints the JSON lines bench/recovery.py reads, as bench/peers/torchft_train.py does:
"initialized" once (began, imported, rank), "synced" once the process group is up and the
checkpoint loaded (gen = the restart count, the highest of the world's agents, so every rank of
one rendezvous says the same; step = the step it goes on from) and "step" for every step
(world, step, gen).
"""

from __future__ import annotations

import time

BEGAN = time.time()  # before the heavy imports, as examples/train_ddp.py

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from datetime import timedelta  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from dlrover.trainer.torch.flash_checkpoint.ddp import (  # type: ignore[import-not-found]  # noqa: E402
    DdpCheckpointer,
    StorageType,
)
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

IMPORTED = time.time()

FEATURES = 16


def emit(**fields: Any) -> None:
    print(json.dumps({"t": round(time.time(), 6), "pid": os.getpid(), **fields}), flush=True)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--checkpoint-dir", required=True, help="DdpCheckpointer's (unused)")
    parser.add_argument("--save-every", type=int, default=10, help="steps between memory saves")
    parser.add_argument("--global-batch", type=int, default=60)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--step-time", type=float, default=0.0, help="extra seconds per step")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--pg-timeout", type=float, default=120.0, help="gloo's, seconds")
    return parser.parse_args()


def batch(step: int, global_batch: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's slice of the step's global batch (examples/train_ddp.py's)."""
    gen = torch.Generator().manual_seed(step)
    x = torch.randn(global_batch, FEATURES, generator=gen)
    y = x @ torch.linspace(-1.0, 1.0, FEATURES) + 0.01 * torch.randn(global_batch, generator=gen)
    per_rank = global_batch // world
    part = slice(rank * per_rank, (rank + 1) * per_rank)
    return x[part], y[part].unsqueeze(1)


def generation() -> int:
    """The highest restart count among the world's agents: the same on every rank."""
    count = torch.tensor([int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))])
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    return int(count.item())


def main() -> int:
    args = parse()
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.pg_timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    emit(event="initialized", rank=rank, world=world, began=BEGAN, imported=IMPORTED)
    gen = generation()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    checkpointer = DdpCheckpointer(args.checkpoint_dir)
    state = checkpointer.load_checkpoint()
    if "model" in state:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    step = int(state.get("step", 0))
    ddp = DistributedDataParallel(model)
    emit(event="synced", rank=rank, world=world, gen=gen, step=step)
    loss_fn = nn.MSELoss()
    while step < args.steps:
        step += 1
        x, y = batch(step, args.global_batch, rank, world)
        optimizer.zero_grad()
        loss = loss_fn(ddp(x), y)
        loss.backward()
        optimizer.step()
        emit(event="step", step=step, loss=round(loss.item(), 6), rank=rank, world=world, gen=gen)
        if step % args.save_every == 0:
            saved = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
            checkpointer.save_checkpoint(step, saved, storage_type=StorageType.MEMORY)
        time.sleep(args.step_time)
    dist.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
