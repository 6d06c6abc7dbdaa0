"""The memory tier with CUDA tensors on a real GPU: the Checkpointer stages a CUDA state into
pinned host memory, writes the tier, and restores onto the GPU bit for bit; FSDP2 on NCCL under
torchrun does the same through examples/train_fsdp.py. Run on a GPU machine: pytest -m gpu.

Skipped (by tests/conftest.py) where NVML cannot be opened, and here where torch sees no CUDA.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nodeagent.channel import manifests, restore, tier

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")


class _Run:
    """A model on the GPU, its Adam, and the TrainState that holds them."""

    def __init__(self, seed: int) -> None:
        from nodeagent.worker import TrainState

        torch.manual_seed(seed)
        self.model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Linear(512, 8))
        self.model.cuda()
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self.state = TrainState(self.model, self.optimizer, epoch=0)

    def train(self, steps: int) -> None:
        for _ in range(steps):
            loss = self.model(torch.randn(64, 512, device="cuda")).square().mean()
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()

    def tensors(self) -> dict[str, Any]:
        """Every tensor of the model and the optimizer, by name."""
        found = {f"model.{k}": v for k, v in self.model.state_dict().items()}
        for index, per in self.optimizer.state_dict()["state"].items():
            found.update({f"optim.{index}.{k}": v for k, v in per.items() if torch.is_tensor(v)})
        return found


def test_a_cuda_state_is_saved_to_the_memory_tier_and_restored_onto_the_gpu_bitwise(
    tmp_path: Path,
) -> None:
    from nodeagent.worker import Checkpointer

    env = {"RANK": "0", "WORLD_SIZE": "1", tier.MEMORY_ENV: str(tmp_path / "m")}
    run = _Run(0)
    run.train(3)
    run.state.epoch = 4
    ck = Checkpointer(env=env)
    assert ck.save(run.state, 3)
    ck.wait()
    saved = {k: v.detach().clone() for k, v in run.tensors().items()}
    run.train(2)  # the live state moves on after the save; the tier keeps step 3

    slot = tier.newest_in_memory(tmp_path / "m", 0, step=3)
    assert slot is not None and manifests.verify(slot).step == 3

    report = tmp_path / "report.json"
    again = _Run(1)  # other weights, other moments
    again.train(1)
    env |= {restore.RESTORE_ENV: "memory:3", restore.RESTORE_REPORT_ENV: str(report)}
    assert Checkpointer(env=env).restore(again.state) == 3
    assert again.state.epoch == 4
    back = again.tensors()
    assert sorted(back) == sorted(saved)
    for name, tensor in back.items():
        assert tensor.device == saved[name].device, name
        assert torch.equal(tensor, saved[name]), name  # bit for bit, on the GPU
    assert json.loads(report.read_text())["tier"] == "memory"


def _torchrun(*args: str, env: dict[str, str]) -> list[dict[str, Any]]:
    command = [
        *(sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1"),
        *(str(ROOT / "examples" / "train_fsdp.py"), "--print-every", "1000", "--digest", *args),
    ]
    # this checkout's nodeagent, installed or not (a GPU machine's python may not have it)
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    full = {**os.environ, **env, "PYTHONPATH": path}
    done = subprocess.run(command, env=full, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


@pytest.mark.timeout(600)
def test_fsdp2_on_nccl_resumes_from_the_memory_tier_bitwise(tmp_path: Path) -> None:
    env = {
        tier.MEMORY_ENV: str(tmp_path / "memory"),
        restore.RESTORE_ENV: "start",
        restore.RESTORE_REPORT_ENV: str(tmp_path / "restore.json"),
    }
    args = ("--save-every", "3", "--width", "1024", "--layers", "4")
    first = _torchrun(*args, "--steps", "8", env=env)
    saved = {x["step"]: x["digest"] for x in first if x["event"] == "saved"}
    assert sorted(saved) == [3, 6, 8]
    again = _torchrun(*args, "--steps", "10", env=env | {restore.RESTORE_ENV: "memory:8"})
    [back] = [x for x in again if x["event"] == "restored"]
    assert (back["step"], back["digest"]) == (8, saved[8])
    assert json.loads((tmp_path / "restore.json").read_text())["tier"] == "memory"
