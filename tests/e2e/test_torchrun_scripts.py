"""A torchrun script, unchanged, under three `nodeagent launch` commands, through a worker kill
and a node kill: the pattern of pytorch/examples' minGPT-ddp (a DDP model, its optimizer's state
and the epoch counter in a snapshot in the working directory, saved every epoch and loaded at
start; ddp-tutorial-series/multinode.py is the same pattern with the counter alone); plain
`print`, no nodeagent import. (One pattern, not both: CI's time.)"""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.helpers.cluster import RedisServer, is_keeper, wait_for

pytest.importorskip("torch")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

MINGPT = """
import os, time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

EPOCHS = 45
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = DDP(torch.nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
start = 0
if os.path.exists("snapshot.pt"):
    snapshot = torch.load("snapshot.pt")
    model.module.load_state_dict(snapshot["MODEL_STATE"])
    optimizer.load_state_dict(snapshot["OPTIMIZER_STATE"])
    start = snapshot["EPOCHS_RUN"]
    print(f"[rank {rank}] Resuming training from snapshot at Epoch {start}")
for epoch in range(start, EPOCHS):
    x = torch.randn(8, 16)
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    total = torch.ones(1)
    dist.all_reduce(total)
    print(f"[rank {rank}] Epoch {epoch} | world {world} | sum {int(total.item())}")
    if rank == 0:
        state = {
            "MODEL_STATE": model.module.state_dict(),
            "OPTIMIZER_STATE": optimizer.state_dict(),
            "EPOCHS_RUN": epoch + 1,
        }
        torch.save(state, "snapshot.tmp")
        os.replace("snapshot.tmp", "snapshot.pt")
    time.sleep(0.15)
dist.destroy_process_group()
"""
RESUMED = re.compile(r"Resuming training from snapshot at Epoch (\d+)")
EPOCH = re.compile(r"Epoch (\d+) \| world (\d+)")


def _workers(launch: subprocess.Popen[bytes]) -> list[psutil.Process]:
    return [p for p in psutil.Process(launch.pid).children() if not is_keeper(p)]


def test_snapshot_script_survives_a_worker_kill_and_a_node_kill(
    tmp_path: Path, redis_server: RedisServer, job_id: str
) -> None:
    (tmp_path / "train.py").write_text(MINGPT)
    endpoint = redis_server.url.removeprefix("redis://").removesuffix("/0")
    launches, outputs = [], []
    for i in range(3):
        outputs.append(tmp_path / f"node-{i}.out")
        with outputs[-1].open("w") as out:
            launches.append(
                subprocess.Popen(
                    [
                        sys.executable, "-m", "nodeagent", "launch", "--nnodes", "2:3",
                        "--nproc-per-node", "1", "--rdzv-endpoint", endpoint, "--rdzv-id",
                        job_id, "--max-restarts", "3", "--node-name", f"n{i}", "train.py",
                    ],
                    cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT,
                )
            )  # fmt: skip

    def text() -> str:
        return "".join(p.read_text() for p in outputs)

    def epochs(world: int) -> list[int]:
        return [int(e) for e, w in EPOCH.findall(text()) if int(w) == world]

    try:
        wait_for(lambda: len(epochs(3)) >= 3 * 5, 120, "five epochs at world 3")
        worker = _workers(launches[0])[0]
        worker.send_signal(signal.SIGKILL)
        wait_for(lambda: RESUMED.search(text()), 60, "a resume after the worker kill")
        first_resume = min(int(e) for e in RESUMED.findall(text()))
        assert first_resume >= 5  # from the snapshot, not from scratch
        seen = len(epochs(3))
        wait_for(lambda: len(epochs(3)) >= seen + 6, 60, "training again at world 3")
        victim = psutil.Process(launches[2].pid)
        for proc in [victim, *victim.children(recursive=True)]:  # the node loses power
            with contextlib.suppress(psutil.Error):
                proc.kill()
        launches[2].wait(10)
        wait_for(lambda: epochs(2), 90, "training at world 2 after the node kill")
        resumes = [int(e) for e in RESUMED.findall(text())]  # every rank, both resumes
        assert max(resumes) > first_resume  # the node kill resumed from a later snapshot
        codes = [launches[0].wait(180), launches[1].wait(180)]
    finally:
        for launch in launches:
            if launch.poll() is None:
                launch.kill()
                launch.wait()
    assert codes == [0, 0], text()[-4000:]
    assert max(epochs(2)) == 44  # finished, at world 2
