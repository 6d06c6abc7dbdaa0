"""nodeagent.worker's Checkpointer with real FSDP2 training (gloo, CPU) under plain torchrun,
without an agent: a directory of DCP checkpoints resumed at another world size (resharded,
bitwise), and the memory tier as the agent lays it out (its variables set by hand here): the
leader's order of sources, a flipped bit refused, a NaN refused, a save cut short."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from nodeagent.channel import manifests, restore, tier

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "train_fsdp.py"


def torchrun(
    nproc: int, *args: str, env: dict[str, str] | None = None, timeout: float = 100
) -> list[dict[str, Any]]:
    """Run examples/train_fsdp.py under torchrun; every JSON line its ranks printed."""
    command = [
        *(sys.executable, "-m", "torch.distributed.run", "--standalone"),
        *("--nproc-per-node", str(nproc), str(SCRIPT), "--print-every", "1000", *args),
    ]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    done = subprocess.run(
        command, env=full_env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def of(lines: list[dict[str, Any]], event: str, rank: int | None = 0) -> list[dict[str, Any]]:
    return [x for x in lines if x["event"] == event and (rank is None or x["rank"] == rank)]


@pytest.mark.timeout(240)
def test_plain_torchrun_saves_a_directory_that_reshards_bitwise_at_any_world(
    tmp_path: Path,
) -> None:
    ck = str(tmp_path / "ck")
    first = torchrun(4, "--checkpoint-dir", ck, "--steps", "12", "--save-every", "5", "--digest")
    saved = {x["step"]: x["digest"] for x in of(first, "saved")}
    assert sorted(saved) == [5, 10, 12]
    assert tier.steps(Path(ck)) == [12, 10]  # keep=2 newest steps, every rank's directory
    assert sorted(p.name for p in tier.step_dir(Path(ck), 12).iterdir()) == [
        f"rank-{r}" for r in range(4)
    ]
    manifest = manifests.read_manifest(tier.rank_dir(tier.step_dir(Path(ck), 12), 0))
    assert manifest.dim0 is not None and manifest.dim0  # FSDP2: every tensor row-wise
    # 4 -> 3: each new rank reads the two old ranks whose rows overlap its own.
    report = tmp_path / "restore.json"
    env = {restore.RESTORE_REPORT_ENV: str(report)}
    args = ("--checkpoint-dir", ck, "--steps", "15", "--save-every", "5", "--digest")
    second = torchrun(3, *args, env=env)
    [restored] = of(second, "restored")
    assert (restored["step"], restored["world"]) == (12, 3)
    assert restored["digest"] == saved[12]
    assert {x["step"] for x in of(second, "restored", None)} == {12}
    assert json.loads(report.read_text())["saves"] == 2  # whichever rank wrote it last
    # 3 -> 4 again, from the save at world 3.
    third = torchrun(4, "--checkpoint-dir", ck, "--steps", "16", "--save-every", "5", "--digest")
    [back] = of(third, "restored")
    assert back["step"] == 15
    assert back["digest"] == {x["step"]: x["digest"] for x in of(second, "saved")}[15]


@pytest.mark.timeout(240)
def test_a_save_whose_layout_lies_is_refused_rather_than_loaded_in_part(tmp_path: Path) -> None:
    """Manifests that say the state is whole on every rank (no rows): at another world each
    new rank then reads one old save, which holds only part of its rows. dcpio.load finds
    the rows missing before loading, and the source is refused (here: the job starts anew)
    rather than loaded with the freshly built model's values in the rest."""
    ck = tmp_path / "ck"
    torchrun(4, "--checkpoint-dir", str(ck), "--steps", "5", "--save-every", "5")
    for rank in range(4):
        directory = tier.rank_dir(tier.step_dir(ck, 5), rank)
        manifest = manifests.read_manifest(directory)
        manifests.write_manifest(directory, dataclasses.replace(manifest, dim0=()))
    report = tmp_path / "restore.json"
    env = {restore.RESTORE_REPORT_ENV: str(report)}
    lines = torchrun(3, "--checkpoint-dir", str(ck), "--steps", "6", "--save-every", "5", env=env)
    assert {x["step"] for x in of(lines, "restored", None)} == {0}
    [refused] = json.loads(report.read_text())["refused"]
    assert refused["kind"] == "absent" and "hold only part of" in refused["reason"]


def memory_env(base: Path, order: str) -> dict[str, str]:
    """The variables the agent gives a worker (one restore report for both ranks here: made
    anew by each, atomically; the agent gives each rank its own)."""
    (base / "restore.json").unlink(missing_ok=True)
    return {
        tier.MEMORY_ENV: str(base / "memory"),
        tier.PERSIST_ENV: str(base / "persist"),
        restore.RESTORE_ENV: order,
        restore.RESTORE_REPORT_ENV: str(base / "restore.json"),
    }


