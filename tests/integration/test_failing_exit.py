"""A worker the agent asked to stop (SIGTERM, handled) whose training then fails exits at once:
the exception printed, the saves being written finished, the atexit handlers run, and nothing
else of Python's finalization (nodeagent/worker/graceful.py, `exit_at_once_when_failing`).
Real processes: one that raises by itself, and gloo ranks whose peer is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FAILING = """
import atexit, os, signal, sys, threading, time
from pathlib import Path
from nodeagent.worker import GracefulExit

out = Path(sys.argv[1])
atexit.register(lambda: (out / "atexit-before").write_text("ran"))  # skipped by a fast exit
guard = GracefulExit().install()
atexit.register(lambda: (out / "atexit-after").write_text("ran"))

def save():  # a save being written, in a thread of its own
    time.sleep(0.3)
    (out / "saved").write_text("written")

threading.Thread(target=save, name="nodeagent-save").start()
if sys.argv[2] != "not asked":
    os.kill(os.getpid(), signal.SIGTERM)
if sys.argv[2] == "uninstalled":  # the stop it answered for is over
    guard.uninstall()
raise RuntimeError("Connection closed by peer")
"""


def _env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path}


@pytest.mark.parametrize("case", ["asked", "not asked", "uninstalled"])
def test_a_worker_asked_to_stop_that_fails_exits_without_finalization(
    tmp_path: Path, case: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", FAILING, str(tmp_path), case],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert "RuntimeError: Connection closed by peer" in done.stderr
    made = sorted(p.name for p in tmp_path.iterdir())
    if case == "asked":  # the save written, the script's atexit run, the rest skipped
        assert "asked to stop, then failed" in done.stderr
        assert made == ["atexit-after", "saved"]
    else:  # not asked to stop, or no longer handling SIGTERM: Python's own exit
        assert "asked to stop" not in done.stderr
        assert made == ["atexit-after", "atexit-before", "saved"]


RANK = """
import os, sys, time
import torch, torch.distributed as dist
from nodeagent.worker import GracefulExit

guard = GracefulExit().install()
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(256, 256))
print("ready", flush=True)
while True:  # a training loop that asks should_stop_all() between steps
    model(torch.randn(8, 256)).square().mean().backward()
    if guard.should_stop_all():
        sys.exit(0)
    time.sleep(0.05)
"""


@pytest.mark.timeout(180)
def test_gloo_survivors_of_a_killed_peer_exit_at_once_when_stopped(tmp_path: Path) -> None:
    from tests.helpers.cluster import free_port

    env = _env() | {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "WORLD_SIZE": "3",
        "OMP_NUM_THREADS": "1",
    }
    logs = [open(tmp_path / f"rank-{r}.err", "w") for r in range(3)]  # noqa: SIM115
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", RANK],
            env=env | {"RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=logs[r],
            text=True,
        )
        for r in range(3)
    ]
    try:
        for rank in ranks:
            assert rank.stdout is not None and rank.stdout.readline().strip() == "ready"
        # rank 2 freezes, so the others block in a step's collective; the agent's failure stop
        # reaches them there (their handler runs once the call returns), then rank 2 dies
        ranks[2].send_signal(signal.SIGSTOP)
        time.sleep(0.5)
        for rank in ranks[:2]:
            rank.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        ranks[2].kill()
        codes = [rank.wait(timeout=60) for rank in ranks[:2]]
    finally:
        for rank, log in zip(ranks, logs, strict=True):
            rank.kill()
            rank.wait()
            assert rank.stdout is not None
            rank.stdout.close()
            log.close()
    errors = [(tmp_path / f"rank-{r}.err").read_text() for r in range(2)]
    # each survivor's next collective raised (the peer is gone), then it left at once
    assert codes == [1, 1], errors
    for index, text in enumerate(errors):
        assert f"[rank{index}]: RuntimeError: " in text, text  # torch's hook printed it
        assert "asked to stop, then failed: exiting now" in text, text
