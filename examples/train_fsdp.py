"""FSDP2 training on synthetic data whose last step survives a crash: nodeagent's memory tier.

Runs unchanged under nodeagent or plain torchrun (gloo on CPU, nccl on GPUs):

    torchrun --standalone --nproc-per-node 4 examples/train_fsdp.py --checkpoint-dir /tmp/ck

What it shows of nodeagent.worker:
- the model is sharded with FSDP2 (`fully_shard`), every Linear layer and the whole;
- `Checkpointer.restore` loads the step the job resumes from once (under nodeagent the leader
  chose it: the memory tier, the persistent tier, this directory; at another world size the
  shards are resharded), `save` every --save-every steps returns once the state is staged;
- on SIGTERM every rank stops at the same step and saves it (GracefulExit), so a graceful stop
  (scale, drain) loses no step;
- with --in-place (job.recovery: in_place) the training runs under `elastic.run`: when the job
  re-forms, survivors keep their processes, leave the old process group, build the model again
  on the new world and restore (from their memory tier where it serves, else resharded), and
  a re-form the agent asks for (scale, drain) saves the current step first
  (`Checkpointer.check`).

Each rank prints one JSON line per event: "restored" (step, tier, and with --digest the sha256 of
the whole model and optimizer state, gathered), "step" (every --print-every steps), "saved"
(with --digest: the same sha256, so a test can compare what was saved with what was restored,
at any world size), "finished". The data of a step depends only on the step.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from datetime import timedelta
from typing import Any, NoReturn

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.distributed.fsdp import fully_shard

from nodeagent.worker import Checkpointer, GracefulExit, TrainState, beat, elastic

FEATURES = 16


def emit(**fields: Any) -> None:
    line = json.dumps({"t": round(time.time(), 6), "pid": os.getpid(), **fields})
    sys.stdout.write(line + "\n")  # one write: ranks sharing a stdout never split a line
    sys.stdout.flush()


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--checkpoint-dir", help="the script's own checkpoints (torchrun)")
    parser.add_argument("--save-every", type=int, default=5)
    parser.add_argument("--global-batch", type=int, default=48)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--width", type=int, default=64, help="units of each hidden layer")
    parser.add_argument("--layers", type=int, default=2, help="hidden layers")
    parser.add_argument("--step-time", type=float, default=0.0, help="extra seconds per step")
    parser.add_argument("--print-every", type=int, default=1)
    parser.add_argument("--digest", action="store_true", help="sha256 of the state at save")
    parser.add_argument(
        "--pg-timeout",
        type=float,
        help="seconds a collective may wait for a peer before failing (torch's default: 30 min)",
    )
    parser.add_argument(
        "--in-place",
        action="store_true",
        help="job.recovery: in_place: survivors of a failure keep their processes",
    )
    return parser.parse_args()


def batch(step: int, global_batch: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's slice of the step's global batch (the same data whatever the world)."""
    gen = torch.Generator().manual_seed(step)
    x = torch.randn(global_batch, FEATURES, generator=gen)
    y = x @ torch.linspace(-1.0, 1.0, FEATURES) + 0.01 * torch.randn(global_batch, generator=gen)
    per_rank = global_batch // world
    part = slice(rank * per_rank, (rank + 1) * per_rank)
    return x[part], y[part].unsqueeze(1)


def sharded_mlp(width: int, layers: int, device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    body: list[nn.Module] = [nn.Linear(FEATURES, width), nn.ReLU()]
    for _ in range(layers - 1):
        body += [nn.Linear(width, width), nn.ReLU()]
    model = nn.Sequential(*body, nn.Linear(width, 1)).to(device)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    return model


def digest(model: nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """sha256 of the whole (gathered) model and optimizer state: equal at any world size."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
    h = hashlib.sha256()
    for name, tensor in sorted(model_sd.items()):
        assert isinstance(tensor, torch.Tensor)
        h.update(name.encode() + tensor.numpy().tobytes())
    state = optim_sd.get("state", {})  # rank 0's only
    assert isinstance(state, dict)
    for name, value in sorted(state.items()):
        assert isinstance(value, dict)
        for key, item in sorted(value.items()):
            assert isinstance(item, torch.Tensor)
            h.update(f"{name}.{key}".encode() + item.float().numpy().tobytes())
    return h.hexdigest()


def leave(code: int) -> NoReturn:
    """Exit without gloo's teardown, which can abort at interpreter exit (see train_ddp.py)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def train(args: argparse.Namespace, checkpoints: Checkpointer, guard: GracefulExit) -> None:
    """Build the model on this world, restore, train; in place, again after every re-form."""
    cuda = torch.cuda.is_available()
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    generation = int(os.environ.get("NODEAGENT_GENERATION", 0))
    model = sharded_mlp(args.width, args.layers, device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    state = TrainState(model, optimizer, data_step=0)
    start = checkpoints.restore(state)
    restored = {"digest": digest(model, optimizer)} if args.digest and start else {}
    emit(event="restored", step=start, rank=rank, world=world, gen=generation, **restored)

    saved = [start]  # the last step saved (a save is skipped while copies lag behind it)

    def save(step: int, last: bool = False) -> None:
        state.data_step = step
        if not checkpoints.save(state, step):  # the committed save is kept: copies behind
            if not last:
                emit(event="skipped", step=step, rank=rank, world=world, gen=generation)
                return
            checkpoints.close()  # written now, over the newer save: the step reached is kept
        saved[0] = step
        fields = {"digest": digest(model, optimizer)} if args.digest else {}
        emit(
            event="saved",
            step=step,
            rank=rank,
            world=world,
            gen=generation,
            blocked=round(checkpoints.last_blocked_s, 6),
            **fields,
        )

    step = start
    loss_fn = nn.MSELoss()
    for step in range(start + 1, args.steps + 1):
        x, y = batch(step, args.global_batch, rank, world)
        optimizer.zero_grad()
        loss = loss_fn(model(x.to(device)), y.to(device))
        loss.backward()
        optimizer.step()
        beat(step)
        if step % args.print_every == 0:
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
        if step % args.save_every == 0:
            save(step)
        reform = checkpoints.reform_due() if args.in_place else None
        if reform is not None:  # (checkpoints.check(state, step) without the printing)
            if saved[0] != step:  # every rank saves the step reached and leaves together
                save(step, last=True)
            raise reform
        if guard.should_stop_all():
            if saved[0] != step:
                save(step, last=True)
            checkpoints.close()
            emit(event="stopped", step=step, rank=rank, world=world, gen=generation)
            leave(0)
    if saved[0] != step:
        save(step, last=True)
    checkpoints.close()
    emit(
        event="finished",
        step=step,
        rank=rank,
        world=world,
        gen=generation,
        digest=digest(model, optimizer),
    )


def main() -> int:
    args = parse()
    checkpoints = Checkpointer(args.checkpoint_dir)
    timeout = timedelta(seconds=args.pg_timeout) if args.pg_timeout else None
    with GracefulExit() as guard:
        if args.in_place:
            try:
                elastic.run(
                    lambda _: train(args, checkpoints, guard),
                    checkpoints,
                    pg_timeout=timeout,
                    stop=guard.should_stop,
                )
            except elastic.Stopped:  # stopped between two generations: nothing to save
                leave(0)
        else:
            backend = "nccl" if torch.cuda.is_available() else "gloo"
            dist.init_process_group(backend, timeout=timeout)
            train(args, checkpoints, guard)
    leave(0)


if __name__ == "__main__":
    sys.exit(main())
