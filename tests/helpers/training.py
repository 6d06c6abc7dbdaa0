"""Reading a training run back from its workers' logs (examples/train_ddp.py JSON lines)."""

from __future__ import annotations

import json
import math
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.helpers.cluster import LocalCluster

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "examples" / "train_ddp.py"


def training_entrypoint(
    directory: Path, steps: int, every: int = 5, step_time: float = 0.05, loader_workers: int = 0
) -> list[str]:
    loader = ["--loader-workers", str(loader_workers)] if loader_workers else []
    return [
        sys.executable,
        str(TRAIN),
        "--steps",
        str(steps),
        "--checkpoint-dir",
        str(directory / "checkpoints"),
        "--checkpoint-every",
        str(every),
        "--final-dir",
        str(directory / "final"),
        "--step-time",
        str(step_time),
        *loader,
    ]


@dataclass
class Generation:
    number: int
    lines: list[dict[str, Any]]

    def of(self, event: str) -> list[dict[str, Any]]:
        return [line for line in self.lines if line.get("event") == event]

    @property
    def world(self) -> int:
        worlds = {int(line["world"]) for line in self.lines if "world" in line}
        assert len(worlds) == 1, f"generation {self.number} saw worlds {worlds}"
        return worlds.pop()

    @property
    def steps(self) -> list[int]:
        return [line["step"] for line in self.of("step") if line["rank"] == 0]

    @property
    def resumed_from(self) -> int | None:
        resumed = [line["step"] for line in self.of("resumed")]
        assert len(set(resumed)) <= 1, f"ranks resumed from different steps: {resumed}"
        return resumed[0] if resumed else None

    @property
    def first_step_time(self) -> float:
        """When every rank of this generation had finished its first step."""
        firsts: dict[int, float] = {}
        for line in self.of("step"):
            firsts.setdefault(line["rank"], line["t"])
        return max(firsts.values())


def generations(cluster: LocalCluster) -> list[Generation]:
    """Every generation that ran training steps, oldest first."""
    by_gen: dict[int, list[dict[str, Any]]] = defaultdict(list)
    root = cluster.directory / "logs" / cluster.job
    for log in root.glob("*/rank-*.log"):
        for text in log.read_text(errors="replace").splitlines():
            if text.startswith("{"):
                with_gen = json.loads(text)
                by_gen[int(log.parent.name)].append(with_gen)
    return [
        Generation(g, sorted(lines, key=lambda x: x["t"])) for g, lines in sorted(by_gen.items())
    ]


def latest_step(cluster: LocalCluster) -> int:
    gens = [g for g in generations(cluster) if g.steps]
    return gens[-1].steps[-1] if gens else 0


def check_history(
    cluster: LocalCluster, steps: int, every: int, graceful: bool = False
) -> list[Generation]:
    """The invariants of a run that recovered from faults; returns its generations."""
    gens = [g for g in generations(cluster) if g.of("started")]
    times = [g.lines[0]["t"] for g in gens]
    assert times == sorted(times), "generations ran out of order"
    previous_last = 0
    for gen in gens:
        assert all(math.isfinite(line["loss"]) for line in gen.of("step")), "a loss went non-finite"
        own = gen.steps
        assert own == list(range(own[0], own[0] + len(own))) if own else True, "steps skipped"
        resumed = gen.resumed_from or 0
        if gen is not gens[0]:
            # Never back past the last checkpoint; a graceful stop loses nothing.
            assert resumed >= previous_last - (0 if graceful else every), (
                gen.number,
                resumed,
                previous_last,
            )
            assert resumed <= previous_last
        if own:
            assert own[0] == resumed + 1
            previous_last = own[-1]
    finals = [json.loads(p.read_text()) for p in (cluster.directory / "final").glob("rank-*.json")]
    assert finals, "no rank finished"
    assert {f["step"] for f in finals} == {steps}
    assert len({f["sha256"] for f in finals}) == 1, "ranks ended with different models"
    # Every rank of the generation that ended the run wrote its file. A change asked for as the
    # run ended may start one more generation after every rank wrote its file: it resumes from
    # the last step and writes again, over fewer ranks, so an earlier generation's files remain.
    last = max(f["gen"] for f in finals)
    ending = {gen.number: gen for gen in gens}[last]
    assert len([f for f in finals if f["gen"] == last]) == ending.world, finals
    return gens
