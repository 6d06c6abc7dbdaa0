"""A worker for the in-place recovery tests: a tiny DDP model trained through elastic.run.

Commits every step and appends JSON lines to $RECORD_DIR/<pid>.jsonl: "synced" after every
sync (rank, world, generation, committed step, parameter hash), "step" after each commit.
It stops, every rank at the same step, once $RECORD_DIR/stop holds a step it has reached
(the test writes one ahead of every rank), writing a "final" line with its parameter hash.
REFORM_TIMEOUT_S sets run()'s reform_timeout, PG_TIMEOUT_S its pg_timeout (default 90 s).
SHARDED=1 also trains an FSDP2-sharded layer beside the model, made anew in every generation,
so that FSDP2 and DTensor hold on to the process group the way a sharded job's do.
WORK=N adds N 256x256 matrix products to each step's forward (about 0.45 ms each on one core
here: CPU work that a throttled node is slow at), with STEP_TIME_S its pause between steps
(default 0.02); MARK_COMPUTE=1 marks that forward with nodeagent.worker.compute. Every step
beats (nodeagent.worker.beat). ABORT_AT_EXIT_RANK=R: rank R aborts (SIGABRT) after its final
line, as a survivor's interpreter did at exit in issue 52. SET_UP_S: a pause before run(), a
slow start (a large model built, a dataset opened) that every new process pays. The rank named
in $RECORD_DIR/deadlock stops at the top of its next step, running but silent for ever, as
behind a data loader that never answers (it removes the file first: its replacement trains).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from nodeagent.worker import beat, compute, elastic

FEATURES = 8
STEP_TIME_S = float(os.environ.get("STEP_TIME_S", "0.02"))
WORK = int(os.environ.get("WORK", "0"))
MARK_COMPUTE = os.environ.get("MARK_COMPUTE") == "1"


def params_sha256(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


class Recorder:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / f"{os.getpid()}.jsonl"
        self.stop_at: int | None = None

    def __call__(self, event: str, **fields: Any) -> None:
        line = {"t": time.time(), "pid": os.getpid(), "event": event, **fields}
        with open(self.path, "a") as f:
            f.write(json.dumps(line) + "\n")

    def should_stop(self, step: int) -> bool:
        if self.stop_at is None:
            stop = self.directory / "stop"
            text = stop.read_text().strip() if stop.exists() else ""
            self.stop_at = int(text) if text else None
        return self.stop_at is not None and step >= self.stop_at

    def deadlock_if_named(self, rank: int, step: int) -> None:
        named = self.directory / "deadlock"
        try:
            text = named.read_text().strip()
        except FileNotFoundError:
            return
        if text != str(rank):
            return
        named.unlink()
        self("deadlocked", rank=rank, step=step)
        threading.Event().wait()  # running, asleep, never beating again


def batch(step: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(4, FEATURES, generator=gen)
    return x, x.sum(dim=1, keepdim=True) * 0.5


def sharded_layer() -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    layer = nn.Linear(FEATURES, FEATURES)
    fully_shard(layer)
    return layer


def main() -> int:
    torch.set_num_threads(1)
    record = Recorder(Path(os.environ["RECORD_DIR"]))
    torch.manual_seed(int(os.environ.get("SEED", "0")))  # newcomers start elsewhere on purpose
    model = nn.Linear(FEATURES, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    state = elastic.State(model=model, optimizer=optimizer)

    def synced() -> None:
        record(
            "synced",
            rank=dist.get_rank(),
            world=dist.get_world_size(),
            gen=state.generation,
            step=state.step,
            hash=params_sha256(model),
        )

    state.on_reset(synced)

    def train(state: elastic.State) -> None:
        ddp = DistributedDataParallel(model)
        sharded = sharded_layer() if os.environ.get("SHARDED") == "1" else None
        rank, world = dist.get_rank(), dist.get_world_size()
        square = torch.randn(256, 256)
        while not record.should_stop(state.step):
            record.deadlock_if_named(rank, state.step)
            x, y = batch(state.step + 1, rank, world)
            optimizer.zero_grad()
            with compute() if MARK_COMPUTE else contextlib.nullcontext():
                for _ in range(WORK):
                    square = torch.tanh(square @ square)
                loss = nn.functional.mse_loss(ddp(x), y)
            torch.autograd.backward(loss)
            if sharded is not None:
                sharded(x).sum().backward()
            optimizer.step()
            state.step += 1
            record("step", step=state.step, rank=rank, world=world, gen=state.generation)
            beat(state.step)
            state.commit()  # may raise Reform: the step is committed by then
            time.sleep(STEP_TIME_S)

    timeout = float(os.environ.get("REFORM_TIMEOUT_S", "30"))
    # A re-form waits for a newcomer's start-up (its torch import: 20 s and more on a busy
    # two-core machine), as a real job's would for up to its rendezvous timeout.
    pg_timeout = timedelta(seconds=float(os.environ.get("PG_TIMEOUT_S", "90")))
    time.sleep(float(os.environ.get("SET_UP_S", "0")))
    record("set_up", gen=state.generation)
    try:
        elastic.run(train, state, reform_timeout=timeout, pg_timeout=pg_timeout)
    except elastic.ReformTimedOut as exc:
        record("timed_out", error=str(exc))
        sys.stdout.flush()
        os._exit(3)
    rank = dist.get_rank()
    record("final", step=state.step, rank=rank, hash=params_sha256(model))
    sys.stdout.flush()
    sys.stderr.flush()
    if os.environ.get("ABORT_AT_EXIT_RANK") == str(rank):
        os.abort()  # what a backend's teardown did at a survivor's exit (issue 52)
    os._exit(0)  # skip gloo's teardown at exit (see examples/train_ddp.py leave())


if __name__ == "__main__":
    sys.exit(main())
