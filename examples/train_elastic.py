"""DDP training over a dataset that recovers in place: survivors keep their process and memory.

Runs unchanged under plain torchrun (gloo on CPU, nccl on GPUs):

    torchrun --standalone --nproc-per-node 2 examples/train_elastic.py --checkpoint-dir /tmp/ck

Under nodeagent with `recovery: in_place`, a re-form (a peer died, `scale`) keeps the survivors'
processes: elastic.run rolls them back to their last commit and sends that state to the new
ranks. What it shows of nodeagent.worker:
- everything that must survive a re-form is in one elastic.State (model, optimizer, epoch and
  `offset`, the samples of the epoch trained so far over all ranks), committed every step;
- after each sync, `reset` sets the learning rate for the world size (rescale) and, on the very
  first start only (no rank has committed a step), resumes from the newest checkpoint;
- `train` builds the DistributedSampler for the current world and skips `offset`, so a change
  of world size skips no sample of the epoch (and repeats fewer than one a rank, see remaining);
- rank 0 saves a checkpoint every --checkpoint-every steps, for a restart of the whole job;
- beats every step (beat) and marks its forward (compute): a rank hung in its own part of a
  step is then replaced alone while the ranks that wait for it keep their processes
  (docs/worker.md); on SIGTERM a rank stops after its step, rank 0 saving it first.

Each rank prints JSON lines: "imported" once, when the process began and finished its imports
(for benchmarks), "synced" after every sync, "step" every --print-every steps ({"step", "epoch",
"offset", "loss", "rank", "world", "gen"}) and "finished" with the sha256 of its parameters, the
same on every rank. --hidden and --layers set the model's size (bench/recovery.py --heavy).
"""

from __future__ import annotations

import time

BEGAN = time.time()  # before the heavy imports: benchmarks split start-up into import and init

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from datetime import timedelta  # noqa: E402
from typing import Any, NoReturn  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset  # noqa: E402

from nodeagent.worker import (  # noqa: E402
    CheckpointManager,
    GracefulExit,
    beat,
    compute,
    elastic,
    rescale,
)

IMPORTED = time.time()

FEATURES = 16
SEED = 0  # of the data, the initial weights and every epoch's shuffle


def emit(**fields: Any) -> None:
    print(json.dumps({"t": round(time.time(), 6), "pid": os.getpid(), **fields}), flush=True)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--checkpoint-dir", required=True)
    parser.add_argument("--checkpoint-every", type=int, default=50)
    parser.add_argument("--samples", type=int, default=960, help="samples in the dataset")
    parser.add_argument("--batch", type=int, default=8, help="per-rank batch")
    parser.add_argument("--lr", type=float, default=0.01, help="learning rate at world size 1")
    parser.add_argument("--print-every", type=int, default=1)
    parser.add_argument("--step-time", type=float, default=0.0, help="extra seconds per step")
    parser.add_argument("--hidden", type=int, default=64, help="units of each hidden layer")
    parser.add_argument("--layers", type=int, default=1, help="hidden layers")
    parser.add_argument(
        "--pg-timeout",
        type=float,
        help="seconds a collective may wait for a peer before failing (torch's default: 30 min)",
    )
    return parser.parse_args()


def synthetic(samples: int) -> TensorDataset:
    gen = torch.Generator().manual_seed(SEED)
    x = torch.randn(samples, FEATURES, generator=gen)
    y = x @ torch.linspace(-1.0, 1.0, FEATURES) + 0.01 * torch.randn(samples, generator=gen)
    return TensorDataset(x, y.unsqueeze(1))


def mlp(hidden: int, layers: int) -> nn.Sequential:
    """FEATURES inputs, `layers` hidden layers of `hidden` units with ReLU, one output."""
    body: list[nn.Module] = [nn.Linear(FEATURES, hidden), nn.ReLU()]
    for _ in range(layers - 1):
        body += [nn.Linear(hidden, hidden), nn.ReLU()]
    return nn.Sequential(*body, nn.Linear(hidden, 1))


