"""nodeagent.runtime.preflight against this machine's real file system, PATH and addresses."""

from __future__ import annotations

import copy
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from nodeagent.config.hosts import Resolver
from nodeagent.config.identity import WorkerUser
from nodeagent.config.load import load_config
from nodeagent.config.settings import Config
from nodeagent.errors import ConfigError
from nodeagent.runtime import preflight
from tests.helpers.runas import AS_TESTER

BASE: dict[str, Any] = {
    "node": {"name": "n1", "address": "127.0.0.1"},
    "redis": {"url": "redis://127.0.0.1:6379/0"},
    "job": {"id": "pf", "entrypoint": [sys.executable, "-c", "pass"], **AS_TESTER},
    "metrics": {"listen": "127.0.0.1:0"},
}


def config_with(tmp_path: Path, **changes: object) -> Config:
    data = copy.deepcopy(BASE)
    data["log_dir"] = str(tmp_path / "logs")
    data["state_dir"] = str(tmp_path / "state")
    for path, value in changes.items():
        *parents, last = path.split("__")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return load_config(data, Resolver())


def make_tree(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "train.py").write_text("pass\n")
    (tmp_path / "work" / "run.sh").write_text("#!/bin/sh\n")
    (tmp_path / "work" / "run.sh").chmod(0o755)
    (tmp_path / "work" / "data.txt").write_text("not a program\n")
    (tmp_path / "work" / "data.txt").chmod(0o644)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "mytrainer").write_text("#!/bin/sh\n")
    (tmp_path / "bin" / "mytrainer").chmod(0o755)


def t(path: str) -> str:
    return "TMP/" + path


BAD = [
    ("log_dir", t("a-file"), "log_dir", "is not a directory"),
    ("log_dir", t("a-file/logs"), "log_dir", "is not a directory"),
    ("state_dir", t("a-file"), "state_dir", "is not a directory"),
    ("state_dir", t("a-file/deeper/state"), "state_dir", "is not a directory"),
    ("job__working_dir", t("missing"), "job.working_dir", "does not exist on this node"),
    ("job__working_dir", t("a-file"), "job.working_dir", "is not a directory"),
    ("job__entrypoint", ["no-such-program-x7"], "job.entrypoint", "not found on this node"),
    ("job__entrypoint", [t("bin/missing")], "job.entrypoint", "not found on this node"),
    ("job__entrypoint", [t("work/data.txt")], "job.entrypoint", "is not executable"),
    ("job__entrypoint", [t("work")], "job.entrypoint", "not found on this node"),
    ("job__entrypoint", ["mytrainer"], "job.entrypoint", "not found on this node"),
    ("job__entrypoint", [sys.executable, "nope.py"], "job.entrypoint", "script nope.py not found"),
    ("job__entrypoint", ["./run.sh"], "job.entrypoint", "not found"),  # relative to the cwd
    ("metrics__listen", "no-such-host.invalid:9410", "metrics.listen", "cannot resolve"),
    ("metrics__listen", "192.0.2.1:9410", "metrics.listen", "cannot listen on 192.0.2.1"),
    ("metrics__listen", "[::1]:9410", "metrics.listen", "cannot resolve"),  # IPv4 server
]


def resolve(value: object, tmp_path: Path) -> object:
    if isinstance(value, str):
        return value.replace("TMP/", f"{tmp_path}/")
    if isinstance(value, list):
        return [resolve(v, tmp_path) for v in value]
    if isinstance(value, dict):
        return {k: resolve(v, tmp_path) for k, v in value.items()}
    return value


@pytest.mark.parametrize("create", [False, True], ids=["check", "run"])
@pytest.mark.parametrize(("path", "value", "key", "words"), BAD)
def test_what_cannot_work_on_this_node_names_its_key(
    tmp_path: Path, path: str, value: object, key: str, words: str, create: bool
) -> None:
    make_tree(tmp_path)
    config = config_with(tmp_path, **{path: resolve(value, tmp_path)})
    with pytest.raises(ConfigError) as err:
        preflight.check_node(config, {"PATH": "/usr/bin:/bin"}, create=create, cwd=tmp_path)
    assert err.value.key == key
    assert words in str(err.value)


