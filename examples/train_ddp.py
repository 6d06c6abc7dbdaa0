"""DDP training on synthetic data that survives faults: the job nodeagent's demo and tests run.

Runs unchanged under nodeagent or plain torchrun (gloo on CPU, nccl on GPUs):

    torchrun --standalone --nproc-per-node 2 examples/train_ddp.py --checkpoint-dir /tmp/ck

What it shows of nodeagent.worker:
- resumes from the newest checkpoint whose checksum verifies (CheckpointManager);
- rescales the per-rank batch when the world size differs from the checkpoint's (rescale);
- on SIGTERM every rank stops at the same step and rank 0 saves it (GracefulExit), so a
  graceful stop loses no step;
- beats every step, so the agent can detect a hang (beat).

Each rank prints one JSON line per step: {"t", "pid", "event": "step", "step", "loss", "rank",
"world", "gen"}, and one "initialized" line with when the script began and finished its imports.
The data of a step depends only on the step, so a run is reproducible whatever
the world sizes it went through. --hidden and --layers set the model's size (bench/recovery.py
--heavy).
"""

from __future__ import annotations

import time

BEGAN = time.time()  # before the heavy imports: benchmarks split start-up into import and init

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from datetime import timedelta  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, NoReturn  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from nodeagent.worker import CheckpointManager, GracefulExit, beat, rescale  # noqa: E402  # noqa: E402

IMPORTED = time.time()

FEATURES = 16


def emit(**fields: Any) -> None:
    print(json.dumps({"t": round(time.time(), 6), "pid": os.getpid(), **fields}), flush=True)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--checkpoint-dir", required=True)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--global-batch", type=int, default=60)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--step-time", type=float, default=0.0, help="extra seconds per step")
    parser.add_argument("--hidden", type=int, default=64, help="units of each hidden layer")
    parser.add_argument("--layers", type=int, default=1, help="hidden layers")
    parser.add_argument(
        "--loader-workers",
        type=int,
        default=0,
        help="DataLoader worker processes that make the batches (0: the main process does)",
    )
    parser.add_argument("--final-dir", help="where each rank writes its final parameter hash")
    parser.add_argument(
        "--pg-timeout",
        type=float,
        help="seconds a collective may wait for a peer before failing (torch's default: 30 min)",
    )
    return parser.parse_args()


def batch(step: int, global_batch: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's slice of the step's global batch; the same data whatever the world size."""
    gen = torch.Generator().manual_seed(step)
    x = torch.randn(global_batch, FEATURES, generator=gen)
    w_true = torch.linspace(-1.0, 1.0, FEATURES)
    y = x @ w_true + 0.01 * torch.randn(global_batch, generator=gen)
    per_rank = global_batch // world
    part = slice(rank * per_rank, (rank + 1) * per_rank)
    return x[part], y[part].unsqueeze(1)


class StepBatches(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """The batches of steps first, first + 1, ..., last, for a DataLoader's workers to make."""

    def __init__(self, first: int, last: int, global_batch: int, rank: int, world: int) -> None:
        self.first, self.last = first, last
        self.shape = (global_batch, rank, world)

    def __len__(self) -> int:
        return max(0, self.last - self.first + 1)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return batch(self.first + index, *self.shape)


def batches(
    args: argparse.Namespace, first: int, global_batch: int, rank: int, world: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Each step's batch from `first` on; made by DataLoader worker processes with
    --loader-workers (they must outlive a SIGTERM until the emergency checkpoint is saved)."""
    steps = StepBatches(first, args.steps, global_batch, rank, world)
    if not args.loader_workers:
        return (steps[i] for i in range(len(steps)))
    loader = torch.utils.data.DataLoader(steps, batch_size=None, num_workers=args.loader_workers)
    return iter(loader)


def mlp(hidden: int, layers: int) -> nn.Sequential:
    """FEATURES inputs, `layers` hidden layers of `hidden` units with ReLU, one output."""
    body: list[nn.Module] = [nn.Linear(FEATURES, hidden), nn.ReLU()]
    for _ in range(layers - 1):
        body += [nn.Linear(hidden, hidden), nn.ReLU()]
    return nn.Sequential(*body, nn.Linear(hidden, 1))


def leave(code: int) -> NoReturn:
    """Exit without tearing down gloo and the rank-0 TCPStore. torch can abort during that
    teardown at interpreter exit ("terminate called without an active exception"), turning a
    finished or checkpointed rank into a failure; everything is saved and flushed by now."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def params_sha256(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().cpu().numpy().tobytes())
    return digest.hexdigest()


def main() -> int:
    args = parse()
    cuda = torch.cuda.is_available()
    timeout = timedelta(seconds=args.pg_timeout) if args.pg_timeout else None
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")
    generation = int(os.environ.get("NODEAGENT_GENERATION", 0))
    emit(
        event="initialized", rank=rank, world=world, gen=generation, began=BEGAN, imported=IMPORTED
    )

    torch.manual_seed(0)
    model = mlp(args.hidden, args.layers).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    checkpoints = CheckpointManager(args.checkpoint_dir, keep=3, rank=rank)
    start, global_batch = 1, args.global_batch
    latest = checkpoints.load_latest(map_location=device)
    if latest is not None:
        model.load_state_dict(latest.state["model"])
        optimizer.load_state_dict(latest.state["optimizer"])
        start = latest.step + 1
        saved_world = latest.state["world_size"]
        if saved_world != world:  # same global batch at the new size; the lr stays
            per_rank = rescale(
                args.lr, global_batch // saved_world, saved_world, world, policy="keep_global_batch"
            ).per_rank_batch
            global_batch = per_rank * world
        emit(
            event="resumed",
            step=latest.step,
            rank=rank,
            world=world,
            gen=generation,
            from_world=saved_world,
            from_gen=latest.generation,
        )
    ddp = DistributedDataParallel(model)
    loss_fn = nn.MSELoss()

    def save(step: int) -> None:
        state = {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "world_size": world,
        }
        checkpoints.save(state, step=step, world_size=world)

    step = start - 1
    with GracefulExit() as guard:
        emit(event="started", step=step, rank=rank, world=world, gen=generation)
        data = batches(args, start, global_batch, rank, world)
        for step, (x, y) in zip(range(start, args.steps + 1), data, strict=True):
            optimizer.zero_grad()
            loss = loss_fn(ddp(x.to(device)), y.to(device))
            loss.backward()
            optimizer.step()
            beat(step)
            emit(
                event="step",
                step=step,
                loss=round(loss.item(), 6),
                rank=rank,
                world=world,
                gen=generation,
            )
            if args.step_time:
                time.sleep(args.step_time)
            if step % args.checkpoint_every == 0:
                save(step)
            if guard.should_stop_all():
                began = time.monotonic()
                if step % args.checkpoint_every:
                    save(step)
                emit(
                    event="emergency_checkpoint",
                    step=step,
                    rank=rank,
                    world=world,
                    gen=generation,
                    seconds=round(time.monotonic() - began, 4),
                )
                leave(0)
        if step % args.checkpoint_every:
            save(step)
        if args.final_dir:
            Path(args.final_dir).mkdir(parents=True, exist_ok=True)
            final = {
                "step": step,
                "sha256": params_sha256(model),
                "world": world,
                "gen": generation,
            }
            (Path(args.final_dir) / f"rank-{rank}.json").write_text(json.dumps(final))
        emit(event="finished", step=step, rank=rank, world=world, gen=generation)
        dist.barrier()
    leave(0)


if __name__ == "__main__":
    sys.exit(main())
