"""nodeagent.integrations.lightning against a real Lightning Trainer, one process, no agent:
what it saves, a fresh process restores bit for bit, with Lightning's own progress (global
step, epoch, batch index, the scheduler, the data loader's position)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.frameworks import assert_the_uninterrupted_run, steps_of, train

pytest.importorskip("lightning")
pytestmark = pytest.mark.timeout(300)

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "train_lightning.py"


def test_a_fit_resumed_from_its_last_save_is_the_uninterrupted_one_bit_for_bit(
    tmp_path: Path,
) -> None:
    whole = train(SCRIPT, tmp_path, "whole", CKPT_DIR=str(tmp_path / "whole-ckpt"))
    ckpt = str(tmp_path / "ckpt")
    crashed = train(SCRIPT, tmp_path, "crashed", CKPT_DIR=ckpt, CRASH_AT="13")  # saved 5 and 10
    assert max(steps_of(crashed)) == 13 and not [x for x in crashed if x["event"] == "final"]
    resumed = train(SCRIPT, tmp_path, "resumed", CKPT_DIR=ckpt)

    step = assert_the_uninterrupted_run(whole, resumed)
    # The same batches: the loader went on from that batch of epoch 0, then epoch 1 from its
    # start (16 batches an epoch: step 17 begins it), at the same learning rates (the scheduler).
    assert [x["epoch"] for x in resumed if x["event"] == "restored"] == [0] and step < 16
    assert steps_of(whole)[17][:2] == (1, 0)


def test_save_every_must_be_a_step_or_more() -> None:
    from nodeagent.integrations.lightning import NodeagentCallback

    with pytest.raises(ValueError, match="save_every must be at least 1"):
        NodeagentCallback(save_every=0)
