"""nodeagent.integrations.lightning against a real Lightning Trainer, no agent: what it saves,
a fresh process restores bit for bit, with Lightning's own progress (global step, epoch, batch
index, the scheduler, the data loader's position); a SIGTERM that reaches one rank of two stops
both after the same step, saved."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.frameworks import assert_the_uninterrupted_run, rank0, steps_of, train

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


def test_a_sigterm_to_one_rank_stops_both_after_the_same_step_saved(tmp_path: Path) -> None:
    """A drain's SIGTERMs reach the ranks one by one, rank 0 not first. Lightning's own handler
    broadcasts from rank 0 inside the signal handler, a collective the other ranks are not in
    (it pairs with whatever they call next); the callback's handler only sets the flag, and
    every rank agrees at the step's end."""
    records = tmp_path / "records"
    records.mkdir()
    ckpt = str(tmp_path / "ckpt")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NODEAGENT_")}
    env |= {"RECORD_DIR": str(records), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    env |= {"CKPT_DIR": ckpt, "MAX_STEPS": "1000", "STEP_TIME_S": "0.1"}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    fit = subprocess.Popen([*torchrun, "--nproc-per-node=2", str(SCRIPT)], env=env)
    try:
        rank1 = None
        deadline = time.monotonic() + 120
        while rank1 is None and time.monotonic() < deadline:
            lines = [
                json.loads(t) for p in records.glob("*.jsonl") for t in p.read_text().splitlines()
            ]
            steps = [x for x in lines if x["event"] == "step" and x["rank"] == 1]
            rank1 = steps[0]["pid"] if steps and steps[-1]["step"] >= 7 else None
            time.sleep(0.1)
        assert rank1 is not None, "rank 1 never reached step 7"
        os.kill(rank1, signal.SIGTERM)
        assert fit.wait(timeout=120) == 0
    finally:
        fit.kill()
        fit.wait()
    lines = [json.loads(t) for p in records.glob("*.jsonl") for t in p.read_text().splitlines()]
    last = {
        r: max(x["step"] for x in lines if x["event"] == "step" and x["rank"] == r) for r in (0, 1)
    }
    assert last[0] == last[1] > 7, last

    resumed = rank0(
        train(SCRIPT, tmp_path, "resumed", ranks=2, CKPT_DIR=ckpt, MAX_STEPS=str(last[0] + 2))
    )
    [restored] = [x for x in resumed if x["event"] == "restored"]
    assert restored["step"] == last[0]  # the stop's own save: not one step lost
