"""nodeagent.integrations.torchtitan with torchtitan's own components (FSDP2 model parts,
OptimizersContainer, LRSchedulersContainer, ParallelAwareDataloader) on two gloo ranks under
torchrun, no agent (examples/train_torchtitan.py): a run crashed after a save and resumed is
the uninterrupted one bit for bit, with the schedule and the data loader's position; resumed
at another world, the shards are read back whole and the data starts over."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers.frameworks import assert_the_uninterrupted_run, rank0, steps_of, train

pytest.importorskip("torchtitan.components.checkpointer.base")
pytestmark = pytest.mark.timeout(600)

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "train_torchtitan.py"


def test_a_run_resumed_from_its_last_save_is_the_uninterrupted_one_at_any_world(
    tmp_path: Path,
) -> None:
    whole_both = train(SCRIPT, tmp_path, "whole", ranks=2, DUMP_DIR=str(tmp_path / "w"))
    whole = rank0(whole_both)
    dump = str(tmp_path / "dump")
    crashed = rank0(train(SCRIPT, tmp_path, "crashed", ranks=2, DUMP_DIR=dump, CRASH_AT="13"))
    assert max(steps_of(crashed)) == 13 and not [x for x in crashed if x["event"] == "final"]
    resumed = rank0(train(SCRIPT, tmp_path, "resumed", ranks=2, DUMP_DIR=dump))

    assert_the_uninterrupted_run(whole, resumed)

    # One rank now: the two ranks' shards read back as one; the loader's position belongs to
    # rank 0 of 2 and is not restored: the data starts over, at the global batch of step 1.
    alone = train(SCRIPT, tmp_path, "alone", ranks=1, DUMP_DIR=dump, MAX_STEPS="24")
    [restored] = [x for x in alone if x["event"] == "restored"]
    assert restored["step"] == 20 and restored["world"] == 1  # the last step's save
    assert restored["hash"] == steps_of(whole)[20][-1]
    first = next(x for x in alone if x["event"] == "step")
    assert first["step"] == 21
    both = [x["batch_sum"] for x in whole_both if x["event"] == "step" and x["step"] == 1]
    assert first["batch_sum"] == pytest.approx(sum(both), abs=1e-4)


def manager(model: Any, tmp_path: Path, **options: Any) -> Any:
    """The manager torchtitan's Trainer would build for `model`, one process, no agent."""
    from torchtitan.components.optimizer import LRSchedulersContainer, OptimizersContainer
    from torchtitan.components.optimizer.optimizer import ParamGroupConfig

    from nodeagent.integrations.torchtitan import NodeagentCheckpointManager

    group = ParamGroupConfig(pattern=".*", optimizer_name="AdamW", optimizer_kwargs={"lr": 0.1})
    config = OptimizersContainer.Config(param_groups=[group], implementation="for-loop")
    optimizers = config.build(model_parts=[model])
    schedulers = LRSchedulersContainer.Config().build(optimizers=optimizers, training_steps=5)
    return NodeagentCheckpointManager.Config(enable=True, interval=5, **options).build(
        dataloader=None,
        model_parts=[model],
        optimizers=optimizers,
        lr_schedulers=schedulers,
        states={},
        sd_adapter=None,
        base_folder=str(tmp_path),
    )


def test_a_load_step_is_refused_by_name(tmp_path: Path) -> None:
    import torch

    made = manager(torch.nn.Linear(2, 1), tmp_path)
    try:
        with pytest.raises(ValueError, match="load_step=5: under nodeagent the job's leader"):
            made.load(step=5)
    finally:
        made.close()


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")  # one process
def test_a_job_with_no_save_yet_starts_from_its_initial_load_path(tmp_path: Path) -> None:
    """A fine-tuning's pretrained weights, read by torchtitan's own manager."""
    import torch
    from torch.distributed.checkpoint.state_dict_saver import save

    torch.manual_seed(7)
    pretrained = torch.nn.Linear(2, 1)
    save(pretrained.state_dict(), checkpoint_id=str(tmp_path / "pretrained"))
    torch.manual_seed(8)
    model = torch.nn.Linear(2, 1)
    assert not torch.equal(model.weight, pretrained.weight)

    made = manager(model, tmp_path, initial_load_path=str(tmp_path / "pretrained"))
    try:
        assert made.load() is True
    finally:
        made.close()
    assert torch.equal(model.weight, pretrained.weight)
    assert torch.equal(model.bias, pretrained.bias)
