"""A node's cores divided between its GPU units, and so between the jobs sharing it
(model/cores.py), and a job's cpus_per_gpu checked against them (runtime/isolation.py)."""

from __future__ import annotations

import pytest

from nodeagent.config.isolation import IsolationConfig
from nodeagent.config.load import job_fields
from nodeagent.config.settings import JobConfig
from nodeagent.config.values import Section
from nodeagent.errors import ConfigError
from nodeagent.model.cores import Unit, cores, divide, job_cpus
from nodeagent.model.resources import Capacity, LimitError, offer

# Two sockets of 4 cores, 2 threads each: core c is CPUs c and c + 8 (Linux's numbering).
SMT = cores(range(16), lambda cpu: cpu % 8)
SOCKET0, SOCKET1 = frozenset({0, 1, 2, 3, 8, 9, 10, 11}), frozenset({4, 5, 6, 7, 12, 13, 14, 15})


def test_cpus_are_grouped_by_core_in_the_order_of_their_first_cpu() -> None:
    assert SMT[:3] == ((0, 8), (1, 9), (2, 10))
    assert cores([3, 1, 2], lambda cpu: cpu) == ((1,), (2,), (3,))


def test_each_gpu_gets_whole_cores_of_its_own_socket() -> None:
    """GPUs 0 and 1 near socket 1, 2 and 3 near socket 0 (listed out of socket order): each
    takes two cores of its own socket, none taken twice."""
    units = [Unit("g0", SOCKET1), Unit("g1", SOCKET1), Unit("g2", SOCKET0), Unit("g3", SOCKET0)]
    held = divide(units, SMT)
    assert held == {
        "g0": ((4, 12), (5, 13)),
        "g1": ((6, 14), (7, 15)),
        "g2": ((0, 8), (1, 9)),
        "g3": ((2, 10), (3, 11)),
    }


def test_a_gpu_whose_socket_is_taken_or_unknown_gets_the_cores_left() -> None:
    """Three GPUs near socket 0 and one of no known affinity, 8 cores: two each; the third
    GPU of socket 0 finds its socket taken and goes across; the remainder is nobody's."""
    units = [Unit("a", SOCKET0), Unit("b", SOCKET0), Unit("c", SOCKET0), Unit("d")]
    held = divide(units, SMT)
    assert held["a"] == ((0, 8), (1, 9)) and held["b"] == ((2, 10), (3, 11))
    assert held["c"] == ((4, 12), (5, 13)) and held["d"] == ((6, 14), (7, 15))
    five = divide([Unit("x"), Unit("y")], SMT[:5])
    assert five == {"x": ((0, 8), (1, 9)), "y": ((2, 10), (3, 11))}  # core 4 is nobody's


def test_more_units_than_cores_divides_nothing() -> None:
    held = divide([Unit(f"u{i}") for i in range(8)], cores([0, 1], lambda cpu: cpu))
    assert set(held.values()) == {()}
    assert job_cpus(held, ["u0"], None) == ()  # it shares the node's CPUs by weight
    with pytest.raises(LimitError, match="fewer cores than GPU units and holds none"):
        job_cpus(held, ["u0"], 1)


def test_a_job_holds_its_units_cores_or_as_many_cpus_of_each_as_it_asks() -> None:
    held = divide([Unit("g0", SOCKET0), Unit("g1", SOCKET0), Unit("g2", SOCKET1)], SMT)
    # 8 cores / 3 units: 2 each (g0, g1 on socket 0; g2 on socket 1), two left over
    assert job_cpus(held, ["g0", "g2"], None) == (0, 1, 4, 5, 8, 9, 12, 13)
    assert job_cpus(held, ["g1"], 2) == (2, 10)  # one whole core: its two threads
    assert job_cpus(held, ["g1"], 3) == (2, 3, 10, 11)  # whole cores: two
    with pytest.raises(LimitError) as more:
        job_cpus(held, ["g0"], 5)
    assert str(more.value) == (
        "asks for 5 CPUs per GPU, but this node holds 4 for each (2 whole cores): ask for 4 "
        "or fewer"
    )


def test_the_node_offers_the_pool_the_cpus_each_unit_holds() -> None:
    held = divide([Unit("a"), Unit("b", SOCKET1)], SMT)
    capacity = Capacity(64 << 30, 16, 2, held)
    assert offer(capacity, IsolationConfig()).cpus_per_gpu == 8
    assert offer(Capacity(64 << 30, 16, 2), IsolationConfig()).cpus_per_gpu == 0  # none held


def job(**keys: object) -> JobConfig:
    return job_fields(Section({"id": "j", "entrypoint": ["python", "t.py"], **keys}, "job"))


def test_cpus_per_gpu_is_a_positive_count() -> None:
    assert job(cpus_per_gpu=4).cpus_per_gpu == 4 and job().cpus_per_gpu is None
    with pytest.raises(ConfigError, match=r"^job.cpus_per_gpu: must be >= 1, got 0"):
        job(cpus_per_gpu=0)
