"""`nodeagentctl run` (as srun) across an allocation, with real agents under pool.auth: munge (a
real munged), two Unix users the tests create and real processes: each node's task started by
its agent as the job's user with its place in the run, its output labelled, the worst status
returned, Ctrl-C passed on, another user (or an operator) refused, a lost agent ending the run;
`alloc` then `run -- torchrun` training a DDP model across two agents."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import select
import signal
import struct
import subprocess
import sys
import termios
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from nodeagent.errors import UsageError
from nodeagent.telemetry.runwire import RunOrder, parse_order, parse_target
from nodeagent.views.run import fed_tasks
from tests.helpers.allocations import holding, users_pool, where
from tests.helpers.cluster import RedisServer, wait_for
from tests.helpers.munge import MungeDaemon
from tests.helpers.pool import PoolCluster
from tests.helpers.users import User, unix_users

pytestmark = pytest.mark.timeout(300)

DDP = """
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(64, 8), torch.randn(64, 1)
for step in range(20):
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    if step in (0, 19):
        print(f"rank {rank} of {dist.get_world_size()} step {step} loss {loss.item():.4f}")
dist.barrier()
print(f"rank {rank} done", flush=True)
dist.destroy_process_group()
# gloo's threads can abort the interpreter's own finalization on a loaded machine ("terminate
# called without an active exception": docs/worker.md, finished()); nothing is left to do
os._exit(0)
"""


@pytest.fixture(scope="module")
def users() -> Iterator[dict[str, User]]:
    with unix_users("alice", "bob") as made:
        yield made


@pytest.fixture
def pool(
    redis_server: RedisServer, job_id: str, munged: MungeDaemon, users: dict[str, User]
) -> Iterator[PoolCluster]:
    """Two nodes' agents under pool.auth: munge, in a directory alice and bob reach."""
    with users_pool(redis_server.url, job_id, munged, users) as cluster:
        yield cluster


def test_a_command_runs_on_every_node_as_the_user_labelled_worst_status(
    pool: PoolCluster, munged: MungeDaemon, users: dict[str, User]
) -> None:
    alice, bob = users["alice"], users["bob"]
    pool.start("a", "b")
    pool.wait_nodes(2)
    held = holding(pool, munged, alice, "held", 2)
    try:
        said = 'echo "task $RANK of $WORLD_SIZE as $(id -un) node rank $PET_NODE_RANK"; exit $RANK'
        done = alice.nodeagentctl(
            *where(pool, munged), "--job", "held", "run", "--", "/bin/sh", "-c", said
        )
        assert done.returncode == 1, done  # the worst of 0 and 1
        lines = sorted(done.stdout.splitlines())
        assert lines == [
            f"a/0: task 0 of 2 as {alice.name} node rank 0",
            f"b/1: task 1 of 2 as {alice.name} node rank 1",
        ], done
        assert "node b (task 1): exit 1" in done.stderr

        one = alice.nodeagentctl(
            *where(pool, munged), "--job", "held", "run", "-N", "1", "--no-label",
            "--export", "GREETING=hello", "--", "/bin/sh", "-c", 'echo "$GREETING $WORLD_SIZE"',
        )  # fmt: skip
        assert (one.returncode, one.stdout) == (0, "hello 1\n"), one
        # a task that leaves a process behind, holding its output open: the task's end is
        # the run's, and what it left is killed
        behind = 'sleep 600 & echo "left $!"'
        left = alice.nodeagentctl(
            *where(pool, munged), "--job", "held", "run", "--", "/bin/sh", "-c", behind
        )
        pids = [int(line.split()[-1]) for line in left.stdout.splitlines() if " left " in line]
        assert left.returncode == 0 and len(pids) == 2, left
        wait_for(lambda: not any(_alive(pid) for pid in pids), 10, "the sleeps left killed")
        missing = alice.nodeagentctl(
            *where(pool, munged), "--job", "held", "run", "--", "/nonexistent/tool"
        )
        assert missing.returncode == 2 and "cannot start '/nonexistent/tool'" in missing.stderr

        theirs = bob.nodeagentctl(*where(pool, munged), "--job", "held", "run", "--", "id")
        assert theirs.returncode == 2 and "403" in theirs.stderr, theirs
        assert f"{bob.name} may not: the job is another user's (its user alone may)" in (
            theirs.stderr
        )
        operator = pool.ctl("--munge-socket", munged.socket, "--job", "held", "run", "--", "id")
        assert operator.returncode == 2 and "its user alone may" in operator.stderr, operator
        assert theirs.stdout == operator.stdout == ""
    finally:
        _end(held)


