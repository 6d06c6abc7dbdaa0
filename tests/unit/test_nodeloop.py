"""NodeLoop: the pool node's reconcile between its placement and the job it serves."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from nodeagent.config.load import load_settings
from nodeagent.config.settings import Config
from nodeagent.model.gpus import GpuUnit
from nodeagent.model.spec import load_spec
from nodeagent.pool.member import NodeState
from nodeagent.runtime.nodeloop import REFUSALS_KEPT, NodeLoop
from nodeagent.runtime.pulls import Pulled, Pulls
from nodeagent.runtime.wakeup import Waker
from nodeagent.supervisor.container import PullFailed
from tests.helpers.cluster import wait_for
from tests.helpers.runas import AS_TESTER


class Member:
    def __init__(self) -> None:
        self.placement: str | None = None
        self.synced = True
        self.last_error = None
        self.left = False
        self.shares: dict[str, int] = {}
        self.beats: list[NodeState] = []
        self.poked = 0

    def due(self, now: float) -> bool:
        return True

    def beat(self, state: NodeState, until: float | None = None) -> bool:
        self.beats.append(state)
        return False

    def next_wakeup(self) -> float:
        return 0.0

    def leave(self) -> None:
        self.left = True

    def poke(self) -> None:
        self.poked += 1

    def submit_pinned(self, spec: Any) -> None:
        pass

    def spec(self, job_id: str) -> str:
        return "not JSON"


class Runner:
    ready: Pulled

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.stops = 0
        self.left = False
        self.outcome: int | None = None
        self.drained_by: str | None = None

    def critical_at(self) -> float | None:
        return None

    def step(self) -> float:
        if self.stops:
            self.left = True
        return 0.0

    def request_stop(self) -> None:
        self.stops += 1

    def close(self, keep_tiers: bool = True) -> None:
        pass

    def unfit(self) -> str | None:
        return None

    def drained(self) -> str | None:
        return self.drained_by

    def healthz(self) -> tuple[bool, str]:
        return True, "ok"

    def pulled(self, ready: Pulled) -> None:
        self.ready = ready


R = TypeVar("R", bound=Runner)


def starter(kind: type[R]) -> tuple[list[R], Callable[[Config, tuple[str, ...] | None], R]]:
    """The runners a loop starts, and how it starts them."""
    runners: list[R] = []

    def start(config: Config, grant: tuple[str, ...] | None) -> R:
        runners.append(kind(config.job.id))
        return runners[-1]

    return runners, start


def pinned_config() -> Config:
    job = {"id": "j", "entrypoint": ["true"], **AS_TESTER}
    config = load_settings({"redis": {"url": "redis://r:6379/0"}, "job": job})
    assert isinstance(config, Config)
    return config


def test_one_stop_request_is_a_graceful_stop_not_a_forced_one() -> None:
    runners, start = starter(Runner)

    member = Member()
    waker = Waker()
    loop = NodeLoop(pinned_config(), member, start, waker, lambda: 0.0)
    loop._reconcile()
    assert [r.job_id for r in runners] == ["j"]
    assert member.poked == 1  # its next pool heartbeat says so at once
    loop.request_stop()
    loop.run()
    waker.close()
    assert runners[0].stops == 1  # a second request_stop would kill the workers at once
    assert member.left


def test_a_job_whose_spec_cannot_be_read_is_refused_and_reported() -> None:
    settings = load_settings({"redis": {"url": "redis://r:6379/0"}})
    member = Member()
    member.placement = "broken"
    waker = Waker()
    loop = NodeLoop(settings, member, lambda c, g: Runner(c.job.id), waker, lambda: 0.0)
    loop._reconcile()
    waker.close()
    assert not loop.runners
    assert "its spec cannot be read: not JSON" in loop._state().refused["broken"]


def test_refusals_reported_stay_within_what_a_pool_report_may_hold() -> None:
    settings = load_settings({"redis": {"url": "redis://r:6379/0"}})
    member = Member()
    waker = Waker()
    loop = NodeLoop(settings, member, lambda c, g: Runner(c.job.id), waker, lambda: 0.0)
    for n in range(100):
        member.placement = f"broken-{n}"
        loop._reconcile()
    waker.close()
    refused = loop._state().refused
    assert len(refused) == REFUSALS_KEPT and "broken-99" in refused and "broken-0" not in refused


def test_a_pool_job_that_drained_this_node_is_refused_from_then_on() -> None:
    """Its slow-node policy drained the node (a cordon in the job): the node says it refuses
    the job, so the pool frees it at once and never lends it back to that job as a standby.
    A pinned node's own job is never refused so: that node serves nothing else."""
    settings = load_settings({"redis": {"url": "redis://r:6379/0"}})
    member, waker = Member(), Waker()
    loop = NodeLoop(settings, member, lambda c, g: Runner(c.job.id), waker, lambda: 0.0)
    runner = loop.runners["p"] = Runner("p")
    loop._refuse_if_drained(member, runner)
    assert "p" not in loop._state().refused
    runner.drained_by = "slow-node: slow: busy 4.0x its peers' median"
    loop._refuse_if_drained(member, runner)
    assert loop._state().refused == {
        "p": "drained from it by slow-node: slow: busy 4.0x its peers' median"
    }
    assert member.poked == 1  # the pool learns at once
    loop.runners.clear()
    member.placement = "p"  # placed on it again before the pool read the refusal
    loop._reconcile()
    assert not loop.runners

    pinned = NodeLoop(pinned_config(), Member(), lambda c, g: Runner(c.job.id), waker, lambda: 0.0)
    own = pinned.runners["j"] = Runner("j")
    own.drained_by = "operator: drained"
    pinned._refuse_if_drained(Member(), own)
    waker.close()
    assert pinned._state().refused == {}


