"""nodeagent.integrations.lightning against a real Lightning Trainer, one process, no agent:
what it saves, a fresh process restores bit for bit, with Lightning's own progress (global
step, epoch, batch index, the scheduler, the data loader's position)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.frameworks import steps_of, train

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

    restored = [x for x in resumed if x["event"] == "restored"]
    # The newest save written whole: 10, or 5 when the crash came while 10 was being written
    # (on a loaded machine: the write is a thread, the crash os._exit).
    [(step, epoch)] = [(x["step"], x["epoch"]) for x in restored]
    assert step in (5, 10) and epoch == 0
    expected = steps_of(whole)
    # The resumed fit takes the same batches (the loader went on from that batch of epoch 0,
    # then epoch 1 from its start), at the same learning rates (the scheduler), from there.
    assert steps_of(resumed) == {s: v for s, v in expected.items() if s > step}
    assert expected[17][:2] == (1, 0)  # 16 batches an epoch: step 17 begins epoch 1
    final = [x["hash"] for x in resumed + whole if x["event"] == "final"]
    assert len(final) == 2 and final[0] == final[1]


def test_save_every_must_be_a_step_or_more() -> None:
    from nodeagent.integrations.lightning import NodeagentCallback

    with pytest.raises(ValueError, match="save_every must be at least 1"):
        NodeagentCallback(save_every=0)
