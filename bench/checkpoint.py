"""What a checkpoint costs a training step, and what a restore costs, by tier (issue 25).

    .venv/bin/python bench/checkpoint.py                  # states of ~200 MB and ~1 GB
    .venv/bin/python bench/checkpoint.py --sizes 200      # one size (MB of model + Adam state)

For each size: FSDP2 over 4 ranks (gloo, CPU, one torchrun), an MLP whose parameters and Adam
state add up to the size. In one run it measures, as medians:
- the training step with no checkpoint;
- `Checkpointer.save` into a memory tier on /dev/shm: the time the step is blocked (staging),
  and the step's wall time while saving every step and every 10 steps; the cost per save is
  (wall time per interval - interval x plain step), and at an interval of 100 it is that cost
  over 100 plain steps (not run: it would take minutes of steps to see);
- the baselines, to a directory on disk: DCP saved synchronously (`dcp.save`, collective),
  asynchronously (`dcp.async_save` on a gloo group of its own: the blocked time), and a full
  state gathered to rank 0 and written with `torch.save`;
- restores: the memory tier (each rank its own slot, verified), the persistent tier (a copy on
  disk, each rank its own directory) and the persistent tier resharded (every rank reads every
  old rank's directory through the merged metadata, as at another world size).
Writes bench/results/checkpoint.json and prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RANKS = 4
STEPS = 6  # timed steps per measurement (after a warm-up step)


def driver(sizes: list[int]) -> None:
    results: dict[str, Any] = {"ranks": RANKS, "steps_per_measurement": STEPS, "sizes": {}}
    for size in sizes:
        with (
            tempfile.TemporaryDirectory(dir="/tmp") as disk,
            tempfile.TemporaryDirectory(dir="/dev/shm") as shm,
        ):
            out = Path(disk) / "result.json"
            command = [
                *(sys.executable, "-m", "torch.distributed.run", "--standalone"),
                *("--nproc-per-node", str(RANKS), __file__, "--worker", "--size", str(size)),
                *("--disk", disk, "--shm", shm, "--out", str(out)),
            ]
            env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
            subprocess.run(command, check=True, env=env, timeout=3600)
            results["sizes"][f"{size}MB"] = json.loads(out.read_text())
            print(json.dumps({f"{size}MB": results["sizes"][f"{size}MB"]}, indent=1), flush=True)
    path = ROOT / "bench" / "results" / "checkpoint.json"
    path.write_text(json.dumps(results, indent=1) + "\n")
    print(f"written to {path}")


def worker(size_mb: int, disk: Path, shm: Path, out: Path) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
    from torch.distributed.checkpoint.state_dict_saver import async_save, save
    from torch.distributed.fsdp import fully_shard

    from nodeagent.channel import manifests, tier
    from nodeagent.channel.restore import RESTORE_ENV
    from nodeagent.worker import Checkpointer, TrainState

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    # Parameters + Adam's two moments, float32: 12 bytes a parameter; 8 square layers.
    width = int((size_mb * 1e6 / 12 / 8) ** 0.5)
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(width, width, bias=False) for _ in range(8)])
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.randn(8, width)

    def step() -> None:
        optimizer.zero_grad()
        model(x).square().mean().backward()
        optimizer.step()

    def timed(fn: Any, reps: int = STEPS) -> list[float]:
        times = []
        for _ in range(reps):
            dist.barrier()
            began = time.perf_counter()
            fn()
            dist.barrier()
            times.append(time.perf_counter() - began)
        return times

    step()  # optimizer state exists from here
    plain = statistics.median(timed(step))
    result: dict[str, Any] = {"width": width, "step_s": round(plain, 4)}
    state = TrainState(model, optimizer)

    def env(memory: bool) -> dict[str, str]:
        base = {"RANK": str(rank), "WORLD_SIZE": str(RANKS)}
        return {**base, tier.MEMORY_ENV: str(shm / "memory")} if memory else base

    memory = Checkpointer(env=env(memory=True))
    blocked: list[float] = []
    counter = [0]

    def train_and_save(every: int) -> None:
        for _ in range(every):
            step()
            counter[0] += 1
        memory.save(state, counter[0])
        blocked.append(memory.last_blocked_s)

    memory.save(state, 0)  # the first save allocates the staging buffers
    memory.wait()
    for every in (1, 10):
        blocked.clear()
        walls = timed(lambda e=every: train_and_save(e), reps=max(2, STEPS // every))
        memory.wait()
        per_save = max(0.0, statistics.median(walls) - every * plain)
        result[f"save_every_{every}"] = {
            "blocked_s": round(statistics.median(blocked), 4),
            "cost_per_save_s": round(per_save, 4),
            "overhead_pct": round(100 * per_save / (every * plain), 2),
        }
    cost = result["save_every_10"]["cost_per_save_s"]
    result["save_every_100"] = {"overhead_pct_estimated": round(100 * cost / (100 * plain), 2)}
    own = [
        manifests.read_manifest(slot).size
        for slot, _ in tier.memory_saves(shm / "memory")
        if (slot / manifests.MANIFEST).exists()
    ]
    total = torch.tensor([max(own, default=0)], dtype=torch.int64)
    dist.all_reduce(total)
    result["bytes_per_save"] = int(total.item())  # every rank's one save, added up

    # Baselines to disk.
    model_sd, optim_sd = get_state_dict(model, optimizer)
    sd = {"model": model_sd, "optim": optim_sd}
    result["dcp_sync_s"] = round(
        statistics.median(timed(lambda: save(sd, checkpoint_id=str(disk / "dcp")), 3)), 4
    )
    group = dist.new_group(backend="gloo")
    pending: list[Any] = []

    def save_async() -> None:
        if pending:
            pending.pop().result()
        pending.append(async_save(sd, checkpoint_id=str(disk / "async"), process_group=group))

    result["dcp_async_blocked_s"] = round(statistics.median(timed(save_async, 3)), 4)
    pending.pop().result()
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)

    def torch_save() -> None:
        whole = get_state_dict(model, optimizer, options=full)
        if rank == 0:
            torch.save(whole, disk / "full.pt")

    result["torch_save_full_s"] = round(statistics.median(timed(torch_save, 3)), 4)

    # Restores: memory, persistent (a verified copy on disk), persistent resharded.
    memory.wait()
    slot = tier.newest_in_memory(shm / "memory", rank)
    assert slot is not None
    step_saved = manifests.read_manifest(slot).step
    target = tier.rank_dir(tier.step_dir(disk / "persist", step_saved), rank)
    manifests.copy_verified(slot, target, durable=True)
    dist.barrier()

    def restore(order: str, persist: bool) -> float:
        extra = {tier.PERSIST_ENV: str(disk / "persist")} if persist else {}
        checkpointer = Checkpointer(env={**env(memory=True), **extra, RESTORE_ENV: order})
        began = time.perf_counter()
        assert checkpointer.restore(state) == step_saved
        return time.perf_counter() - began

    result["restore_memory_s"] = round(
        statistics.median([restore(f"memory:{step_saved}", False) for _ in range(3)]), 4
    )
    result["restore_persistent_s"] = round(
        statistics.median([restore(f"persistent:{step_saved}", True) for _ in range(3)]), 4
    )
    from nodeagent.worker import dcpio

    def resharded() -> float:
        dirs = [tier.rank_dir(tier.step_dir(disk / "persist", step_saved), r) for r in range(RANKS)]
        began = time.perf_counter()
        for directory in dirs:
            manifests.verify(directory)
        target_sd = TrainState(model, optimizer).state_dict()
        dcpio.load(target_sd, dirs)
        state.load_state_dict(target_sd)
        dist.barrier()
        return time.perf_counter() - began

    result["restore_persistent_resharded_s"] = round(
        statistics.median([resharded() for _ in range(3)]), 4
    )
    if rank == 0:
        out.write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[200, 1000])
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--size", type=int)
    parser.add_argument("--disk", type=Path)
    parser.add_argument("--shm", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.worker:
        worker(args.size, args.disk, args.shm, args.out)
    else:
        driver(args.sizes)


if __name__ == "__main__":
    main()