class EndingRunner(Runner):
    """A job that ends at its third pass with exit code 3."""

    def __init__(self, job_id: str) -> None:
        super().__init__(job_id)
        self.passes = 0

    def step(self) -> float:
        self.passes += 1
        if self.passes == 3:
            self.left, self.outcome = True, 3
        return 0.0


def test_with_no_pool_the_pinned_job_is_served_once_and_its_exit_code_returned() -> None:
    runners, start = starter(EndingRunner)

    waker = Waker()
    loop = NodeLoop(pinned_config(), None, start, waker, lambda: 0.0)
    assert loop.healthz() == (False, "not serving its job yet")
    assert loop.run() == 3
    waker.close()
    assert [(r.job_id, r.passes) for r in runners] == [("j", 3)]  # not started again
    assert not loop.runners


def test_with_no_pool_a_stop_ends_the_loop_once_the_job_has_left() -> None:
    runners, start = starter(Runner)

    waker = Waker()
    loop = NodeLoop(pinned_config(), None, start, waker, lambda: 0.0)
    loop._reconcile()
    loop.request_stop()
    assert loop.run() is None  # stopped before the job ended: no exit code of its own
    waker.close()
    assert [r.stops for r in runners] == [1]


def test_with_no_pool_a_loop_needs_a_job_to_serve() -> None:
    settings = load_settings({"redis": {"url": "redis://r:6379/0"}})
    waker = Waker()
    with pytest.raises(ValueError, match="no pool serves its config's job"):
        NodeLoop(settings, None, lambda c, g: Runner(c.job.id), waker, lambda: 0.0)
    waker.close()


def test_a_node_placed_elsewhere_lets_its_tiers_go_and_a_stopping_one_keeps_them() -> None:
    """The memory tier outlives an agent that stops (a restart finds it), not a node that the
    pool moved off the job (its ranks will run elsewhere: the tier would only fill tmpfs)."""
    user = str(AS_TESTER["user"])
    settings = load_settings(
        {"redis": {"url": "redis://r:6379/0"}, "pool": {"users": [user], "allow_root": True}}
    )
    job = load_spec({"id": "j", "entrypoint": ["true"], "user": user})

    class Placed(Member):
        def spec(self, job_id: str) -> Any:
            return job if job_id == "j" else "not JSON"

    member = Placed()
    kept: list[bool] = []
    waker = Waker()

    class Closing(Runner):
        def close(self, keep_tiers: bool = True) -> None:
            kept.append(keep_tiers)
            loop.request_stop()

    loop = NodeLoop(settings, member, lambda c, g: Closing(c.job.id), waker, lambda: 0.0)
    member.placement = "j"
    loop._reconcile()
    assert loop.runners
    member.placement = "k"  # the pool placed this node on another job
    loop.run()
    assert kept == [False]

    loop = NodeLoop(pinned_config(), Member(), lambda c, g: Closing(c.job.id), waker, lambda: 0.0)
    loop._reconcile()
    loop.request_stop()
    loop.run()
    waker.close()
    assert kept == [False, True]