@pytest.mark.timeout(240)
def test_the_memory_tier_restores_the_chosen_step_and_refuses_a_flipped_bit(
    tmp_path: Path,
) -> None:
    env = memory_env(tmp_path, "start")
    ck = str(tmp_path / "script")
    args = ("--checkpoint-dir", ck, "--save-every", "3", "--digest")
    first = torchrun(2, *args, "--steps", "8", env=env)
    saved = {x["step"]: x["digest"] for x in of(first, "saved")}
    assert sorted(saved) == [3, 6, 8]
    assert not Path(ck).exists()  # under the agent's tier the script's directory is not written
    memory = tmp_path / "memory"
    for rank in range(2):  # two slots per rank: the last two steps
        held = sorted(manifests.verify(slot).step for slot in tier.slots(memory, rank))
        assert held == [6, 8]

    plain = torchrun(2, *args, "--steps", "4")  # the script's own directory: step 4
    assert [x["step"] for x in of(plain, "saved")] == [3, 4]

    # A bit flipped in rank 1's copy of step 8: both ranks refuse it and take the next source.
    slot = tier.newest_in_memory(memory, 1, step=8)
    assert slot is not None
    data = bytearray((slot / "__0_0.distcp").read_bytes())
    data[len(data) // 2] ^= 0x10
    (slot / "__0_0.distcp").write_bytes(bytes(data))
    order = "memory:8 memory:6 script"
    again = torchrun(2, *args, "--steps", "6", env=memory_env(tmp_path, order))
    assert [(x["step"], x["digest"]) for x in of(again, "restored")] == [(6, saved[6])]
    assert {x["step"] for x in of(again, "restored", None)} == {6}
    report = json.loads((tmp_path / "restore.json").read_text())
    assert (report["tier"], report["step"]) == ("memory", 6)
    [refused] = report["refused"]
    assert refused["source"] == "memory:8"
    # Rank 1 read the bad copy; rank 0 (whichever wrote the report last) only lacks the step.
    assert refused["kind"] == ("absent" if refused["reason"].startswith("rank 1: ") else "bad_copy")
    for rank in range(2):  # step 8 is of a timeline the job left at 6: forgotten
        assert tier.newest_in_memory(memory, rank, step=8) is None

    fallback = torchrun(2, *args, "--steps", "5", env=memory_env(tmp_path, "memory:8 script"))
    assert {x["step"] for x in of(fallback, "restored", None)} == {4}
    report = json.loads((tmp_path / "restore.json").read_text())
    assert (report["tier"], report["step"]) == ("script", 4)
    assert "holds no step 8" in report["refused"][0]["reason"]
    assert report["refused"][0]["kind"] == "absent"


@pytest.mark.timeout(120)
def test_a_non_finite_state_and_a_cut_save_are_never_restored(tmp_path: Path) -> None:
    """One process, no process group: the checks are the rank's own."""
    code = f"""
import math, sys, torch
from pathlib import Path
from nodeagent.channel import manifests, restore, tier
from nodeagent.worker import Checkpointer, TrainState
env = {{"RANK": "0", "WORLD_SIZE": "1", tier.MEMORY_ENV: {str(tmp_path / "m")!r}}}
model = torch.nn.Linear(4, 3)
state = TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1), epoch=1)
ck = Checkpointer(env=env)
ck.save(state, 2)
ck.wait()
with torch.no_grad():
    model.weight[0, 0] = math.nan
state.epoch = 9
ck.save(state, 4)
ck.wait()
# A save of step 6 killed half way: its slot (the one of step 2) lost its manifest, half written.
cut = tier.slot_for_save(Path(env[tier.MEMORY_ENV]), 0)
manifests.begin(cut)
(cut / "__0_0.distcp").write_bytes(b"half")
fresh = torch.nn.Linear(4, 3)
again = TrainState(fresh, torch.optim.SGD(fresh.parameters(), lr=0.1), epoch=0)
order = "memory:6 memory:4 start"
report = {{restore.RESTORE_REPORT_ENV: {str(tmp_path / "report.json")!r}}}
step = Checkpointer(env={{**env, restore.RESTORE_ENV: order, **report}}).restore(again)
print(step, again.epoch, bool(torch.isfinite(fresh.weight).all()))
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=100, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["0", "0", "True"]  # neither step 6 (cut) nor 4 (NaN)
    assert "non-finite value in model.weight" in done.stderr  # a warning; step 6's lack is not
    report = json.loads((tmp_path / "report.json").read_text())
    assert [(r["source"], r["kind"]) for r in report["refused"]] == [
        ("memory:6", "absent"),
        ("memory:4", "bad_state"),
    ]
    assert "holds no step 6" in report["refused"][0]["reason"]


@pytest.mark.timeout(240)
def test_a_source_one_rank_refuses_leaves_nothing_of_it_in_any_rank(tmp_path: Path) -> None:
    """Rank 1's copy of step 4 is damaged; rank 0's is whole and loads. Falling back to the
    start, rank 0 must not keep step 4's shards: both ranks end with the initial state."""
    args = ("--save-every", "2", "--digest")
    torchrun(2, *args, "--steps", "4", env=memory_env(tmp_path, "start"))
    slot = tier.newest_in_memory(tmp_path / "memory", 1, step=4)
    assert slot is not None
    data = bytearray((slot / "__0_0.distcp").read_bytes())
    data[len(data) // 2] ^= 0x01
    (slot / "__0_0.distcp").write_bytes(bytes(data))
    (tmp_path / "fresh").mkdir()
    fresh = torchrun(2, *args, "--steps", "0", env=memory_env(tmp_path / "fresh", "start"))
    refused = torchrun(2, *args, "--steps", "0", env=memory_env(tmp_path, "memory:4 start"))
    [initial] = of(fresh, "finished")
    [after] = of(refused, "finished")
    assert of(refused, "restored")[0]["step"] == 0
    assert after["digest"] == initial["digest"]


def test_check_saves_the_step_reached_once_and_leaves_when_told(tmp_path: Path) -> None:
    """In place: told to leave, check() saves the step reached (unless that step was just
    saved) and raises Reform. One process, no group: the agreement is its own."""
    import torch

    from nodeagent.channel import control, manifests, tier
    from nodeagent.worker import Checkpointer, TrainState
    from nodeagent.worker.follow import Reform

    channel_path = tmp_path / "rank-0.control"
    control.create(channel_path)
    env = {"RANK": "0", "WORLD_SIZE": "1", tier.MEMORY_ENV: str(tmp_path / "m")}
    model = torch.nn.Linear(4, 3)
    state = TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))
    ck = Checkpointer(env=env)
    agent = control.ControlFile(channel_path)
    ck.follower.attach(control.ControlFile(channel_path))
    ck.check(state, 1)  # nothing said: nothing saved, no Reform
    ck.save(state, 2)
    agent.leave(0)
    with pytest.raises(Reform, match="told to leave generation 0"):
        ck.check(state, 2)  # step 2 was just saved: not again
    ck.wait()
    steps = sorted(
        manifests.read_manifest(s).step
        for s in tier.slots(tmp_path / "m", 0)
        if (s / manifests.MANIFEST).exists()
    )
    assert steps == [2]
    agent.leave(0)  # said again: a new message
    with pytest.raises(Reform):
        ck.check(state, 3)
    ck.wait()
    steps = sorted(
        manifests.read_manifest(s).step
        for s in tier.slots(tmp_path / "m", 0)
        if (s / manifests.MANIFEST).exists()
    )
    assert steps == [2, 3]


