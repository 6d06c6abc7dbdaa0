"""Running examples/train_lightning.py, train_transformers.py and train_torchtitan.py as their
own processes, no agent (one, several under torchrun, one of them sent SIGTERM), and reading the
lines they record (tests/integration/test_lightning.py, test_transformers.py, test_torchtitan.py,
tests/gpu/)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from nodeagent.channel import beats, restore, tier


def train(
    script: Path, tmp_path: Path, name: str, ranks: int = 0, **env: str
) -> list[dict[str, Any]]:
    """Run `script` as its own process, or as `ranks` processes under torchrun (standalone);
    their lines, in order."""
    records = tmp_path / name
    records.mkdir(exist_ok=True)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("NODEAGENT_")}
    environ.update(RECORD_DIR=str(records), PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **env)
    launcher = [sys.executable]
    if ranks:
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
    subprocess.run([*launcher, str(script)], env=environ, timeout=240, check=False)
    lines = []
    for path in sorted(records.glob("*.jsonl")):
        lines += [json.loads(text) for text in path.read_text().splitlines()]
    return sorted(lines, key=lambda line: line["t"])


def progress_files(tmp_path: Path) -> dict[str, Path]:
    """A progress file for a "whole" and a "crashed" run, as the agent makes them."""
    files = {name: tmp_path / f"{name}.progress" for name in ("whole", "crashed")}
    for path in files.values():
        beats.create(path)
    return files


def finished(path: Path) -> bool:
    """The run said its training reached its end (nodeagent.worker.ending.training_ended)."""
    beat = beats.read(path)
    return beat is not None and beat.finished


def stopped_by_sigterm(
    script: Path, tmp_path: Path, name: str, after: int = 7, **env: str
) -> tuple[int, list[dict[str, Any]]]:
    """`script` on two ranks under torchrun (standalone), a step taking 0.1 s, and SIGTERM to
    rank 1 alone once it took `after` steps, as a drain's SIGTERMs reach the ranks one by one:
    torchrun's exit status (every rank's) and the lines, in order."""
    records = tmp_path / name
    records.mkdir()
    environ = {k: v for k, v in os.environ.items() if not k.startswith("NODEAGENT_")}
    environ |= {"RECORD_DIR": str(records), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    environ |= {"MAX_STEPS": "1000", "STEP_TIME_S": "0.1", **env}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    fit = subprocess.Popen([*torchrun, "--nproc-per-node=2", str(script)], env=environ)

    def lines() -> list[dict[str, Any]]:
        found = [json.loads(t) for p in records.glob("*.jsonl") for t in p.read_text().splitlines()]
        return sorted(found, key=lambda line: line["t"])

    try:
        rank1 = None
        deadline = time.monotonic() + 120
        while rank1 is None and time.monotonic() < deadline:
            steps = [x for x in lines() if x["event"] == "step" and x["rank"] == 1]
            rank1 = steps[0]["pid"] if steps and steps[-1]["step"] >= after else None
            time.sleep(0.1)
        assert rank1 is not None, f"rank 1 never reached step {after}"
        os.kill(rank1, signal.SIGTERM)
        status = fit.wait(timeout=120)
    finally:
        fit.kill()
        fit.wait()
    return status, lines()


def rank0(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The lines rank 0 wrote (every line of a run of several ranks names its rank)."""
    return [x for x in lines if x.get("rank") == 0]


def steps_of(lines: list[dict[str, Any]]) -> dict[int, tuple[Any, ...]]:
    """Step -> what the script says of it: epoch (and batch index), the batch, the rate, the
    parameters after it."""
    return {
        line["step"]: tuple(
            line[k] for k in ("epoch", "batch_idx", "batch_sum", "lr", "hash") if k in line
        )
        for line in lines
        if line["event"] == "step"
    }


def assert_the_uninterrupted_run(
    whole: list[dict[str, Any]], resumed: list[dict[str, Any]], saves: tuple[int, int] = (5, 10)
) -> int:
    """`resumed` (a run crashed after step 13 with saves at `saves`, run again; one rank's
    lines) restored the newest save written whole, 10, or 5 when the crash came while 10 was
    being written (on a loaded machine: the write is a thread, the crash os._exit), then took
    the same steps as `whole`, the run never interrupted, and ended with its parameters. The
    step restored."""
    [step] = [x["step"] for x in resumed if x["event"] == "restored"]
    assert step in saves
    expected = steps_of(whole)
    assert steps_of(resumed) == {s: v for s, v in expected.items() if s > step}
    final = [x["hash"] for x in resumed + whole if x["event"] == "final"]
    assert len(final) == 2 and final[0] == final[1]
    return int(step)


def assert_resumed_from_the_memory_tier(
    script: Path, tmp_path: Path, directory_env: str, ranks: int = 0, **env: str
) -> None:
    """`script` (one rank) run whole for 20 steps, then crashed after step 13, then again from
    the crashed run's newest save in its memory tier, as a job's leader would order it (each
    run with its own directory in `directory_env`): the restore came from the memory tier at
    that step, bit for bit the state saved, and the resumed run is the uninterrupted one."""

    def run(name: str, memory: Path, **more: str) -> list[dict[str, Any]]:
        tiers = {tier.MEMORY_ENV: str(memory), restore.RESTORE_ENV: "start"}
        own = {directory_env: str(tmp_path / f"{name}-dir")}
        return train(script, tmp_path, name, ranks, **(env | tiers | own | more))

    whole = run("whole", tmp_path / "whole-memory")
    assert max(steps_of(whole)) == 20
    memory = tmp_path / "memory"
    crashed = run("crashed", memory, CRASH_AT="13")
    assert max(steps_of(crashed)) == 13 and not [x for x in crashed if x["event"] == "final"]

    slot = tier.newest_in_memory(memory, 0)
    assert slot is not None
    step = json.loads((slot / "manifest.json").read_text())["step"]
    report = tmp_path / "restore.json"
    order = {restore.RESTORE_ENV: f"memory:{step}", restore.RESTORE_REPORT_ENV: str(report)}
    resumed = run("resumed", memory, **order)

    [back] = [x for x in resumed if x["event"] == "restored"]
    assert back["step"] == step
    assert back["hash"] == steps_of(crashed)[step][-1]  # the saved state, bit for bit
    assert json.loads(report.read_text())["tier"] == "memory"
    # the schedule, the data's position and every parameter after it: the uninterrupted run's
    assert_the_uninterrupted_run(whole, resumed)
