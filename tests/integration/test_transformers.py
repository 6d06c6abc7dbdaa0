"""nodeagent.integrations.transformers against a real transformers Trainer, no agent: what it
saves, a fresh process resumes bit for bit, with Trainer's own progress (global step, epoch, the
batches skipped, the schedule, the RNG after them); a SIGTERM to one rank of two stops both after
the same step and `train` returns on both, as Lightning's `fit` does."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.frameworks import (
    assert_the_uninterrupted_run,
    finished,
    progress_files,
    steps_of,
    stopped_by_sigterm,
    train,
)

pytest.importorskip("transformers")
pytestmark = pytest.mark.timeout(300)

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "train_transformers.py"


def test_a_training_resumed_from_its_last_save_is_the_uninterrupted_one_bit_for_bit(
    tmp_path: Path,
) -> None:
    said = progress_files(tmp_path)  # what the agent would read: the end said, or not
    whole = train(SCRIPT, tmp_path, "whole", CKPT_DIR=str(tmp_path / "whole-ckpt"),
                  NODEAGENT_PROGRESS_FILE=str(said["whole"]))  # fmt: skip
    assert finished(said["whole"])  # train returned: its exit's failure would not be the job's
    ckpt = str(tmp_path / "ckpt")
    crashed = train(SCRIPT, tmp_path, "crashed", CKPT_DIR=ckpt, CRASH_AT="13",
                    NODEAGENT_PROGRESS_FILE=str(said["crashed"]))  # fmt: skip
    assert max(steps_of(crashed)) == 13 and not [x for x in crashed if x["event"] == "final"]
    assert not finished(said["crashed"])
    resumed = train(SCRIPT, tmp_path, "resumed", CKPT_DIR=ckpt)

    assert_the_uninterrupted_run(whole, resumed)


def test_a_sigterm_to_one_rank_stops_both_after_the_same_step_and_train_returns(
    tmp_path: Path,
) -> None:
    """As tests/integration/test_lightning.py's: the script's code after `train` runs on every
    rank, sees `stopped`, and the script exits 0."""
    status, lines = stopped_by_sigterm(SCRIPT, tmp_path, "stopped", CKPT_DIR=str(tmp_path / "c"))
    assert status == 0
    last = {
        r: max(x["step"] for x in lines if x["event"] == "step" and x["rank"] == r) for r in (0, 1)
    }
    assert last[0] == last[1] > 7, last
    after = [
        (x["event"], x["rank"], x["step"]) for x in lines if x["event"] in ("stopped", "final")
    ]
    assert sorted(after) == [("stopped", 0, last[0]), ("stopped", 1, last[0])]


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
