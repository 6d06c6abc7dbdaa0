"""A stand-in for the agent's side of in-place recovery: control files, assignments, workers.

Starts a training script as the agent will start an in-place worker (torchrun's variables from
an Assignment, NODEAGENT_CONTROL_FILE, NODEAGENT_REFORM_TIMEOUT_S), or as plain torchrun would
(no control file), and reads back the JSON lines it prints (examples/train_elastic.py's).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodeagent.channel import control
from nodeagent.channel.control import Assignment, ControlFile

ROOT = Path(__file__).resolve().parents[2]


def assignment(generation: int, rank: int, world: int, port: int) -> Assignment:
    """Every worker on one node: local rank = rank, one group."""
    return Assignment(generation, rank, rank, world, world, 0, 1, "127.0.0.1", port, generation)


def stacks_of(pid: int) -> str:
    """py-spy's dump of a live worker, native frames too: where it hangs."""
    py_spy = Path(sys.executable).with_name("py-spy")
    try:
        done = subprocess.run(
            [str(py_spy), "dump", "--native", "--pid", str(pid)],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"no dump: {exc}"
    return (done.stdout + done.stderr)[-6000:]


@dataclass
class Worker:
    process: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path
    channel: ControlFile | None

    @property
    def pid(self) -> int:
        return self.process.pid

    def lines(self, event: str | None = None) -> list[dict[str, Any]]:
        """The JSON lines it printed so far (of `event` only, if given)."""
        found = []
        for text in self.stdout.read_text().splitlines():
            if text.startswith("{") and text.endswith("}"):  # a line still being written is not
                line = json.loads(text)
                if event is None or line.get("event") == event:
                    found.append(line)
        return found


class Workers:
    """The workers one test started, each with its output files in `directory`."""

    def __init__(self, directory: Path, reform_timeout: float = 30.0) -> None:
        self.directory = directory
        self.reform_timeout = reform_timeout
        self.started: list[Worker] = []

    def start(self, command: list[str], a: Assignment, in_place: bool = True) -> Worker:
        """Start `command` as rank `a.rank` of `a`; with a control file if `in_place`."""
        name = f"worker-{len(self.started)}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("NODEAGENT_")}
        env.update(a.environment(), OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
        env.update(TORCHELASTIC_RUN_ID="standin", TORCHELASTIC_MAX_RESTARTS="3")
        channel = None
        if in_place:
            path = self.directory / f"{name}.control"
            control.create(path)
            channel = ControlFile(path)
            env.update(
                NODEAGENT_CONTROL_FILE=str(path),
                NODEAGENT_REFORM_TIMEOUT_S=str(self.reform_timeout),
            )
        else:
            del env["NODEAGENT_GENERATION"]  # plain torchrun does not set it
        stdout, stderr = self.directory / f"{name}.out", self.directory / f"{name}.err"
        with open(stdout, "wb") as out, open(stderr, "wb") as err:
            process = subprocess.Popen(command, env=env, stdout=out, stderr=err, cwd=ROOT)
        worker = Worker(process, stdout, stderr, channel)
        self.started.append(worker)
        return worker

    def wait(self, what: str, until: Callable[[], bool], timeout: float = 60.0) -> None:
        """Poll `until` every 20 ms; on timeout fail with every worker's output and stacks."""
        deadline = time.monotonic() + timeout
        while not until():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; {self.describe()}")
            time.sleep(0.02)

    def describe(self) -> str:
        parts = []
        for w in self.started:
            alive = w.process.poll() is None
            parts.append(
                f"\n--- pid {w.pid} ({'alive' if alive else f'exit {w.process.returncode}'})"
                f"\nstdout: {w.stdout.read_text()[-1500:]}\nstderr: {w.stderr.read_text()[-2000:]}"
                + (f"\nstacks: {stacks_of(w.pid)}" if alive else "")
            )
        return "".join(parts)

    def close(self) -> None:
        for worker in self.started:
            if worker.process.poll() is None:
                worker.process.kill()
            worker.process.wait()
            if worker.channel is not None:
                worker.channel.close()