def test_between_jobs_the_loop_sweeps_stale_tiers_once_per_job_wanted() -> None:
    """Only once the node has heard from the pool (else it does not know what it serves), and
    never while it serves a job (the agent owns that job's tier)."""
    member = Member()
    member.synced = False
    swept: list[tuple[str, ...]] = []
    waker = Waker()
    loop = NodeLoop(
        load_settings({"redis": {"url": "redis://r:6379/0"}}),
        member,
        lambda c, g: Runner(c.job.id),
        waker,
        lambda: 0.0,
        sweep=lambda _settings, serving: swept.append(serving),
    )
    loop._sweep_stale()
    assert swept == []  # not synced yet
    member.synced = True
    loop._sweep_stale()
    loop._sweep_stale()
    assert swept == [()]  # free: every tier of this node is stale, once
    member.placement = "j"
    loop._sweep_stale()
    assert swept == [(), ("j",)]
    loop.runners["j"] = Runner("j")
    member.placement = "k"
    loop._sweep_stale()
    assert swept == [(), ("j",)]  # serving j: its agent owns its tier
    waker.close()


class Registry:
    """A container runtime whose pulls the test lets finish (or fail)."""

    worker_depth = 1

    def __init__(self, present: bool = False, fails: str | None = None) -> None:
        self.is_present = present
        self.fails = fails
        self.go = threading.Event()
        self.pulls: list[str] = []

    def present(self, image: str) -> bool:
        return self.is_present

    def pull(self, image: str, timeout_s: float) -> None:
        self.pulls.append(image)
        self.go.wait(10)
        if self.fails:
            raise PullFailed(self.fails)

    def cgroup_parent(self) -> str:
        raise AssertionError("not started here")

    def remove(self, *names: str) -> None:
        raise AssertionError("not started here")

    def run_argv(self, launch: Any) -> list[str]:
        raise AssertionError("not started here")


def contained_config() -> Config:
    job = {"id": "j", "entrypoint": ["true"], "container": {"image": "localhost/t:1"}, **AS_TESTER}
    containers = {"allowed": True, "images": ["localhost/"]}
    doc = {"redis": {"url": "redis://r:6379/0"}, "containers": containers, "job": job}
    config = load_settings(doc)
    assert isinstance(config, Config)
    return config


def _reconciled(loop: NodeLoop) -> bool:
    loop._reconcile()
    return True


def _loop(registry: Registry) -> tuple[NodeLoop, list[Runner], Waker]:
    runners, start = starter(Runner)
    waker = Waker()
    pulls = Pulls(waker.wake, runtime_of=lambda config: registry)
    loop = NodeLoop(contained_config(), None, start, waker, lambda: 0.0, pulls=pulls)
    return loop, runners, waker


def test_a_jobs_image_is_pulled_before_its_agent_starts_and_said_once_ready() -> None:
    registry = Registry()
    loop, runners, waker = _loop(registry)
    loop._reconcile()
    assert not runners and loop.healthz() == (False, "pulling image localhost/t:1")
    assert loop._state().pulling == "localhost/t:1"  # the pool's nodes listing says so
    loop._reconcile()  # still pulling: one pull, not another
    registry.go.set()
    wait_for(lambda: _reconciled(loop) and runners, 10, "the agent to start once pulled")
    assert registry.pulls == ["localhost/t:1"]
    assert runners[0].ready.image == "localhost/t:1" and runners[0].ready.seconds >= 0
    assert loop._state().pulling is None
    waker.close()


def test_an_image_present_is_not_pulled_again() -> None:
    registry = Registry(present=True)
    loop, runners, waker = _loop(registry)
    wait_for(lambda: _reconciled(loop) and runners, 10, "the agent to start")
    assert registry.pulls == [] and runners[0].ready == Pulled("localhost/t:1", 0.0)
    registry.is_present = False  # removed from the node since (podman image prune)
    runners.clear()
    loop.runners.clear()  # the job left; placed here again
    registry.go.set()
    wait_for(lambda: _reconciled(loop) and runners, 10, "the agent to start again")
    assert registry.pulls == ["localhost/t:1"]  # looked again, and pulled it
    waker.close()


