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

from pathlib import Path

import pytest

from tests.helpers.frameworks import assert_resumed_from_the_memory_tier

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
    assert_resumed_from_the_memory_tier(script, tmp_path, "OUTPUT_DIR", DEVICE="cuda")
