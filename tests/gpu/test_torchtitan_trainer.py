"""torchtitan's own Trainer with nodeagent's checkpoint manager, on a real GPU
(examples/train_torchtitan_trainer.py: the llama3 debug model, FSDP2 on NCCL, flex attention,
AdamW with warm-up, deterministic): a run crashed after step 13 and started again from the
memory tier restores the save bit for bit, with the schedule and the data loader's position,
and takes the steps of the run never interrupted. Run on a GPU machine: pytest -m gpu.

Skipped (by tests/conftest.py) where NVML cannot be opened, and here where torch sees no CUDA
or torchtitan's Trainer cannot be imported (torchtitan 0.3.0 needs PyTorch 2.13 or newer: on
2.11 it asks torch.distributed.fsdp for a DataParallelMeshDims that is not there).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from nodeagent.channel import restore, tier
from tests.helpers.frameworks import assert_the_uninterrupted_run, rank0, steps_of, train

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]
torch = pytest.importorskip("torch")
try:
    with warnings.catch_warnings():  # torchtitan's imports warn of torch's deprecations
        warnings.simplefilter("ignore")
        import torchtitan.trainer  # noqa: F401  (everything the example's Trainer imports)
except ImportError as error:
    pytest.skip(f"torchtitan's Trainer does not import here: {error}", allow_module_level=True)
SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "train_torchtitan_trainer.py"


@pytest.fixture(autouse=True)
def _cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")


def test_torchtitans_trainer_resumes_from_the_memory_tier_as_if_never_interrupted(
    tmp_path: Path,
) -> None:
    def run(name: str, memory: Path, **env: str) -> list[dict[str, object]]:
        tiers = {tier.MEMORY_ENV: str(memory), restore.RESTORE_ENV: "start"}
        return rank0(train(SCRIPT, tmp_path, name, ranks=1, **(tiers | env)))

    whole = run("whole", tmp_path / "whole-memory", DUMP_DIR=str(tmp_path / "w"))
    assert max(steps_of(whole)) == 20
    memory = tmp_path / "memory"
    crashed = run("crashed", memory, DUMP_DIR=str(tmp_path / "c"), CRASH_AT="13")
    assert max(steps_of(crashed)) == 13 and not [x for x in crashed if x["event"] == "final"]

    slot = tier.newest_in_memory(memory, 0)
    assert slot is not None
    step = json.loads((slot / "manifest.json").read_text())["step"]
    report = tmp_path / "restore.json"
    order = {restore.RESTORE_ENV: f"memory:{step}", restore.RESTORE_REPORT_ENV: str(report)}
    resumed = run("resumed", memory, DUMP_DIR=str(tmp_path / "c"), **order)

    [back] = [x for x in resumed if x["event"] == "restored"]
    assert back["step"] == step
    assert back["hash"] == steps_of(crashed)[step][-1]  # the saved state, bit for bit
    assert json.loads(report.read_text())["tier"] == "memory"
    # the schedule, the data's position and every parameter after it: the uninterrupted run's
    assert_the_uninterrupted_run(whole, resumed)
