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

import warnings
from pathlib import Path

import pytest

from tests.helpers.frameworks import assert_resumed_from_the_memory_tier

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
    assert_resumed_from_the_memory_tier(SCRIPT, tmp_path, "DUMP_DIR", ranks=1)