def remaining(data: Dataset[Any], epoch: int, offset: int, rank: int, world: int) -> list[int]:
    """This rank's indices for the rest of `epoch`, `offset` samples of it trained already.

    The sampler shuffles the epoch the same way whatever the world size and deals the shuffled
    indices out in turn, so the steps so far trained the first `offset` of them, at any world
    size. Each rank skips `offset // world`, so all take the same number of steps: when `world`
    does not divide `offset` (a re-form mid-epoch), the last `offset % world` samples trained,
    fewer than one a rank, are trained again. (The sampler pads an epoch to a multiple of the
    world size by repeating samples: pick a --samples that the world sizes divide.)
    """
    sampler: DistributedSampler[int] = DistributedSampler(
        data, num_replicas=world, rank=rank, shuffle=True, seed=SEED
    )
    sampler.set_epoch(epoch)
    return list(sampler)[offset // world :]


def params_sha256(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().cpu().numpy().tobytes())
    return digest.hexdigest()


def leave(code: int) -> NoReturn:
    """Exit without tearing down gloo (see examples/train_ddp.py)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def position(state: elastic.State) -> dict[str, int]:
    return {
        "step": state.step,
        "epoch": state.epoch,
        "offset": state.offset,
        "gen": state.generation,
    }


def main() -> int:
    args = parse()
    emit(event="imported", began=BEGAN, imported=IMPORTED)
    device = torch.device(
        f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if torch.cuda.is_available() else "cpu"
    )
    torch.manual_seed(SEED)
    data = synthetic(args.samples)
    model = mlp(args.hidden, args.layers).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    state = elastic.State(model=model, optimizer=optimizer, epoch=0, offset=0)

    def save() -> None:  # rank 0 writes; the manager is made anew: a re-form may change ranks
        rank, world = dist.get_rank(), dist.get_world_size()
        saved: dict[str, Any] = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
        saved.update(epoch=state.epoch, offset=state.offset)
        manager = CheckpointManager(args.checkpoint_dir, keep=3, rank=rank)
        manager.save(saved, step=state.step, generation=state.generation, world_size=world)

    def reset() -> None:  # after every sync, on every rank: the first start and each re-form
        rank, world = dist.get_rank(), dist.get_world_size()
        resumed: int | None = None
        if state.committed_step < 0:  # the very first start: no rank holds a trained state
            manager = CheckpointManager(args.checkpoint_dir, rank=rank)
            latest = manager.load_latest(map_location=device)
            if latest is not None:
                model.load_state_dict(latest.state["model"])
                optimizer.load_state_dict(latest.state["optimizer"])
                state.step, resumed = latest.step, latest.step
                state.epoch, state.offset = latest.state["epoch"], latest.state["offset"]
        lr = rescale(args.lr, args.batch, 1, world).lr  # the synced optimizer has the sender's
        for group in optimizer.param_groups:
            group["lr"] = lr
        emit(event="synced", lr=lr, rank=rank, world=world, resumed=resumed, **position(state))

    state.on_reset(reset)

    def train(state: elastic.State) -> None:  # called again after each re-form
        rank, world = dist.get_rank(), dist.get_world_size()
        ddp = DistributedDataParallel(model)
        while state.step < args.steps:
            state.offset -= state.offset % world  # where remaining() goes on from
            indices = remaining(data, state.epoch, state.offset, rank, world)
            for x, y in DataLoader(data, batch_size=args.batch, sampler=indices):
                optimizer.zero_grad()
                with compute():  # this rank's own part: the all-reduce is in backward
                    loss = nn.functional.mse_loss(ddp(x.to(device)), y.to(device))
                torch.autograd.backward(loss)
                optimizer.step()
                state.step += 1
                state.offset += len(x) * world
                beat(state.step)
                if state.step % args.print_every == 0:
                    loss_now = round(loss.item(), 6)
                    emit(event="step", loss=loss_now, rank=rank, world=world, **position(state))
                if state.step % args.checkpoint_every == 0:
                    save()
                state.commit()  # may raise Reform: this step is committed by then
                # SIGTERM: this rank stops, rank 0 saving first. Not should_stop_all(): its
                # all-reduce would stop every rank when the agent stops one node's workers,
                # where the others are to re-form without them.
                if guard.should_stop():
                    if state.step % args.checkpoint_every:
                        save()
                    emit(event="stopped", rank=rank, world=world, **position(state))
                    leave(0)
                time.sleep(args.step_time)
                if state.step >= args.steps:
                    return
            state.epoch, state.offset = state.epoch + 1, 0

    pg_timeout = timedelta(seconds=args.pg_timeout) if args.pg_timeout else None
    with GracefulExit() as guard:
        # reform_timeout defaults to NODEAGENT_REFORM_TIMEOUT_S, which the agent sets. Without
        # a control channel (plain torchrun) this initializes the group, syncs, trains once.
        try:
            elastic.run(train, state, pg_timeout=pg_timeout, stop=guard.should_stop)
        except elastic.Stopped:  # stopped between two generations: in no group, nothing to save
            emit(event="stopped", rank=int(os.environ.get("RANK", "0")), **position(state))
            leave(0)
    if state.step % args.checkpoint_every:
        save()
    rank, world = dist.get_rank(), dist.get_world_size()
    emit(event="finished", step=state.step, rank=rank, world=world, sha256=params_sha256(model))
    dist.barrier()
    leave(0)


if __name__ == "__main__":
    sys.exit(main())