GOOD = [
    ("job__working_dir", t("work")),
    ("job__entrypoint", [sys.executable, "train.py"]),  # found in working_dir below
    ("job__entrypoint", ["./run.sh"]),  # relative to working_dir, as exec does with cwd
    ("job__entrypoint", [sys.executable, "-m", "not.checked"]),
    # a bare python is the agent's own interpreter (job.python), wherever PATH points
    ("job__entrypoint", ["python", "train.py"]),
    ("job__entrypoint", ["sh", "-c", "true"]),  # found in PATH
    ("job__env", {"PATH": t("bin")}),  # the workers' PATH finds mytrainer
    ("metrics__listen", "off"),
    ("metrics__listen", ":0"),
    ("metrics__listen", "localhost:9410"),  # another process may hold the port: not checked
]


@pytest.mark.parametrize("create", [False, True], ids=["check", "run"])
@pytest.mark.parametrize(("path", "value"), GOOD)
def test_what_works_on_this_node_passes(
    tmp_path: Path, path: str, value: object, create: bool
) -> None:
    make_tree(tmp_path)
    changes: dict[str, object] = {"job__working_dir": str(tmp_path / "work")}
    changes[path] = resolve(value, tmp_path)
    if path == "job__env":
        changes["job__entrypoint"] = ["mytrainer"]
    config = config_with(tmp_path, **changes)
    node = preflight.check_node(config, {"PATH": "/usr/bin:/bin"}, create=create, cwd=tmp_path)
    assert node.state_dir == tmp_path / "state" and node.warnings == ()


def test_check_leaves_directories_alone_and_run_creates_them(tmp_path: Path) -> None:
    config = config_with(
        tmp_path, log_dir=str(tmp_path / "a" / "logs"), state_dir=str(tmp_path / "b" / "state")
    )
    preflight.check_node(config, os.environ, create=False)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    node = preflight.check_node(config, os.environ, create=True)
    assert (tmp_path / "a" / "logs").is_dir() and node.state_dir == tmp_path / "b" / "state"
    assert node.state_dir.is_dir()


def test_a_default_state_dir_that_cannot_be_used_is_only_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a-file").write_text("x")
    monkeypatch.setattr(preflight, "DEFAULT_STATE_DIR", str(tmp_path / "a-file" / "state"))
    data = copy.deepcopy(BASE)
    data["log_dir"] = str(tmp_path / "logs")
    config = load_config(data, Resolver())
    assert config.state_dir is None
    for create in (False, True):
        node = preflight.check_node(config, os.environ, create=create)
        assert node.state_dir is None
        assert len(node.warnings) == 1 and "set state_dir" in node.warnings[0]


# -- what the job's user (job.user, another uid) can reach ------------------------------------

