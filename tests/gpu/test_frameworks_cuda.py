"""nodeagent.integrations for Lightning and transformers' Trainer with the model on a real GPU
(examples/train_lightning.py, train_transformers.py with DEVICE=cuda, one rank, no agent): a
run crashed after step 13 and started again from the memory tier restores the save bit for
bit (the model and its AdamW on the GPU, staged through pinned host memory) with the
framework's own progress, and takes the steps of the run never interrupted. Run on a GPU
machine: pytest -m gpu.

Skipped (by tests/conftest.py) where NVML cannot be opened, and here where torch sees no CUDA
or the framework is not installed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nodeagent.channel import restore, tier
from tests.helpers.frameworks import assert_the_uninterrupted_run, steps_of, train

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]
torch = pytest.importorskip("torch")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(autouse=True)
def _cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")


@pytest.mark.parametrize("framework", ["lightning", "transformers"])
def test_a_framework_on_the_gpu_resumes_from_the_memory_tier_as_if_never_interrupted(
    tmp_path: Path, framework: str
) -> None:
    pytest.importorskip(framework)
    script = EXAMPLES / f"train_{framework}.py"

    def run(name: str, memory: Path, **env: str) -> list[dict[str, object]]:
        tiers = {tier.MEMORY_ENV: str(memory), restore.RESTORE_ENV: "start", "DEVICE": "cuda"}
        return train(script, tmp_path, name, 0, **(tiers | env))

    whole = run("whole", tmp_path / "whole-memory", OUTPUT_DIR=str(tmp_path / "w"))
    assert max(steps_of(whole)) == 20
    memory = tmp_path / "memory"
    crashed = run("crashed", memory, OUTPUT_DIR=str(tmp_path / "c"), CRASH_AT="13")
    assert max(steps_of(crashed)) == 13 and not [x for x in crashed if x["event"] == "final"]

    slot = tier.newest_in_memory(memory, 0)
    assert slot is not None
    step = json.loads((slot / "manifest.json").read_text())["step"]
    report = tmp_path / "restore.json"
    order = {restore.RESTORE_ENV: f"memory:{step}", restore.RESTORE_REPORT_ENV: str(report)}
    resumed = run("resumed", memory, OUTPUT_DIR=str(tmp_path / "r"), **order)

    [back] = [x for x in resumed if x["event"] == "restored"]
    assert back["step"] == step
    assert json.loads(report.read_text())["tier"] == "memory"
    assert_the_uninterrupted_run(whole, resumed)  # every parameter after it, bit for bit
