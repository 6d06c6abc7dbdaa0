"""nodeagent.worker.elastic in one process: State's commit/restore/check, and run()'s loop in a
world of one (gloo) against a channel the test writes as the agent would."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nodeagent.channel import control
from nodeagent.channel.control import Assignment, ControlFile
from nodeagent.worker import Reform, ReformTimedOut, State, Stopped, elastic
from tests.helpers.cluster import free_port

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")


def model_and_optimizer(kind: str) -> tuple[Any, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 1))
    if kind == "adam":
        return model, torch.optim.Adam(model.parameters(), lr=0.01)
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def train_steps(model: Any, optimizer: Any, first: int, count: int) -> None:
    for step in range(first, first + count):
        gen = torch.Generator().manual_seed(step)
        x = torch.randn(8, 6, generator=gen)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
        optimizer.step()


def flat(state_dict: Any) -> list[Any]:
    """Every leaf of a (nested) state_dict, in order."""
    if isinstance(state_dict, dict):
        return [leaf for key in state_dict for leaf in [key, *flat(state_dict[key])]]
    if isinstance(state_dict, list | tuple):
        return [leaf for item in state_dict for leaf in flat(item)]
    return [state_dict]


def same(a: Any, b: Any) -> bool:
    left, right = flat(a), flat(b)
    return len(left) == len(right) and all(
        torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y
        for x, y in zip(left, right, strict=True)
    )


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_commit_and_restore_round_trip_a_model_and_optimizer_exactly(kind: str) -> None:
    model, optimizer = model_and_optimizer(kind)
    state = State(model=model, optimizer=optimizer, epoch=2)
    train_steps(model, optimizer, 1, 3)
    state.step = 3
    state.commit()
    committed = (model.state_dict(), optimizer.state_dict())
    committed = tuple(elastic._copy_into(sd, None) for sd in committed)
    expected_model, expected_optimizer = model_and_optimizer(kind)
    train_steps(expected_model, expected_optimizer, 1, 5)  # the run without a rollback
    for _ in range(2):  # restoring twice: the snapshot is not aliased by what training did
        train_steps(model, optimizer, 4, 4)
        state.step, state.epoch = 7, 3
        state.restore()
        assert same(model.state_dict(), committed[0])
        assert same(optimizer.state_dict(), committed[1])
        assert (state.step, state.epoch) == (3, 2)
    train_steps(model, optimizer, 4, 2)  # continuing from the restore = never having left
    assert same(model.state_dict(), expected_model.state_dict())
    assert same(optimizer.state_dict(), expected_optimizer.state_dict())


def test_values_are_attributes_and_objects_cannot_be_replaced() -> None:
    model, optimizer = model_and_optimizer("sgd")
    state = State(model=model, optimizer=optimizer, epoch=0)
    assert state.model is model and state.step == 0 and state.committed_step == -1
    with pytest.raises(AttributeError, match="stateful"):
        state.model = model
    with pytest.raises(AttributeError):
        _ = state.missing
    state.restore()  # before any commit: nothing happens
    assert state.epoch == 0


@pytest.fixture
def channel(tmp_path: Path) -> Iterator[ControlFile]:
    path = tmp_path / "rank-0.control"
    control.create(path)
    channel = ControlFile(path)
    yield channel
    channel.close()


def one(generation: int, port: int) -> Assignment:
    return Assignment(generation, 0, 0, 1, 1, 0, 1, "127.0.0.1", port, generation)


def test_check_raises_only_for_a_newer_generation(
    channel: ControlFile, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NODEAGENT_GENERATION", "3")
    model, optimizer = model_and_optimizer("sgd")
    state = State(model=model, optimizer=optimizer)
    channel.assign(one(3, 1000))  # its own generation, there when it attaches: not news
    state.attach(channel)
    state.check()
    channel.assign(one(3, 1001))  # same generation again: not news either
    state.step = 5
    state.commit()
    assert channel.report().committed_step == 5
    channel.assign(one(4, 1002))
    with pytest.raises(Reform) as raised:
        state.check()
    assert raised.value.assignment == one(4, 1002)
    state.check()  # read once: the loop takes it from the exception


@pytest.fixture
def world_of_one(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name, value in one(1, free_port()).environment().items():
        monkeypatch.setenv(name, value)  # undone after the test, whatever run() sets
    monkeypatch.setenv("LOCAL_RANK", "0")
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.mark.usefixtures("world_of_one")
def test_run_reforms_in_place_on_a_new_assignment(
    channel: ControlFile, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(elastic.ENV, str(channel.path))
    model, optimizer = model_and_optimizer("sgd")
    state = State(model=model, optimizer=optimizer)
    calls: list[tuple[int, int, str]] = []
    resets: list[int] = []
    state.on_reset(lambda: resets.append(state.generation))
    port = free_port()

    def train(state: State) -> str:
        calls.append((state.generation, state.step, os.environ["MASTER_PORT"]))
        if len(calls) == 2:
            return "done"
        for _ in range(3):
            train_steps(model, optimizer, state.step + 1, 1)
            state.step += 1
            state.commit()
        channel.assign(one(2, port))  # the agent's move
        train_steps(model, optimizer, state.step + 1, 1)  # not committed: rolled back
        state.step += 1
        state.check()
        raise AssertionError("check() did not raise")

    assert elastic.run(train, state) == "done"
    assert calls[1] == (2, 3, str(port)) and resets == [1, 2]
    assert channel.report().left_generation == 1 and dist.get_world_size() == 1


@pytest.mark.usefixtures("world_of_one")
def test_told_to_leave_it_leaves_and_waits_for_the_next_assignment(
    channel: ControlFile, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent's re-form: leave(1) while ranks are unknown, the assignment for 3 later (the
    leader may skip a generation); a stale leave(0) is not news."""
    monkeypatch.setenv(elastic.ENV, str(channel.path))
    state = State(model=torch.nn.Linear(2, 2))
    port = free_port()
    seen: list[tuple[int, int, bool]] = []
    agent = threading.Timer(0.3, lambda: channel.assign(one(3, port)))  # after it has left

    def train(state: State) -> None:
        seen.append((state.generation, int(os.environ["MASTER_PORT"]), dist.is_initialized()))
        if len(seen) == 2:
            return
        channel.leave(0)
        state.check()
        channel.leave(1)
        agent.start()
        state.check()
        raise AssertionError("check() did not raise")

    try:
        elastic.run(train, state)
    finally:
        agent.join()
    assert seen[1] == (3, port, True) and channel.report().left_generation == 1