def test_ctrl_c_reaches_every_task_and_a_lost_agent_ends_the_run(
    pool: PoolCluster, munged: MungeDaemon, users: dict[str, User]
) -> None:
    alice = users["alice"]
    pool.start("a", "b")
    pool.wait_nodes(2)
    held = holding(pool, munged, alice, "held-ctrl-c", 2)
    trapping = 'trap "echo got INT; exit 3" INT; echo ready; while :; do sleep 0.1; done'
    try:
        run = alice.start_nodeagentctl(
            *where(pool, munged), "--job", "held-ctrl-c", "run", "--", "/bin/sh", "-c", trapping
        )
        out = _until(run, lambda seen: seen.count("ready") == 2)
        run.send_signal(signal.SIGINT)  # as a terminal's Ctrl-C
        rest, _ = run.communicate(timeout=60)  # closes its pipe
        out += rest
        assert run.returncode == 3, out
        assert "a/0: got INT" in out and "b/1: got INT" in out, out

        sleeping = alice.start_nodeagentctl(
            *where(pool, munged),
            "--job",
            "held-ctrl-c",
            "run",
            "--",
            "/bin/sh",
            "-c",
            "echo up; sleep 600",
        )
        _until(sleeping, lambda seen: seen.count("up") == 2)
        pool.kill_tree("b")  # the node's agent, and what it runs, gone at once
        rest, _ = sleeping.communicate(timeout=90)
        assert sleeping.returncode == 255, rest
        assert "node b (task 1): its agent closed the connection" in rest, rest
        assert "a node is lost: ending the tasks on the others (SIGTERM)" in rest
        assert "node a (task 0): killed by SIGTERM" in rest
    finally:
        _end(held)


def test_stdin_goes_to_every_task_or_one_and_a_task_that_reads_none_still_hears_ctrl_c(
    pool: PoolCluster, munged: MungeDaemon, users: dict[str, User]
) -> None:
    """run's stdin, as srun's: to every task (4 MiB, past the window a client may send before
    the task takes it: each task's digest is the data's), to task 1 alone (--input 1), and fed
    to a task that never reads it while Ctrl-C still reaches it (the relay keeps reading the
    caller's frames while input waits)."""
    alice = users["alice"]
    pool.start("a", "b")
    pool.wait_nodes(2)
    held = holding(pool, munged, alice, "held-stdin", 2)
    data = "".join(f"{i:07d} {'x' * 56}\n" for i in range(65536))  # 4 MiB of lines
    digest = hashlib.sha256(data.encode()).hexdigest()
    run = [*where(pool, munged), "--job", "held-stdin", "run"]
    try:
        done = alice.nodeagentctl(*run, "--", "/bin/sh", "-c", "sha256sum -", stdin=data)
        assert done.returncode == 0, done
        assert sorted(done.stdout.splitlines()) == [f"a/0: {digest}  -", f"b/1: {digest}  -"]

        one = alice.nodeagentctl(*run, "--input", "1", "--", "wc", "-l", stdin="a\nb\nc\n")
        assert sorted(one.stdout.splitlines()) == ["a/0: 0", "b/1: 3"], one
        bad = alice.nodeagentctl(*run, "--input", "2", "--", "true")
        assert (
            bad.returncode == 2 and "--input 2: all, none, or a task's number below 2" in bad.stderr
        )

        trapping = 'trap "echo got INT; exit 3" INT; echo ready; while :; do sleep 0.1; done'
        deaf = alice.start_nodeagentctl(
            *run, "--", "/bin/sh", "-c", trapping, stdin=subprocess.PIPE
        )
        assert deaf.stdin is not None
        feeding = threading.Thread(target=_write, args=(deaf.stdin, data), daemon=True)
        feeding.start()
        out = _until(deaf, lambda seen: seen.count("ready") == 2)
        deaf.send_signal(signal.SIGINT)
        rest, _ = deaf.communicate(timeout=60)
        assert deaf.returncode == 3 and rest.count("got INT") == 2, out + rest
        feeding.join(timeout=60)

        endless = alice.start_nodeagentctl(
            *run, "--", "/bin/sh", "-c", "exec 0<&-; sleep 3; echo done", stdin=subprocess.PIPE
        )
        assert endless.stdin is not None
        sent = [0]
        flooding = threading.Thread(target=_flood, args=(endless.stdin, sent), daemon=True)
        flooding.start()
        assert endless.stdout is not None
        rest = endless.stdout.read()  # not communicate(): it would close the flooded stdin
        assert endless.wait(timeout=60) == 0 and rest.count("done") == 2, rest
        endless.stdout.close()
        assert sent[0] < 8 << 20, sent  # fed no more once both closed their stdin
        flooding.join(timeout=60)
        with contextlib.suppress(OSError):
            endless.stdin.close()
    finally:
        _end(held)