GHOST = WorkerUser("ghost", 54321, 54321, (54321, 54322), switch=True)  # no passwd entry needed
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory every user can enter (pytest's tmp_path is under a 0700 one), with a job's
    files in it: work/train.py and an interpreter, bin/python."""
    base = Path(tempfile.mkdtemp(prefix="na-preflight-", dir="/tmp"))
    base.chmod(0o755)
    (base / "work").mkdir(mode=0o755)
    (base / "work" / "train.py").write_text("pass\n")
    (base / "work" / "train.py").chmod(0o644)
    (base / "bin").mkdir(mode=0o755)
    (base / "bin" / "python").write_text("#!/bin/sh\n")
    (base / "bin" / "python").chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def private(path: Path, mode: int = 0o700, uid: int = -1, gid: int = -1) -> dict[str, str]:
    path.mkdir(exist_ok=True)
    path.chmod(mode)
    os.chown(path, uid, gid)
    return {}


def unreadable_script(base: Path) -> dict[str, str]:
    (base / "work" / "train.py").chmod(0o600)
    return {}


def hidden_interpreter(base: Path) -> dict[str, str]:
    private(base / "hidden")
    (base / "bin" / "python").rename(base / "hidden" / "python")
    (base / "bin" / "python").symlink_to(base / "hidden" / "python")
    return {}


REACH = [
    ("all-open", lambda b: {}, None, ""),
    ("log-dir-0700", lambda b: private(b / "logs"), "log_dir", "cannot enter {b}/logs"),
    ("log-dir-parent-0700", lambda b: {"log_dir": str(private(b / "p") or b / "p" / "logs")},
     "log_dir", "cannot enter {b}/p (mode 0700, uid 0, gid 0)"),
    ("log-dir-its-own", lambda b: private(b / "logs", uid=GHOST.uid), None, ""),
    ("log-dir-group-0750", lambda b: private(b / "logs", 0o750, gid=54322), None, ""),
    ("log-dir-group-0705", lambda b: private(b / "logs", 0o705, gid=54322), "log_dir", "enter"),
    ("workdir-0700", lambda b: private(b / "work"), "job.working_dir", "cannot enter {b}/work"),
    ("workdir-parent-0700", lambda b: private(b), "log_dir", "cannot enter {b} "),
    ("script-0600", unreadable_script, "job.entrypoint", "cannot read {b}/work/train.py"),
    ("bin-0700", lambda b: private(b / "bin"), "job.entrypoint", "cannot enter {b}/bin"),
    ("linked-interpreter", hidden_interpreter, "job.entrypoint", "cannot enter {b}/hidden"),
]  # fmt: skip


@ROOT_ONLY
@pytest.mark.parametrize("create", [False, True], ids=["check", "run"])
@pytest.mark.parametrize(
    ("prepare", "key", "words"), [r[1:] for r in REACH], ids=[r[0] for r in REACH]
)
def test_the_job_user_must_reach_its_files(
    open_dir: Path,
    prepare: Callable[[Path], dict[str, str]],
    key: str | None,
    words: str,
    create: bool,
) -> None:
    base = open_dir
    config = as_ghost(config_with(base, **{**job_files(base), **prepare(base)}))
    if key is None:
        preflight.check_node(config, {"PATH": "/usr/bin:/bin"}, create=create, cwd=base)
        return
    with pytest.raises(ConfigError) as err:
        preflight.check_node(config, {"PATH": "/usr/bin:/bin"}, create=create, cwd=base)
    assert err.value.key == key
    assert "the workers' user cannot reach" in str(err.value) and "'ghost'" in str(err.value)
    assert words.format(b=base) in str(err.value)


def job_files(base: Path) -> dict[str, object]:
    """The config's paths into `open_dir` (this test's Python may be out of ghost's reach)."""
    return {
        "log_dir": str(base / "logs"),
        "job__working_dir": str(base / "work"),
        "job__python": str(base / "bin" / "python"),
        "job__entrypoint": ["python", "train.py"],
    }


def as_ghost(config: Config) -> Config:
    return replace(config, job=replace(config.job, user=GHOST))


@ROOT_ONLY
def test_the_log_dirs_run_creates_are_the_job_users_to_enter(open_dir: Path) -> None:
    changes = {**job_files(open_dir), "log_dir": str(open_dir / "a" / "logs")}
    config = as_ghost(config_with(open_dir, **changes))
    preflight.check_node(config, os.environ, create=False, cwd=open_dir)
    assert not (open_dir / "a").exists()
    preflight.check_node(config, os.environ, create=True, cwd=open_dir)
    for made in (open_dir / "a", open_dir / "a" / "logs"):
        st = made.stat()
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, GHOST.gid, 0o750)
    assert stat.S_IMODE(open_dir.stat().st_mode) == 0o755  # what was there stays as it was


@ROOT_ONLY
def test_the_agents_working_directory_when_job_working_dir_is_not_set(open_dir: Path) -> None:
    private(open_dir / "work")
    changes = {**job_files(open_dir), "job__working_dir": None}
    config = as_ghost(config_with(open_dir, **changes))
    with pytest.raises(ConfigError) as err:
        preflight.check_node(config, os.environ, create=False, cwd=open_dir / "work")
    assert err.value.key == "job.working_dir" and "job.working_dir is not set" in str(err.value)


@ROOT_ONLY
def test_workers_that_run_as_the_agent_are_not_checked_for_another_user(open_dir: Path) -> None:
    private(open_dir / "logs")
    private(open_dir / "work")
    config = config_with(open_dir, log_dir=str(open_dir / "logs"), job__working_dir="work")
    assert config.job.user is not None and not config.job.user.switch  # root, as AS_TESTER says
    preflight.check_node(config, os.environ, create=True, cwd=open_dir)
