"""examples/train_elastic.py: under plain torchrun's environment, resumed from its checkpoint at
another world size, and re-formed in place around a killed rank by a stand-in for the agent
(tests/helpers/standin.py). Real processes, gloo on CPU, no agent, no Redis."""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.helpers.cluster import free_port
from tests.helpers.standin import ROOT, Worker, Workers, assignment

torch = pytest.importorskip("torch")

SCRIPT = ROOT / "examples" / "train_elastic.py"
BATCH = 4


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    started = Workers(tmp_path)
    yield started
    started.close()


def command(directory: Path, steps: int, samples: int, *extra: str) -> list[str]:
    return [
        *(sys.executable, str(SCRIPT), "--steps", str(steps), "--samples", str(samples)),
        *("--batch", str(BATCH), "--checkpoint-dir", str(directory / "checkpoints"), *extra),
    ]


def walk(epoch: int, offset: int, world: int, samples: int, count: int) -> list[tuple[int, int]]:
    """(epoch, offset) after each of `count` steps from (epoch, offset), `samples` a multiple
    of BATCH * world (every batch full)."""
    found = []
    for _ in range(count):
        if offset >= samples:
            epoch, offset = epoch + 1, 0
        offset += BATCH * world
        found.append((epoch, offset))
    return found


def positions(worker: Worker) -> dict[int, tuple[int, int]]:
    return {line["step"]: (line["epoch"], line["offset"]) for line in worker.lines("step")}


def wait_exit(workers: Workers, *started: Worker, timeout: float = 90.0) -> None:
    workers.wait(
        "the workers to exit", lambda: all(w.process.poll() is not None for w in started), timeout
    )
    for worker in started:
        assert worker.process.returncode == 0, workers.describe()


def finished(*started: Worker) -> list[dict[str, Any]]:
    return [line for worker in started for line in worker.lines("finished")]


@pytest.mark.timeout(120)
def test_plain_torchrun_then_resumed_from_its_checkpoint_at_another_world_size(
    workers: Workers, tmp_path: Path
) -> None:
    samples, port = 64, free_port()  # 8 steps an epoch at world 2, 16 at world 1
    pair = [
        workers.start(command(tmp_path, 12, samples, "--checkpoint-every", "5"), a, False)
        for a in (assignment(0, rank, 2, port) for rank in range(2))
    ]
    wait_exit(workers, *pair)
    ends = finished(*pair)
    assert [line["step"] for line in ends] == [12, 12]
    assert len({line["sha256"] for line in ends}) == 1
    expected = walk(0, 0, 2, samples, 12)  # through the end of epoch 0
    for worker in pair:
        assert positions(worker) == dict(enumerate(expected, start=1))
        assert [line["resumed"] for line in worker.lines("synced")] == [None]

    alone = workers.start(command(tmp_path, 20, samples), assignment(0, 0, 1, free_port()), False)
    wait_exit(workers, alone)
    [synced] = alone.lines("synced")
    assert (synced["resumed"], synced["epoch"], synced["offset"]) == (12, 1, 32)
    assert synced["lr"] == pytest.approx(pair[0].lines("synced")[0]["lr"] / 2)  # rescaled
    # The rest of epoch 1, four samples a step now: none trained twice, none skipped.
    assert positions(alone) == dict(enumerate(walk(1, 32, 1, samples, 8), start=13))
    assert [line["step"] for line in finished(alone)] == [20]


@pytest.mark.timeout(150)
def test_survivor_of_a_killed_rank_reforms_in_place_and_the_epoch_goes_on(
    workers: Workers, tmp_path: Path
) -> None:
    samples, steps = 1024, 160  # 128 steps an epoch at world 2: the run crosses into epoch 1
    argv = command(tmp_path, steps, samples, "--step-time", "0.02", "--checkpoint-every", "50")
    port = free_port()
    killed, survivor = (workers.start(argv, assignment(1, rank, 2, port)) for rank in range(2))
    workers.wait(
        "both ranks stepping", lambda: all(len(w.lines("step")) >= 3 for w in (killed, survivor))
    )
    os.kill(killed.pid, signal.SIGKILL)  # rank 0: the process group's store goes with it
    killed.process.wait()
    assert survivor.channel is not None
    channel = survivor.channel
    workers.wait(
        "the survivor to leave generation 1", lambda: channel.report().left_generation == 1
    )
    committed = channel.report().committed_step
    assert committed >= 3  # it printed step 3, which it commits next: its offset is not 0
    port = free_port()
    channel.assign(assignment(2, 0, 2, port))
    newcomer = workers.start(argv, assignment(2, 1, 2, port))
    wait_exit(workers, survivor, newcomer)

    synced = {
        w.pid: [line for line in w.lines("synced") if line["gen"] == 2] for w in workers.started
    }
    assert {line["pid"] for line in survivor.lines()} == {survivor.pid}  # one process, and
    assert [line["step"] for line in synced[survivor.pid]] == [committed]  # it re-formed
    assert [(line["step"], line["resumed"]) for line in synced[newcomer.pid]] == [(committed, None)]
    assert min(positions(newcomer)) == committed + 1
    assert min(line["step"] for line in survivor.lines("step") if line["gen"] == 2) == committed + 1
    expected = dict(enumerate(walk(0, 0, 2, samples, steps), start=1))
    for worker in (survivor, newcomer):  # the offset went on from the commit, no reset to 0
        assert positions(worker).items() <= expected.items()
    ends = finished(survivor, newcomer)
    assert [line["step"] for line in ends] == [steps, steps]
    assert len({line["sha256"] for line in ends}) == 1
    assert (tmp_path / "checkpoints" / f"step-{steps:010d}.json").exists()  # by the new rank 0


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_elastic", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(60)
@pytest.mark.parametrize("trained_steps", [6, 5])  # offsets 48 and 40, from world 2 to world 3
def test_the_rest_of_an_epoch_at_a_new_world_size_skips_nothing(trained_steps: int) -> None:
    example, samples = load_example(), 96
    data = torch.utils.data.TensorDataset(torch.arange(samples))
    trained = Counter(
        i
        for rank in range(2)
        for i in example.remaining(data, 3, 0, rank, 2)[: trained_steps * BATCH]
    )
    offset = trained_steps * BATCH * 2
    rest = [example.remaining(data, 3, offset, rank, 3) for rank in range(3)]
    assert len({len(part) for part in rest}) == 1  # every rank takes as many steps
    seen = trained + Counter(i for part in rest for i in part)
    assert set(seen) == set(range(samples))  # nothing skipped
    assert sum(seen.values()) - samples == offset % 3  # repeated: none when 3 divides offset