def _flood(pipe: IO[str], sent: list[int]) -> None:
    """Write into `pipe` until its reader is gone, counting what it took."""
    chunk = "y\n" * 32768
    with contextlib.suppress(OSError, ValueError):
        while True:
            pipe.write(chunk)
            pipe.flush()
            sent[0] += len(chunk)


def _write(pipe: IO[str], data: str) -> None:
    """`data` into `pipe` until its reader is gone."""
    with contextlib.suppress(OSError, ValueError):
        pipe.write(data)
        pipe.close()


def _end(held: subprocess.Popen[str]) -> None:
    """alloc's end as a terminal's: SIGTERM (it ends its shell and cancels the allocation)."""
    held.terminate()
    try:
        held.wait(30)
    except subprocess.TimeoutExpired:
        held.kill()
        held.wait()
    if held.stdout is not None:
        held.stdout.close()


def _until(proc: subprocess.Popen[str], done: object, timeout: float = 60) -> str:
    """What `proc` printed, read line by line until `done(seen)`."""
    assert proc.stdout is not None and callable(done)
    seen = ""

    def more() -> bool:
        nonlocal seen
        line = proc.stdout.readline() if proc.stdout is not None else ""
        if not line:
            raise AssertionError(f"it ended first: {seen}")
        seen += line
        return bool(done(seen))

    wait_for(more, timeout, "its tasks' lines")
    return seen