def test_reform_due_keeps_the_step_reached_as_check_does(tmp_path: Path) -> None:
    """Issue 41: a script that saves its own way asks `reform_due()`, then saves the step it
    reached; that save is skipped (the newer one is not committed) and must be written as the
    rank leaves, as after `check()`, not dropped as after a failure (it lost a step on a
    graceful scale 4 -> 3: left at 21, restored 20)."""
    import torch

    from nodeagent.channel import control, pin
    from nodeagent.channel.pin import Pin
    from nodeagent.worker import Checkpointer, TrainState

    memory = tmp_path / "m"
    env = {"RANK": "0", "WORLD_SIZE": "1", "NODEAGENT_GENERATION": "3"}
    env[tier.MEMORY_ENV] = str(memory)
    env[tier.REPLICAS_ENV] = str(tmp_path / "area")  # copies to peers: the pin counts
    model = torch.nn.Linear(4, 3)
    state = TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))
    ck = Checkpointer(env=env)
    assert ck.save(state, 10) and ck.save(state, 20)
    ck.wait()
    pin.write(memory, Pin((10, 3, 1)))  # 20's copies not all made
    channel_path = tmp_path / "rank-0.control"
    control.create(channel_path)
    ck.follower.attach(control.ControlFile(channel_path))
    control.ControlFile(channel_path).leave(3)  # a scale: the agent asks the ranks to leave
    assert ck.reform_due() is not None
    assert not ck.save(state, 21)  # the script's own save of the step reached: skipped
    ck.leaving()
    held = sorted(manifests.read_manifest(s).step for s in tier.slots(memory, 0) if s.is_dir())
    assert held == [10, 21]


