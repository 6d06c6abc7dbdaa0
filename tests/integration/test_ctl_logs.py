"""`nodeagentctl logs`: this node's rank logs, read from log_dir (no Redis)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from nodeagent.cli.ctl import main as ctl_main
from nodeagent.telemetry.logtail import Follower, last_lines, rank_logs
from tests.helpers.runas import AS_TESTER

EX_USAGE = 2


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    job = tmp_path / "logs" / "llama"
    job.mkdir(parents=True)
    (job / "rank-0.log").write_text("".join(f"line {i}\n" for i in range(100)))
    (job / "rank-1.log").write_text("=== nodeagent: generation 1 ===\nhello\n")
    (job / "rank-1.progress").write_text("")  # not a log
    (job / "1").mkdir()
    return tmp_path / "logs"


def test_tail_of_one_rank(logs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = ctl_main(
        ["--job", "llama", "logs", "--log-dir", str(logs), "--rank", "0", "--tail", "5"]
    )
    assert code == 0
    assert capsys.readouterr().out.splitlines() == [f"line {i}" for i in range(95, 100)]


def test_every_rank_from_the_config(
    logs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "node": {"name": "n1", "address": "127.0.0.1"},
                "job": {"id": "llama", "entrypoint": ["true"], **AS_TESTER},
                "log_dir": str(logs),
            }
        )
    )
    assert ctl_main(["--config", str(config), "logs", "--tail", "1"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"==> rank 0: {logs / 'llama' / 'rank-0.log'} <==",
        "line 99",
        f"==> rank 1: {logs / 'llama' / 'rank-1.log'} <==",
        "hello",
    ]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--job", "llama", "logs", "--rank", "7"], "rank 7 has no log in"),
        (["--job", "other", "logs"], "no rank logs in"),
        (["logs", "--tail", "-1"], "--tail must be >= 0"),
    ],
)
def test_nothing_to_show_exits_2(
    logs: Path, args: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert ctl_main([*args, "--log-dir", str(logs)]) == EX_USAGE
    assert words in capsys.readouterr().err


def test_the_only_job_is_the_default(logs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert ctl_main(["logs", "--log-dir", str(logs), "--rank", "1", "-n", "1"]) == 0
    assert capsys.readouterr().out == "hello\n"


def test_follow_prints_what_is_appended(logs: Path) -> None:
    log = logs / "llama" / "rank-1.log"
    argv = ["--job", "llama", "logs", "--log-dir", str(logs), "--rank", "1", "-f", "-n", "1"]
    follow = subprocess.Popen(
        [sys.executable, "-m", "nodeagent.cli.ctl", *argv], stdout=subprocess.PIPE, text=True
    )
    try:
        assert follow.stdout is not None
        assert follow.stdout.readline() == "hello\n"  # the tail: it follows from here on
        with log.open("a") as f:
            f.write("=== nodeagent: generation 2 ===\nresumed")
            f.flush()
            f.write(" at step 40\n")
        assert follow.stdout.readline() == "=== nodeagent: generation 2 ===\n"
        assert follow.stdout.readline() == "resumed at step 40\n"
    finally:
        follow.terminate()
        follow.wait(10)
        if follow.stdout is not None:
            follow.stdout.close()


@pytest.mark.parametrize("count", [0, 1, 3, 5000])
def test_last_lines_read_from_the_end(tmp_path: Path, count: int) -> None:
    path = tmp_path / "rank-0.log"
    lines = [f"{i:06d} " + "x" * 50 for i in range(4000)]  # several read blocks
    path.write_text("\n".join(lines) + "\n")
    got, size = last_lines(path, count)
    assert got == (lines[-count:] if count else []) and size == path.stat().st_size


def test_a_truncated_log_is_followed_from_its_start(tmp_path: Path) -> None:
    path = tmp_path / "rank-3.log"
    path.write_text("old old old\n")
    follower = Follower(path, path.stat().st_size)
    path.write_text("new\n")
    assert list(follower.read()) == ["new"]
    assert rank_logs(tmp_path) == {3: path}


def test_a_job_named_reads_across_the_pool_so_it_needs_redis(
    logs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `logs JOB` asks the agent of the rank's node (tests/integration/test_pool_logs.py); the
    # files of this node are `logs` without JOB.
    assert ctl_main(["logs", "llama", "--rank", "1"], environ={}) == EX_USAGE
    assert "give --config PATH, or --redis URL" in capsys.readouterr().err
