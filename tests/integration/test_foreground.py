"""supervisor/foreground.py with real processes: a command's exit code as a shell says it,
and its end as a hang-up ends a shell, escalated to SIGKILL for one that ignores both."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from nodeagent.supervisor.foreground import Foreground
from tests.helpers.cluster import wait_for


def test_an_exit_and_a_death_by_signal_are_said_as_a_shell_says_them() -> None:
    assert Foreground(["sh", "-c", "exit 7"], os.environ).wait(30) == 7
    killed = Foreground(["sh", "-c", "kill -TERM $$"], os.environ)
    assert killed.wait(30) == 128 + signal.SIGTERM
    running = Foreground(["sleep", "30"], os.environ)
    assert running.wait(0.1) is None
    running.send(signal.SIGUSR1)
    assert running.wait(30) == 128 + signal.SIGUSR1


def test_a_command_that_ignores_the_hang_up_and_sigterm_is_killed_after_the_grace(
    tmp_path: Path,
) -> None:
    ready = tmp_path / "ready"
    stubborn = Foreground(["sh", "-c", f"trap '' HUP TERM; touch {ready}; sleep 30"], os.environ)
    wait_for(ready.exists, 30, "its traps set")
    began = time.monotonic()
    stubborn.end(grace=0.5)
    assert stubborn.wait(0) == 128 + signal.SIGKILL
    assert time.monotonic() - began >= 0.5
    polite = Foreground(["sleep", "30"], os.environ)
    began = time.monotonic()
    polite.end(grace=30)  # SIGHUP (or SIGTERM, sent right after it) ends it, long before
    assert polite.wait(0) in (128 + signal.SIGHUP, 128 + signal.SIGTERM)
    assert time.monotonic() - began < 30
