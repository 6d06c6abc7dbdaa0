"""`nodeagent launch`: torchrun's command line, one job in the foreground, its result as the
exit code; with an embedded Redis (--standalone) and with three launches on one redis-server."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cluster import RedisServer, wait_for

EX_CONFIG = 78


def launch(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nodeagent", "launch", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def script(directory: Path, body: str) -> Path:
    path = directory / "train.py"
    path.write_text(body)
    return path


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ("import sys\nprint('epoch', sys.argv[1:])\n", 0),
        ("import sys\nprint('boom')\nsys.exit(3)\n", 3),
    ],
    ids=["succeeds", "exits-3"],
)
def test_standalone_exits_with_the_jobs_result(tmp_path: Path, body: str, code: int) -> None:
    script(tmp_path, body)
    result = launch("--standalone", "--nproc-per-node", "2", "train.py", "a", cwd=tmp_path)
    assert result.returncode == code, result.stderr[-3000:]
    assert f"exit code {code}; logs in {tmp_path / 'nodeagent-logs'}" in result.stderr
    assert "level=INFO" not in result.stderr  # warnings only, as torchrun (--log-level)
    logs = tmp_path / "nodeagent-logs"  # the default: under the current directory
    assert sorted(p.name for p in logs.glob("*/rank-*.log")) == ["rank-0.log", "rank-1.log"]
    assert list(logs.rglob("*.progress")) == []  # the script never called beat()


def test_two_standalone_launches_on_one_machine_run_side_by_side(tmp_path: Path) -> None:
    """Same host name, two jobs: neither takes the other's workers for leftovers to kill."""
    runs = []
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        script(tmp_path / name, "import time\ntime.sleep(3)\nprint('done')\n")
        runs.append(
            subprocess.Popen(
                [sys.executable, "-m", "nodeagent", "launch", "--standalone", "train.py"],
                cwd=tmp_path / name,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    for run in runs:
        output, _ = run.communicate(timeout=120)
        assert run.returncode == 0, output[-3000:]
        assert "[rank 0]: done" in output and "left by a previous agent" not in output


def test_logs_of_a_launch(tmp_path: Path) -> None:
    script(tmp_path, "for i in range(30):\n    print('step', i)\n")
    assert launch("--standalone", "train.py", cwd=tmp_path).returncode == 0
    result = subprocess.run(
        [sys.executable, "-m", "nodeagent.cli.ctl", "logs", "--rank", "0", "--tail", "5"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,  # ./nodeagent-logs and its only job: what launch wrote
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"step {i}" for i in range(25, 30)]


def test_a_launch_stopped_before_the_job_ended_is_not_a_success(tmp_path: Path) -> None:
    script(tmp_path, "import time\nprint('started')\ntime.sleep(60)\n")
    out = tmp_path / "launch.out"
    with out.open("w") as f:
        agent = subprocess.Popen(
            [sys.executable, "-m", "nodeagent", "launch", "--standalone", "train.py"],
            cwd=tmp_path,
            stdout=f,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: "[rank 0]: started" in out.read_text(), 60, "the worker to start")
        agent.send_signal(signal.SIGINT)
        assert agent.wait(60) == 1, out.read_text()[-3000:]
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    assert "stopped before it ended" in out.read_text()


def test_module_and_ignored_flags(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "main.py").write_text("import sys\nprint('args', sys.argv[1:])\n")
    result = launch(
        "--nnodes", "1", "--node-rank", "0", "--rdzv-backend", "c10d", "-m", "pkg.main", "x",
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[rank 0]: args ['x']" in result.stderr + result.stdout
    assert "--node-rank ignored: ranks are assigned" in result.stderr


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--rdzv-backend", "etcd", "t.py"], "--rdzv-backend etcd"),
        (["--nnodes", "2", "t.py"], "no --rdzv-endpoint: one node only"),
        (["--nproc-per-node", "gpu", "t.py"], "give a number"),
    ],
)
def test_refused_command_lines(tmp_path: Path, args: list[str], words: str) -> None:
    result = launch(*args, cwd=tmp_path)
    assert result.returncode == EX_CONFIG and words in result.stderr


@pytest.mark.slow
def test_three_launches_on_one_redis_run_a_job_to_success(
    tmp_path: Path, redis_server: RedisServer, job_id: str
) -> None:
    """Output printed with plain print (no flush) shows in the agent's output at once."""
    script(
        tmp_path,
        "import os, time\n"
        "print('step one', time.time())\n"
        "time.sleep(3)\n"
        "print('done', os.environ['RANK'])\n",
    )
    endpoint = redis_server.url.removeprefix("redis://").removesuffix("/0")
    agents, outputs = [], []
    for i in range(3):
        out = (tmp_path / f"agent-{i}.out").open("w")
        outputs.append(tmp_path / f"agent-{i}.out")
        agents.append(
            subprocess.Popen(
                [
                    sys.executable, "-m", "nodeagent", "launch", "--nnodes", "3",
                    "--nproc-per-node", "1", "--rdzv-endpoint", endpoint,
                    "--rdzv-id", job_id, "--node-name", f"n{i}", "train.py",
                ],
                cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT,
            )
        )  # fmt: skip
        out.close()
    try:
        wait_for(
            lambda: all("[rank" in p.read_text() and "step one" in p.read_text() for p in outputs),
            60,
            "every rank's first line in its agent's output",
        )
        still_running = [a.poll() is None for a in agents]
        codes = [a.wait(120) for a in agents]
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
    text = "".join(p.read_text() for p in outputs)
    assert codes == [0, 0, 0], text[-4000:]
    assert all(still_running), "the first line showed only once the script had ended"
    assert sorted(line.split()[-1] for line in text.splitlines() if ": done " in line) == [
        "0",
        "1",
        "2",
    ]
    assert (tmp_path / "nodeagent-logs" / job_id).is_dir()
    again = launch(
        "--nnodes", "1:3", "--rdzv-endpoint", endpoint, "--rdzv-id", job_id, "train.py",
        cwd=tmp_path,
    )  # fmt: skip
    assert again.returncode == 1  # an ended job id is not this run's result
    assert f"job {job_id} already ended (succeeded)" in again.stderr
