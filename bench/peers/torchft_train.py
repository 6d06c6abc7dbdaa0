"""examples/train_elastic.py's workload under torchft: one replica group of one process.

Run by torchft's own interpreter under its torchrun (bench/peers/torchft_launch.py), with
REPLICA_GROUP_ID and TORCHFT_LIGHTHOUSE set; torchrun gives MASTER_ADDR/MASTER_PORT, RANK=0 and
WORLD_SIZE=1 for the Manager's store. The same MLP (16 -> 64 -> 1), SGD with momentum, a batch of
8 and --step-time of sleep a step; torchft's Manager (min_replica_size 1, ProcessGroupGloo, the
timeouts of upstream's train_ddp.py), its DDP and Optimizer wrappers: every step asks the
lighthouse for the quorum, all-reduces the gradients in it and commits. A process that joins a
quorum behind the others heals: it receives the model and optimizer from a peer.

Prints the JSON lines bench/recovery.py reads: "initialized" once (began, imported, rank = the
replica group), "synced" when a new quorum is first used (its id as gen, the step it goes on from:
a healed process's received one) and "step" for every committed step (world = the replicas
taking part in it, step = torchft's committed step count, gen = the quorum's id).
"""

# No `from __future__ import annotations`: DDP checks a comm hook's annotations (tolerant_hook's)
# as objects, not strings.
import time

BEGAN = time.time()  # before the heavy imports, as examples/train_elastic.py

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
from datetime import timedelta  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch._C._distributed_c10d import GradBucket  # noqa: E402
from torchft import (  # type: ignore[import-not-found]  # noqa: E402
    DistributedDataParallel,
    Manager,
    Optimizer,
    ProcessGroupGloo,
)

IMPORTED = time.time()

FEATURES = 16
SEED = 0
PG_TIMEOUT = timedelta(seconds=5)  # upstream train_ddp.py's gloo timeout on CPU
MANAGER_TIMEOUT = timedelta(seconds=30)  # and its Manager's


def emit(**fields: Any) -> None:
    print(json.dumps({"t": round(time.time(), 6), "pid": os.getpid(), **fields}), flush=True)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=960)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--step-time", type=float, default=0.0, help="extra seconds per step")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument(
        "--hook-fix",
        action="store_true",
        help="replace DDP's comm hook by one that survives a failed all-reduce (tolerant_hook)",
    )
    return parser.parse_args()


def tolerant_hook(manager: Any, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """torchft's DDP comm hook, handing back the bucket as it is when the all-reduce failed.

    torchft's own (0.2.0, and its main branch as of #287) asserts that the all-reduce's future
    is set, which it is not when the all-reduce failed: the work's wait() has reported the error
    to the manager, which skips the step, but the assertion then kills the process. A peer lost
    in the middle of an all-reduce so kills every survivor in it. Here the step goes on, its
    gradients discarded: should_commit() says no.
    """
    work = manager.allreduce(bucket.buffer())
    work.wait()
    reduced = getattr(work.get_future(), "_fut", None)
    if reduced is not None:
        return reduced  # type: ignore[no-any-return]
    failed: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    failed.set_result(bucket.buffer())
    return failed


def batch(
    data: tuple[torch.Tensor, torch.Tensor], size: int, step: int, group: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """This replica group's samples for `step`: the same whoever trains them."""
    x, y = data
    gen = torch.Generator().manual_seed(step * 1000 + group)
    picked = torch.randint(0, len(x), (size,), generator=gen)
    return x[picked], y[picked]


def main() -> None:
    args = parse()
    group = int(os.environ["REPLICA_GROUP_ID"])
    torch.manual_seed(SEED)
    x = torch.randn(args.samples, FEATURES, generator=torch.Generator().manual_seed(SEED))
    data = (x, (x @ torch.linspace(-1.0, 1.0, FEATURES)).unsqueeze(1))
    model = nn.Sequential(nn.Linear(FEATURES, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 1))
    inner = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    def state_dict() -> dict[str, Any]:
        return {"model": model.state_dict(), "optim": inner.state_dict()}

    def load_state_dict(state: dict[str, Any]) -> None:
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["optim"])

    manager = Manager(
        pg=ProcessGroupGloo(timeout=PG_TIMEOUT),
        min_replica_size=1,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"bench_{group}",
        timeout=MANAGER_TIMEOUT,
    )
    if args.hook_fix:  # read by DistributedDataParallel.__init__, which registers it
        DistributedDataParallel._comm_hook = staticmethod(tolerant_hook)
    ddp = DistributedDataParallel(manager, model)
    optimizer = Optimizer(manager, inner)
    emit(event="initialized", rank=group, began=BEGAN, imported=IMPORTED)
    synced = None
    while manager.current_step() < args.steps:
        optimizer.zero_grad()  # asks for the quorum
        manager.wait_quorum()  # configured, and a healing process has received the state
        quorum = manager._quorum_id  # torchft 0.2.0 has no accessor for it
        if quorum != synced:
            synced = quorum
            emit(event="synced", rank=group, gen=quorum, step=manager.current_step())
        before = manager.current_step()
        inputs, targets = batch(data, args.batch, before, group)
        loss = nn.functional.mse_loss(ddp(inputs), targets)
        torch.autograd.backward(loss)
        optimizer.step()  # commits only if every replica's all-reduce went through
        if manager.current_step() > before:
            world = manager.num_participants()
            emit(event="step", rank=group, world=world, step=manager.current_step(), gen=quorum)
        time.sleep(args.step_time)
    manager.shutdown(wait=False)


if __name__ == "__main__":
    main()
