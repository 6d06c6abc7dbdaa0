"""The worker's abort thread (nodeagent/worker/abort.py): which sockets it shuts down, and when
it acts. Real sockets of this process; no torch."""

from __future__ import annotations

import itertools
import socket
import threading
import time
from collections.abc import Callable

import pytest

from nodeagent.worker import abort


def test_only_the_groups_connections_are_shut_down_never_a_listener() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    mine: set[int] = set()
    with abort.group_sockets(mine):
        inside = socket.create_connection(listener.getsockname())
        served, _ = listener.accept()
    outside = socket.create_connection(listener.getsockname())
    other, _ = listener.accept()
    try:
        assert abort.shut_down(mine) == 2  # inside and served
        served.settimeout(1)
        assert served.recv(1) == b""  # the group's connection ended
        outside.sendall(b"x")
        assert other.recv(1) == b"x"  # the other connection works
        late = socket.create_connection(listener.getsockname())  # the listener too
        late.close()
    finally:
        for sock in (listener, inside, served, outside, other):
            sock.close()


def test_a_listener_opened_with_the_group_is_left_listening() -> None:
    mine: set[int] = set()
    with abort.group_sockets(mine):
        listener = socket.create_server(("127.0.0.1", 0))
    try:
        assert mine and abort.shut_down(mine) == 0
        socket.create_connection(listener.getsockname()).close()
    finally:
        listener.close()


def ticking(step: float) -> Callable[[], float]:
    """A clock that moves `step` seconds at every reading."""
    ticks = itertools.count()
    return lambda: next(ticks) * step


def recorder(fired: list[str]) -> Callable[[], str]:
    def abort_group() -> str:
        fired.append("x")
        return "recorded"

    return abort_group


def test_the_grace_is_two_steps_within_its_bounds() -> None:
    commits = itertools.count()
    quick = abort.Aborter(lambda: False, lambda: next(commits), lambda: "", ticking(0.01))
    slow = abort.Aborter(lambda: False, lambda: next(commits), lambda: "", ticking(0.4))
    stuck = abort.Aborter(lambda: False, lambda: 7, lambda: "", ticking(0.01))
    assert quick.grace() == slow.grace() == stuck.grace() == abort.MAX_GRACE_S  # none seen yet
    for aborter in (quick, slow, stuck):
        with aborter.armed():
            time.sleep(0.1)
    assert quick.grace() == abort.MIN_GRACE_S  # 2 x 10 ms, raised to the floor
    assert slow.grace() == pytest.approx(0.8)
    assert stuck.grace() == abort.MAX_GRACE_S  # one commit only: as long as allowed


def test_it_aborts_once_when_told_and_the_step_does_not_end_in_its_grace() -> None:
    fired: list[str] = []
    aborter = abort.Aborter(lambda: True, lambda: 7, recorder(fired), ticking(1.0))
    with aborter.armed():
        time.sleep(0.3)  # thirty looks, a second apart on its clock: past the 2 s grace
    assert fired == ["x"]  # once per arming


def test_nothing_is_aborted_while_disarmed_or_not_told() -> None:
    fired: list[str] = []
    told = threading.Event()
    aborter = abort.Aborter(told.is_set, lambda: 1, recorder(fired), ticking(1.0))
    told.set()
    time.sleep(0.2)  # told, but not armed: between steps, the worker sees it itself
    told.clear()
    with aborter.armed():
        time.sleep(0.2)  # armed, not told
    assert fired == []
