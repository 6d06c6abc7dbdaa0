"""nodeagent.integrations.lightning against a real Lightning Trainer, no agent: what it saves,
a fresh process restores bit for bit, with Lightning's own progress (global step, epoch, batch
index, the scheduler, the data loader's position, the random generators), one process and three
gloo ranks from an epoch's last batch; a SIGTERM that reaches one rank of two stops both after
the same step, saved, and `fit` returns on both."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.frameworks import (
    assert_the_uninterrupted_run,
    finished,
    progress_files,
    rank0,
    steps_of,
    stopped_by_sigterm,
    train,
)

pytest.importorskip("lightning")
pytestmark = pytest.mark.timeout(300)

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "train_lightning.py"
END = ("stopped", "final")  # the lines the script writes once `fit` returned


def test_a_fit_resumed_from_its_last_save_is_the_uninterrupted_one_bit_for_bit(
    tmp_path: Path,
) -> None:
    """One process, dropout on: each step draws its mask from torch's generator, which the
    save keeps and the resumed fit puts back before its first step (without it, that step's
    mask is the one the fresh process draws: the parameters apart from there)."""
    said = progress_files(tmp_path)  # what the agent would read: the end said, or not
    whole = train(SCRIPT, tmp_path, "whole", CKPT_DIR=str(tmp_path / "w"), DROPOUT="0.2",
                  NODEAGENT_PROGRESS_FILE=str(said["whole"]))  # fmt: skip
    assert finished(said["whole"])  # fit returned: its exit's failure would not be the job's
    ckpt = str(tmp_path / "ckpt")
    crashed = train(SCRIPT, tmp_path, "crashed", CKPT_DIR=ckpt, CRASH_AT="13", DROPOUT="0.2",
                    NODEAGENT_PROGRESS_FILE=str(said["crashed"]))  # fmt: skip
    assert max(steps_of(crashed)) == 13 and not [x for x in crashed if x["event"] in END]
    assert not finished(said["crashed"])
    resumed = train(SCRIPT, tmp_path, "resumed", CKPT_DIR=ckpt, DROPOUT="0.2")  # saved 5, 10

    step = assert_the_uninterrupted_run(whole, resumed)
    # The same batches: the loader went on from that batch of epoch 0, then epoch 1 from its
    # start (16 batches an epoch: step 17 begins it), at the same learning rates (the scheduler).
    assert [x["epoch"] for x in resumed if x["event"] == "restored"] == [0] and step < 16
    assert steps_of(whole)[17][:2] == (1, 0)


def test_a_fit_resumed_at_world_3_from_an_epochs_last_batch_is_the_uninterrupted_one(
    tmp_path: Path,
) -> None:
    """Three gloo ranks: 64 samples, 22 a rank (the DistributedSampler pads), 6 batches an
    epoch, in an order the sampler shuffles by epoch; a save every 6 steps, each at an epoch's
    last batch. Resumed from one, Lightning counts that epoch done and goes on with the next,
    from its first batch: the loader's position saved then ("the pass handed out whole") would
    have made the next pass empty, one more epoch counted, and its successor's batches taken:
    the parameters apart from step 13 on (they were, before the position was left out). With
    dropout: the generators put back before the next epoch's loader draws its seed, as the
    uninterrupted fit's drew it after that step (put back at the next step instead, they
    were apart from step 13 too)."""
    env = {"SAVE_EVERY": "6", "MAX_STEPS": "20", "DROPOUT": "0.2"}
    whole = train(SCRIPT, tmp_path, "whole", ranks=3, CKPT_DIR=str(tmp_path / "w"), **env)
    ckpt = str(tmp_path / "ckpt")
    crashed = train(SCRIPT, tmp_path, "crashed", ranks=3, CKPT_DIR=ckpt, CRASH_AT="13", **env)
    assert max(steps_of(crashed)) == 13 and not [x for x in crashed if x["event"] in END]
    resumed = train(SCRIPT, tmp_path, "resumed", ranks=3, CKPT_DIR=ckpt, **env)

    for rank in range(3):
        mine = [x for x in resumed if x.get("rank") == rank]
        theirs = [x for x in whole if x.get("rank") == rank]
        step = assert_the_uninterrupted_run(theirs, mine, saves=(6, 12))
        # as the fit starts, the epoch the step ended; Lightning then counts it done
        assert [x["epoch"] for x in mine if x["event"] == "restored"] == [step // 6 - 1]
    by_step = steps_of(rank0(whole))  # (epoch, batch index, batch's sum, ...)
    assert by_step[13][:2] == (2, 0) and by_step[19][:2] == (3, 0)
    assert by_step[13][2] != by_step[19][2]  # another epoch, other batches: a skip would show


def test_save_every_must_be_a_step_or_more() -> None:
    from nodeagent.integrations.lightning import NodeagentCallback

    with pytest.raises(ValueError, match="save_every must be at least 1"):
        NodeagentCallback(save_every=0)


def test_a_sigterm_to_one_rank_stops_both_after_the_same_step_saved_and_fit_returns(
    tmp_path: Path,
) -> None:
    """A drain's SIGTERMs reach the ranks one by one, rank 0 not first. Lightning's own handler
    broadcasts from rank 0 inside the signal handler, a collective the other ranks are not in
    (it pairs with whatever they call next); the callback's handler only sets the flag, and
    every rank agrees at the step's end. Then `fit` returns on every rank (Lightning's own stop
    raises SIGTERMException, a SystemExit out of `fit`): the script's code after it runs, sees
    `stopped`, and the script exits 0."""
    ckpt = str(tmp_path / "ckpt")
    status, lines = stopped_by_sigterm(SCRIPT, tmp_path, "stopped", CKPT_DIR=ckpt)
    assert status == 0
    last = {
        r: max(x["step"] for x in lines if x["event"] == "step" and x["rank"] == r) for r in (0, 1)
    }
    assert last[0] == last[1] > 7, last
    after_fit = [(x["event"], x["rank"], x["step"]) for x in lines if x["event"] in END]
    assert sorted(after_fit) == [("stopped", 0, last[0]), ("stopped", 1, last[0])]

    resumed = rank0(
        train(SCRIPT, tmp_path, "resumed", ranks=2, CKPT_DIR=ckpt, MAX_STEPS=str(last[0] + 2))
    )
    [restored] = [x for x in resumed if x["event"] == "restored"]
    assert restored["step"] == last[0]  # the stop's own save: not one step lost
    assert [x["event"] for x in resumed][-1] == "final"