def test_a_failed_pull_is_a_refusal_not_a_crash_loop() -> None:
    registry = Registry(fails="manifest unknown")
    registry.go.set()
    loop, runners, waker = _loop(registry)
    assert loop.run() == 1  # served once (nodeagent launch): it could not start
    assert not runners and registry.pulls == ["localhost/t:1"]
    assert loop._refused["j"].endswith("pulling image localhost/t:1 failed: manifest unknown")
    waker.close()


def test_a_whole_node_job_is_shown_holding_every_unit_the_node_offers() -> None:
    """Every unit the inventory offers goes into the pool report. A job that has the node
    whole holds all of them, those its workers use or not (a MIG instance beside 8 GPUs once
    showed "(free)" while the accounting charged it); all are free once it serves nothing."""
    settings = load_settings({"redis": {"url": "redis://r:6379/0"}})
    units = (GpuUnit("GPU-a", "H100", 81559), GpuUnit("MIG-b-0", "H100", 9856))
    member, waker = Member(), Waker()
    loop = NodeLoop(
        settings, member, lambda c, g: Runner(c.job.id), waker, lambda: 0.0, inventory=lambda: units
    )
    waker.close()
    assert loop._state().gpus == units
    loop.runners["p"] = Runner("p")
    assert [(u.uuid, u.job) for u in loop._state().gpus] == [("GPU-a", "p"), ("MIG-b-0", "p")]
    loop.runners.clear()
    assert all(u.job is None for u in loop._state().gpus)


def test_jobs_sharing_a_node_each_get_gpus_of_their_own_and_leave_alone() -> None:
    """Placed as shares, the node starts an agent per job, each with units no other job holds
    (the first free in the order the node offers them); a job no longer placed here is asked to
    leave, the others untouched; a share whose units are still another job's waits for them,
    and a whole-node job waits until every job sharing the node left."""
    settings = load_settings({"redis": {"url": "redis://r:6379/0"}})
    units = tuple(GpuUnit(f"GPU-{i}", "H100") for i in range(4))
    granted: dict[str, tuple[str, ...] | None] = {}
    started: dict[str, Runner] = {}

    def start(config: Config, grant: tuple[str, ...] | None) -> Runner:
        granted[config.job.id] = grant
        runner = started[config.job.id] = Runner(config.job.id)
        return runner

    def config_for(job_id: str) -> Config:
        config = load_settings(
            {
                "redis": {"url": "redis://r:6379/0"},
                "job": {"id": job_id, "entrypoint": ["true"], **AS_TESTER},
            }
        )
        assert isinstance(config, Config)
        return config

    member, waker = Member(), Waker()
    loop = NodeLoop(settings, member, start, waker, lambda: 0.0, inventory=lambda: units)
    loop._config_for = config_for  # type: ignore[method-assign]
    member.shares = {"a": 1, "b": 2}
    loop._reconcile()
    assert granted == {"a": ("GPU-0",), "b": ("GPU-1", "GPU-2")}
    state = loop._state()
    assert (state.serving, state.sharing) == (None, ("a", "b"))
    assert [u.job for u in state.gpus] == ["a", "b", "b", None]

    member.shares = {"b": 2, "c": 2}  # a leaves; c needs 2 of the 1 free: it waits for a's
    loop._reconcile()
    assert (started["a"].stops, started["b"].stops) == (1, 0)
    assert "c" not in loop.runners
    loop._forget("a")  # a's agent left
    loop._reconcile()
    assert granted["c"] == ("GPU-0", "GPU-3") and started["b"].stops == 0

    member.shares, member.placement = {}, "whole"  # a whole-node job: after every share left
    loop._reconcile()
    assert "whole" not in loop.runners and started["c"].stops == 1
    loop._forget("b")
    loop._forget("c")
    loop._reconcile()
    waker.close()
    assert granted["whole"] is None and list(loop.runners) == ["whole"]
