"""nodeagent.integrations.transformers against a real transformers Trainer, one process, no
agent: what it saves, a fresh process resumes bit for bit, with Trainer's own progress (global
step, epoch, the batches skipped, the schedule, the RNG after them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.frameworks import assert_the_uninterrupted_run, steps_of, train

pytest.importorskip("transformers")
pytestmark = pytest.mark.timeout(300)

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "train_transformers.py"


def test_a_training_resumed_from_its_last_save_is_the_uninterrupted_one_bit_for_bit(
    tmp_path: Path,
) -> None:
    whole = train(SCRIPT, tmp_path, "whole", CKPT_DIR=str(tmp_path / "whole-ckpt"))
    ckpt = str(tmp_path / "ckpt")
    crashed = train(SCRIPT, tmp_path, "crashed", CKPT_DIR=ckpt, CRASH_AT="13")
    assert max(steps_of(crashed)) == 13 and not [x for x in crashed if x["event"] == "final"]
    resumed = train(SCRIPT, tmp_path, "resumed", CKPT_DIR=ckpt)

    assert_the_uninterrupted_run(whole, resumed)


def test_save_every_must_be_a_step_or_more() -> None:
    from nodeagent.integrations.transformers import NodeagentCallback

    with pytest.raises(ValueError, match="save_every must be at least 1"):
        NodeagentCallback(save_every=0)


def test_a_trainer_that_shards_before_making_its_optimizer_is_refused_by_name(
    tmp_path: Path,
) -> None:
    """Under FSDP, tensor parallelism or DeepSpeed `Trainer` makes its optimizer after wrapping
    the model: the one `resume` would make now would not be it."""
    import torch
    from transformers import Trainer, TrainingArguments

    from nodeagent.integrations.transformers import NodeagentCallback

    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    trainer = Trainer(torch.nn.Linear(2, 1), args)
    trainer.is_fsdp_enabled = True  # what Trainer sets when Accelerate's FSDP plugin is on
    callback = NodeagentCallback(save_every=5, directory=tmp_path / "ckpt")
    with pytest.raises(ValueError, match="is_fsdp_enabled: not supported"):
        callback.resume(trainer)
    assert trainer.optimizer is None
