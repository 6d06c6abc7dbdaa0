"""A tiny worker for integration tests: checks its torchrun environment and records its life.

Appends JSON lines to $RECORD_DIR/records.jsonl: a "start" record (pid, process start time,
generation, ranks), an "overlap" record if any worker of an older generation is still alive when
it starts, a "stop" record when SIGTERM arrives, a "signal" record when SIGUSR1 does. It exits
with the code written to $RECORD_DIR/exit-<generation> (all workers of that generation), else
runs until stopped.
With DEVICES_DIR set, the start record says which device nodes there it may open
(tests/helpers/devicenodes.py).
With SPAWN_CHILD=1 it first starts a child process (like a data loader) that sleeps for ever,
and names it in the start record; with SPAWN_CHILD=detached that child leaves the worker's
session and process group (setsid), as a daemon a job starts does.
With HOLD_MB=N it holds N MiB it has written to; with GROW_MB=N it writes N MiB more every
0.2 s, up to GROW_CAP_MB (default 2048: where the test's cgroup limit failed, it stops there,
the machine unharmed).
With LEAVE_FILES=NAME it writes NAME (1 MiB) in /dev/shm and in its temp directory, and the
start record says what /dev/shm holds and where its temp directory is.
With a file $RECORD_DIR/train ("STEP_S EVERY") it trains too: a step every STEP_S seconds, each
beaten (nodeagent.worker.progress), rank 0 saving the step to $RECORD_DIR/saved every EVERY
steps, and every rank resuming from the step saved there.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from nodeagent.supervisor.spec import TORCHRUN_VARIABLES

REQUIRED = (*TORCHRUN_VARIABLES, "NODEAGENT_JOB_ID", "NODEAGENT_GENERATION", "NODEAGENT_NODE")


def record(directory: Path, **fields: object) -> None:
    line = json.dumps({"time": time.time(), "pid": os.getpid(), **fields}) + "\n"
    fd = os.open(directory / "records.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def check_env() -> list[str]:
    env = os.environ
    problems = [f"{name} missing" for name in REQUIRED if name not in env]
    if problems:
        return problems
    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    local, nlocal = int(env["LOCAL_RANK"]), int(env["LOCAL_WORLD_SIZE"])
    group, ngroups = int(env["GROUP_RANK"]), int(env["GROUP_WORLD_SIZE"])
    if not 0 <= rank < world or rank != group * nlocal + local or world != ngroups * nlocal:
        problems.append(f"inconsistent ranks {rank}/{world} {local}/{nlocal} {group}/{ngroups}")
    if any(name in env for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")):
        problems.append("systemd variables leaked into the worker")
    return problems


def older_alive(directory: Path, generation: int) -> list[dict[str, object]]:
    alive = []
    path = directory / "records.jsonl"
    for line in path.read_text().splitlines() if path.exists() else ():
        entry = json.loads(line)
        if entry["event"] != "start" or entry["generation"] >= generation:
            continue
        try:
            proc = psutil.Process(int(entry["pid"]))
            if proc.create_time() == entry["create_time"] and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(entry)
        except psutil.Error:
            continue
    return alive


class Training:
    """Steps at a fixed pace, beaten, saved by rank 0 every few, resumed from the last save."""

    def __init__(self, directory: Path, rank0: bool) -> None:
        settings = directory / "train"
        self.on = settings.exists()
        values = settings.read_text().split() if self.on else ["0", "0"]
        self.step_s, self.every = float(values[0]), int(values[1])
        self.saved = directory / "saved"
        self.step = int(self.saved.read_text()) if self.on and self.saved.exists() else 0
        self.rank0 = rank0
        self.next_at = time.monotonic()

    def tick(self) -> None:
        from nodeagent.worker.progress import beat

        while self.on and time.monotonic() >= self.next_at:
            self.step += 1
            beat(self.step)
            if self.rank0 and self.step % self.every == 0:
                fresh = self.saved.with_suffix(".tmp")
                fresh.write_text(str(self.step))
                fresh.replace(self.saved)
            self.next_at += self.step_s


def opened(directory: str) -> dict[str, str]:
    """Each device node in `directory`: "ok" if this process may open it, else the errno."""
    found = {}
    for name in sorted(os.listdir(directory)):
        try:
            os.close(os.open(os.path.join(directory, name), os.O_RDWR))
            found[name] = "ok"
        except OSError as exc:
            found[name] = errno.errorcode.get(exc.errno or 0, str(exc.errno))
    return found


def touched(mib: int) -> bytearray:
    """`mib` MiB written to, page by page: memory the kernel charges (calloc's is not yet)."""
    held = bytearray(mib << 20)
    held[::4096] = b"\1" * len(range(0, len(held), 4096))
    return held


class Growth:
    """Memory held from the start (HOLD_MB), and more taken every 0.2 s (GROW_MB)."""

    def __init__(self) -> None:
        self.held = [touched(int(os.environ.get("HOLD_MB", "0")))]
        self.step = int(os.environ.get("GROW_MB", "0"))
        self.cap = int(os.environ.get("GROW_CAP_MB", "2048"))
        self.next_at = time.monotonic()

    def tick(self) -> None:
        grown = sum(len(h) for h in self.held) >> 20
        if self.step and grown < self.cap and time.monotonic() >= self.next_at:
            self.held.append(touched(self.step))
            self.next_at = time.monotonic() + 0.2


def leave_files(name: str | None) -> dict[str, object]:
    """NAME written in /dev/shm and the temp directory; what /dev/shm holds, and where that
    temp directory is."""
    if not name:
        return {}
    tmp = tempfile.gettempdir()
    for directory in ("/dev/shm", tmp):
        Path(directory, name).write_bytes(b"x" * 2**20)
    return {"shm": sorted(os.listdir("/dev/shm")), "tmpdir": tmp}


def main() -> int:
    directory = Path(os.environ["RECORD_DIR"])
    generation = int(os.environ.get("NODEAGENT_GENERATION", "0"))
    problems = check_env()
    base = {
        "generation": generation,
        "rank": int(os.environ.get("RANK", -1)),
        "world_size": int(os.environ.get("WORLD_SIZE", -1)),
        "node": os.environ.get("NODEAGENT_NODE"),
        "restart_count": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", -1)),
        "master": f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}",
        "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "cuda_order": os.environ.get("CUDA_DEVICE_ORDER"),
        "preloaded": os.environ.get("NODEAGENT_PRELOADED"),
    }
    if problems:
        record(directory, event="bad_env", problems=problems, **base)
        return 3
    for older in older_alive(directory, generation):
        record(
            directory,
            event="overlap",
            other_pid=older["pid"],
            other_generation=older["generation"],
            **base,
        )
    child = None
    spawn = os.environ.get("SPAWN_CHILD")
    if spawn in ("1", "detached"):
        sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
        child = subprocess.Popen(sleeper, start_new_session=spawn == "detached").pid
    growth = Growth()
    training = Training(directory, base["rank"] == 0)
    record(
        directory,
        event="start",
        create_time=psutil.Process().create_time(),
        child=child,
        resumed=training.step,
        devices=opened(os.environ["DEVICES_DIR"]) if "DEVICES_DIR" in os.environ else None,
        **leave_files(os.environ.get("LEAVE_FILES")),
        **base,
    )
    stopping = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    def on_usr1(signum: int, frame: object) -> None:
        record(directory, event="signal", signal="USR1", **base)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGUSR1, on_usr1)
    exit_file = directory / f"exit-{generation}"
    while not stopping:
        training.tick()
        growth.tick()
        # A file being written is empty at first (a test's write_text, a shell's `>`): it
        # says its code once written (read empty, it once made a failing worker exit 0).
        try:
            told = exit_file.read_text().strip()
        except FileNotFoundError:  # not told (or the file was taken away: a test's unlink)
            told = ""
        if told:
            code = int(told)
            record(directory, event="exit", code=code, **base)
            return code
        time.sleep(0.02)
    record(directory, event="stop", step=training.step, **base)
    return 0


if __name__ == "__main__":
    sys.exit(main())