@pytest.mark.usefixtures("world_of_one")
def test_a_stop_asked_for_while_waiting_ends_the_wait(
    channel: ControlFile, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent stops a parked worker it has no place for: with a GracefulExit's should_stop
    as `stop`, run() raises Stopped instead of waiting out reform_timeout."""
    monkeypatch.setenv(elastic.ENV, str(channel.path))
    state = State(model=torch.nn.Linear(2, 2))
    asked = threading.Event()

    def train(state: State) -> None:
        channel.leave(1)
        threading.Timer(0.2, asked.set).start()
        state.check()

    with pytest.raises(Stopped, match="asked to stop after leaving generation 1"):
        elastic.run(train, state, reform_timeout=30, stop=asked.is_set)
    assert channel.report().left_generation == 1


@pytest.mark.usefixtures("world_of_one")
def test_a_failed_collective_waits_for_an_assignment_then_gives_up(
    channel: ControlFile, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(elastic.ENV, str(channel.path))
    state = State(model=torch.nn.Linear(2, 2))

    def broken(state: State) -> None:
        state.commit()
        raise RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error: Connection reset")

    monkeypatch.setenv(elastic.TIMEOUT_ENV, "0.2")  # as the agent sets timing.reform_timeout
    with pytest.raises(ReformTimedOut, match="no assignment newer than generation 1"):
        elastic.run(broken, state)
    assert channel.report().left_generation == 1 and not dist.is_initialized()


@pytest.mark.usefixtures("world_of_one")
def test_without_a_channel_it_is_a_plain_script() -> None:
    state = State(model=torch.nn.Linear(2, 2))

    def broken(state: State) -> None:
        state.check()  # never raises without a channel
        raise RuntimeError("[gloo] Connection closed by peer")

    with pytest.raises(RuntimeError, match="Connection closed"):
        elastic.run(broken, state)


@pytest.mark.usefixtures("world_of_one")
def test_an_error_of_the_script_is_not_a_reform(
    channel: ControlFile, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(elastic.ENV, str(channel.path))

    def broken(state: State) -> None:
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    with pytest.raises(RuntimeError, match="shapes"):
        elastic.run(broken, State(model=torch.nn.Linear(2, 2)))
    assert channel.report().left_generation == -1


@pytest.mark.usefixtures("world_of_one")
def test_a_newer_assignment_that_came_during_start_up_is_taken_before_joining(
    channel: ControlFile, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A newcomer started for generation 1 whose job moved on to 2 while it imported torch."""
    monkeypatch.setenv(elastic.ENV, str(channel.path))
    port = free_port()
    channel.assign(one(2, port))
    seen: list[tuple[int, str]] = []
    elastic.run(
        lambda state: seen.append((state.generation, os.environ["MASTER_PORT"])),
        State(model=torch.nn.Linear(2, 2)),
    )
    assert seen == [(2, str(port))] and channel.report().left_generation == 1


def test_other_ranks_wait_for_rank_0s_store_before_init(monkeypatch: pytest.MonkeyPatch) -> None:
    """TCPStore's client waits ~0.5 s after a refused connect; after a re-form rank 0 binds its
    fresh port a little after the others try it, so they poll for it first."""
    import socket
    from datetime import timedelta

    port = free_port()
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    server = socket.socket()

    def rank_0_binds() -> None:
        server.bind(("127.0.0.1", port))
        server.listen()

    threading.Timer(0.1, rank_0_binds).start()
    began = time.monotonic()
    try:
        elastic._await_store(timedelta(seconds=5))
        waited = time.monotonic() - began
    finally:
        server.close()
    assert 0.09 <= waited < 5  # it waited for the bind, not for its timeout
    began = time.monotonic()
    elastic._await_store(timedelta(seconds=0.2))  # nobody listens now: gives up at its timeout
    assert time.monotonic() - began >= 0.2


def test_in_place_without_numpy_fails_at_once_naming_the_extra(
    channel: ControlFile, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without numpy the first re-form's sync would fail ("Numpy is not available"), long
    after the start; run() says so before training, with the fix."""
    monkeypatch.setenv(elastic.ENV, str(channel.path))
    monkeypatch.setitem(sys.modules, "numpy", None)  # import numpy raises ImportError
    trained: list[State] = []
    with pytest.raises(RuntimeError, match=r"pip install 'nodeagent\[worker\]'"):
        elastic.run(trained.append, State(model=torch.nn.Linear(2, 2)))
    assert not trained