def test_alloc_then_run_torchrun_trains_a_ddp_model_across_two_agents(
    pool: PoolCluster, munged: MungeDaemon, users: dict[str, User]
) -> None:
    alice = users["alice"]
    script = pool.directory / "ddp.py"
    script.write_text(DDP)
    pool.start("a", "b")
    pool.wait_nodes(2)
    nested = [sys.executable, "-m", "nodeagent.cli.ctl", *where(pool, munged), "run", "--"]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1"]
    done = alice.run(
        [
            sys.executable,
            "-m",
            "nodeagent.cli.ctl",
            *where(pool, munged),
            "alloc",
            "--nodes",
            "2",
            "--",
            *nested,
            *torchrun,
            str(script),
        ],
        reach=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    for rank, node in ((0, "a"), (1, "b")):
        assert f"{node}/{rank}: rank {rank} of 2 step 19 loss" in out, out
        assert f"{node}/{rank}: rank {rank} done" in out
    first = [line.split("loss ")[1] for line in out.splitlines() if "step 0 loss" in line]
    last = [line.split("loss ")[1] for line in out.splitlines() if "step 19 loss" in line]
    assert len(set(last)) == 1 and float(last[0]) < float(first[0]), out  # one model, trained


UNSIGNED = "expected ?credential=<a MUNGE credential> (nodeagentctl run signs its requests)"
BAD_RANK = "rank and size: whole numbers, 0 <= rank < size"


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("/run/j?credential=MUNGE:abc=:", ("j", "MUNGE:abc=:")),
        ("/run/../x?credential=MUNGE:a:", "expected /run/JOB with a valid job id"),
        ("/run/j", UNSIGNED),
        ("/run/j?credential=token1.x", UNSIGNED),
    ],
)
def test_parse_target(target: str, expected: object) -> None:
    assert parse_target(target) == expected


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            b'{"argv": ["id"], "rank": 1, "size": 2, "env": {"A": "b"}}',
            RunOrder(("id",), 1, 2, {"A": "b"}),
        ),
        (b'{"argv": []}', "argv: a list of 1 to 4096 strings"),
        (b'{"argv": ["id", 3]}', "argv: strings without NUL, the first not empty"),
        (b'{"argv": ["id"], "rank": 2, "size": 2}', f"{BAD_RANK} (got 2, 2)"),
        (b'{"argv": ["id"], "rank": true}', f"{BAD_RANK} (got True, 1)"),
        (b'{"argv": ["id"], "env": {"A B": "x"}}', "env: bad variable 'A B': a name of letters, digits and _"),  # noqa: E501
        (b'{"argv": ["id"], "pid": 1}', "expected {argv, rank, size, env, window, stdin}"),
        (b"[1]", "expected {argv, rank, size, env, window, stdin}"),
        (b'{"argv": ["wc"], "stdin": true}', RunOrder(("wc",), stdin=True)),
        (b'{"argv": ["wc"], "stdin": 1}', "stdin: true or false, and not with a window (a terminal is its own stdin)"),  # noqa: E501
        (b'{"argv": ["sh"], "stdin": true, "window": [24, 80]}', "stdin: true or false, and not with a window (a terminal is its own stdin)"),  # noqa: E501
        (b"\xff", "the body is not JSON"),
        (b'{"argv": ["sh"], "window": [24, 80]}', RunOrder(("sh",), window=(24, 80))),
        (b'{"argv": ["sh"], "window": [0, 80]}', "window: [rows, columns], each 1 to 9999 (got [0, 80])"),  # noqa: E501
    ],
)  # fmt: skip
def test_parse_order(body: bytes, expected: object) -> None:
    assert parse_order(body) == expected


@pytest.mark.parametrize(
    ("given", "size", "fed"),
    [("all", 3, {0, 1, 2}), ("none", 3, set()), ("0", 3, {0}), ("2", 3, {2}), ("3", 3, None),
     ("-1", 3, None), ("task0", 3, None), ("", 3, None)],
)  # fmt: skip
def test_fed_tasks(given: str, size: int, fed: set[int] | None) -> None:
    """--input as srun's: all, none, or one task's number below the run's size."""
    if fed is None:
        with pytest.raises(UsageError, match=f"--input {given}: all, none, or a task's number"):
            fed_tasks(given, size)
    else:
        assert fed_tasks(given, size) == fed


