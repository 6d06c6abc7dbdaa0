"""The members' watch of each other (job/peerwatch.py), over real TCP on this machine: peers in
this process and in child processes, killed and frozen for real."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from nodeagent.job.accrual import MIN_SAMPLES, Silence
from nodeagent.job.peerwatch import BEAT, MAGIC, Heard, Peer, PeerWatch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHILD = """
import sys, time
from nodeagent.job.peerwatch import PeerWatch
watch = PeerWatch("127.0.0.1", 0.05, float(sys.argv[1]), lambda: None)
print(watch.port, watch.token, flush=True)
time.sleep(600)
"""


def eventually(check: Callable[[], bool], within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.01)
    return check()


@contextmanager
def watches(count: int, timeout: float = 30.0) -> Iterator[list[PeerWatch]]:
    made = [PeerWatch("127.0.0.1", 0.05, timeout, lambda: None) for _ in range(count)]
    try:
        yield made
    finally:
        for watch in made:
            watch.close()


def peer(name: str, watch: PeerWatch) -> Peer:
    return Peer(name, "127.0.0.1", watch.port, watch.token)


@contextmanager
def child_peer(timeout: float = 30.0) -> Iterator[tuple[subprocess.Popen[str], Peer]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(timeout)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    try:
        assert proc.stdout is not None
        port, token = proc.stdout.readline().split()
        yield proc, Peer("child", "127.0.0.1", int(port), token)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_members_hear_each_other_and_suspect_one_whose_agent_is_gone() -> None:
    with watches(3) as (a, b, c):
        a.watch([peer("b", b), peer("c", c)])
        b.watch([peer("a", a), peer("c", c)])
        c.watch([peer("a", a), peer("b", b)])
        time.sleep(0.3)  # many beats: nobody is suspected while all beat
        assert a.suspects() == b.suspects() == c.suspects() == frozenset()
        c.close()  # its sockets close, as the kernel closes a dead agent's
        # long before the 30 s of silence: the closed connection says it
        assert eventually(lambda: a.suspects() == b.suspects() == {"c"}, within=5.0)


def test_a_killed_peer_is_suspected_at_once_and_a_new_agent_in_its_place_is_heard() -> None:
    with watches(1) as (watcher,), child_peer() as (proc, first):
        watcher.watch([first])
        assert eventually(lambda: "child" in watcher.heard())
        assert watcher.suspects() == frozenset()
        proc.kill()
        assert eventually(lambda: watcher.suspects() == {"child"}, within=5.0)
        with child_peer() as (_, second):  # the node's next agent, on a new endpoint
            watcher.watch([second])
            assert eventually(lambda: watcher.suspects() == frozenset(), within=5.0)


def test_a_frozen_peer_is_suspected_after_the_timeout_and_cleared_when_it_beats_again() -> None:
    with watches(1, timeout=0.5) as (watcher,), child_peer() as (proc, child):
        watcher.watch([child])
        assert eventually(lambda: "child" in watcher.heard())
        os.kill(proc.pid, signal.SIGSTOP)
        assert eventually(lambda: watcher.suspects() == {"child"})
        assert "child" in watcher.heard()  # still connected: silent, not closed
        os.kill(proc.pid, signal.SIGCONT)
        assert eventually(lambda: watcher.suspects() == frozenset())


def test_beats_with_another_token_or_no_listener_prove_nothing_and_suspect_no_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """b's endpoint serves another agent's beats, nothing listens at c's: neither is heard,
    and neither is suspected (a firewall would otherwise hold a healthy node out): their leases
    find them if they are gone, and the watch warns."""
    with watches(2, timeout=0.5) as (watcher, other):
        impostor = Peer("b", "127.0.0.1", other.port, "00" * 8)  # b's endpoint, not b's beats
        with socket.socket() as closed:
            closed.bind(("127.0.0.1", 0))
            nobody = Peer("c", "127.0.0.1", closed.getsockname()[1], "11" * 8)
        watcher.watch([impostor, nobody])
        assert eventually(lambda: caplog.text.count("nothing heard from") == 2)
        assert watcher.suspects() == frozenset() and watcher.heard() == frozenset()


def test_the_port_serves_beats_to_anyone_and_reads_nothing_from_them() -> None:
    with watches(1) as (watch,), socket.create_connection(("127.0.0.1", watch.port)) as conn:
        conn.sendall(b"x" * 100_000)  # never read by the watch: it cannot be made to parse it
        conn.settimeout(5)
        magic, version, said, bits, token = BEAT.unpack(conn.recv(BEAT.size, socket.MSG_WAITALL))
        assert (magic, version, said, bits, token.hex()) == (MAGIC, 1, 0, 0, watch.token)


@pytest.mark.parametrize(
    ("heard", "now", "silent"),
    [
        (Heard(since=10.0), 11.0, False),
        (Heard(since=10.0), 12.5, False),  # never heard: not judged (its lease is)
        (Heard(since=10.0, last=12.0), 12.5, False),
        (Heard(since=10.0, last=12.0), 14.5, True),
        (Heard(since=10.0, last=12.0, ended=True), 12.1, True),  # its connection ended
    ],
)
def test_silence_is_judged_from_the_last_beat(heard: Heard, now: float, silent: bool) -> None:
    assert heard.silent(now, Silence(interval=0.1, timeout=2.0)) is silent


def test_a_frozen_peer_is_suspected_by_its_beats_history_long_before_the_timeout() -> None:
    """With the accrual detector (timing.peer_phi) a peer that beat steadily is suspected about
    FLOOR_BEATS intervals after its last beat, not at the 30 s timeout; one that beats is not."""
    made = [PeerWatch("127.0.0.1", 0.05, 30.0, lambda: None, phi=8.0) for _ in range(2)]
    watcher, steady = made
    try:
        with child_peer() as (proc, child):
            watcher.watch([child, peer("steady", steady)])
            assert eventually(lambda: watcher.heard() == {"child", "steady"})
            time.sleep(MIN_SAMPLES * 0.05 * 2)  # a history to judge by
            os.kill(proc.pid, signal.SIGSTOP)
            stopped = time.monotonic()
            assert eventually(lambda: watcher.suspects() == {"child"}, within=10.0)
            assert time.monotonic() - stopped < 10.0  # a third of the timeout, at the most
            os.kill(proc.pid, signal.SIGCONT)
            assert eventually(lambda: watcher.suspects() == frozenset())
    finally:
        for watch in made:
            watch.close()


def test_a_peer_s_beats_say_what_it_told_and_an_older_agent_s_still_count() -> None:
    """What an agent tells its watch goes out at once in its beats' three bytes that were
    padding; a reader hears it. An older agent's beats (those bytes zero) are heard as before."""
    with watches(2) as (a, b):
        a.watch([peer("b", b)])
        assert eventually(lambda: "b" in a.heard())
        assert a.said() == {}  # b says nothing yet: as an older agent
        b.tell(3, 0x1234)
        assert eventually(lambda: a.said() == {"b": (3, 0x1234)}, within=2.0)
        b.tell(5, 7)
        assert eventually(lambda: a.said() == {"b": (5, 7)}, within=2.0)
        assert a.suspects() == frozenset()
        b.close()  # a connection ended: nothing it said stands any more
        assert eventually(lambda: a.said() == {} and a.suspects() == {"b"}, within=5.0)