def test_a_save_never_goes_over_the_committed_one_the_agent_pinned(tmp_path: Path) -> None:
    """Steps 2 and 4 saved, 2 committed (4's copies not all made): step 6 is skipped, not saved
    over 2, and written over 4 as the worker stops; so is a save once the newer one is older
    than the patience; once the newer one is committed, the next save goes over the older.
    One process, no group."""
    import torch

    from nodeagent.channel import control, manifests, pin, tier
    from nodeagent.channel.pin import Pin
    from nodeagent.worker import Checkpointer, TrainState
    from nodeagent.worker.checkpointer import PATIENCE_S
    from nodeagent.worker.follow import Reform

    memory = tmp_path / "m"
    env = {"RANK": "0", "WORLD_SIZE": "1", "NODEAGENT_GENERATION": "1"}
    env[tier.MEMORY_ENV] = str(memory)
    env[tier.REPLICAS_ENV] = str(tmp_path / "area")  # copies to peers: the pin counts
    model = torch.nn.Linear(4, 3)
    state = TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))
    ck = Checkpointer(env=env)

    def held() -> list[int]:
        ck.wait()
        return sorted(manifests.read_manifest(s).step for s in tier.slots(memory, 0) if s.is_dir())

    assert ck.save(state, 2) and ck.save(state, 4)
    pin.write(memory, Pin((2, 1, 1)))
    assert not ck.save(state, 6)
    assert held() == [2, 4]
    ck.close()  # the worker stops: the step it reached is written, over the newer save
    assert held() == [2, 6]
    pin.write(memory, Pin((6, 1, 1)))  # 6 committed
    assert ck.save(state, 8)
    assert held() == [6, 8]
    assert not ck.save(state, 10)  # 8 not committed: the copies never come
    newer = tier.newest_in_memory(memory, 0, step=8)
    assert newer is not None
    past = time.time() - PATIENCE_S - 1
    os.utime(newer / manifests.MANIFEST, (past, past))
    assert ck.save(state, 10)  # patience spent: over 8, the committed one kept
    assert held() == [6, 10]
    # A new generation: the last one's newer save is written over at once.
    again = Checkpointer(env={**env, "NODEAGENT_GENERATION": "2"})
    assert again.save(state, 12)
    again.wait()
    assert held() == [6, 12]
    (memory / pin.FILE).write_text("{")  # not the agent's: pins nothing
    assert again.save(state, 14)
    again.wait()
    assert held() == [12, 14]
    # In place: a save skipped, then the group fails (a rank never saved that step): leaving
    # drops it, keeping the newer save. Told to leave (check), every rank wrote it.
    pin.write(memory, Pin((12, 2, 1)))
    assert not again.save(state, 16)
    again.leaving()
    assert held() == [12, 14]
    channel_path = tmp_path / "rank-0.control"
    control.create(channel_path)
    again.follower.attach(control.ControlFile(channel_path))
    assert not again.save(state, 18)
    control.ControlFile(channel_path).leave(2)
    with pytest.raises(Reform):
        again.check(state, 18)  # saved (skipped) at 18 already: not again
    again.leaving()
    assert held() == [12, 18]
    # Without copies to peers, a pin left from before is stale: nothing waits for it.
    alone = {k: v for k, v in env.items() if k != tier.REPLICAS_ENV}
    without = Checkpointer(env={**alone, "NODEAGENT_GENERATION": "2"})
    assert without.save(state, 20)
    without.wait()
    assert held() == [18, 20]


def _worker_example() -> str:
    """The code block of nodeagent/worker/__init__.py's docstring, as a script would copy it."""
    import nodeagent.worker

    doc = nodeagent.worker.__doc__ or ""
    block = [line for line in doc.splitlines() if line.startswith("    ") or not line.strip()]
    start = next(i for i, line in enumerate(block) if line.strip())
    end = max(i for i, line in enumerate(block) if line.strip())
    return textwrap.dedent("\n".join(block[start : end + 1]))


def test_the_example_nodeagent_worker_shows_runs_and_resumes(tmp_path: Path) -> None:
    """What `help(nodeagent.worker)` shows a script author is current: it trains, saves, and a
    second run resumes from the step the first saved last (plain python, no launcher)."""
    example = _worker_example().replace('"/shared/ckpt/llama"', repr(str(tmp_path / "ck")))
    assert "Checkpointer(" in example and "checkpointer.restore(state)" in example
    script = tmp_path / "example.py"
    script.write_text(
        "import torch\n"
        "model = torch.nn.Linear(4, 4)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "steps = 120\n"
        "def train_one_step(step: int) -> None:\n"
        "    model(torch.ones(1, 4)).sum().backward()\n"
        "    optimizer.step()\n" + example + "\nprint('resumed from', start)\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    runs = [
        subprocess.run(
            [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
        )
        for _ in range(2)
    ]
    for done in runs:
        assert done.returncode == 0, done.stderr[-3000:]
    assert [r.stdout.split()[-1] for r in runs] == ["0", "100"]
    assert tier.steps(tmp_path / "ck") == [100, 50]  # keep=2 newest steps