def test_every_task_of_a_command_is_in_its_own_session_killed_with_what_it_left() -> None:
    """supervisor/command.Command.wait: what a task left running in its group is killed at its
    end, before it is reaped (so the group's id is still its own)."""
    from nodeagent.supervisor.command import Command

    popen = subprocess.Popen(
        ["/bin/sh", "-c", "sleep 600 & echo $!"],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    command = Command(popen)
    assert command.wait(30) == 0
    assert popen.stdout is not None
    left = int(popen.stdout.read().split()[0])
    command.close()
    wait_for(lambda: not _alive(left), 10, "what it left killed")


def test_a_commands_stdin_is_held_until_taken_counted_and_ended() -> None:
    """Command's stdin pipe: what it cannot take yet is held (never a blocking write), `taken`
    counts what it took, its end closes the pipe once all is taken; what a command that closed
    its stdin is sent is dropped, and counted taken (the client waits on that count)."""
    from nodeagent.supervisor.command import Command

    reader = _piped("sleep 1; exec wc -c")
    command = Command(reader)
    data = b"x" * (1 << 20)  # past the pipe's 64 KiB: held while the reader sleeps
    command.write(data)
    assert command.pending_input and command.taken < len(data)
    command.end_input()

    def taken() -> bool:
        command.flush_input()  # as the relay does once its stdin is writable
        return not command.pending_input

    wait_for(taken, 30, "all taken")
    assert command.taken == len(data) and command.input == -1
    assert command.wait(30) == 0
    assert reader.stdout is not None
    assert reader.stdout.read().split() == [str(len(data)).encode()]
    command.close()

    deaf = _piped("exec 0<&-; sleep 600")
    command = Command(deaf)
    wait_for(lambda: not Path(f"/proc/{deaf.pid}/fd/0").exists(), 10, "its stdin closed")
    command.write(b"y" * 1000)
    assert command.taken == 1000 and not command.pending_input and command.input == -1
    command.write(b"z")  # after its end: dropped, counted
    assert command.taken == 1001
    command.signal(signal.SIGKILL)
    assert command.wait(30) == -signal.SIGKILL
    command.close()


def _piped(script: str) -> subprocess.Popen[bytes]:
    """`script` in a session of its own, its stdin and stdout pipes, as a fed task's."""
    return subprocess.Popen(
        ["/bin/sh", "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(") ")[1][0] != "Z"


def test_a_terminal_on_a_node_driven_through_a_pseudo_terminal(
    pool: PoolCluster, munged: MungeDaemon, users: dict[str, User]
) -> None:
    """run --pty: a shell on the job's first node, on a terminal the agent made there of this
    one's size (and its new size), typed at through a pseudo-terminal as a person would:
    Ctrl-C interrupts the far command, not the session; its exit is run's."""
    alice = users["alice"]
    pool.start("a", "b")
    pool.wait_nodes(2)
    held = holding(pool, munged, alice, "held-pty", 2)
    ours, theirs = os.openpty()
    _window(theirs, 24, 80)
    command = [
        *alice.argv_as(reach=True), sys.executable, "-m", "nodeagent.cli.ctl",
        *where(pool, munged), "--job", "held-pty", "run", "--pty", "--", "/bin/sh",
    ]  # fmt: skip
    session = subprocess.Popen(
        command, stdin=theirs, stdout=theirs, stderr=theirs, env=alice.environ(), cwd="/"
    )
    os.close(theirs)
    screen = _Screen(ours)
    try:
        os.write(ours, b"echo $((6*7))-$RANK-$(id -un); tty; stty size\n")  # typed ahead
        screen.until(f"42-0-{alice.name}")
        screen.until("/dev/pts/")
        screen.until("24 80")
        _window(ours, 30, 100)  # our terminal resized: the far one follows
        session.send_signal(signal.SIGWINCH)
        wait_for(lambda: os.write(ours, b"stty size\n") and screen.seen("30 100"), 30, "resized")
        os.write(ours, b"sleep 100; echo slept-$((2+3))\n")
        sleeping = ["pgrep", "-u", alice.name, "-fx", "sleep 100"]
        wait_for(lambda: subprocess.run(sleeping).returncode == 0, 30, "the far sleep started")
        os.write(ours, b"\x03")  # Ctrl-C: the far terminal's SIGINT to its foreground job
        os.write(ours, b"echo still-$((1+1))\n")
        screen.until("still-2")
        assert "slept-5" not in screen.text
        os.write(ours, b"exit 3\n")
        assert session.wait(60) == 3, screen.text
    finally:
        if session.poll() is None:
            session.kill()
            session.wait()
        os.close(ours)
        _end(held)


def _window(fd: int, rows: int, columns: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))


class _Screen:
    """What a terminal showed, read as it comes."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self.text = ""

    def seen(self, words: str) -> bool:
        while select.select([self._fd], [], [], 0.2)[0]:
            try:
                chunk = os.read(self._fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            self.text += chunk.decode("utf-8", "replace")
        return words in self.text

    def until(self, words: str, timeout: float = 30) -> None:
        try:
            wait_for(lambda: self.seen(words), timeout, f"{words!r} on the screen")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {self.text!r}") from None
