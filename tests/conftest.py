from __future__ import annotations

import itertools
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from _pytest.nodes import Node

from tests.helpers import unitcgroup
from tests.helpers.cluster import RedisServer
from tests.helpers.munge import MungeDaemon

_jobs = itertools.count(1)


def _nvml_works() -> bool:
    from nodeagent.gpu.nvml import GpuUnavailable, NvmlBackend, load_pynvml

    try:
        backend = NvmlBackend(load_pynvml())
        backend.open()
    except GpuUnavailable:
        return False
    backend.close()
    return True


LEASES = (3.0, 5.0)  # the chaos suite's two leases (tests/chaos)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--reps", type=int, default=1, help="repetitions of each chaos scenario (tests/chaos)"
    )
    parser.addoption(
        "--all-leases",
        action="store_true",
        help="run each chaos scenario at both leases (3 s and 5 s), not only at its lease mark's",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "rep" in metafunc.fixturenames:
        reps = int(metafunc.config.getoption("--reps"))
        metafunc.parametrize("rep", range(reps), ids=[f"rep{i}" for i in range(reps)])
    mark = metafunc.definition.get_closest_marker("lease")
    if mark is not None:
        leases = LEASES if metafunc.config.getoption("--all-leases") else (float(mark.args[0]),)
        name = "chaos" if "chaos" in metafunc.fixturenames else "lease"
        ids = [f"lease{lease:g}s" for lease in leases]
        metafunc.parametrize(name, leases, indirect=name == "chaos", ids=ids)


# Under pytest-xdist (-n, --dist loadgroup), the tests of each of these folders run one after
# another on one worker: the chaos suite's namespaces share a subnet, two trainings at once on
# two cores would time each other out, and the booted nodes are booted once for their folder.
SERIAL_GROUPS = ("chaos", "e2e", "booted")


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked gpu need a real GPU and driver; skip them where NVML does not open."""
    for item in items:
        folder = item.path.parent.name
        if folder in SERIAL_GROUPS:
            item.add_marker(pytest.mark.xdist_group(folder))
    gpu_tests = [item for item in items if item.get_closest_marker("gpu")]
    if gpu_tests and not _nvml_works():
        skip = pytest.mark.skip(reason="no NVIDIA GPU/driver here (NVML does not open)")
        for item in gpu_tests:
            item.add_marker(skip)


def pytest_configure(config: pytest.Config) -> None:
    """Groups must hold: pytest-xdist tags a grouped test by rewriting its node ID
    (item._nodeid), which pytest 9.2 no longer reads, and then the groups silently run side by
    side (two trainings at once time each other out)."""
    if config.getvalue("dist") != "loadgroup":
        return
    probe = types.SimpleNamespace(_nodeid="probe@group", _id="probe")
    if Node.nodeid.fget(probe) != "probe@group":  # type: ignore[attr-defined]
        raise pytest.UsageError(
            f"pytest {pytest.__version__} ignores the groups of pytest-xdist's --dist loadgroup; "
            "install the pytest pyproject.toml's test extra pins (pip install -e '.[test]')"
        )


@pytest.fixture(scope="session", autouse=True)
def unit_cgroups_ended() -> Iterator[None]:
    """The cgroups made for the session's agents (tests/helpers/unitcgroup.py), ended after."""
    yield
    unitcgroup.remove_all()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One real redis-server for the session; tests keep apart by job id."""
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def munged() -> Iterator[MungeDaemon]:
    """One real munged for the session, with a key of its own (tests/helpers/munge.py)."""
    daemon = MungeDaemon().start()
    yield daemon
    daemon.stop()


@pytest.fixture
def job_id(request: pytest.FixtureRequest) -> str:
    name = "".join(c if c.isalnum() else "-" for c in request.node.name)[:40].strip("-")
    return f"{name}-{next(_jobs)}"


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path
