"""Preloaded worker interpreters (job.preload) with real processes, alone and under real agents."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from nodeagent.supervisor.group import Supervisor
from nodeagent.supervisor.spares import PRESTART_DELAY_S, SPARE_MODULE, Spawner
from nodeagent.supervisor.spec import WorkerSpec
from nodeagent.supervisor.status import GroupPhase
from tests.helpers.cluster import RedisServer, local_cluster, wait_for

# A module nothing imports at start-up: in sys.modules before the script runs only if preloaded.
MODULE = "xml.dom.minidom"
SCRIPT = f"""
import json, os, sys
preloaded = {MODULE!r} in sys.modules
record = {{
    "preloaded": preloaded,
    "marker": os.environ.get("NODEAGENT_PRELOADED"),
    "name": __name__,
    "argv": sys.argv,
    "cwd": os.getcwd(),
    "path0": sys.path[0],
    "rank": os.environ.get("RANK"),
    "extra": os.environ.get("EXTRA"),
    "pid": os.getpid(),
    "stdin": sys.stdin.read(),
}}
print(json.dumps(record), flush=True)
sys.exit(int(sys.argv[-1]) if sys.argv[-2] == "--exit" else 0)
"""


class Harness:
    def __init__(self, tmp_path: Path, modules: tuple[str, ...] = (MODULE,)) -> None:
        self.tmp = tmp_path
        self.now = 0.0
        self.spawner = Spawner(modules)
        self.sup = Supervisor(
            echo=lambda rank, line: None,
            wake=threading.Event().set,
            clock=lambda: self.now,
            spawner=self.spawner,
        )
        (tmp_path / "script.py").write_text(SCRIPT)
        (tmp_path / "pkg").mkdir()
        (tmp_path / "pkg" / "__init__.py").write_text("")
        (tmp_path / "pkg" / "entry.py").write_text(SCRIPT)

    def spec(self, generation: int, argv: tuple[str, ...] | None = None, **env: str) -> WorkerSpec:
        log = self.tmp / "logs" / str(generation) / "rank-0.log"
        return WorkerSpec(
            rank=0,
            local_rank=0,
            argv=argv or (sys.executable, "script.py", "--flag", "x"),
            env={
                **os.environ,
                "RANK": str(generation),  # changes every generation, as ranks may
                "NODEAGENT_GENERATION": str(generation),
                "NODEAGENT_PROGRESS_FILE": str(log.with_suffix(".progress")),
                **env,
            },
            cwd=str(self.tmp),
            log_path=log,
            progress_path=log.with_suffix(".progress"),
        )

    def run(self, spec: WorkerSpec, generation: int) -> tuple[dict[str, object], int | None]:
        """Start one generation, wait for it to exit; its record and exit code."""
        self.sup.start(generation, "n", [spec])

        def exited() -> bool:
            self.sup.poll()
            return self.sup.status().phase is GroupPhase.EXITED

        wait_for(exited, 30, f"generation {generation} exited")
        code = self.sup.workers()[0].exit_code
        record = json.loads(spec.log_path.read_text().splitlines()[-1])
        return record, code

    def spares_ready(self) -> list[psutil.Process]:
        """Let the pre-start delay pass and wait until the spare interpreter has its imports."""
        self.now += PRESTART_DELAY_S + 0.1
        self.sup.poll()
        pids = self.spawner.spare_pids()
        assert pids, "no spare was started"
        procs = [psutil.Process(pid) for pid in pids]

        def waiting() -> bool:  # imported, blocked reading stdin
            return all(p.status() == psutil.STATUS_SLEEPING for p in procs)

        wait_for(waiting, 30, "spares waiting")
        return procs


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path)
    yield harness
    harness.sup.kill()
    harness.sup.close()


def test_restart_runs_in_the_preloaded_interpreter(h: Harness) -> None:
    first, code = h.run(h.spec(1), 1)
    assert code == 0 and first["preloaded"] is False and first["marker"] is None
    (spare,) = h.spares_ready()
    second, code = h.run(h.spec(2, (sys.executable, "script.py", "--exit", "3")), 2)
    assert code == 3, "the script's exit code is the worker's"
    assert h.sup.status().failure is not None
    assert second["pid"] == spare.pid
    assert second["preloaded"] is True and second["marker"] == MODULE
    assert second["name"] == "__main__"
    assert second["argv"] == ["script.py", "--exit", "3"]
    assert second["cwd"] == str(h.tmp) and second["path0"] == str(h.tmp)
    assert second["rank"] == "2", "the new generation's environment"
    assert second["stdin"] == "", "stdin is /dev/null, as for a cold start"


def test_module_entrypoint(h: Harness) -> None:
    argv = (sys.executable, "-m", "pkg.entry", "arg")
    h.run(h.spec(1, argv), 1)
    h.spares_ready()
    record, code = h.run(h.spec(2, argv), 2)
    assert code == 0 and record["preloaded"] is True and record["name"] == "__main__"
    assert record["argv"] == [str(h.tmp / "pkg" / "entry.py"), "arg"]


def test_a_spare_started_for_another_environment_is_not_used(h: Harness) -> None:
    h.run(h.spec(1, EXTRA="a"), 1)
    (spare,) = h.spares_ready()
    record, code = h.run(h.spec(2, EXTRA="b"), 2)  # say CUDA_VISIBLE_DEVICES changed
    assert record["preloaded"] is False and record["extra"] == "b" and code == 0
    assert not spare.is_running() or spare.status() == psutil.STATUS_ZOMBIE


def test_a_dead_spare_means_a_cold_start(h: Harness) -> None:
    h.run(h.spec(1), 1)
    (spare,) = h.spares_ready()
    spare.kill()
    spare.wait(10)
    record, code = h.run(h.spec(2), 2)
    assert record["preloaded"] is False and code == 0


def test_close_stops_the_spares(h: Harness) -> None:
    h.run(h.spec(1), 1)
    (spare,) = h.spares_ready()
    h.sup.close()
    assert h.spawner.spare_pids() == []
    assert not spare.is_running()


def test_a_spare_exits_when_the_agent_goes_away(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", SPARE_MODULE, MODULE],
        stdin=subprocess.PIPE,
        cwd=tmp_path,
    )
    assert proc.stdin is not None
    proc.stdin.close()  # what the agent's death does to the pipe
    assert proc.wait(30) == 0


def test_agents_restart_workers_from_spares(
    redis_server: RedisServer, job_id: str, tmp_path: Path
) -> None:
    with local_cluster(
        redis_server.url,
        tmp_path,
        job=job_id,
        max_nodes=2,
        timing={"heartbeat_interval": "200ms", "lease_ttl": "1s"},
        job_options={"preload": [MODULE]},
    ) as cluster:
        cluster.start("a", "b")
        first = cluster.wait_running(2)["generation"]
        assert {s["preloaded"] for s in cluster.starts(first)} == {None}

        def spares() -> list[psutil.Process]:
            return [
                p
                for name in ("a", "b")
                for p in psutil.Process(cluster.agents[name].proc.pid).children()
                if SPARE_MODULE in p.cmdline()
            ]

        wait_for(lambda: len(spares()) == 2, 30, "a spare on each node")
        spare_pids = {p.pid for p in spares()}
        (victim,) = [pid for pid in cluster.worker_pids("b") if pid not in spare_pids]
        psutil.Process(victim).kill()
        second = cluster.wait_running(2, after_generation=first)["generation"]
        starts = cluster.starts(second)
        assert {s["preloaded"] for s in starts} == {MODULE}
        assert {s["pid"] for s in starts} == spare_pids
        started = [
            e
            for e in cluster.events()
            if e["type"] == "workers_started" and e["generation"] == second
        ]
        assert [e["data"]["preloaded"] for e in started] == [1, 1]
        assert all("1 in preloaded interpreters" in e["message"] for e in started)


def test_a_spare_that_cannot_import_says_why_and_the_worker_starts_cold(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    h = Harness(tmp_path, modules=("no_such_module_for_nodeagent",))
    try:
        h.run(h.spec(1), 1)
        h.now += PRESTART_DELAY_S + 0.1
        h.sup.poll()
        (pid,) = h.spawner.spare_pids()
        wait_for(
            lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie",
            30,
            "the spare to fail",
        )
        record, code = h.run(h.spec(2), 2)
        assert record["preloaded"] is False and code == 0
        assert "No module named 'no_such_module_for_nodeagent'" in caplog.text
    finally:
        h.sup.kill()
        h.sup.close()
